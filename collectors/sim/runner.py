"""`gpumeter collect --source simulated`: publish the simulated fleet's samples to Kafka."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.core import jsonio, topics
from gpumeter.core.records import RecordBatcher
from gpumeter.core.settings import Settings
from gpumeter.infra.kafka import make_producer


class FleetPublisher:
    """Sends fleet windows to the samples topic (key = tenant) and topology to its compacted topic."""

    def __init__(self, settings: Settings, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.producer = make_producer(settings.kafka)
        self.samples_topic = settings.kafka.topic(topics.SAMPLES)
        self.topology_topic = settings.kafka.topic(topics.TOPOLOGY)
        self.published = 0

    def publish_topology(self) -> None:
        for node in self.fleet.topology():
            self.producer.send(self.topology_topic, key=node.node.encode(),
                               value=jsonio.dumpb(node.model_dump()))

    def publish_window(self) -> list[dict[str, Any]]:
        """One window of the fleet, as multi-sample records per tenant (gpumeter/records.py)."""
        samples = self.fleet.step_dicts()
        batcher = RecordBatcher()
        for sample in samples:
            ready = batcher.add(sample["tenant"].encode(), jsonio.dumpb(sample))
            if ready is not None:
                self.producer.send(self.samples_topic, key=ready[0], value=ready[1])
        for key, record, _count in batcher.drain():
            self.producer.send(self.samples_topic, key=key, value=record)
        self.published += len(samples)
        return samples

    def send_raw(self, key: bytes, payload: bytes) -> None:
        """For the demo's deliberate bad input and duplicates."""
        self.producer.send(self.samples_topic, key=key, value=payload)
        self.published += 1

    def flush(self) -> None:
        self.producer.flush(timeout=60)

    def close(self) -> None:
        self.producer.flush(timeout=60)
        self.producer.close(timeout=30)


def run_simulated(settings: Settings, seed: int, windows: int | None, speed: float | None,
                  config: FleetConfig | None = None,
                  should_stop: Callable[[], bool] = lambda: False) -> int:
    """Publish ``windows`` windows (None: until stopped), ``speed`` windows per second at most."""
    fleet = SimulatedFleet(config or FleetConfig(seed=seed))
    publisher = FleetPublisher(settings, fleet)
    try:
        publisher.publish_topology()
        count = 0
        while (windows is None or count < windows) and not should_stop():
            started = time.monotonic()
            publisher.publish_window()
            count += 1
            if speed is not None:
                time.sleep(max(0.0, 1.0 / speed - (time.monotonic() - started)))
        return publisher.published
    finally:
        publisher.close()
