"""The actuator's handling of many tenants' crossings at once, against a fake API server.

Pure unit test: ``FakeApiServer`` stands in for the API server (answers as it does: merge patch
preconditioned on the uid, 422 on another uid; Eviction 201, 404 for a pod gone, 429 with a
``TooManyRequests`` Status for API Priority and Fairness throttling) and ``FakeRecords`` and
``FakeGrants`` for ClickHouse. Events are dispatched the way the consumer dispatches them
(``Actuator._chain``, without a topic position, so no read-ahead). What is checked:

- evictions of different tenants' pods are in flight at the same time (a barrier the first
  calls must all reach together: a serial actuator never gets there), never more at once than
  the actuator's API threads;
- per pod, the notice annotation lands before the first Eviction; a throttled Eviction (429) is
  sent again and the pod is evicted exactly once;
- a tenant's events are handled one at a time, in order;
- an event the tenants file disagrees with (the trust amendment) evicts nothing;
- Volcano queue work (one call at a time on its own thread) holds no tenant slot: more tenants
  than there are slots are evicted while every queue close is still waiting.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpumeter.core.kube import EVICTION_NOTICE_ANNOTATION
from gpumeter.core.models import QuotaEvent
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantPolicy
from scheduler_hooks.actuator.kube_gateway import MERGE_PATCH
from scheduler_hooks.actuator.plan import Position
from scheduler_hooks.actuator.service import IO_THREADS, TENANT_CONCURRENCY, Actuator
from scheduler_hooks.actuator.tenants_source import TenantsSource
from scheduler_hooks.actuator.volcano_queues import NoVolcanoQueues, QueueChange
from scheduler_hooks.cluster.kube_objects import PodView

TENANTS = [f"team-{i:02d}" for i in range(12)]
PODS_PER_TENANT = 2
TOGETHER = 4  # Eviction calls that must be in flight at once before any is answered
THROTTLED = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                        "reason": "TooManyRequests", "message": "Too many requests, please try again later.",
                        "details": {"retryAfterSeconds": 1}}).encode()


class FakeApiServer:
    """The actuator's ClusterGateway over pods in memory, answering as the API server does."""

    def __init__(self, pods: list[dict[str, Any]], throttle_first: set[str]) -> None:
        self._lock = threading.Lock()
        self._pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self._throttle_first = set(throttle_first)  # pod keys whose first Eviction gets a 429
        self.calls: dict[str, list[str]] = defaultdict(list)  # pod key -> what happened, in order
        self.in_flight = 0
        self.most_in_flight = 0
        self._together = threading.Barrier(TOGETHER, timeout=20)
        self._waited = 0

    def namespaces(self) -> list[dict[str, Any]]:
        with self._lock:
            names = sorted({ns for ns, _ in self._pods})
        return [{"metadata": {"name": ns, "labels": {}}} for ns in names]

    def nodes(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "gpu-0", "labels": {}}, "spec": {}, "status": {}}]

    def pods_of(self, namespace: str | None) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(p)) for (ns, _), p in sorted(self._pods.items())
                    if namespace is None or ns == namespace]

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.pods_of(namespace)

    def unscheduled_pods(self) -> list[dict[str, Any]]:
        return []

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._pods.get((namespace, name))
            return None if found is None else json.loads(json.dumps(found))

    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> int:
        assert content_type == MERGE_PATCH, "only notices are written in these scenarios"
        with self._lock:
            pod = self._pods.get((namespace, name))
            if pod is None:
                return 404
            if body["metadata"]["uid"] != pod["metadata"]["uid"]:
                return 422
            pod["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
            self.calls[f"{namespace}/{name}"].append("noticed")
            return 200

    def evict(self, namespace: str, name: str, uid: str) -> tuple[int, bytes]:
        key = f"{namespace}/{name}"
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            wait = self._waited < TOGETHER
            self._waited += 1
        try:
            if wait:
                self._together.wait()  # BrokenBarrierError (a failed test) if calls never overlap
            with self._lock:
                pod = self._pods.get((namespace, name))
                if pod is None or pod["metadata"]["uid"] != uid:
                    return 404, b""
                noticed = EVICTION_NOTICE_ANNOTATION in (pod["metadata"].get("annotations") or {})
                self.calls[key].append("evict" if noticed else "evict before notice")
                if key in self._throttle_first:
                    self._throttle_first.discard(key)
                    self.calls[key].append("429")
                    return 429, THROTTLED
                if pod["metadata"].get("deletionTimestamp"):
                    self.calls[key].append("evicted again")
                pod["metadata"]["deletionTimestamp"] = "2026-12-06T11:00:00Z"
                self.calls[key].append("201")
                return 201, b"{}"
        finally:
            with self._lock:
                self.in_flight -= 1

    def post_event(self, pod: PodView, reason: str, message: str, warning: bool = False) -> None:
        pass

    def post_namespace_event(self, namespace: str, reason: str, message: str, warning: bool = False) -> None:
        pass


class FakeRecords:
    """RecordSink in memory: nothing planned before; every write accepted."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    async def recorded(self, tenant: str, cause: str) -> set[str] | None:
        return set()

    async def write(self, records: Any) -> bool:
        self.written.extend(records)
        return True


class FakeGrants:
    async def get(self, fresh: bool = False) -> dict[str, Any]:
        return {}


def running_pod(tenant: str, index: int) -> dict[str, Any]:
    resources = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    return {
        "metadata": {"name": f"job-{index}", "namespace": tenant, "uid": f"uid-{tenant}-{index}",
                     "creationTimestamp": "2026-12-06T10:00:00Z"},
        "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "resources": resources}]},
        "status": {"phase": "Running", "startTime": "2026-12-06T10:00:00Z"},
    }


def crossing(tenant: str, limit: str = "1.000000") -> QuotaEvent:
    now = datetime.now(UTC)
    return QuotaEvent(event_id=f"exceeded-{tenant}-{limit}", tenant=tenant, metric="gpu_hours",
                      level="exceeded", threshold="1", used="1.500000", limit=limit,
                      period=now.strftime("%Y-%m"), at=now)


class WatchedActuator(Actuator):
    """Notes how many events of each tenant are being handled at once, and their order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handling: dict[str, int] = defaultdict(int)
        self.overlapping: set[str] = set()
        self.order: dict[str, list[str]] = defaultdict(list)

    async def handle(self, event: QuotaEvent, position: Position | None = None) -> None:
        self.handling[event.tenant] += 1
        if self.handling[event.tenant] > 1:
            self.overlapping.add(event.tenant)
        self.order[event.tenant].append(event.event_id)
        try:
            await super().handle(event, position)
        finally:
            self.handling[event.tenant] -= 1


class StuckQueues(NoVolcanoQueues):
    """Volcano queues whose every close waits until ``release`` is set (an API server slow to
    answer the queue calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def close(self, tenant: str, metric: str, policy: TenantPolicy | None) -> QueueChange | None:
        self.release.wait(timeout=30)
        return None


def make_actuator(tmp_path: Path, api: FakeApiServer, tenant_names: list[str] = TENANTS,
                  queues: NoVolcanoQueues | None = None) -> tuple[WatchedActuator, FakeRecords]:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(yaml.safe_dump({"tenants": [
        {"tenant": t, "gpu_hours": 1, "on_exceed": "preempt", "grace_seconds": 0} for t in tenant_names]}))
    settings = Settings(data_dir=tmp_path)
    settings.hooks.eviction_max_backoff_seconds = 0.05  # a throttled Eviction is sent again soon
    actuator = WatchedActuator(settings, dry_run=False, kube=api, tenants=TenantsSource(tenants),
                               queues=queues or NoVolcanoQueues(), grants=FakeGrants())
    records = FakeRecords()
    actuator.sink = records  # type: ignore[assignment]
    actuator.evictions.sink = records  # type: ignore[assignment]
    return actuator, records


async def dispatch_and_settle(actuator: Actuator, events: list[QuotaEvent]) -> list[str]:
    """Dispatch as the consumer does; wait until every chain and every eviction is over."""
    done: list[str] = []

    def marker(event_id: str) -> Callable[[], None]:
        return lambda: done.append(event_id)

    for event in events:
        actuator._chain(event, None, marker(event.event_id))  # type: ignore[arg-type]
    while actuator._chains or actuator.evictions.tasks():
        await asyncio.gather(*actuator._chains.values(), *actuator.evictions.tasks())
    actuator._stop.set()
    await asyncio.gather(*actuator._side_tasks, return_exceptions=True)
    return done


def test_crossings_of_many_tenants_evict_side_by_side_in_order_per_pod(tmp_path: Path) -> None:
    pods = [running_pod(t, i) for t in TENANTS for i in range(PODS_PER_TENANT)]
    throttled = {f"{t}/job-0" for t in TENANTS[::3]}
    api = FakeApiServer(pods, throttle_first=throttled)
    untrusted = TENANTS[-1]
    actuator, records = make_actuator(tmp_path, api)
    # Each trusted tenant: its crossing twice (a replay, folded); the last tenant's event names a
    # limit its policy does not have: ignored (trust), it evicts nothing.
    events = [crossing(t) for t in TENANTS[:-1]] + [crossing(untrusted, limit="99.000000")]
    events += [crossing(t) for t in TENANTS[:-1]]
    try:
        done = asyncio.run(dispatch_and_settle(actuator, events))
    finally:
        actuator._pool.shutdown(wait=True)
        actuator._events_pool.shutdown(wait=True)
        actuator._queues_pool.shutdown(wait=True)

    assert sorted(done) == sorted(e.event_id for e in events)
    assert TOGETHER <= api.most_in_flight <= IO_THREADS
    for tenant in TENANTS[:-1]:
        for index in range(PODS_PER_TENANT):
            key = f"{tenant}/job-{index}"
            throttled_first = ["evict", "429"] if key in throttled else []
            assert api.calls[key] == ["noticed", *throttled_first, "evict", "201"], key
    assert not any(key.startswith(f"{untrusted}/") for key in api.calls)
    assert actuator.overlapping == set()
    trusted = {t: order for t, order in actuator.order.items() if t != untrusted}
    assert trusted == {t: [f"exceeded-{t}-1.000000"] * 2 for t in TENANTS[:-1]}
    evicted = {(r.namespace, r.pod) for r in records.written if r.action == "evicted"}
    assert evicted == {(t, f"job-{i}") for t in TENANTS[:-1] for i in range(PODS_PER_TENANT)}


def test_queue_work_holds_no_tenant_slot(tmp_path: Path) -> None:
    tenants = [f"team-{i:02d}" for i in range(TENANT_CONCURRENCY + 4)]
    api = FakeApiServer([running_pod(t, 0) for t in tenants], throttle_first=set())
    queues = StuckQueues()
    actuator, _ = make_actuator(tmp_path, api, tenants, queues)

    async def scenario() -> set[str]:
        dispatched = asyncio.ensure_future(dispatch_and_settle(actuator, [crossing(t) for t in tenants]))
        for _ in range(200):  # until every pod is evicted, or 10 s: then the slots were held
            if all("201" in api.calls[f"{t}/job-0"] for t in tenants):
                break
            await asyncio.sleep(0.05)
        evicted_while_stuck = {t for t in tenants if "201" in api.calls[f"{t}/job-0"]}
        queues.release.set()
        await dispatched
        return evicted_while_stuck

    try:
        assert asyncio.run(scenario()) == set(tenants)
    finally:
        queues.release.set()
        actuator._pool.shutdown(wait=True)
        actuator._events_pool.shutdown(wait=True)
        actuator._queues_pool.shutdown(wait=True)
