"""Reading the quota events topic ahead of the actuator's consumer, to the end of a partition.

Before the actuator evicts for an ``exceeded``, it must know whether a later ``recovered`` of
the same tenant, metric and period has cancelled it (contract 4, amendment "trust"). The
consumer's own fetches only reach so far ahead of handling (a batch, or the in-flight limit
under back-pressure), while a backlog read after downtime can hold the two events any number
of records apart. So the partition is read from past what is already known to its current
end, by a consumer of its own (no group, nothing committed), and every event is folded into
the ``Recoveries`` the consumer also feeds. Only the positions read for the first time are
read: while the actuator keeps up, that is nothing or a few records per ``exceeded``.

Tenants' chains ask side by side, and one reader serves them one at a time; each read asks the
broker for the partition's end. A call is also served by any read of its partition whose end
was asked for after the call began (that end is at least as late as one the call would have
asked for itself), so callers waiting together share one round trip: at 10 crossings a second
under the fleet's load, each waiting for its own had queued them behind each other.
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
        self._calls = 0  # calls begun so far (each call's ticket is the count at its start)
        self._served: dict[int, int] = {}  # partition -> calls begun before its last end request
        self.end_requests = 0  # round trips for a partition's end (what coalescing saves)

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
        """Fold every event on ``partition`` after offset ``after`` up to its end as of some
        moment after this call began."""
        self._calls += 1
        ticket = self._calls
        async with self._lock:
            if self._served.get(partition, 0) >= ticket:
                return  # a read that asked for the end after this call began has folded it all
            consumer = await self._reader()
            tp = TopicPartition(self.topic, partition)
            begun = self._calls  # every call begun so far is served once this read is done
            self.end_requests += 1
            end = (await consumer.end_offsets([tp]))[tp]
            start = max(after, self.recoveries.read_to(partition)) + 1
            if start >= end:
                self._served[partition] = max(begun, self._served.get(partition, 0))
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
            self._served[partition] = max(begun, self._served.get(partition, 0))
            log.debug("read ahead %d event(s) on partition %d, offsets %d to %d",
                      read, partition, start, end - 1)
