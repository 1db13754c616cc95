"""A 3-node Kafka cluster for the broker-loss chaos tests (contract 9's local runtime, plaintext)
and what they ask of it: which node leads a partition or coordinates a group, killing a node
with SIGKILL, restarting it and waiting until it is back in the ISR of every partition."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from gpumeter.app.runtime.kafka_broker import LocalBroker, LocalKafkaCluster
from gpumeter.core.settings import KafkaSettings
from gpumeter.infra import kafka
from tests.services import wait_until

NODES = 3
OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class Replicas:
    leader: int
    isr: frozenset[int]
    replicas: frozenset[int]


def describe(settings: KafkaSettings, topics: Iterable[str]) -> dict[tuple[str, int], Replicas]:
    """(topic, partition) -> its leader, in-sync replicas and replicas, as the cluster reports them."""
    client = kafka.admin(settings)
    try:
        described = client.describe_topics(list(topics))
    finally:
        client.close()
    return {
        (topic["name"], partition["partition_index"]): Replicas(
            partition["leader_id"], frozenset(partition["isr_nodes"]), frozenset(partition["replica_nodes"]))
        for topic in described for partition in topic["partitions"]
    }


def partition_leader(settings: KafkaSettings, topic: str, partition: int = 0) -> int:
    return describe(settings, [topic])[(topic, partition)].leader


def group_coordinator(settings: KafkaSettings, group: str) -> int:
    """The node coordinating ``group``. kafka-python 3.0 resolves it (FindCoordinator) only in
    its admin client's private ``_find_coordinator_id``, run on the client's own event loop, as
    its public ``describe_groups`` does."""
    client = kafka.admin(settings)
    try:
        return int(client._manager.run(client._find_coordinator_id, group))
    finally:
        client.close()


def topics_under(settings: KafkaSettings) -> list[str]:
    client = kafka.admin(settings)
    try:
        return sorted(name for name in client.list_topics() if name.startswith(settings.topic_prefix))
    finally:
        client.close()


def node(cluster: LocalKafkaCluster, node_id: int) -> LocalBroker:
    (found,) = [candidate for candidate in cluster.nodes if candidate.node_id == node_id]
    return found


def kill9(broker: LocalBroker) -> None:
    """SIGKILL the node: no controlled shutdown, its partitions are led elsewhere only once the
    controller fences it."""
    pid = broker.pid()
    assert pid is not None, f"node {broker.node_id} is not running"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not broker.answers(), 30, f"node {broker.node_id} still answers after SIGKILL")


def restart(cluster: LocalKafkaCluster, broker: LocalBroker) -> None:
    """Start a killed node again on its own data (formatted before: no cluster id is needed)."""
    assert broker.start(), f"node {broker.node_id} was already running"
    wait_until(broker.answers, 90, f"node {broker.node_id} did not come back")


def out_of_sync(settings: KafkaSettings, topics: Iterable[str], node_id: int) -> list[str]:
    """Partitions of ``topics`` replicated on ``node_id`` whose ISR lacks it."""
    described = describe(settings, topics)
    return sorted(f"{topic}-{partition}" for (topic, partition), replicas in described.items()
                  if node_id in replicas.replicas and node_id not in replicas.isr)


def wait_back_in_sync(settings: KafkaSettings, topics: Iterable[str], node_id: int, timeout: float) -> None:
    names = list(topics)
    wait_until(lambda: not out_of_sync(settings, names, node_id), timeout,
               f"node {node_id} not back in the ISR of {out_of_sync(settings, names, node_id)}", interval=1)
