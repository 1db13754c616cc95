"""`gpumeter collect --source simulated`: publish the simulated fleet's records to Kafka.

Per window: the samples (key = tenant, multi-sample records) and one ``NodeAllocation`` per
node that reported the window (compacted topic, key = node). Each node's ``NodeTopology`` goes
out once, and again only when it changes (compacted topic, key = node): a reclaimed spot node
comes back on another machine, with other GPU UUIDs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.core import jsonio, topics
from gpumeter.core.models import NodeTopology
from gpumeter.core.records import tenant_records
from gpumeter.core.settings import Settings
from gpumeter.infra.kafka import make_producer


def _layout(topology: NodeTopology) -> tuple[object, ...]:
    """What a topology change is: the GPUs and their links, not the time it was read."""
    return (tuple(topology.gpus), tuple(sorted(topology.links.items())))


class FleetPublisher:
    """Sends fleet windows to the samples topic, allocations and topology to their compacted topics."""

    def __init__(self, settings: Settings, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.producer = make_producer(settings.kafka)
        self.samples_topic = settings.kafka.topic(topics.SAMPLES)
        self.topology_topic = settings.kafka.topic(topics.TOPOLOGY)
        self.allocation_topic = settings.kafka.topic(topics.ALLOCATION)
        self.published = 0  # samples (the demo compares it with what was stored)
        self.allocations_published = 0
        self.topologies_published = 0
        self._layouts: dict[str, tuple[object, ...]] = {}
        self._last: dict[str, NodeTopology] = {}

    def publish_topology(self) -> int:
        """Publish the topology of every node not yet published or changed since; returns how many."""
        sent = 0
        for node in self.fleet.topology():
            if self._last.get(node.node) is node:
                continue  # the very record already sent (the fleet keeps it until the layout changes)
            layout = _layout(node)
            self._last[node.node] = node
            if self._layouts.get(node.node) == layout:
                continue
            self.producer.send(self.topology_topic, key=node.node.encode(),
                               value=jsonio.dumpb(node.model_dump()))
            self._layouts[node.node] = layout
            sent += 1
        self.topologies_published += sent
        return sent

    def publish_window(self) -> list[dict[str, Any]]:
        """One window of the fleet, as multi-sample records per tenant (gpumeter/core/records.py),
        then every node's allocation for that window."""
        self.publish_topology()
        samples = self.fleet.step_dicts()
        for key, record in tenant_records(samples):
            self.producer.send(self.samples_topic, key=key, value=record)
        self.published += len(samples)
        self.publish_topology()  # a reclaimed spot node back on a new machine: its new layout first
        for allocation in self.fleet.allocation_dicts():
            self.producer.send(self.allocation_topic, key=allocation["node"].encode(),
                               value=jsonio.dumpb(allocation))
            self.allocations_published += 1
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
