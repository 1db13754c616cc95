"""The eviction state machine: notice, grace, evict (contract 4; issue 9 item 3).

A victim gets the annotation ``gpumeter.io/eviction-notice`` (reason, deadline, cause), then,
at its deadline, a policy/v1 Eviction. Before every attempt the pod is read again: gone,
replaced, terminating, or its notice withdrawn or changed means no eviction; a spot reclaim
whose pending pod no longer waits withdraws its notice. A PodDisruptionBudget refusal (429,
cause DisruptionBudget) is recorded and retried with exponential back-off up to
``hooks.eviction_max_backoff_seconds``; the pod is never deleted directly. Every step is a
PreemptionRecord. ``dry_run``: the same decisions, recorded with action ``dry_run``; no
annotation, no eviction. service.py explains why the annotation is the eviction in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from gpumeter.core.models import PreemptionAction
from scheduler_hooks.actuator.backoff import backoff_seconds
from scheduler_hooks.actuator.kube_gateway import (
    JSON_PATCH,
    MERGE_PATCH,
    ClusterGateway,
    classify_eviction,
    notice_patch,
    status_message,
    withdraw_patch,
)
from scheduler_hooks.actuator.leader import NotLeading
from scheduler_hooks.actuator.plan import Victim
from scheduler_hooks.actuator.reclaim import RECLAIM_PREFIX
from scheduler_hooks.actuator.records import RecordSink, pod_record
from scheduler_hooks.cluster.kube_objects import Notice, PodView, pod_view, rfc3339

log = logging.getLogger("gpumeter.actuator")
T = TypeVar("T")


def _now() -> datetime:
    return datetime.now(UTC)


class RunIO(Protocol):
    """Runs a blocking API server call off the event loop."""

    def __call__(self, call: Callable[..., T], *args: Any) -> Awaitable[T]: ...


PostEvent = Callable[..., None]  # post_event(pod, reason, message, warning=False): a Kubernetes Event


@dataclass
class InFlight:
    """An eviction waiting for its deadline or retrying."""

    pod: PodView
    notice: Notice
    notice_text: str  # the annotation exactly as written: checked before every attempt
    task: asyncio.Task[None] | None = None


class Evictions:
    """Evictions in flight, by pod uid, each a task counting down to its deadline."""

    def __init__(self, kube: ClusterGateway, sink: RecordSink, *, dry_run: bool, max_backoff: float,
                 io: RunIO, sleep: Callable[[float], Awaitable[None]], stopping: Callable[[], bool],
                 post_event: PostEvent, act: RunIO | None = None,
                 clock: Callable[[], datetime] = _now, tick: float | None = None) -> None:
        """``clock``: "now" for notices and deadlines (the real clock; the demo passes its
        simulated fleet's). ``tick``: with a clock that does not follow wall time, a countdown
        looks at it again every ``tick`` wall seconds instead of sleeping the whole grace once."""
        self._clock = clock
        self._tick = tick
        self.kube = kube
        self.sink = sink
        self.dry_run = dry_run
        self.max_backoff = max_backoff
        self._io = io
        # Writes (notice, withdrawal, eviction) go through ``act``: it refuses (NotLeading) once
        # this process no longer holds the actuator's Lease.
        self._act = act or io
        self._sleep = sleep
        self._stopping = stopping
        self._event = post_event
        self._inflight: dict[str, InFlight] = {}  # by pod uid

    def tasks(self) -> list[asyncio.Task[None]]:
        """The countdowns running now (cancelled when the actuator stops)."""
        return [f.task for f in self._inflight.values() if f.task]

    def resume(self, pods: Iterable[PodView]) -> int:
        """Pods noticed by an earlier run (annotation present) go ahead at their deadline; how many."""
        count = 0
        for pod in pods:
            if pod.notice is None or not pod.evictable or pod.uid in self._inflight:
                continue
            self.start(InFlight(pod, pod.notice, pod.notice_text), fresh=False)
            count += 1
        return count

    async def carry_out(self, victims: Sequence[Victim], metric: str,
                        recorded: set[str] | None = None) -> None:
        """Notice every victim (in parallel), record it, and start its eviction countdown."""
        if not victims:
            return
        now = self._clock()
        if self.dry_run:
            records = [
                pod_record(v.notice.cause, metric, v.pod, "dry_run",
                           f"would notice, evict at {rfc3339(v.notice.deadline)}: {v.notice.reason}", now)
                for v in victims
            ]
            await self.sink.write(records)
            return
        noticed = await asyncio.gather(*(self._notice(v) for v in victims))
        kept = [flight for flight in noticed if flight is not None]
        # The countdowns start before the records are written: with grace 0 the eviction goes out
        # at once instead of after three round trips to the stores. The event is committed only
        # after the records below are written, so a crash in between replays it; its evicted
        # pods are terminating by then and are not chosen again.
        for flight in kept:
            self.start(flight, fresh=True)
        records = [pod_record(f.notice.cause, metric, f.pod, "noticed",
                              f"evict at {rfc3339(f.notice.deadline)}: {f.notice.reason}", now) for f in kept]
        await self.sink.write([r for r in records if r.record_id not in (recorded or ())])

    async def _notice(self, victim: Victim) -> InFlight | None:
        pod, notice = victim.pod, victim.notice
        if victim.resumed:
            return InFlight(pod, notice, pod.notice_text)
        status = await self._act(self.kube.patch_pod, pod.namespace, pod.name,
                                 notice_patch(pod.uid, notice), MERGE_PATCH)
        if status != 200:
            log.info("%s is gone or replaced (HTTP %d): no notice", pod.key, status)
            return None
        self._event(pod, "EvictionNotice", f"{notice.reason}; eviction at {rfc3339(notice.deadline)}")
        return InFlight(pod, notice, notice.to_annotation())

    async def _until(self, deadline: datetime) -> bool:
        """Wait until ``deadline`` on the clock; True if there was anything to wait for."""
        waited = False
        while not self._stopping():
            delay = (deadline - self._clock()).total_seconds()
            if delay <= 0:
                break
            waited = True
            await self._sleep(delay if self._tick is None else min(delay, self._tick))
        return waited

    def start(self, flight: InFlight, fresh: bool) -> None:
        uid = flight.pod.uid
        running = self._inflight.get(uid)
        if running is not None and running.task is not None and not running.task.done():
            return  # already counting down (another cause noticed it first)
        flight.task = asyncio.create_task(self._evict_when_due(flight, fresh), name=f"evict-{flight.pod.key}")
        self._inflight[uid] = flight

    async def _evict_when_due(self, flight: InFlight, fresh: bool) -> None:
        pod, notice = flight.pod, flight.notice
        try:
            if await self._until(notice.deadline):
                fresh = False
            attempt = 0
            reported: set[str] = set()
            while not self._stopping():
                # A pod we noticed and looked at a moment ago needs no second read; after a wait it does.
                if not fresh and not await self._still_due(flight):
                    return
                fresh = False
                log.debug("evicting %s (%s)", pod.key, notice.cause[:12])
                try:
                    status, body = await self._act(self.kube.evict, pod.namespace, pod.name, pod.uid)
                except NotLeading:
                    raise
                except Exception as exc:  # unreachable API server: same as a 5xx
                    status, body = 0, str(exc).encode()
                outcome = classify_eviction(status, body)
                if outcome == "evicted":
                    log.info("evicted %s (%s)", pod.key, notice.cause[:12])
                    await self._record(pod, notice, "evicted", "Eviction API accepted: the pod terminates")
                    self._event(pod, "Evicted", f"gpumeter: evicted (Eviction API): {notice.reason}")
                    return
                if outcome == "gone":
                    log.info("%s was gone or replaced before its eviction (HTTP %d)", pod.key, status)
                    return
                delay = backoff_seconds(attempt, self.max_backoff)
                if outcome == "pdb" and "pdb" not in reported:
                    message = status_message(body) or "PodDisruptionBudget allows no disruption now"
                    await self._record(pod, notice, "pdb_refused",
                                       f"HTTP 429 DisruptionBudget: {message}; retried with back-off up to "
                                       f"{self.max_backoff:g}s, never deleted")
                    self._event(pod, "EvictionBlocked",
                                f"gpumeter: eviction refused by a PodDisruptionBudget: {message}; retrying",
                                warning=True)
                elif outcome == "error" and "error" not in reported:
                    await self._record(pod, notice, "failed",
                                       f"HTTP {status}: {status_message(body) or 'no answer'}; retrying")
                reported.add(outcome)
                log.info("eviction of %s: %s (HTTP %d); next try in %.1fs", pod.key, outcome, status, delay)
                attempt += 1
                await self._sleep(delay)
        except NotLeading:
            log.info("eviction of %s left to the next leader: the lease is no longer held here", pod.key)
        finally:
            current = self._inflight.get(pod.uid)
            if current is flight:
                del self._inflight[pod.uid]

    async def _still_due(self, flight: InFlight) -> bool:
        """Re-read the pod: still ours, not terminating, notice unchanged, reclaim still wanted."""
        pod = flight.pod
        current = await self._io(self.kube.pod, pod.namespace, pod.name)
        if current is None:
            return False
        view = pod_view(current, pod.tenant)
        if view.uid != pod.uid or view.deleting:
            return False
        if view.notice_text != flight.notice_text:
            log.info("%s: eviction notice withdrawn or changed; not evicting", pod.key)
            return False
        beneficiary = flight.notice.beneficiary
        if flight.notice.cause.startswith(RECLAIM_PREFIX) and beneficiary and not await self._still_pending(
                beneficiary, flight.notice.cause[len(RECLAIM_PREFIX):]):
            await self.withdraw_notice(view, f"the room was for {beneficiary}, which no longer waits")
            return False
        return True

    async def _still_pending(self, key: str, uid: str) -> bool:
        namespace, _, name = key.partition("/")
        current = await self._io(self.kube.pod, namespace, name)
        if current is None:
            return False
        view = pod_view(current, "")
        return view.uid == uid and view.pending

    async def _record(self, pod: PodView, notice: Notice, action: PreemptionAction, detail: str) -> None:
        record = pod_record(notice.cause, notice.metric, pod, action, detail, self._clock())
        await self.sink.write([record])

    async def withdraw_notice(self, pod: PodView, why: str) -> None:
        flight = self._inflight.pop(pod.uid, None)
        current_task = asyncio.current_task()
        if flight is not None and flight.task is not None and flight.task is not current_task:
            flight.task.cancel()
        if self.dry_run:
            return
        status = await self._act(self.kube.patch_pod, pod.namespace, pod.name,
                                 withdraw_patch(pod.notice_text), JSON_PATCH)
        if status == 200:
            log.info("eviction notice on %s withdrawn: %s", pod.key, why)
            self._event(pod, "EvictionWithdrawn", f"gpumeter: eviction called off: {why}")
