"""The quota agents: rated topic -> per-tenant quota ledgers -> quota events topic -> ClickHouse.

``account_quota`` (with the ``quota_clock`` timer) keeps the ledgers in a faust table (its
changelog topic compacted) and produces one event per crossing (key = tenant);
``sink_quota`` stores the quota events topic in ``quota_events``. See ``add_quota``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faust
from aiokafka.partitioner import DefaultPartitioner
from faust.types import TP, EventT, StreamT

from gpumeter.core import topics
from gpumeter.core.models import QuotaEvent, dead_letter
from gpumeter.core.settings import Settings
from gpumeter.core.topics import LEDGER_TABLE, TopicSpec, ledger_changelog_topic
from gpumeter.infra import kafka as kafka_admin
from gpumeter.infra.grants import GrantsReader
from gpumeter.infra.rows import Row
from gpumeter.infra.schema import QUOTA_EVENTS
from quota.grants import fold
from streams.batch_writer import BatchWriter
from streams.quota import (
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
)
from streams.quota_producer import QuotaEventProducer
from streams.sink import ClickHouseSink, first_line
from streams.stage import encode_dead

log = logging.getLogger("gpumeter.worker")


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
    kafka_admin.wait_for_broker(kafka)  # one clear error when it stays away
    rated = kafka_admin.end_offsets(kafka, [kafka.topic(topics.RATED)])
    partitions = len(rated) or kafka.partitions.rated
    sized = kafka.model_copy(update={"partitions": kafka.partitions.model_copy(update={"rated": partitions})})
    name = ledger_changelog_topic(kafka.topic_prefix, settings.worker.group).removeprefix(kafka.topic_prefix)
    kafka_admin.ensure_topics(sized, [TopicSpec(name, "rated", compacted=True)])
    return partitions


@dataclass(frozen=True)
class QuotaWiring:
    processor: QuotaProcessor
    writer: BatchWriter


def add_quota(app: faust.App, settings: Settings, rated_topic: Any, quota_topic: Any, dead_topic: Any,
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
    partitions = _ensure_ledger_changelog(settings)
    ledgers = app.Table(LEDGER_TABLE, default=None, key_type=bytes, value_type=bytes, partitions=partitions,
                        help="quota ledger state per tenant (LedgerState JSON)")
    changelog = ledger_changelog_topic(kafka.topic_prefix, worker.group)
    if ledgers.changelog_topic.get_topic_name() != changelog:  # `gpumeter quota status` reads it by name
        raise RuntimeError(f"ledger changelog is {ledgers.changelog_topic.get_topic_name()}, not {changelog}")
    partitioner = DefaultPartitioner()  # the producer's: where a tenant's rated records go

    def home(tenant: str) -> int:
        return int(partitioner(tenant.encode(), list(range(partitions)), []))

    def owns(tenant: str) -> bool:
        return TP(rated_name, home(tenant)) in app.consumer.assignment()

    store = TableLedgerStore(ledgers, home, owns)
    watcher = TenantsWatcher(settings.tenants)
    # Grants come from ClickHouse quota_grants, read again every grants_poll_seconds, rather
    # than from a Kafka topic: the table is the one record of grants (numbered there), so no
    # second write can be lost between the two, and a worker restarted after kill -9 reads the
    # same set again. The limit is a function of the whole set: nothing is applied twice.
    grants = GrantsReader(settings.clickhouse.connection_dsn(), fold)
    # Before any record is counted: evaluating a tenant without its grants would announce a
    # lower limit (an exceeded, then a recovered once they are read).
    initial = grants.read()
    if initial is None:
        raise RuntimeError("quota_grants could not be read at start (see the log line above)")
    applied = [initial]
    processor = QuotaProcessor(store, watcher.current, settings.quota.stale_seconds, grants=initial)
    # One step at a time: a tick must not store a ledger whose events a record still awaits.
    lock = asyncio.Lock()
    # Rated records counted into ledgers not stored yet: acknowledged once they are.
    held: list[EventT] = []
    rated_stream: list[StreamT] = []

    producer = QuotaEventProducer(kafka, quota_name)

    @app.on_before_shutdown.connect
    async def stop_producer(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        await producer.stop()

    async def publish(events: list[QuotaEvent]) -> None:
        """Produce ``events`` and wait until the broker has them all (on the agent's own
        producer, streams/quota_producer.py: not behind the rated records' batches)."""
        delay = 0.2
        while events:
            try:
                await producer.send_all([(event.tenant.encode(), encode_event(event)) for event in events])
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

    @app.timer(settings.quota.grants_poll_seconds)
    async def quota_grants() -> None:
        # Read outside the lock: a slow ClickHouse must not hold rated records back.
        read = await asyncio.to_thread(grants.read)
        if read is None or read == applied[0]:
            return
        async with lock:
            if app.rebalancing or app.in_recovery:
                return  # tried again next time: ``applied`` is still the old set
            applied[0] = read
            await publish(processor.set_grants(read))
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

