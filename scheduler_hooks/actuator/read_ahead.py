"""Reading the quota events topic ahead of the actuator's consumer, to the end of a partition.

Before the actuator evicts for an ``exceeded``, it must know whether a later ``recovered`` of
the same tenant, metric and period has cancelled it (contract 4, amendment "trust"). The
consumer's own fetches only reach so far ahead of handling (a batch, or the in-flight limit
under back-pressure), while a backlog read after downtime can hold the two events any number
of records apart. So the partition is read from past what is already known to its current
end, by a consumer of its own (no group, nothing committed), and every event is folded into
the ``Recoveries`` the consumer also feeds. Only the positions read for the first time are
read: while the actuator keeps up, that is nothing or a few records per ``exceeded``.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from gpumeter.core.models import QuotaEvent
from gpumeter.core.settings import Settings
from gpumeter.infra import kafka as gkafka
from scheduler_hooks.actuator.plan import Recoveries

log = logging.getLogger("gpumeter.actuator")

BATCH = 5000
FETCH_WAIT_MS = 200


class ReadAhead:
    def __init__(self, settings: Settings, topic: str, recoveries: Recoveries) -> None:
        self.settings = settings
        self.topic = topic
        self.recoveries = recoveries
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()  # one reader: tenants' chains ask side by side

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def _reader(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.settings.kafka.bootstrap,
                **gkafka.security_options(self.settings.kafka),
                group_id=None,
                enable_auto_commit=False,
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def to_end(self, partition: int, after: int) -> None:
        """Fold every event on ``partition`` after offset ``after`` up to its current end."""
        async with self._lock:
            consumer = await self._reader()
            tp = TopicPartition(self.topic, partition)
            end = (await consumer.end_offsets([tp]))[tp]
            start = max(after, self.recoveries.read_to(partition)) + 1
            if start >= end:
                return
            consumer.assign([tp])
            consumer.seek(tp, start)
            read = 0
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=FETCH_WAIT_MS, max_records=BATCH)
                for message in batch.get(tp, ()):
                    try:
                        event = QuotaEvent.model_validate_json(message.value or b"")
                    except ValidationError:
                        continue  # the consumer reports it when it gets there
                    self.recoveries.observe(event, (partition, message.offset))
                    read += 1
            log.debug("read ahead %d event(s) on partition %d, offsets %d to %d",
                      read, partition, start, end - 1)
