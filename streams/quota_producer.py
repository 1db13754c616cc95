"""The quota agent's own Kafka producer for quota events (key = tenant).

Quota events went through faust's producer, the one that carries the rated records: a few
records a crossing behind batches of thousands of rated lines (linger 5 ms, one request in
flight per broker connection), while the quota agent, holding its lock, awaited their delivery
before counting the next rated record. Under the 10,000-GPU fleet's windows that wait and the
event's own delivery were a visible part of crossing -> eviction (benchmarks/quota_latency.py).
On a producer of their own (own connection, linger 0, idempotent, acks from all in-sync
replicas) a crossing's events are sent at once. The agent's order of effects is unchanged:
events delivered, then the ledger stored and the record acknowledged (streams/quota_agent.py).
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from gpumeter.core.settings import KafkaSettings
from gpumeter.infra import kafka as kafka_admin


class QuotaEventProducer:
    """Started on first use (inside the worker's event loop), stopped with the app."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self._kafka = kafka
        self.topic = topic
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def _started(self) -> AIOKafkaProducer:
        async with self._starting:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._kafka.bootstrap,
                    acks="all",
                    enable_idempotence=True,  # retries neither duplicate nor reorder a tenant's events
                    linger_ms=0,
                    compression_type=kafka_admin.compression_type(self._kafka),
                    **kafka_admin.security_options(self._kafka),
                )
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def send_all(self, records: list[tuple[bytes, bytes]]) -> None:
        """Send ``records`` (key, value) in order and return once the broker has them all;
        raises if any was not delivered (the caller sends them again: consumers fold ids)."""
        producer = await self._started()
        deliveries = [await producer.send(self.topic, key=key, value=value) for key, value in records]
        await asyncio.gather(*deliveries)

    async def stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()
