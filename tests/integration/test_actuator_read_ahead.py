"""The actuator's read-ahead on a real broker: callers waiting together share one round trip
for the partition's end, and a call begun after a read still sees what was produced since.

Contract 4 (trust): an ``exceeded`` that a later ``recovered`` cancelled never evicts; the
read-ahead is how the actuator knows of that recovered (scheduler_hooks/actuator/read_ahead.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gpumeter.core.models import QuotaEvent
from gpumeter.core.settings import Settings
from gpumeter.core.topics import QUOTA_EVENTS
from gpumeter.infra import kafka as gkafka
from scheduler_hooks.actuator.plan import Recoveries
from scheduler_hooks.actuator.read_ahead import ReadAhead

PARTITION = 0


def event(tenant: str, level: str, serial: int) -> QuotaEvent:
    return QuotaEvent(event_id=f"{tenant}-{level}-{serial}", tenant=tenant, metric="gpu_hours", level=level,
                      threshold="1", used="2.000000", limit="1.000000", period="2026-12",
                      at=datetime(2026, 12, 6, 11, 0, tzinfo=UTC))


def produce(settings: Settings, events: list[QuotaEvent]) -> list[int]:
    """Offsets of ``events`` on PARTITION, in order."""
    producer = gkafka.make_producer(settings.kafka)
    try:
        sent = [producer.send(settings.kafka.topic(QUOTA_EVENTS), key=e.tenant.encode(),
                              value=e.model_dump_json().encode(), partition=PARTITION) for e in events]
        return [future.get(timeout=30).offset for future in sent]
    finally:
        producer.close()


def test_callers_waiting_together_share_one_end_request(settings: Settings) -> None:
    tenants = [f"team-{i}" for i in range(8)]
    exceeded = [event(t, "exceeded", 1) for t in tenants]
    offsets = produce(settings, exceeded)
    later = produce(settings, [event(t, "recovered", 2) for t in tenants])
    assert min(later) > max(offsets)
    recoveries = Recoveries()
    reader = ReadAhead(settings, settings.kafka.topic(QUOTA_EVENTS), recoveries)

    async def scenario() -> int:
        try:
            await reader.to_end(PARTITION, offsets[0])  # the reader's consumer started, one read
            before = reader.end_requests
            await asyncio.gather(*(reader.to_end(PARTITION, offset) for offset in offsets))
            return reader.end_requests - before
        finally:
            await reader.stop()

    # The first of the eight asks before the others have begun; the second's read, asked after
    # all of them began, serves the other six: two round trips, not eight.
    assert asyncio.run(scenario()) == 2
    assert all(recoveries.cancelled(e, (PARTITION, o)) for e, o in zip(exceeded, offsets, strict=True))


def test_a_call_begun_after_a_read_reads_again(settings: Settings) -> None:
    first = event("team-a", "exceeded", 1)
    [offset] = produce(settings, [first])
    recoveries = Recoveries()
    reader = ReadAhead(settings, settings.kafka.topic(QUOTA_EVENTS), recoveries)

    async def scenario() -> tuple[bool, bool]:
        try:
            await reader.to_end(PARTITION, offset)
            before = recoveries.cancelled(first, (PARTITION, offset))
            await asyncio.to_thread(produce, settings, [event("team-a", "recovered", 2)])
            await reader.to_end(PARTITION, offset)  # begun after the first read: not served by it
            return before, recoveries.cancelled(first, (PARTITION, offset))
        finally:
            await reader.stop()

    assert asyncio.run(scenario()) == (False, True)
