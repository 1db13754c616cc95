"""The quota actuator (contract 4; issue 9 items 3-5): the cluster reacts to quota events.

``gpumeter hooks`` runs it beside the extender::

    actuator = Actuator.from_settings(settings, dry_run)
    await actuator.run(stop)

What it does
- Consumes gpumeter.quota.events.v1 (consumer group ``<hooks.group>-actuator``, under the
  topic prefix like every group). Fetching never waits for handling: each tenant's events
  run in order (one key, one partition), tenants side by side, and an offset is committed
  once every event up to it is handled (offsets.py).
- Trust (contract 4, amendment "trust"): an event the tenants file it holds disagrees with
  (``quota.trust.distrust``: tenant not in the file, a limit not the policy's, a period not
  the current one...) is ignored with one log line and counted in
  ``gpumeter_actuator_untrusted_events_total{reason}``; it closes, opens and evicts nothing.
- ``exceeded`` for an ``on_exceed: preempt`` tenant: the victims of
  ``plan.plan_preemption`` get the annotation ``gpumeter.io/eviction-notice`` (reason,
  deadline, the event id), then, after the tenant's ``grace_seconds``, a policy/v1 Eviction.
  A PodDisruptionBudget refusal (429, cause DisruptionBudget) is recorded and retried with
  exponential back-off up to ``hooks.eviction_max_backoff_seconds``; the pod is never
  deleted directly (evictions.py). ``recovered`` withdraws notices of that metric still waiting.
  An ``exceeded`` that a later ``recovered`` of the same tenant, metric and period cancelled
  evicts nobody, however far apart on the topic: before evicting, the partition is read
  ahead to its end (read_ahead.py, plan.Recoveries).
- ``exceeded`` for ``block`` or ``preempt`` closes the tenant's Volcano queue; ``recovered``
  reopens it once no metric is left (volcano_queues.py).
- Every few seconds: queues in step with the tenants file (re-read when it changes; a file
  that does not parse is refused with one line and the last good one stays), and spot
  reclaim (reclaim.py).
- Every decision is a PreemptionRecord on gpumeter.preemptions.v1 and in ClickHouse (records.py).
- ``dry_run``: the same decisions, recorded with action ``dry_run``; no annotation, no
  eviction, no queue change.

Durability, and why a replayed event evicts nobody twice
- The pod annotation is the eviction in flight. It carries the event id and the deadline,
  lives and dies with the pod (nothing to garbage-collect), is what a tenant sees in
  ``kubectl describe``, and is read back before every eviction attempt: an actuator restarted
  mid-grace resumes every annotated pod with its original deadline, and removing the
  annotation by hand calls the eviction off.
- ClickHouse ``preemptions`` is the memory of which events were handled: the annotation
  cannot be, because an evicted pod takes it along. Before planning an ``exceeded`` event
  the actuator asks for records with ``cause = event_id``; if there are any, the event was
  planned before and is only re-driven (pods still carrying its notice; no new victims,
  no new grace). The annotation is written before the record, and the record before the
  offset is committed, so a crash at any point leaves either an unhandled event (planned
  again: its already-noticed pods keep their notice and deadline, pods already terminating
  are never chosen again) or a handled one. With grace 0 the eviction goes out while its
  "noticed" record is being written (three round trips to the stores are not worth delaying
  it for); a crash in that window can lose that record, never double an eviction. An event
  that chose no victim leaves no record and is simply planned again on replay, which can
  evict nobody twice since it evicted nobody.
- Kafka replays are not the only copies: the quota worker may republish a crossing (same
  id) after its own crash; the same guard folds it.
- Record ids are sha256(cause, pod uid, action): replays fold.

Several replicas: only the holder of the actuator's Lease runs this (leader.py, wired by
``gpumeter hooks``); ``may_act`` is asked right before every write to the API server (notice,
withdrawal, eviction, queue change), so a process whose Lease ran out sends nothing more even
before its loops have wound down. A new leader starts from the committed offsets and the
annotations on the pods, exactly as a restarted actuator does (above): noticed pods keep their
deadline, evicted ones are terminating or gone (404: nothing to do), nobody is noticed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError
from kubernetes.client import ApiClient
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from gpumeter.core.kube import NO_TENANT, PROTECTED_ANNOTATION, tenant_of_namespace
from gpumeter.core.models import PreemptionAction, QuotaEvent
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantPolicy
from gpumeter.core.topics import QUOTA_EVENTS, actuator_group_id
from gpumeter.infra import kafka as gkafka
from gpumeter.infra.grants import GrantsReader
from quota.grants import fold
from quota.trust import Distrust, distrust
from scheduler_hooks.actuator.backoff import backoff_seconds
from scheduler_hooks.actuator.evictions import Evictions
from scheduler_hooks.actuator.grants_source import GrantsSource
from scheduler_hooks.actuator.kube_gateway import ClusterGateway, KubeGateway
from scheduler_hooks.actuator.leader import NotLeading
from scheduler_hooks.actuator.offsets import OffsetTracker
from scheduler_hooks.actuator.plan import (
    BLOCKING,
    Position,
    PreemptionPlan,
    Recoveries,
    Victim,
    blocked_after,
    crossing_event,
    notice_metric,
    plan_preemption,
)
from scheduler_hooks.actuator.read_ahead import ReadAhead
from scheduler_hooks.actuator.reclaim import RECLAIM_PREFIX, plan_spot_reclaim, qualifies, reclaim_victims
from scheduler_hooks.actuator.records import RecordSink, queue_record
from scheduler_hooks.actuator.refreshing_cache import RefreshingCache
from scheduler_hooks.actuator.tenants_source import TenantsSource
from scheduler_hooks.actuator.volcano_queues import QueueChange, VolcanoQueues
from scheduler_hooks.cluster.feeds import kube_api_client
from scheduler_hooks.cluster.kube_objects import PodView, namespace_labels, node_view, pod_view, tenants_of

log = logging.getLogger("gpumeter.actuator")
T = TypeVar("T")

RECLAIM_SECONDS = 5.0
QUEUE_SYNC_SECONDS = 5.0
NODE_CACHE_SECONDS = 30.0
NAMESPACE_CACHE_SECONDS = 5.0
# Tenants whose pods' part runs at once. The calls themselves are bounded below it (IO_THREADS
# API calls, records.READERS ClickHouse reads, one read-ahead); the slots only bound how many
# tenants are in flight. At 16, crossings released together after a window of the 10,000-GPU
# fleet waited p99 0.7 s for a slot (benchmarks/quota_latency.py, at load 9).
TENANT_CONCURRENCY = 64
IO_THREADS = 8
BATCH = 500
FETCH_WAIT_MS = 100
MAX_IN_FLIGHT = 2000  # events fetched, not yet handled


def untrusted_events_counter(registry: CollectorRegistry | None = None) -> Counter:
    """The actuator's count of ignored quota events, in ``registry`` (made once per registry)."""
    return Counter(
        "gpumeter_actuator_untrusted_events", "Quota events ignored because the tenants file disagrees",
        ["reason"], registry=registry if registry is not None else CollectorRegistry())


def _now() -> datetime:
    return datetime.now(UTC)


async def _in_thread(pool: ThreadPoolExecutor, call: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(call, *args))


class Actuator:
    def __init__(
        self,
        settings: Settings,
        *,
        dry_run: bool,
        kube: ClusterGateway,
        tenants: TenantsSource,
        reclaim_seconds: float = RECLAIM_SECONDS,
        queue_sync_seconds: float = QUEUE_SYNC_SECONDS,
        registry: CollectorRegistry | None = None,
        untrusted: Counter | None = None,
        may_act: Callable[[], bool] = lambda: True,
        clock: Callable[[], datetime] = _now,
        queues: VolcanoQueues | None = None,
        tick: float | None = None,
        grants: GrantsSource | None = None,
    ) -> None:
        """``clock``: "now" for the trust check, plans and deadlines; the real clock, always, in
        production (the demo passes its simulated fleet's clock, whose periods are the ones its
        quota events name; the trust rule itself is unchanged). ``queues``: Volcano's queues
        (default: through ``kube``'s API client); ``tick``: see ``Evictions``."""
        self._now = clock
        self.settings = settings
        self.may_act = may_act
        self.dry_run = dry_run
        self.kube = kube
        self.tenants = tenants
        if queues is None:  # only the API server's gateway has Volcano's queues behind it
            assert isinstance(kube, KubeGateway), "a cluster without an API server: pass queues"
            queues = VolcanoQueues(kube.custom, dry_run=dry_run)
        self.queues = queues
        self.sink = RecordSink(settings)
        self.reclaim_seconds = reclaim_seconds
        self.queue_sync_seconds = queue_sync_seconds
        self.max_backoff = settings.hooks.eviction_max_backoff_seconds
        self.blocked: dict[str, frozenset[str]] = {}
        self._handled: set[str] = set()  # event ids planned by this process
        self._announced: set[str] = set()  # event ids posted as namespace Events by this process
        self.recoveries = Recoveries()
        self.read_ahead = ReadAhead(settings, settings.kafka.topic(QUOTA_EVENTS), self.recoveries)
        self.untrusted = untrusted if untrusted is not None else untrusted_events_counter(registry)
        self._node_labels = RefreshingCache(self._read_node_labels, NODE_CACHE_SECONDS, self._spawn,
                                            what="the nodes' labels")
        self._namespace_labels = RefreshingCache(self._read_namespace_labels, NAMESPACE_CACHE_SECONDS,
                                                 self._spawn, what="the namespaces' labels")
        self.grants = grants if grants is not None else GrantsSource(
            GrantsReader(settings.clickhouse.connection_dsn(), fold), settings.quota.grants_poll_seconds,
            self._spawn)
        self._tenant_slots = asyncio.Semaphore(TENANT_CONCURRENCY)
        self._chains: dict[str, asyncio.Task[None]] = {}  # tenant -> its latest event's task
        # Below the client's connection pool (10 by default), so no connection is thrown away.
        self._pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="actuator-io")
        self._events_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="actuator-events")
        self._queues_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="actuator-queues")
        self._resumed = False
        self._last_sync: list[str] = []
        self._stop = asyncio.Event()
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self.evictions = Evictions(kube, self.sink, dry_run=dry_run, max_backoff=self.max_backoff,
                                   io=self._io, sleep=self._sleep, stopping=lambda: self._stop.is_set(),
                                   post_event=self._event, act=self._act, clock=clock, tick=tick)

    @classmethod
    def from_settings(cls, settings: Settings, dry_run: bool, api: ApiClient | None = None,
                      registry: CollectorRegistry | None = None, untrusted: Counter | None = None,
                      may_act: Callable[[], bool] = lambda: True, instance: str | None = None) -> Actuator:
        """``api``: a Kubernetes client to share (``gpumeter hooks`` has one); else the
        in-cluster account or the kubeconfig, as every controller finds them. ``registry``:
        where its Prometheus series go (the extender's, served on ``/metrics``); ``untrusted``:
        the counter made there once (``untrusted_events_counter``) when actuators follow each other
        in one process. ``may_act``: the Lease is held (leader.py); ``instance``: who reports the
        Events (the Lease identity)."""
        return cls(settings, dry_run=dry_run or settings.hooks.dry_run,
                   kube=KubeGateway(api if api is not None else kube_api_client(), instance=instance),
                   tenants=TenantsSource(settings.tenants), registry=registry, untrusted=untrusted,
                   may_act=may_act)

    @property
    def group(self) -> str:
        return actuator_group_id(self.settings.kafka.topic_prefix, self.settings.hooks.group)

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set; raises if one of its loops fails beyond retrying."""
        self._stop = stop
        await self.sink.start(stop)
        consumer = AIOKafkaConsumer(
            self.settings.kafka.topic(QUOTA_EVENTS),
            bootstrap_servers=self.settings.kafka.bootstrap,
            **gkafka.security_options(self.settings.kafka),
            group_id=self.group,
            enable_auto_commit=False,
            fetch_max_wait_ms=self.settings.hooks.actuator_fetch_max_wait_ms,
            # A first start acts on the whole history it finds; the trust check drops crossings
            # of past periods, the read-ahead those a later recovered made moot.
            auto_offset_reset="earliest",
        )
        loops: list[asyncio.Task[None]] = []
        try:
            await consumer.start()
            loops = [
                asyncio.create_task(self._consume(consumer)),
                asyncio.create_task(self._every(self.queue_sync_seconds, self._sync_queues)),
                asyncio.create_task(self._every(self.reclaim_seconds, self._reclaim)),
            ]
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([*loops, stopper], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            for task in done:
                failure = None if task is stopper else task.exception()
                if failure is not None:
                    raise failure
        finally:
            stop.set()
            pending = [*loops, *self._chains.values(), *self.evictions.tasks(), *self._side_tasks]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await consumer.stop()
            await self.read_ahead.stop()
            await self.sink.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._events_pool.shutdown(wait=False, cancel_futures=True)
            self._queues_pool.shutdown(wait=False, cancel_futures=True)

    async def _every(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while not self._stop.is_set():
            try:
                await work()
            except NotLeading:
                return  # the Lease ran out: the actuator is stopping
            except Exception:  # a periodic pass failing (API server away) is retried next period
                log.exception("%s failed; again in %.0fs", getattr(work, "__name__", "work"), seconds)
            await self._sleep(seconds)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, seconds))

    async def _io(self, call: Callable[..., T], *args: Any) -> T:
        """A blocking API server call, off the event loop, in the actuator's own threads (the
        loop's default pool is a handful of threads shared with everything else in the process)."""
        return await _in_thread(self._pool, call, *args)

    async def _act(self, call: Callable[..., T], *args: Any) -> T:
        """A write to the API server, sent only while this process holds the Lease (asked right
        before sending: an answer that comes back after the Lease ran out was sent before)."""
        if not self.may_act():
            raise NotLeading("this actuator does not hold the lease")
        return await self._io(call, *args)

    async def _queue_io(self, call: Callable[..., T], *args: Any) -> T:
        """Volcano queue work, one call at a time on a thread of its own: a long sync pass (the
        first one creates a queue per tenant) never holds up an eviction's API calls. Queue
        passes write, so they too run only while the Lease is held."""
        if not self.may_act():
            raise NotLeading("this actuator does not hold the lease")
        return await _in_thread(self._queues_pool, call, *args)

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _event(self, pod: PodView, reason: str, message: str, warning: bool = False) -> None:
        """A Kubernetes Event, posted from a thread of its own: courtesy never delays an eviction."""
        if not self.dry_run:
            self._spawn(_in_thread(self._events_pool, self.kube.post_event, pod, reason, message, warning))

    # -- quota events -----------------------------------------------------------------------
    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        """Fetch, dispatch, commit: fetching never waits for handling.

        Each event joins its tenant's chain (a tenant's events run in order: one key, one
        partition), different tenants run side by side (at most TENANT_CONCURRENCY on their pods
        at once),
        and an offset is committed once every event up to it is handled (OffsetTracker).
        """
        offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        while not self._stop.is_set():
            while offsets.in_flight >= MAX_IN_FLIGHT and not self._stop.is_set():
                await self._sleep(0.05)  # back-pressure: a backlog is read as fast as it is handled
            batch = await consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=BATCH)
            messages = [(tp, m) for tp, partition in batch.items() for m in partition]
            if not messages and not self._resumed and offsets.in_flight == 0:
                await self._resume()  # caught up: notices left by an earlier run go ahead now
            parsed: list[tuple[QuotaEvent, Position, Callable[[], None]]] = []
            for tp, message in messages:
                done = offsets.add(tp, message.offset)
                try:
                    event = QuotaEvent.model_validate_json(message.value or b"")
                except ValidationError as exc:
                    log.error("skipping a record on %s at offset %d that is not a QuotaEvent: %s",
                              message.topic, message.offset, str(exc).splitlines()[0])
                    done()
                    continue
                position = (tp.partition, message.offset)
                self.recoveries.observe(event, position)  # the whole fetch, before any is handled
                parsed.append((event, position, done))
            for event, position, done in parsed:
                self._chain(event, position, done)
            committable = offsets.committable()
            if committable:
                try:
                    await consumer.commit(committable)
                except CommitFailedError as exc:  # a rebalance took partitions: their next owner replays
                    log.warning("offset commit refused (%s); the events will be replayed and folded", exc)
                    offsets.forget(set(committable) - set(consumer.assignment()))

    def _chain(self, event: QuotaEvent, position: Position, done: Callable[[], None]) -> None:
        previous = self._chains.get(event.tenant)

        async def run() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # order within the tenant; its outcome is its own
            handled = await self._handle_with_retry(event, position)
            if handled and not self._stop.is_set():
                done()

        task = asyncio.create_task(run())
        self._chains[event.tenant] = task

        def forget(finished: asyncio.Task[None], tenant: str = event.tenant) -> None:
            if self._chains.get(tenant) is finished:
                del self._chains[tenant]

        task.add_done_callback(forget)

    async def _handle_with_retry(self, event: QuotaEvent, position: Position) -> bool:
        """True once handled; False if stopped first (or the Lease ran out): left uncommitted,
        the next run or leader reads it again."""
        attempt = 0
        while not self._stop.is_set():
            try:
                await self.handle(event, position)
                return True
            except NotLeading:
                return False
            except Exception as exc:  # API server or stores away: the event is retried, never dropped
                delay = backoff_seconds(attempt, self.max_backoff)
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning("quota event %s (%s %s %s) not handled yet: %s; retrying in %.0fs",
                            event.event_id[:12], event.tenant, event.metric, event.level, reason, delay)
                attempt += 1
                await self._sleep(delay)
        return False

    async def handle(self, event: QuotaEvent, position: Position | None = None) -> None:
        """One quota event: its queue, and preemption (exceeded) or withdrawal (recovered), the
        two side by side (independent; both idempotent, so a retry of the pair is safe).
        ``position``: where the event sits on the topic (None: not read from it, nothing
        can come after it)."""
        log.debug("quota event %s: %s %s %s", event.event_id[:12], event.tenant, event.metric, event.level)
        policy = self.tenants.current().policy(event.tenant)
        grants = (await self.grants.get()).get(event.tenant, ())
        reason = distrust(event, policy, self._now(), grants)
        if reason == "limit_mismatch":
            # A grant newer than the last read raised the limit this event shows: read again.
            grants = (await self.grants.get(fresh=True)).get(event.tenant, ())
            reason = distrust(event, policy, self._now(), grants)
        if reason is not None:
            self._ignore(event, reason)
            return
        self.blocked = blocked_after(self.blocked, event, policy, self._now(), grants)
        await asyncio.gather(self._queue_for(event, policy), self._pods_with_slot(event, policy, position),
                             self._announce(event))

    async def _pods_with_slot(self, event: QuotaEvent, policy: TenantPolicy | None,
                              position: Position | None) -> None:
        """The pods' part of an event, at most TENANT_CONCURRENCY tenants at once. Only this part:
        Volcano queue work runs one call at a time on its own thread and was holding slots while
        it waited there (with its record), so that at 10 crossings a second under load the
        next tenants' evictions waited for slots (benchmarks/quota_latency.py: p99 0.6 s between
        fetching an event and handling it)."""
        async with self._tenant_slots:
            await self._pods_for(event, policy, position)

    async def _announce(self, event: QuotaEvent) -> None:
        """A Kubernetes Event on each of the tenant's namespaces for a trusted crossing (once per
        event id in this process; a courtesy, so a replay after a restart may post it again)."""
        if self.dry_run or event.event_id in self._announced:
            return
        self._announced.add(event.event_id)
        reason, message, warning = crossing_event(event)
        for namespace in await self._namespaces_of(event.tenant):
            self._spawn(_in_thread(self._events_pool, self.kube.post_namespace_event, namespace, reason,
                                   message, warning))

    def _ignore(self, event: QuotaEvent, reason: Distrust) -> None:
        self.untrusted.labels(reason).inc()
        log.warning("quota event %s (%s %s %s, limit %s, period %s) ignored: the tenants file disagrees (%s)",
                    event.event_id[:12], event.tenant, event.metric, event.level, event.limit, event.period,
                    reason)

    async def _queue_for(self, event: QuotaEvent, policy: TenantPolicy | None) -> None:
        if event.gpu_model is not None:
            return  # a tenant's Volcano queue is all its models: a per-model budget leaves it open
        if event.level == "exceeded" and policy is not None and policy.on_exceed in BLOCKING:
            change = await self._queue_io(self.queues.close, event.tenant, event.metric, policy)
            await self._queue_decision(event, change, "queue_closed")
        elif event.level == "recovered":
            change = await self._queue_io(self.queues.reopen, event.tenant, event.metric)
            await self._queue_decision(event, change, "queue_opened")

    async def _pods_for(self, event: QuotaEvent, policy: TenantPolicy | None,
                        position: Position | None) -> None:
        if event.level == "exceeded":
            await self._preempt(event, policy, position)
        elif event.level == "recovered":
            await self._withdraw(event)

    async def _cancelled(self, event: QuotaEvent, position: Position | None) -> bool:
        """A later recovered of the same tenant, metric and period is on the topic."""
        if position is None:
            return False
        await self.read_ahead.to_end(*position)
        if not self.recoveries.cancelled(event, position):
            return False
        log.info("quota event %s (%s %s exceeded, %s) is cancelled by a later recovered on the topic: "
                 "nothing to evict", event.event_id[:12], event.tenant, event.metric, event.period)
        return True

    async def _queue_decision(self, event: QuotaEvent, change: QueueChange | None,
                              action: PreemptionAction) -> None:
        if change is None:
            return
        if action == "queue_closed":
            detail = f"close Volcano queue {change.queue} (blocked on {','.join(sorted(change.blocked_on))})"
        else:
            detail = f"reopen Volcano queue {change.queue} (recovered on {event.metric}, nothing left)"
        if self.dry_run:
            action, detail = "dry_run", f"would {detail}"
        log.info("%s%s", "[dry-run] " if self.dry_run else "", detail)
        await self.sink.write([queue_record(event.event_id, event.metric, event.tenant, change.queue, action,
                                            detail, self._now())])

    async def _preempt(self, event: QuotaEvent, policy: TenantPolicy | None,
                       position: Position | None) -> None:
        if policy is None or policy.on_exceed != "preempt" or event.event_id in self._handled:
            return
        # Three reads side by side, nothing written before all are in: whether a later recovered
        # cancelled the event (Kafka), whether it was planned before (ClickHouse), the pods (API
        # server). One after the other they were the actuator's largest share of a crossing.
        cancelled, recorded, pods = await asyncio.gather(
            self._cancelled(event, position), self.sink.recorded(event.tenant, event.event_id),
            self._tenant_pods(event.tenant))
        if cancelled:
            return
        if recorded is None:
            return  # stopping
        if recorded:
            # Planned before (a replay): re-drive what is still noticed, choose nobody new.
            victims = tuple(Victim(p, p.notice, True) for p in pods
                            if p.evictable and p.notice is not None and p.notice.cause == event.event_id)
            plan: PreemptionPlan | None = PreemptionPlan(
                event.event_id, event.tenant, event.metric, victims, ())
        else:
            plan = plan_preemption(event, policy, pods, self._now())
        if plan is None:
            return
        log.info("quota event %s (%s %s exceeded): %d pod(s) to evict%s", event.event_id[:12], event.tenant,
                 event.metric, len(plan.victims), " (replay: only those still noticed)" if recorded else "")
        await self.evictions.carry_out(plan.victims, event.metric, recorded)
        for pod in plan.protected:
            log.info("quota event %s: %s is protected, not evicted", event.event_id[:12], pod.key)
            self._event(pod, "EvictionSkippedProtected",
                        f"gpumeter: tenant {event.tenant} over {event.metric} quota; this pod is annotated "
                        f"{PROTECTED_ANNOTATION} and is not evicted")
        self._handled.add(event.event_id)

    # -- recovered ----------------------------------------------------------------------------
    async def _withdraw(self, event: QuotaEvent) -> None:
        """Call off evictions still waiting for this tenant and metric: it is back under."""
        for pod in await self._tenant_pods(event.tenant):
            notice = pod.notice
            if (notice is None or pod.deleting or notice.metric != notice_metric(event)
                    or notice.cause.startswith(RECLAIM_PREFIX)):
                continue
            await self.evictions.withdraw_notice(pod, f"tenant {event.tenant} recovered on {event.metric}")

    # -- resume after a restart ---------------------------------------------------------------
    async def _resume(self) -> None:
        """Pods noticed by an earlier run (annotation present) go ahead at their deadline."""
        if self.dry_run:
            self._resumed = True
            return
        try:
            namespaces = await self._namespace_map(refresh=True)
            listed = await self._io(self.kube.pods)
        except Exception as exc:  # API server away: tried again at the next idle poll
            log.warning("cannot list pods to resume earlier notices yet: %s", str(exc).strip()[:300])
            return
        self._resumed = True
        count = self.evictions.resume(self._view(raw, namespaces) for raw in listed)
        if count:
            log.info("resumed %d eviction(s) noticed before this start", count)

    # -- cluster reads ------------------------------------------------------------------------
    async def _read_node_labels(self) -> dict[str, dict[str, str]]:
        return {n.name: dict(n.labels) for n in map(node_view, await self._io(self.kube.nodes))}

    async def _read_namespace_labels(self) -> dict[str, dict[str, str]]:
        return namespace_labels(await self._io(self.kube.namespaces))

    async def _labels_of_nodes(self) -> dict[str, dict[str, str]]:
        """Node -> labels, NODE_CACHE_SECONDS old or a little more (read again in the background)."""
        return await self._node_labels.get()

    async def _namespace_map(self, refresh: bool = False) -> dict[str, dict[str, str]]:
        """Namespace -> its labels (its tenant, whether protection counts there),
        NAMESPACE_CACHE_SECONDS old or a little more (read again in the background), or read
        now if ``refresh``."""
        return await self._namespace_labels.get(fresh=refresh)

    async def _namespaces_of(self, tenant: str) -> dict[str, dict[str, str]]:
        """The tenant's namespaces and their labels; the map is read again at once when it
        shows none (a namespace made or labelled since the last read)."""
        for refresh in (False, True):
            namespaces = await self._namespace_map(refresh)
            owners = tenants_of(namespaces)
            found = {ns: namespaces[ns] for ns in sorted(owners) if owners[ns] == tenant}
            if found:
                break
        return found

    async def _tenant_pods(self, tenant: str) -> list[PodView]:
        namespaces = await self._namespaces_of(tenant)
        listed = await asyncio.gather(*(self._io(self.kube.pods, ns) for ns in namespaces))
        labels = await self._labels_of_nodes()
        return [pod_view(raw, tenant, labels.get(str((raw.get("spec") or {}).get("nodeName") or "")),
                         ns_labels)
                for ns_labels, pods in zip(namespaces.values(), listed, strict=True) for raw in pods]

    # -- periodic work ------------------------------------------------------------------------
    async def _sync_queues(self) -> None:
        self.tenants.poll()
        changes = await self._queue_io(self.queues.sync, self.tenants.current())
        if self.dry_run and changes == self._last_sync:
            return  # a dry run finds the same changes every pass: say them once
        self._last_sync = changes
        for change in changes:
            log.info("%sVolcano queues: %s", "[dry-run] would " if self.dry_run else "", change)

    async def _reclaim(self) -> None:
        # The cheap question first: is any pod waiting that spot reclaim could serve? Only then
        # read every node and pod (the pass runs every few seconds on clusters of any size).
        namespaces = await self._namespace_map(refresh=True)
        waiting = [self._view(raw, namespaces) for raw in await self._io(self.kube.unscheduled_pods)]
        if not any(qualifies(p, self.blocked) for p in waiting):
            return
        nodes, pods = await asyncio.gather(self._io(self.kube.nodes), self._io(self.kube.pods))
        node_views = [node_view(n) for n in nodes]
        labels = {n.name: dict(n.labels) for n in node_views}
        views = [self._view(raw, namespaces, labels) for raw in pods]
        plans = plan_spot_reclaim(node_views, views, set(self.blocked))
        for plan in plans:
            log.info("spot reclaim for %s on %s: %s", plan.pending.key, plan.node,
                     ", ".join(p.key for p in plan.victims))
            await self.evictions.carry_out(reclaim_victims(plan, self.tenants.current(), self._now()), "")

    @staticmethod
    def _view(raw: dict[str, Any], namespaces: dict[str, dict[str, str]],
              node_labels: dict[str, dict[str, str]] | None = None) -> PodView:
        namespace = str((raw.get("metadata") or {}).get("namespace", ""))
        node = str((raw.get("spec") or {}).get("nodeName") or "")
        # A namespace made since the list: its name is its tenant, and protection does not count.
        labels = namespaces.get(namespace)
        tenant = tenant_of_namespace(namespace, labels) or NO_TENANT  # matches no tenant: never acted on
        return pod_view(raw, tenant, (node_labels or {}).get(node), labels)
