"""`gpumeter ingest FILE`: validate UsageSample lines, publish the valid ones, account for the rest.

Rejected lines are not lost: besides being reported, each is published to the dead-letter
topic with its reason (source ``ingest:<file>``, offset = line number), so the pipeline's
dead-letter table holds them too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpumeter.core import jsonio, topics
from gpumeter.core.models import SampleRejected, dead_letter, parse_sample
from gpumeter.core.records import RecordBatcher
from gpumeter.core.settings import Settings
from gpumeter.infra.kafka import make_producer

REPORTED_REJECTIONS = 20


@dataclass
class IngestResult:
    accepted: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)


def ingest_lines(
    lines: Iterable[bytes],
    settings: Settings,
    source: str,
    on_line: Callable[[int], None] | None = None,
) -> IngestResult:
    """Publish every valid line (key = tenant, batched per tenant) with acks=all.

    Returns counts and the first reasons. Lines of one tenant keep their file order.
    """
    producer = make_producer(settings.kafka)
    samples_topic = settings.kafka.topic(topics.SAMPLES)
    dead_topic = settings.kafka.topic(topics.DEADLETTER)
    result = IngestResult()
    futures = []
    batcher = RecordBatcher()
    try:
        for number, line in enumerate(lines, start=1):
            if on_line is not None:
                on_line(len(line))
            payload = line.strip()
            if not payload:
                continue
            try:
                sample = parse_sample(payload)
            except SampleRejected as exc:
                result.rejected += 1
                if len(result.reasons) < REPORTED_REJECTIONS:
                    result.reasons.append(f"line {number}: {exc.reason}")
                futures.append(producer.send(dead_topic, value=_dead_letter(payload, exc, source, number)))
                continue
            result.accepted += 1
            ready = batcher.add(sample.tenant.encode(), payload)
            if ready is not None:
                futures.append(producer.send(samples_topic, key=ready[0], value=ready[1]))
            if len(futures) >= 200:
                _wait(producer, futures)
        for key, record, _count in batcher.drain():
            futures.append(producer.send(samples_topic, key=key, value=record))
        _wait(producer, futures)
    finally:
        producer.close(timeout=30)
    return result


def _wait(producer: object, futures: list[object]) -> None:
    """Block until the broker acknowledged everything sent so far; raise if any send failed."""
    producer.flush(timeout=60)  # type: ignore[attr-defined]
    for future in futures:
        future.get(timeout=60)  # type: ignore[attr-defined]
    futures.clear()


def _dead_letter(payload: bytes, exc: SampleRejected, source: str, line: int) -> bytes:
    return jsonio.dumpb(dead_letter(payload, exc.code, exc.reason, source, -1, line).model_dump())
