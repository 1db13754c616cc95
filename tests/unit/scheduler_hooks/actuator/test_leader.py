"""The actuator's leader election (leader.py) against a stand-in for the Lease API.

``LeaseServerStandIn`` is not the API server: it is a stand-in that answers the three
CoordinationV1Api calls the elector makes the way the API server does for Lease objects
(404 when missing, 409 Conflict on a create of an existing name or a replace carrying a stale
resourceVersion, a new resourceVersion on every write), and can be cut off (every call fails
as an unreachable server does). tests/kube/test_actuator_leader.py runs the same code against
the real kube-apiserver. Time is a hand-driven clock: every expectation follows from the
timings, none from a sleep.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from scheduler_hooks.actuator.leader import (
    LeaderElector,
    LeaseClient,
    LeaseTimings,
    lead,
    micro_time,
)

TIMINGS = LeaseTimings(duration=15, renew_deadline=10.0, retry_period=2.0)
NAMESPACE, NAME = "gpumeter-system", "gpumeter-actuator"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@dataclass
class _Response:
    data: bytes


class LeaseServerStandIn:
    """Stand-in for the API server's Lease endpoints (see the module docstring)."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.reachable = True
        self.writes: list[dict[str, Any]] = []
        self.before_write: Callable[[], None] | None = None  # a competitor writing in between

    def _check(self) -> None:
        if not self.reachable:
            raise ConnectionError("connection refused (stand-in cut off)")

    def _stamp(self, body: dict[str, Any], namespace: str, name: str) -> _Response:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"] = {"name": name, "namespace": namespace, "resourceVersion": str(self.version)}
        self.leases[(namespace, name)] = stored
        self.writes.append(stored)
        return _Response(json.dumps(stored).encode())

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> _Response:
        self._check()
        found = self.leases.get((namespace, name))
        if found is None:
            raise ApiException(status=404, reason="Not Found")
        return _Response(json.dumps(found).encode())

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> _Response:
        self._check()
        if self.before_write is not None:
            self.before_write()
        if (namespace, body["metadata"]["name"]) in self.leases:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._stamp(body, namespace, body["metadata"]["name"])

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any],
                                 **_: Any) -> _Response:
        self._check()
        if self.before_write is not None:
            self.before_write()
        current = self.leases.get((namespace, name))
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._stamp(body, namespace, name)

    def spec(self) -> dict[str, Any]:
        return dict(self.leases[(NAMESPACE, NAME)]["spec"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.wall0 + timedelta(seconds=self.now - 1000.0)


async def _direct(call: Callable[..., Any], *args: Any) -> Any:
    return call(*args)


def elector(server: LeaseServerStandIn, clock: Clock, identity: str,
            timings: LeaseTimings = TIMINGS) -> LeaderElector:
    async def wait(stop: asyncio.Event, seconds: float) -> None:
        clock.now += seconds  # time passes only when the elector waits
        await asyncio.sleep(0)

    return LeaderElector(LeaseClient(server, NAMESPACE, NAME, request_timeout=1.0), identity, timings,
                         clock=clock, wall=clock.wall, io=_direct, wait=wait)


def in_another_thread(work: Callable[[], Any]) -> Any:
    """A competing process acting while this one is between its read and its write."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result()


def attempt(candidate: LeaderElector) -> bool:
    return asyncio.run(candidate.try_acquire_or_renew())


# -- acquiring and renewing ---------------------------------------------------------------------


def test_the_first_candidate_creates_the_lease_and_holds_it() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    first = elector(server, clock, "a")
    assert not first.holding()
    assert attempt(first)
    assert first.holding()
    spec = server.spec()
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"] == "2026-11-20T12:00:00.000000Z"
    assert MICRO_TIME.match(micro_time(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)))


def test_a_held_lease_is_taken_only_after_it_went_unchanged_for_its_duration() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader, follower = elector(server, clock, "a"), elector(server, clock, "b")
    assert attempt(leader)
    assert not attempt(follower)  # first sight of the lease: its duration starts now
    clock.now += 14.9
    assert not attempt(follower)
    clock.now += 0.2  # 15.1 s unchanged as the follower saw it
    assert attempt(follower)
    spec = server.spec()
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    assert spec["acquireTime"] == spec["renewTime"] == micro_time(clock.wall())
    assert not leader.holding()  # its renew deadline (10 s) passed long before


def test_renewals_keep_the_acquire_time_and_keep_followers_waiting() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader, follower = elector(server, clock, "a"), elector(server, clock, "b")
    assert attempt(leader)
    acquired = server.spec()["acquireTime"]
    assert not attempt(follower)
    for _ in range(10):  # 10 renewals 2 s apart: 20 s, beyond the duration, never unchanged for 15
        clock.now += 2
        assert attempt(leader)
        assert not attempt(follower)
    spec = server.spec()
    assert spec["holderIdentity"] == "a" and spec["acquireTime"] == acquired
    assert spec["renewTime"] == micro_time(clock.wall()) and spec["leaseTransitions"] == 0


def test_of_two_candidates_writing_at_once_the_stale_resource_version_is_refused() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    assert attempt(elector(server, clock, "old"))
    first, second = elector(server, clock, "b"), elector(server, clock, "c")
    assert not attempt(first) and not attempt(second)
    clock.now += 16  # "old" went silent: both may take over, and both try

    def second_writes_first() -> None:
        server.before_write = None
        assert in_another_thread(lambda: attempt(second))

    server.before_write = second_writes_first
    assert not attempt(first)  # read version N, "c" wrote N+1 in between: 409
    assert server.spec()["holderIdentity"] == "c"
    assert second.holding() and not first.holding()


def test_two_creators_of_a_missing_lease_one_wins() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    first, second = elector(server, clock, "b"), elector(server, clock, "c")

    def second_creates_first() -> None:
        server.before_write = None
        assert in_another_thread(lambda: attempt(second))

    server.before_write = second_creates_first
    assert not attempt(first)  # read: 404; create: 409 AlreadyExists
    assert server.spec()["holderIdentity"] == "c"


# -- losing it ----------------------------------------------------------------------------------


def test_a_cut_off_leader_stops_holding_at_its_renew_deadline_before_anyone_may_take_over() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader, follower = elector(server, clock, "a"), elector(server, clock, "b")
    assert attempt(leader)  # the last renewal that gets through started at t0
    t0 = clock.now
    assert not attempt(follower)  # the follower saw it after it was written: at t0 or later
    clock.now = t0 + TIMINGS.renew_deadline - 0.01
    assert leader.holding()
    clock.now = t0 + TIMINGS.renew_deadline
    assert not leader.holding()  # stopped acting here, with no answer from anyone needed
    assert not attempt(follower)  # and the follower may not take it yet
    clock.now = t0 + TIMINGS.duration + 0.01
    assert attempt(follower)


def test_hold_renews_until_cut_off_and_returns_at_the_renew_deadline() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader = elector(server, clock, "a")
    assert attempt(leader)
    cut_after = 4  # the create and 3 renewals get through
    last_success: list[float] = []
    original_replace = server.replace_namespaced_lease

    def replace(name: str, namespace: str, body: dict[str, Any], **kwargs: Any) -> Any:
        if len(server.writes) >= cut_after:
            raise ConnectionError("connection refused (stand-in cut off)")
        last_success.append(clock.now)
        return original_replace(name, namespace, body, **kwargs)

    server.replace_namespaced_lease = replace  # type: ignore[method-assign]
    asyncio.run(asyncio.wait_for(leader.hold(asyncio.Event()), timeout=30))
    assert not leader.holding()
    renewals = [w["spec"]["renewTime"] for w in server.writes]
    assert len(renewals) == cut_after and len(set(renewals)) == cut_after  # renewed every retry period
    assert clock.now == last_success[-1] + TIMINGS.renew_deadline  # gave up exactly at its deadline


def test_hold_returns_when_another_candidate_holds_the_lease() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader = elector(server, clock, "a")
    assert attempt(leader)
    taken = copy.deepcopy(server.leases[(NAMESPACE, NAME)])
    taken["spec"]["holderIdentity"] = "intruder"
    server._stamp(taken, NAMESPACE, NAME)  # e.g. an operator handed it over
    started = clock.now
    asyncio.run(asyncio.wait_for(leader.hold(asyncio.Event()), timeout=30))
    assert not leader.holding()
    assert clock.now == started + TIMINGS.retry_period  # at its next renewal, not at its deadline


def test_release_clears_the_holder_so_a_successor_takes_over_at_once() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader, follower = elector(server, clock, "a"), elector(server, clock, "b")
    assert attempt(leader)
    assert not attempt(follower)
    asyncio.run(leader.release())
    assert not leader.holding()
    assert server.spec()["holderIdentity"] is None
    assert attempt(follower)  # no waiting for the duration
    assert server.spec()["leaseTransitions"] == 1


def test_release_leaves_a_lease_someone_else_holds_alone() -> None:
    server, clock = LeaseServerStandIn(), Clock()
    leader, follower = elector(server, clock, "a"), elector(server, clock, "b")
    assert attempt(leader)
    assert not attempt(follower)
    clock.now += 16
    assert attempt(follower)
    clock.now -= 16 - 1  # the old leader's clock: still inside its own deadline, a stale belief
    writes = len(server.writes)
    asyncio.run(leader.release())
    assert len(server.writes) == writes
    assert server.spec()["holderIdentity"] == "b"


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"),
    [
        pytest.param(10, 10.0, 2.0, id="deadline-equals-duration"),
        pytest.param(10, 12.0, 2.0, id="deadline-above-duration"),
        pytest.param(10, 5.0, 5.0, id="retry-equals-deadline"),
        pytest.param(10, 5.0, 0.0, id="no-retry-period"),
    ],
)
def test_timings_out_of_order_are_refused(duration: int, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError, match="lease timings"):
        LeaseTimings(duration, deadline, retry)


# -- terms of leadership ------------------------------------------------------------------------


def test_lead_runs_the_work_each_term_and_ends_it_when_the_lease_is_lost() -> None:
    server = LeaseServerStandIn()
    timings = LeaseTimings(duration=3, renew_deadline=0.6, retry_period=0.05)
    candidate = LeaderElector(LeaseClient(server, NAMESPACE, NAME, request_timeout=1.0), "a", timings,
                              io=_direct)
    terms: list[str] = []
    changes: list[bool] = []

    async def scenario() -> None:
        stop = asyncio.Event()

        async def work(term: asyncio.Event) -> None:
            terms.append("started")
            assert candidate.holding()
            if len(terms) == 1:
                server.reachable = False  # the first term ends by the lease running out
            await term.wait()
            if len(terms) == 1:
                assert not candidate.holding()  # the term ended because the deadline passed
                server.reachable = True
            else:
                assert stop.is_set()
            terms.append("ended")
            if len(terms) == 4:
                return

        async def stop_in_second_term() -> None:
            while len(terms) < 3:
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.create_task(stop_in_second_term())
        await asyncio.wait_for(lead(candidate, work, stop, on_change=changes.append), timeout=30)
        await stopper

    asyncio.run(scenario())
    assert terms == ["started", "ended", "started", "ended"]
    assert changes == [True, False, True, False]
    assert server.spec()["holderIdentity"] is None  # released on stop


def test_lead_releases_the_lease_and_raises_when_the_work_fails() -> None:
    server = LeaseServerStandIn()
    timings = LeaseTimings(duration=3, renew_deadline=1.0, retry_period=0.05)
    candidate = LeaderElector(LeaseClient(server, NAMESPACE, NAME, request_timeout=1.0), "a", timings,
                              io=_direct)

    async def work(term: asyncio.Event) -> None:
        raise RuntimeError("actuator failed beyond retrying")

    with pytest.raises(RuntimeError, match="beyond retrying"):
        asyncio.run(asyncio.wait_for(lead(candidate, work, asyncio.Event()), timeout=30))
    assert server.spec()["holderIdentity"] is None
