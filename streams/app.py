"""`gpumeter worker`: the faust-streaming app. Rating, the ClickHouse sink, dead letters.

Agents:
- ``rate``: samples topic -> rated topic (key = tenant, for the quota processor and any
  other consumer) and rated_usage in ClickHouse, or -> dead-letter topic. Its stream does
  not auto-acknowledge: a sample is acknowledged (its offset becomes committable) only
  after its batch is stored in ClickHouse, and faust flushes the producer before every
  commit, so a committed sample is both published and stored. A crash replays samples;
  replays are folded by event_id (see streams/sink.py).
- ``sink_dead``: dead-letter topic (from the rate agent and from `gpumeter ingest`) ->
  dead_letters in ClickHouse, acknowledged after storing likewise.

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
import logging
import random
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import faust
from faust.types import EventT, StreamT

from gpumeter.core import jsonio, records, topics
from gpumeter.core.models import RatedUsage, dead_letter
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.settings import Settings
from gpumeter.infra.schema import RATED_USAGE
from streams import metrics
from streams.sink import (
    BadRecord,
    ClickHouseSink,
    Row,
    StoreResult,
    connector,
    dead_row,
    first_line,
    rated_row,
)
from streams.stage import RatingStage, encode_dead, encode_rated

log = logging.getLogger("gpumeter.worker")
T = TypeVar("T")


@dataclass
class PendingBatch:
    """Events held unacknowledged until the rows they produced are stored (rows may be fewer)."""

    events: list[EventT] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
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
    dead-letters them) before their events are acknowledged. After ``stop()`` nothing more
    is acknowledged: a batch not stored stays uncommitted and is replayed by the next owner.
    """

    def __init__(
        self, store: Callable[[Sequence[Row]], StoreResult], name: str, batch_size: int, max_backoff: float,
        on_rejected: Callable[[Rejected], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.batch_size = batch_size
        self.max_backoff = max_backoff
        self.on_rejected = on_rejected
        self.pending = PendingBatch()
        self.stream: StreamT | None = None
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def add(self, event: EventT, rows: list[Row]) -> None:
        """Hold ``event`` until a flush stores its ``rows`` (none: just acknowledge it in order)."""
        async with self.pending.lock:
            self.pending.events.append(event)
            self.pending.rows.extend(rows)
            full = len(self.pending.rows) >= self.batch_size or len(self.pending.events) >= self.batch_size
        if full:
            await self.flush()

    async def flush(self) -> None:
        async with self.pending.lock:
            if not self.pending.events or self.stream is None or self._stopping.is_set():
                return
            if self.pending.rows:
                result = await self._store_with_retry(self.pending.rows)
                if result is None:
                    return  # stopping: leave the batch unacknowledged
                if result.rejected:
                    if self.on_rejected is None:
                        log.error("%s: %d rows refused by ClickHouse and not kept: %s", self.name,
                                  len(result.rejected), result.rejected[0][1])
                    else:
                        await self.on_rejected(result.rejected)
            for event in self.pending.events:
                await self.stream.ack(event)
            self.pending.rows, self.pending.events = [], []

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


def create_app(settings: Settings) -> WorkerApp:
    kafka = settings.kafka
    cards = load_rate_cards(settings.rate_cards)

    app = faust.App(
        kafka.topic_prefix + settings.worker.group,
        broker=f"kafka://{kafka.bootstrap}",
        store="memory://",
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
    )
    samples_topic = _raw_topic(app, kafka.topic(topics.SAMPLES))
    rated_topic = _raw_topic(app, kafka.topic(topics.RATED))
    dead_topic = _raw_topic(app, kafka.topic(topics.DEADLETTER))

    samples_name = kafka.topic(topics.SAMPLES)
    stage = RatingStage(cards, samples_name)
    sink = ClickHouseSink(connector(settings.clickhouse.dsn))
    worker = settings.worker

    async def dead_letter_unstorable(rejected: Rejected) -> None:
        for row, reason in rejected:
            document = RATED_USAGE.as_mapping(row)
            raw = jsonio.dumpb(document)
            dead = dead_letter(raw, "unstorable", f"ClickHouse refused the row: {reason}", samples_name,
                               document["source_partition"], document["source_offset"])
            await dead_topic.send(key=str(document["tenant"]).encode(), value=encode_dead(dead))

    rated_writer = BatchWriter(sink.store_rated, "rated", worker.sink_batch_size,
                               worker.sink_max_backoff_seconds, on_rejected=dead_letter_unstorable)
    dead_writer = BatchWriter(sink.store_dead, "dead letters", worker.sink_batch_size,
                              worker.sink_max_backoff_seconds)

    @app.agent(samples_topic)
    async def rate(stream: StreamT) -> None:
        stream = stream.noack()  # type: ignore[attr-defined]
        rated_writer.stream = stream
        async for event in stream.events():
            message = event.message
            rated: list[RatedUsage] = []
            for outcome in stage.process_record(event.value, message.partition, message.offset):
                if outcome.rated is not None:
                    rated.append(outcome.rated)
                elif outcome.dead is not None:
                    await dead_topic.send(key=message.key, value=encode_dead(outcome.dead))
            if rated:
                # One rated record per sample record: the same per-record economy downstream.
                await rated_topic.send(key=message.key, value=records.join([encode_rated(r) for r in rated]))
            await rated_writer.add(event, [rated_row(r) for r in rated])

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

    pending = {"rated": 0, "dead letters": 0}
    metrics.serve(metrics.WorkerCollector(stage.counters, sink.counters, pending), worker.metrics_port)

    @app.timer(1.0)
    async def measure_pending() -> None:
        pending["rated"] = len(rated_writer.pending.rows)
        pending["dead letters"] = len(dead_writer.pending.rows)

    @app.timer(worker.sink_batch_seconds)
    async def flush_due() -> None:
        await rated_writer.flush()
        await dead_writer.flush()

    @app.timer(30.0)
    async def report() -> None:
        counters = stage.counters
        log.info("rated %d, dead letters %d, duplicates %d, stored %d, sink failures %d",
                 counters.rated, counters.dead, counters.duplicates, sink.counters.stored,
                 sink.counters.failures)

    return WorkerApp(app, (rated_writer, dead_writer))


class _Worker(faust.Worker):
    """faust's Worker, telling the batch writers to give up first when a signal arrives.

    A writer retrying a batch would otherwise hold the shutdown until ClickHouse answers.
    """

    def __init__(self, app: faust.App, writers: Sequence[BatchWriter], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._writers = writers

    def _schedule_shutdown(self, signum: signal.Signals) -> None:
        for writer in self._writers:
            writer.stop()
        super()._schedule_shutdown(signum)


def run_worker(settings: Settings, loglevel: str = "warn") -> None:
    """Run the worker until SIGTERM/SIGINT: unstored batches stay uncommitted."""
    built = create_app(settings)
    worker = _Worker(built.app, built.writers, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
