"""The actuator's writes wait on the Lease: once ``may_act`` says no, no notice and no eviction
is sent (scheduler_hooks/actuator/evictions.py with the gate the actuator passes it).

The Kubernetes side is a recording stand-in for KubeGateway: it counts the calls that would
reach the API server and answers as the server does for a live pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from scheduler_hooks.actuator.evictions import Evictions
from scheduler_hooks.actuator.leader import NotLeading
from scheduler_hooks.actuator.plan import Victim
from scheduler_hooks.cluster.kube_objects import Notice, pod_view
from tests.unit.scheduler_hooks.actuator.test_decisions import pod_json

T = TypeVar("T")


class RecordingKube:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> int:
        self.calls.append(f"patch {name}")
        return 200

    def evict(self, namespace: str, name: str, uid: str) -> tuple[int, bytes]:
        self.calls.append(f"evict {name}")
        return 201, b"{}"


class Sink:
    async def write(self, records: Any) -> bool:
        return True


def run_evictions(fresh_notice: bool, may_act: Callable[[], bool]) -> list[str]:
    kube = RecordingKube()

    async def io(call: Callable[..., T], *args: Any) -> T:
        return call(*args)

    async def act(call: Callable[..., T], *args: Any) -> T:
        if not may_act():
            raise NotLeading("no lease")
        return call(*args)

    async def main() -> None:
        evictions = Evictions(kube, Sink(), dry_run=False, max_backoff=1.0,  # type: ignore[arg-type]
                              io=io, sleep=asyncio.sleep, stopping=lambda: False,
                              post_event=lambda *a, **k: None, act=act)
        due = datetime.now(UTC) - timedelta(seconds=1)
        notice = Notice(cause="e" * 64, reason="over quota", deadline=due, metric="gpu_hours")
        pod = pod_view(pod_json("victim"), "team-a")
        await evictions.carry_out([Victim(pod, notice, resumed=not fresh_notice)], "gpu_hours")
        await asyncio.gather(*evictions.tasks(), return_exceptions=True)

    try:
        asyncio.run(main())
    except NotLeading:
        kube.calls.append("refused")
    return kube.calls


@pytest.mark.parametrize(
    ("fresh_notice", "leading", "calls"),
    [
        pytest.param(True, True, ["patch victim", "evict victim"], id="leader-notices-and-evicts"),
        pytest.param(False, True, ["evict victim"], id="leader-resumes-a-notice-and-evicts"),
        pytest.param(True, False, ["refused"], id="no-lease-no-notice"),
        pytest.param(False, False, [], id="no-lease-no-eviction"),
    ],
)
def test_writes_wait_on_the_lease(fresh_notice: bool, leading: bool, calls: list[str]) -> None:
    assert run_evictions(fresh_notice, lambda: leading) == calls
