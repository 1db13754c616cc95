"""The dead-letter agent: dead-letter topic -> dead_letters in ClickHouse.

Dead letters come from the rating and quota agents and from `gpumeter ingest`; each is
acknowledged once its batch is stored (streams/batch_writer.py).
"""

from __future__ import annotations

from typing import Any

import faust
from faust.types import StreamT

from gpumeter.core import topics
from gpumeter.core.models import dead_letter
from gpumeter.core.settings import Settings
from streams.batch_writer import BatchWriter
from streams.sink import BadRecord, ClickHouseSink, dead_row
from streams.stage import encode_dead


def add_dead_letter_sink(app: faust.App, settings: Settings, dead_topic: Any,
                         sink: ClickHouseSink) -> BatchWriter:
    """The ``sink_dead`` agent; returns the writer that stores what it reads."""
    kafka = settings.kafka
    worker = settings.worker
    dead_writer = BatchWriter(sink.store_dead, "dead letters", worker.sink_batch_size,
                              worker.sink_max_backoff_seconds)

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

    return dead_writer
