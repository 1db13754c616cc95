"""An in-memory stand-in for kafka-python's producer and the broker behind it, for the
publisher's tests: it acknowledges and records sends while the broker is up; while it is
down, futures never complete and flush times out, as the real client does. One partition can be
down alone (``down_keys``: its leader is gone): sends keyed to it never complete, the others do."""

from __future__ import annotations

from typing import Any

from kafka.errors import KafkaTimeoutError

from gpumeter.core.models import parse_sample
from gpumeter.core.records import split
from gpumeter.infra.kafka import KafkaUnavailable


class _Future:
    def __init__(self, ok: bool) -> None:
        self.is_done = ok
        self._ok = ok

    def succeeded(self) -> bool:
        return self._ok


class RecordingProducer:
    """Acknowledges (and records) sends while ``up``; otherwise its futures never complete."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.closed = False
        # Keys of sends that did not complete: the real client holds them until their delivery
        # timeout; this stand-in lets them expire (never delivered) once their partition is back.
        self.stuck: set[bytes] = set()

    def send(self, topic: str, key: bytes, value: bytes) -> _Future:
        if self.broker.block_sends:
            raise KafkaTimeoutError("metadata not available")
        writable = self.broker.up and key not in self.broker.down_keys
        if writable:
            self.broker.log.append((topic, key, value))
        else:
            self.stuck.add(key)
        return _Future(writable)

    def flush(self, timeout: float | None = None) -> None:
        if not self.broker.up or self.stuck & self.broker.down_keys:
            raise KafkaTimeoutError("flush timed out")

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


class Broker:
    """The Kafka the producers reach: ``reachable`` or not (the factory fails), ``up`` or not
    (sends never complete), ``down_keys`` (the partitions of these keys have no leader),
    ``block_sends`` (send raises as on missing metadata)."""

    def __init__(self) -> None:
        self.up = True
        self.block_sends = False
        self.reachable = True
        self.down_keys: set[bytes] = set()
        self.log: list[tuple[str, bytes, bytes]] = []
        self.producers = 0

    def factory(self) -> Any:
        if not self.reachable:
            raise KafkaUnavailable("no Kafka broker answers")
        self.producers += 1
        return RecordingProducer(self)

    def on(self, suffix: str) -> list[tuple[bytes, bytes]]:
        """(key, value) of every acknowledged send to the topic ending in ``suffix``."""
        return [(key, value) for topic, key, value in self.log if topic.endswith(suffix)]

    def sample_ids(self) -> list[str]:
        return [
            parse_sample(line).event_id
            for topic, _, value in self.log
            if topic.endswith("samples.v1")
            for line in split(value)
        ]
