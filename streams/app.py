"""`gpumeter worker`: the faust-streaming app. Rating, the ClickHouse sink, dead letters, quotas.

Agents:
- ``rate``: samples topic -> rated topic (key = tenant, for the quota processor and any
  other consumer) and rated_usage in ClickHouse, or -> dead-letter topic. Its stream does
  not auto-acknowledge: a sample is acknowledged (its offset becomes committable) only
  after its batch is stored in ClickHouse, and faust flushes the producer before every
  commit, so a committed sample is both published and stored. A crash replays samples;
  replays are folded by event_id (see streams/sink.py).
- ``sink_dead``: dead-letter topic (from the rate agent and from `gpumeter ingest`) ->
  dead_letters in ClickHouse, acknowledged after storing likewise.
- ``account_quota`` (+ the ``quota_clock`` timer): rated topic -> per-tenant quota ledgers
  in a faust table (changelog topic, compacted) -> quota events topic (key = tenant);
  ``sink_quota``: quota events topic -> quota_events in ClickHouse. See ``_add_quota``.

DESIGN.md draws the sink as a consumer of the rated topic. Storing in the rating agent
instead saves a Kafka round trip and a JSON decode per sample (the pipeline's throughput
rose about 40%), and makes "committed" mean "stored" for the samples topic directly; the
rated topic is still produced for downstream consumers.

ClickHouse being down stalls the agents with exponential back-off; nothing is
acknowledged meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import signal
import threading
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import faust
from aiokafka.partitioner import DefaultPartitioner
from faust.types import TP, EventT, StreamT

from gpumeter.core import jsonio, records, topics
from gpumeter.core.models import QuotaEvent, dead_letter
from gpumeter.core.settings import Settings
from gpumeter.core.topics import TopicSpec
from gpumeter.infra import kafka as kafka_admin
from gpumeter.infra.rows import Row, values_of
from gpumeter.infra.schema import QUOTA_EVENTS, RATED_USAGE
from streams import metrics
from streams.faust_consumer import seek_safe_transport
from streams.quota import (
    LEDGER_TABLE,
    BadQuotaEvent,
    BadRatedRecord,
    BadState,
    LedgerState,
    QuotaProcessor,
    TenantsWatcher,
    decode_event,
    decode_state,
    encode_event,
    encode_state,
    ledger_changelog_topic,
)
from streams.ratecards import RateCardWatcher
from streams.sink import (
    BadRecord,
    ClickHouseSink,
    StoreResult,
    connector,
    dead_row,
    first_line,
)
from streams.stage import RatingStage, encode_dead

log = logging.getLogger("gpumeter.worker")
T = TypeVar("T")


@dataclass
class PendingBatch:
    """Events held unacknowledged until the rows they produced are stored (rows may be fewer)."""

    events: list[EventT] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # rows each event added, in order
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


Rejected = list[tuple[Row, str]]


def _in_daemon_thread(function: Callable[[], T]) -> asyncio.Future[T]:
    """Run blocking I/O off the event loop in a daemon thread.

    Unlike the default executor's threads, a daemon thread does not hold the process at
    exit, so SIGTERM stops a worker whose ClickHouse call hangs until its timeout.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            value = function()
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
            loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            loop.call_soon_threadsafe(settle, lambda: future.set_result(value))

    threading.Thread(target=run, name="clickhouse-store", daemon=True).start()
    return future


class BatchWriter:
    """Flushes a PendingBatch into ClickHouse, retrying transient failures with back-off.

    Rows the store refuses for good come back from it and go to ``on_rejected`` (which
    dead-letters them, reason ``unstorable``), and later copies of a billed event_id that
    differ from it to ``on_conflicts`` (``duplicate_conflict``), before their events are
    acknowledged. After ``stop()`` nothing more
    is acknowledged: a batch not stored stays uncommitted and is replayed by the next owner.

    One batch is stored while the next is gathered: a full batch is handed to a task and
    ``add`` returns, so the agent rates on while ClickHouse works; the next batch starts only
    once the one before it is stored and acknowledged, so batches are stored and acknowledged
    in order and the store sees every earlier batch when it looks for replays.
    """

    def __init__(
        self, store: Callable[[Sequence[Row]], StoreResult], name: str, batch_size: int, max_backoff: float,
        on_rejected: Callable[[Rejected], Awaitable[None]] | None = None,
        on_conflicts: Callable[[Rejected], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.batch_size = batch_size
        self.max_backoff = max_backoff
        self.on_rejected = on_rejected
        self.on_conflicts = on_conflicts
        self.pending = PendingBatch()
        self.stream: StreamT | None = None
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()  # clear while a batch is being stored
        self._idle.set()
        self._in_flight: asyncio.Task[None] | None = None  # the batch being stored
        self._failure: BaseException | None = None  # what ended a batch's task unexpectedly
        # Per partition, the consumer generation in which it was last revoked from this worker.
        self._revoked_in: dict[TP, int] = {}

    def stop(self) -> None:
        self._stopping.set()

    def _stale(self, event: EventT) -> bool:
        """Fetched before its partition was last revoked from this worker: by then the
        partition's earlier records held here were dropped, and it may belong to another worker."""
        if not self._revoked_in:
            return False
        revoked_in = self._revoked_in.get(event.message.tp)
        if revoked_in is None:
            return False
        fetched_in = getattr(event.message, "generation_id", None)
        return fetched_in is None or fetched_in <= revoked_in

    async def add(self, event: EventT, rows: list[Row]) -> None:
        """Hold ``event`` until a flush stores its ``rows`` (none: just acknowledge it in order).

        An event fetched before its partition was revoked (the agent held it while the
        rebalance dropped the partition's pending batch) is dropped too: stored and acknowledged
        after the records before it were dropped, it would be a committable offset past records
        nobody stored. It is read again from the committed offset, here or by the new owner.
        """
        if self._stale(event):
            return
        async with self.pending.lock:
            self.pending.events.append(event)
            self.pending.rows.extend(rows)
            self.pending.sizes.append(len(rows))
            full = len(self.pending.rows) >= self.batch_size or len(self.pending.events) >= self.batch_size
        if full:
            await self._launch()

    async def flush(self) -> None:
        """Store what is pending and wait until it, and every batch before it, is stored and
        acknowledged (or the writer is stopped)."""
        await self._launch()
        await self._settle()

    async def _launch(self) -> None:
        """Hand what is pending to a task of its own, once the batch before it is done.

        Storing beside the agent was tried four times with the store in a thread and was slower
        each time while the consumer fetched 1 MiB a partition: the agent, no longer waiting
        for its batch, starved the fetching thread (a worker whose store cost nothing was slower
        than the real one). With bigger fetches (``worker.fetch_partition_bytes``) it is faster:
        9.2-9.9k against 7.6k samples/s, alternated (README, Measured).
        """
        async with self.pending.lock:
            self._raise_failure()
            if not self.pending.events or self.stream is None or self._stopping.is_set():
                return
            # The lock is held meanwhile: nothing is added until this batch is on its way.
            await self._settle()
            if not self.pending.events or self._stopping.is_set():  # revoked or stopped meanwhile
                return
            rows, events = self.pending.rows, self.pending.events
            self.pending.rows, self.pending.events, self.pending.sizes = [], [], []
            self._idle.clear()
            self._in_flight = asyncio.ensure_future(self._store_then_idle(rows, events))

    async def _store_then_idle(self, rows: list[Row], events: list[EventT]) -> None:
        try:
            await self._store_and_ack(rows, events)
        except Exception as exc:
            # Its events stay unacknowledged; the agent stops at its next batch, as it stopped
            # when it stored its batches itself.
            self._failure = exc
        except asyncio.CancelledError as exc:
            self._failure = exc
            raise
        finally:
            self._idle.set()

    async def _settle(self) -> None:
        """Wait for the batch being stored, if any."""
        flight = self._in_flight
        if flight is not None:
            # asyncio.wait: the flight's own failure is _failure's to report, and cancelling
            # the waiter (shutdown) cancels the waiter only, never the store under way.
            await asyncio.wait({flight})
            if flight is self._in_flight:
                self._in_flight = None
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self.name}: storing a batch failed") from self._failure

    async def revoke(self, revoked: set[TP], generation: int | None, wait_seconds: float = 10.0) -> None:
        """Partitions taken away in a rebalance (``generation``: the consumer generation ending):
        drop their pending events and rows, so the batch is not stored behind the new owner's
        back (faust seeks every partition back to its committed offset, so they are read again,
        here or by the new owner), and give a batch being stored a bounded time to finish
        before the partitions move; its events of these partitions are not acknowledged."""
        for tp in revoked:
            self._revoked_in[tp] = generation if generation is not None else -1
        # No await until the pending lists are rebuilt: add() cannot interleave.
        kept_events: list[EventT] = []
        kept_rows: list[Row] = []
        kept_sizes: list[int] = []
        position = 0
        dropped = 0
        for event, size in zip(self.pending.events, self.pending.sizes, strict=True):
            if event.message.tp in revoked:
                dropped += size
            else:
                kept_events.append(event)
                kept_rows.extend(self.pending.rows[position:position + size])
                kept_sizes.append(size)
            position += size
        self.pending.events, self.pending.rows, self.pending.sizes = kept_events, kept_rows, kept_sizes
        if dropped:
            log.info("%s: %d pending rows of revoked partitions dropped", self.name, dropped)
        if not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), wait_seconds)
            except TimeoutError:
                # Its rows are then stored after the new owner may have read them again: the
                # sink's id lookup and insert tokens keep them from being billed twice.
                log.warning("%s: a batch still being stored %.0f s into a rebalance", self.name,
                            wait_seconds)

    async def _store_and_ack(self, rows: list[Row], events: list[EventT]) -> None:
        if rows:
            result = await self._store_with_retry(rows)
            if result is None:
                return  # stopping: leave the batch unacknowledged
            if result.rejected:
                if self.on_rejected is None:
                    log.error("%s: %d rows refused by ClickHouse and not kept: %s", self.name,
                              len(result.rejected), result.rejected[0][1])
                else:
                    await self.on_rejected(result.rejected)
            if result.conflicts:
                if self.on_conflicts is None:
                    log.error("%s: %d conflicting copies of billed event_ids not kept: %s", self.name,
                              len(result.conflicts), result.conflicts[0][1])
                else:
                    await self.on_conflicts(result.conflicts)
        if self._stopping.is_set() or self.stream is None:
            return
        for event in events:
            # Stored, but its partition was revoked meanwhile: its owner reads it again from
            # the committed offset (and finds it stored); an acknowledgement here is stale.
            if not self._stale(event):
                await self.stream.ack(event)

    async def _store_with_retry(self, rows: list[Row]) -> StoreResult | None:
        """The store's result, or None once stop() was called before the rows were stored."""
        delay = 0.2
        attempt = 0
        while not self._stopping.is_set():
            attempt += 1
            try:
                # A thread keeps the event loop (and the consumer's heartbeats) alive during I/O.
                result = await _in_daemon_thread(lambda: self.store(rows))
                if attempt > 1:
                    log.warning("%s: stored %d rows after %d attempts", self.name, len(rows), attempt)
                return result
            except Exception as exc:  # transient: not stored, try again
                pause = delay * (0.5 + random.random())
                log.warning("%s: storing %d rows failed (attempt %d, retry in %.1fs): %s",
                            self.name, len(rows), attempt, pause, first_line(exc)[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause)
                delay = min(delay * 2, self.max_backoff)
        return None


def _raw_topic(app: faust.App, name: str) -> Any:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


@dataclass(frozen=True)
class WorkerApp:
    app: faust.App
    writers: tuple[BatchWriter, ...]


class TableLedgerStore:
    """The worker's LedgerStore: a faust table of LedgerState JSON, key = tenant.

    A tenant's ledger lives on its home partition: the partition the producer's partitioner
    gives its key, where its rated records arrive (same key, same partition count), so
    faust recovers it on the worker that owns that rated partition. A stored value is
    parsed once (cached against its bytes, so one replaced by recovery after a rebalance is
    parsed again). Writes wait in ``pending`` until ``flush()``: the events they announce
    are published first.
    """

    def __init__(self, table: Any, home: Callable[[str], int], owns: Callable[[str], bool]) -> None:
        self._table = table
        self._home = home
        self._owns = owns
        self._parsed: dict[str, tuple[bytes, LedgerState]] = {}
        self.pending: dict[str, LedgerState] = {}

    def get(self, tenant: str) -> LedgerState | None:
        if tenant in self.pending:
            return self.pending[tenant]
        raw = self._table.get(tenant.encode())
        if raw is None:
            return None
        cached = self._parsed.get(tenant)
        if cached is not None and cached[0] == raw:
            return cached[1]
        try:
            state = decode_state(raw)
        except BadState as exc:
            log.error("quota ledger of tenant %s: %s; counting it afresh", tenant, exc)
            return None
        self._parsed[tenant] = (raw, state)
        return state

    def put(self, tenant: str, state: LedgerState) -> None:
        self.pending[tenant] = state

    def tenants(self) -> list[str]:
        """Tenants of the rated partitions assigned to this worker (the table may keep others)."""
        names = {key.decode() for key in self._table} | set(self.pending)
        return [tenant for tenant in names if self._owns(tenant)]

    def flush(self) -> None:
        for tenant, state in self.pending.items():
            if not self._owns(tenant):
                # Its partition was revoked meanwhile: the new owner replays the records.
                continue
            key, raw = tenant.encode(), encode_state(state)
            # The store and the changelog directly, with the partition named: a timer writes
            # outside any stream event, where faust's table cannot pick a partition.
            self._table.data[key] = raw
            self._table.send_changelog(self._home(tenant), key, raw)
            self._parsed[tenant] = (raw, state)
        self.pending.clear()


def _ensure_ledger_changelog(settings: Settings) -> int:
    """Create the ledger table's compacted changelog (faust may not declare topics here).

    It must have as many partitions as the rated topic, whose partitions it mirrors.
    """
    kafka = settings.kafka
    kafka_admin.wait_for_broker(kafka.bootstrap)  # one clear error when it stays away
    rated = kafka_admin.end_offsets(kafka, [kafka.topic(topics.RATED)])
    partitions = len(rated) or kafka.partitions.rated
    sized = kafka.model_copy(update={"partitions": kafka.partitions.model_copy(update={"rated": partitions})})
    name = ledger_changelog_topic(kafka, settings.worker.group).removeprefix(kafka.topic_prefix)
    kafka_admin.ensure_topics(sized, [TopicSpec(name, "rated", compacted=True)])
    return partitions


@dataclass(frozen=True)
class QuotaWiring:
    processor: QuotaProcessor
    writer: BatchWriter


def _add_quota(app: faust.App, settings: Settings, rated_topic: Any, dead_topic: Any,
               sink: ClickHouseSink) -> QuotaWiring:
    """Quota accounting (contract 4): rated topic -> ledgers -> quota events topic -> ClickHouse.

    Order of effects, so that a crash anywhere loses no crossing and counts nothing twice:
    1. the processor counts a rated record into its tenant's ledger (skipping a replayed one);
    2. the events it returns are produced and their delivery awaited;
    3. only then is the ledger (with its replay guard) written to the changelog, and the
       record acknowledged; faust flushes the changelog writes before it commits offsets.
       Records without events are stored in batches (every sink_batch_seconds).
    A crash after 2 replays the record: the same crossings with the same deterministic ids,
    folded by consumers. ``quota_events`` in ClickHouse is fed from the topic by its own
    agent, acknowledged after storing, folded by its ReplacingMergeTree.
    """
    kafka = settings.kafka
    worker = settings.worker
    rated_name = kafka.topic(topics.RATED)
    quota_name = kafka.topic(topics.QUOTA_EVENTS)
    quota_topic = _raw_topic(app, quota_name)
    partitions = _ensure_ledger_changelog(settings)
    ledgers = app.Table(LEDGER_TABLE, default=None, key_type=bytes, value_type=bytes, partitions=partitions,
                        help="quota ledger state per tenant (LedgerState JSON)")
    changelog = ledger_changelog_topic(kafka, worker.group)
    if ledgers.changelog_topic.get_topic_name() != changelog:  # `gpumeter quota status` reads it by name
        raise RuntimeError(f"ledger changelog is {ledgers.changelog_topic.get_topic_name()}, not {changelog}")
    partitioner = DefaultPartitioner()  # the producer's: where a tenant's rated records go

    def home(tenant: str) -> int:
        return int(partitioner(tenant.encode(), list(range(partitions)), []))

    def owns(tenant: str) -> bool:
        return TP(rated_name, home(tenant)) in app.consumer.assignment()

    store = TableLedgerStore(ledgers, home, owns)
    watcher = TenantsWatcher(settings.tenants)
    processor = QuotaProcessor(store, watcher.current, settings.quota.stale_seconds)
    # One step at a time: a tick must not store a ledger whose events a record still awaits.
    lock = asyncio.Lock()
    # Rated records counted into ledgers not stored yet: acknowledged once they are.
    held: list[EventT] = []
    rated_stream: list[StreamT] = []

    async def publish(events: list[QuotaEvent]) -> None:
        """Produce ``events`` and wait until the broker has them all."""
        delay = 0.2
        while events:
            try:
                sent = [await quota_topic.send(key=event.tenant.encode(), value=encode_event(event))
                        for event in events]
                await asyncio.gather(*sent)
                return
            except Exception as exc:  # not delivered: the ledger must not say it was announced
                log.warning("quota events: publishing %d failed (retry in %.1fs): %s", len(events), delay,
                            first_line(exc)[:300])
                await asyncio.sleep(delay)
                delay = min(delay * 2, worker.sink_max_backoff_seconds)

    async def persist() -> None:
        """Store the ledgers changed so far, then acknowledge the records counted into them.

        faust flushes the changelog writes before it commits those offsets. Batching keeps
        the changelog to one write per tenant and batch, not one per record.
        """
        store.flush()
        for event in held:
            await rated_stream[0].ack(event)
        held.clear()

    @app.agent(rated_topic)
    async def account_quota(stream: StreamT) -> None:
        stream = stream.noack()  # type: ignore[attr-defined]
        rated_stream[:] = [stream]
        async for event in stream.events():
            async with lock:
                try:
                    events = processor.process_record(event.value)
                except BadRatedRecord as exc:
                    message = event.message
                    dead = dead_letter(event.value, "bad_rated", str(exc), rated_name, message.partition,
                                       message.offset)
                    await dead_topic.send(key=message.key, value=encode_dead(dead))
                    events = []
                held.append(event)
                if events:
                    await publish(events)  # before the ledgers that announced them are stored
                if events or len(held) >= worker.sink_batch_size:
                    await persist()

    @app.timer(worker.sink_batch_seconds)
    async def persist_due() -> None:
        async with lock:
            await persist()

    @app.timer(settings.quota.reload_seconds)
    async def quota_clock() -> None:
        async with lock:
            # During a rebalance the table may hold a tenant's older state: never evaluate it.
            if app.rebalancing or app.in_recovery:
                return
            policies = watcher.poll()
            await publish(processor.tick() if policies is None else processor.reload(policies))
            await persist()

    writer = BatchWriter(lambda rows: sink.store_folded(QUOTA_EVENTS, rows), "quota events",
                         worker.sink_batch_size, worker.sink_max_backoff_seconds)

    @app.agent(quota_topic)
    async def sink_quota(stream: StreamT) -> None:
        stream = stream.noack()  # type: ignore[attr-defined]
        writer.stream = stream
        async for event in stream.events():
            rows: list[Row] = []
            try:
                rows.append(QUOTA_EVENTS.row_of(decode_event(event.value)))
            except BadQuotaEvent as exc:
                message = event.message
                dead = dead_letter(event.value, "bad_quota_event", str(exc), quota_name, message.partition,
                                   message.offset)
                await dead_topic.send(key=message.key, value=encode_dead(dead))
            await writer.add(event, rows)

    return QuotaWiring(processor, writer)


class _SeekSafeApp(faust.App):
    """faust's App on a consumer whose seek after recovery loses nothing (streams/faust_consumer.py)."""

    def _new_transport(self) -> Any:
        return seek_safe_transport(self)


def create_app(settings: Settings) -> WorkerApp:
    kafka = settings.kafka
    rate_cards = RateCardWatcher(settings.rate_cards)

    faust_dir = settings.data_dir / "faust"
    faust_dir.mkdir(parents=True, exist_ok=True)
    app = _SeekSafeApp(
        kafka.topic_prefix + settings.worker.group,
        broker=f"kafka://{kafka.bootstrap}",
        store="memory://",
        # faust's default is "<app id>-data" in the working directory: one stray directory per
        # worker group wherever a worker was started.
        datadir=str(faust_dir),
        autodiscover=False,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        producer_acks=-1,
        topic_allow_declare=False,
        topic_disable_leader=True,
        stream_wait_empty=False,
        producer_linger_ms=5,
        broker_max_poll_records=2000,
        consumer_max_fetch_size=settings.worker.fetch_partition_bytes,
        stream_buffer_maxsize=settings.worker.stream_buffer_records,
    )
    samples_topic = _raw_topic(app, kafka.topic(topics.SAMPLES))
    rated_topic = _raw_topic(app, kafka.topic(topics.RATED))
    dead_topic = _raw_topic(app, kafka.topic(topics.DEADLETTER))

    samples_name = kafka.topic(topics.SAMPLES)
    stage = RatingStage(rate_cards.current, samples_name)
    sink = ClickHouseSink(connector(settings.clickhouse.dsn))
    worker = settings.worker

    async def dead_letter_rows(rejected: Rejected, code: str, prefix: str) -> None:
        for row, reason in rejected:
            document = RATED_USAGE.as_mapping(values_of(RATED_USAGE, row))
            raw = jsonio.dumpb(document)
            # The row no longer knows its place in a multi-sample record; a per-event_id index
            # keeps two dead rows of one record apart in dead_letters (keyed by source position).
            index = zlib.crc32(str(document["event_id"]).encode())
            dead = dead_letter(raw, code, prefix + reason, samples_name,
                               document["source_partition"], document["source_offset"], index=index)
            await dead_topic.send(key=str(document["tenant"]).encode(), value=encode_dead(dead))

    async def dead_letter_unstorable(rejected: Rejected) -> None:
        await dead_letter_rows(rejected, "unstorable", "ClickHouse refused the row: ")

    async def dead_letter_conflicts(conflicts: Rejected) -> None:
        await dead_letter_rows(conflicts, "duplicate_conflict", "")

    rated_writer = BatchWriter(sink.store_rated, "rated", worker.sink_batch_size,
                               worker.sink_max_backoff_seconds, on_rejected=dead_letter_unstorable,
                               on_conflicts=dead_letter_conflicts)
    dead_writer = BatchWriter(sink.store_dead, "dead letters", worker.sink_batch_size,
                              worker.sink_max_backoff_seconds)

    @app.agent(samples_topic)
    async def rate(stream: StreamT) -> None:
        stream = stream.noack()  # type: ignore[attr-defined]
        rated_writer.stream = stream
        async for event in stream.events():
            message = event.message
            rows, dead = stage.rate_record(event.value, message.partition, message.offset)
            for letter in dead:
                await dead_topic.send(key=message.key, value=encode_dead(letter))
            if rows:
                # One rated record per sample record: the same per-record economy downstream.
                await rated_topic.send(key=message.key, value=records.join([row[-1] for row in rows]))
            # The store sends these same lines to ClickHouse (streams/sink.py).
            await rated_writer.add(event, rows)

    @app.agent(dead_topic)
    async def sink_dead(stream: StreamT) -> None:
        stream = stream.noack()  # type: ignore[attr-defined]
        dead_writer.stream = stream
        source = kafka.topic(topics.DEADLETTER)
        async for event in stream.events():
            try:
                row = dead_row(event.value)
            except BadRecord as exc:
                # Not ours to drop: record why, keeping the bytes, as a dead letter of its own.
                message = event.message
                row = dead_row(encode_dead(dead_letter(
                    event.value, "bad_dead_letter", str(exc), source, message.partition, message.offset)))
            await dead_writer.add(event, [row])

    quota = _add_quota(app, settings, rated_topic, dead_topic, sink)

    pending = {"rated": 0, "dead letters": 0, "quota events": 0}
    metrics.serve(metrics.WorkerCollector(stage.counters, sink.counters, pending), worker.metrics_port)

    @app.timer(1.0)
    async def measure_pending() -> None:
        pending["rated"] = len(rated_writer.pending.rows)
        pending["dead letters"] = len(dead_writer.pending.rows)
        pending["quota events"] = len(quota.writer.pending.rows)

    @app.on_partitions_revoked.connect
    async def drop_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        revoked: set[TP] = set(args[0])  # mode's Signal calls receiver(sender, revoked, signal=...)
        stage.forget()  # before anything is read again: dropped samples are not duplicates
        for writer in (rated_writer, dead_writer, quota.writer):
            await writer.revoke(revoked, app.consumer_generation_id)

    @app.timer(worker.rate_card_reload_seconds)
    async def reload_rate_cards() -> None:
        cards = await asyncio.get_running_loop().run_in_executor(None, rate_cards.poll)
        if cards is not None:
            stage.use_cards(cards)

    @app.timer(worker.sink_batch_seconds)
    async def flush_due() -> None:
        await rated_writer.flush()
        await dead_writer.flush()
        await quota.writer.flush()

    @app.timer(30.0)
    async def report() -> None:
        counters = stage.counters
        log.info("rated %d, dead letters %d, duplicates %d, stored %d, sink failures %d; quota: records %d, "
                 "replays skipped %d, events %d",
                 counters.rated, counters.dead, counters.duplicates, sink.counters.stored,
                 sink.counters.failures, quota.processor.counters.records, quota.processor.counters.replayed,
                 quota.processor.counters.events)

    return WorkerApp(app, (rated_writer, dead_writer, quota.writer))


class _Worker(faust.Worker):
    """faust's Worker, telling the batch writers to give up first when a signal arrives,
    and logging at the level asked for.

    A writer retrying a batch would otherwise hold the shutdown until ClickHouse answers.
    """

    def __init__(self, app: faust.App, writers: Sequence[BatchWriter], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._writers = writers
        # faust's start-up spinner sets the root logger to DEBUG so that every record turns
        # it, and leaves it there: each debug call of aiokafka and faust (several per produce
        # request) then built a LogRecord for handlers that drop it, ~3 % of the worker's CPU.
        # Without the spinner the root logger keeps --loglevel.
        self.spinner = None

    def _schedule_shutdown(self, signum: signal.Signals) -> None:
        for writer in self._writers:
            writer.stop()
        super()._schedule_shutdown(signum)


# Young-generation collections every GC_YOUNG_THRESHOLD container allocations, not 700.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collect garbage cycles at a pace fit for a worker allocating a dozen objects a sample.

    With the defaults, collections cost the worker ~10 µs a sample (measured with gc.callbacks
    on the rating, quota and sink path), most of it full collections traversing the
    hundreds of thousands of objects that imports and start-up leave behind, which live as
    long as the process. Those are frozen (never traversed again) and young collections run
    less often; what refcounting frees is unaffected, cycles are still collected.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run_worker(settings: Settings, loglevel: str = "warn") -> None:
    """Run the worker until SIGTERM/SIGINT: unstored batches stay uncommitted."""
    built = create_app(settings)
    worker = _Worker(built.app, built.writers, loglevel=loglevel, quiet=True)
    tune_gc()  # after the start-up objects exist
    worker.execute_from_commandline()
