"""`gpumeter worker`: the faust-streaming app. Rating, dead letters and the ClickHouse sink.

Agents:
- ``rate``: samples topic -> rated topic (key = tenant) or dead-letter topic. At-least-once:
  faust flushes the producer before it commits the source offsets, so a crash replays
  samples, and replays are folded by event_id downstream.
- ``sink_rated`` / ``sink_dead``: rated and dead-letter topics -> ClickHouse in batches.
  Their streams do not auto-acknowledge: an event is acknowledged (its offset becomes
  committable) only after the batch holding it is stored. ClickHouse being down stalls
  the sink with exponential back-off; nothing is acknowledged meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types import EventT, StreamT

from gpumeter import clickhouse, topics
from gpumeter.models import dead_letter
from gpumeter.ratecard import load_rate_cards
from gpumeter.settings import Settings
from streams.sink import BadRecord, ClickHouseSink, connector, dead_row, rated_row
from streams.stage import RatingStage, encode_dead, encode_rated

log = logging.getLogger("gpumeter.worker")


@dataclass
class PendingBatch:
    """Events held unacknowledged until their rows are stored."""

    events: list[EventT] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class BatchWriter:
    """Flushes a PendingBatch into ClickHouse, retrying with back-off until it is stored."""

    def __init__(self, store: Callable[[Sequence[tuple[Any, ...]]], int], name: str,
                 max_backoff: float) -> None:
        self.store = store
        self.name = name
        self.max_backoff = max_backoff
        self.pending = PendingBatch()

    async def flush(self, stream: StreamT) -> None:
        async with self.pending.lock:
            if not self.pending.events:
                return
            rows, events = self.pending.rows, self.pending.events
            await self._store_with_retry(rows)
            for event in events:
                await stream.ack(event)
            self.pending.rows, self.pending.events = [], []

    async def _store_with_retry(self, rows: list[tuple[Any, ...]]) -> None:
        delay = 0.2
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            attempt += 1
            try:
                # A thread keeps the event loop (and the consumer's heartbeats) alive during I/O.
                await loop.run_in_executor(None, self.store, rows)
                if attempt > 1:
                    log.warning("%s: stored %d rows after %d attempts", self.name, len(rows), attempt)
                return
            except Exception as exc:  # any failure means: not stored, try again
                log.warning("%s: storing %d rows failed (attempt %d, retry in %.1fs): %s",
                            self.name, len(rows), attempt, delay, str(exc).splitlines()[0][:300])
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_backoff)


def create_app(settings: Settings) -> faust.App:
    kafka = settings.kafka
    cards = load_rate_cards(settings.rate_cards)
    client = clickhouse.connect(settings.clickhouse.dsn)
    clickhouse.migrate(client)
    client.close()

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
    samples_topic = app.topic(kafka.topic(topics.SAMPLES), key_type=bytes, value_type=bytes,
                              key_serializer="raw", value_serializer="raw")
    rated_topic = app.topic(kafka.topic(topics.RATED), key_type=bytes, value_type=bytes,
                            key_serializer="raw", value_serializer="raw")
    dead_topic = app.topic(kafka.topic(topics.DEADLETTER), key_type=bytes, value_type=bytes,
                           key_serializer="raw", value_serializer="raw")

    stage = RatingStage(cards, kafka.topic(topics.SAMPLES))
    sink = ClickHouseSink(connector(settings.clickhouse.dsn))
    worker = settings.worker
    rated_writer = BatchWriter(sink.store_rated, "sink_rated", worker.sink_max_backoff_seconds)
    dead_writer = BatchWriter(sink.store_dead, "sink_dead", worker.sink_max_backoff_seconds)
    streams_by_writer: dict[str, StreamT] = {}

    @app.agent(samples_topic)
    async def rate(stream: StreamT) -> None:
        async for event in stream.events():
            message = event.message
            outcome = stage.process(event.value, message.partition, message.offset)
            if outcome.rated is not None:
                await rated_topic.send(key=outcome.rated.tenant.encode(), value=encode_rated(outcome.rated))
            elif outcome.dead is not None:
                await dead_topic.send(key=message.key, value=encode_dead(outcome.dead))

    async def consume(stream: StreamT, writer: BatchWriter, to_row: Callable[[bytes], tuple[Any, ...]],
                      source_topic: str) -> None:
        stream = stream.noack()  # type: ignore[attr-defined]
        streams_by_writer[writer.name] = stream
        async for event in stream.events():
            try:
                row = to_row(event.value)
            except BadRecord as exc:
                # Not ours to drop: park it as a dead letter and move on.
                await dead_topic.send(key=event.message.key, value=_internal_dead_letter(
                    exc, event, source_topic))
                await stream.ack(event)
                continue
            async with writer.pending.lock:
                writer.pending.events.append(event)
                writer.pending.rows.append(row)
                full = len(writer.pending.rows) >= worker.sink_batch_size
            if full:
                await writer.flush(stream)

    @app.agent(rated_topic)
    async def sink_rated(stream: StreamT) -> None:
        await consume(stream, rated_writer, rated_row, kafka.topic(topics.RATED))

    @app.agent(dead_topic)
    async def sink_dead(stream: StreamT) -> None:
        await consume(stream, dead_writer, dead_row, kafka.topic(topics.DEADLETTER))

    @app.timer(worker.sink_batch_seconds)
    async def flush_due() -> None:
        for writer in (rated_writer, dead_writer):
            stream = streams_by_writer.get(writer.name)
            if stream is not None:
                await writer.flush(stream)

    @app.timer(30.0)
    async def report() -> None:
        counters = stage.counters
        log.info("rated %d, dead letters %d, duplicates %d, stored %d, sink failures %d",
                 counters.rated, counters.dead, counters.duplicates, sink.counters.stored,
                 sink.counters.failures)

    return app


def _internal_dead_letter(exc: BadRecord, event: EventT, source_topic: str) -> bytes:
    message = event.message
    return encode_dead(
        dead_letter(event.value, "bad_internal_record", str(exc), source_topic, message.partition,
                    message.offset)
    )


def run_worker(settings: Settings, loglevel: str = "warn") -> None:
    """Run the worker until SIGTERM/SIGINT (faust's Worker handles the signals)."""
    app = create_app(settings)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
