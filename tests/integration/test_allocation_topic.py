"""Contract 8 on a real broker: `gpumeter collect --source simulated` publishes every node's
topology once and its allocation every window, keyed by node, decodable as the models."""

from __future__ import annotations

from collections import defaultdict

import pytest
from kafka import KafkaConsumer

from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.core import jsonio, topics
from gpumeter.core.models import NodeAllocation, NodeTopology
from gpumeter.core.settings import Settings
from gpumeter.infra import kafka
from tests.services import run_cli

pytestmark = pytest.mark.integration

WINDOWS = 3


def read_all(settings: Settings, base: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) on a topic, partition by partition in offset order."""
    topic = settings.kafka.topic(base)
    ends = kafka.end_offsets(settings.kafka, [topic])
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, enable_auto_commit=False)
    consumer.assign(list(ends))
    consumer.seek_to_beginning()
    records: dict[int, list[tuple[int, bytes, bytes]]] = defaultdict(list)
    while any(consumer.position(tp) < end for tp, end in ends.items()):
        for tp, batch in consumer.poll(timeout_ms=1000).items():
            records[tp.partition].extend((r.offset, r.key, r.value) for r in batch)
    consumer.close()
    return [(key, value) for partition in sorted(records) for _, key, value in sorted(records[partition])]


def test_collect_simulated_publishes_topology_and_allocation_keyed_by_node(settings: Settings) -> None:
    result = run_cli(settings, "collect", "--source", "simulated", "--seed", "5", "--windows", str(WINDOWS))
    assert result.returncode == 0, result.stderr

    # What the same fleet holds, computed in this process.
    fleet = SimulatedFleet(FleetConfig(seed=5))
    expected_topology = {t.node: t for t in fleet.topology()}
    expected_allocations: dict[str, list[NodeAllocation]] = defaultdict(list)
    for _ in range(WINDOWS):
        fleet.step_dicts()
        for record in fleet.allocations():
            expected_allocations[record.node].append(record)
    # The default fleet: 3 H100, 1 H200, 1 B200, 2 A100, 1 L40S, 2 L4 nodes; all report in so short a run.
    assert len(expected_topology) == 10
    assert all(len(records) == WINDOWS for records in expected_allocations.values())

    published_topology = read_all(settings, topics.TOPOLOGY)
    # Once per node: the layout did not change during the run.
    assert sorted(key for key, _ in published_topology) == sorted(n.encode() for n in expected_topology)
    for key, value in published_topology:
        topology = NodeTopology.model_validate(jsonio.loads(value))
        assert key == topology.node.encode()
        assert topology == expected_topology[topology.node]

    published_allocations = read_all(settings, topics.ALLOCATION)
    assert len(published_allocations) == WINDOWS * len(expected_topology)
    by_node: dict[str, list[NodeAllocation]] = defaultdict(list)
    for key, value in published_allocations:
        record = NodeAllocation.model_validate(jsonio.loads(value))  # one record per message
        assert key == record.node.encode()
        by_node[record.node].append(record)  # one key, one partition: in publish order
    assert by_node == expected_allocations
    assert any(record.assignments for records in by_node.values() for record in records)
