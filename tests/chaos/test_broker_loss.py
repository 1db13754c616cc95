"""Broker loss on a 3-node cluster (issue 28, point 3): while the simulated fleet publishes and
two workers run, one node is killed with SIGKILL (the leader of a busy samples partition, the
workers' group coordinator, or the leader of a busy quota-ledger changelog partition) and
restarted. Topics are replicated 3 times with min ISR 2, so one node down leaves every
partition writable once its leadership moves.

Each time: the fleet keeps publishing while the node is down, nothing it published is lost,
`gpumeter drain` completes, every published event id is stored exactly once, the invoices equal
the independent reference (tests/unit/reference_billing.py), each quota crossing is announced
once (expected crossings worked out here from the published samples, not read from the code),
and the restarted node is back in the ISR of every partition it replicates.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from collectors.agent.publisher import Publisher
from collectors.agent.samples import event_id
from collectors.agent.spool import Spool
from collectors.sim.config import FleetConfig
from collectors.sim.fleet import SimulatedFleet
from collectors.sim.runner import FleetPublisher
from gpumeter.app.runtime.kafka_broker import LocalKafkaCluster
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.models import UsageSample
from gpumeter.core.records import split
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.core.topics import ledger_changelog_topic
from gpumeter.infra import clickhouse, kafka
from testkit.builders import OMIT, shipped_rate_card_documents, usage_sample
from tests.chaos import brokers
from tests.integration.invoice_checks import (
    assert_every_sample_stored_once,
    assert_invoices_match,
    count_rows,
    produced_invoices,
)
from tests.services import Endpoints, Namespaces, free_port, isolated_settings, prepared, run_cli, wait_until
from tests.unit.reference_billing import reference_invoices, unit_hours, utc_month

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# GPU-hour quotas the fleet below crosses within a few dozen windows (about 0.3 GPU-hours a
# window for team-a), so crossings fall before, during and after the outage.
TENANTS: list[dict[str, Any]] = [
    {"tenant": "team-a", "gpu_hours": 10, "warn_at": [0.5, 0.8], "on_exceed": "notify"},
    {"tenant": "research", "gpu_hours": 6, "warn_at": [0.5], "on_exceed": "notify"},
    {"tenant": "inference", "gpu_hours": 2, "warn_at": [0.25, 0.75], "on_exceed": "notify"},
    {"tenant": "team-b", "gpu_hours": 1, "warn_at": [0.5], "on_exceed": "notify"},
]
WINDOW_PAUSE = 0.25  # seconds between fleet windows (each about 70 samples)
MAX_WINDOWS = 600  # a bound, never reached unless the workers never start
DOWN_SECONDS = 15  # longer than the controller's broker session timeout (9 s): leadership moves
WINDOWS_AFTER_RESTART = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    home = tmp_path_factory.mktemp("kafka-3-nodes")
    ports = [free_port() for _ in range(brokers.NODES)]
    controllers = [free_port() for _ in range(brokers.NODES)]
    cluster = LocalKafkaCluster.on_ports(home, "127.0.0.1", ports, controllers, "384m")
    cluster.start()
    try:
        kafka.wait_for_broker(KafkaSettings(bootstrap=cluster.bootstrap, replication_factor=brokers.NODES),
                              timeout=120)
        yield cluster
    finally:
        # All at once: stopped one by one, the last nodes wait out their timeout for a quorum
        # the first ones took away (about 50 s).
        with ThreadPoolExecutor(len(cluster.nodes)) as pool:
            list(pool.map(lambda node: node.stop(), cluster.nodes))


@pytest.fixture
def cluster_settings(endpoints: Endpoints, cluster: LocalKafkaCluster, tmp_path: Path,
                     namespaces: Namespaces) -> Settings:
    """A namespace of the test's own (topic prefix, database) on the 3-node cluster and the
    session's ClickHouse; topics replicated 3 times, min ISR 2; the quotas above."""
    configured = isolated_settings(endpoints, tmp_path / "data")
    configured.kafka = KafkaSettings.model_validate({
        **configured.kafka.model_dump(), "bootstrap": cluster.bootstrap,
        "replication_factor": 3, "min_insync_replicas": 2})
    tenants_file = tmp_path / "tenants.yaml"
    tenants_file.write_text(yaml.safe_dump({"tenants": TENANTS}))
    configured.tenants = tenants_file
    namespaces.add(configured)
    return prepared(configured)


class FleetRun(threading.Thread):
    """`gpumeter collect --source simulated` in a thread: windows published back to back until
    stopped, every samples record's acknowledgement (or failure) noted."""

    def __init__(self, settings: Settings, seed: int) -> None:
        super().__init__(name="fleet", daemon=True)
        config = FleetConfig(seed=seed, start=datetime(2026, 11, 10, tzinfo=UTC))
        self.publisher = FleetPublisher(settings, SimulatedFleet(config))
        self.samples: list[dict[str, Any]] = []
        self.windows = 0
        self.acknowledged = 0  # samples records
        self.failures: list[BaseException] = []
        self.error: BaseException | None = None
        self._stop_after: int | None = None
        self._lock = threading.Lock()

    def stop_after(self, more_windows: int) -> None:
        self._stop_after = self.windows + more_windows

    def _acked(self, _metadata: Any) -> None:
        with self._lock:
            self.acknowledged += 1

    def _failed(self, error: BaseException) -> None:
        with self._lock:
            self.failures.append(error)

    def run(self) -> None:
        producer = self.publisher.producer
        send = producer.send

        def recorded_send(topic: str, *args: Any, **kwargs: Any) -> Any:
            future = send(topic, *args, **kwargs)
            if topic == self.publisher.samples_topic:
                future.add_callback(self._acked)
                future.add_errback(self._failed)
            return future

        producer.send = recorded_send
        try:
            self.publisher.publish_topology()
            while self.windows < min(MAX_WINDOWS, self._stop_after or MAX_WINDOWS):
                self.samples.extend(self.publisher.publish_window())
                self.windows += 1
                time.sleep(WINDOW_PAUSE)
            self.publisher.close()
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc


def busiest_partition(settings: KafkaSettings, topic: str) -> int:
    ends = kafka.end_offsets(settings, [topic])
    return max(ends, key=lambda tp: ends[tp]).partition


def victim_node(victim: str, settings: Settings) -> int:
    group = settings.kafka.topic_prefix + settings.worker.group
    if victim == "samples leader":
        samples = settings.kafka.topic(topics.SAMPLES)
        return brokers.partition_leader(settings.kafka, samples, busiest_partition(settings.kafka, samples))
    if victim == "group coordinator":
        return brokers.group_coordinator(settings.kafka, group)
    changelog = ledger_changelog_topic(settings.kafka.topic_prefix, settings.worker.group)
    return brokers.partition_leader(settings.kafka, changelog, busiest_partition(settings.kafka, changelog))


def first_copies(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for sample in samples:
        seen.setdefault(sample["event_id"], sample)
    return list(seen.values())


Crossing = tuple[str, str, str, Fraction, str]  # tenant, metric, level, threshold, period


def expected_crossings(samples: list[dict[str, Any]]) -> set[Crossing]:
    """Contract 4 for GPU-hour quotas within one period: a warning per warn_at fraction reached,
    and exceeded once the limit is reached."""
    used: dict[tuple[str, str], Fraction] = {}
    for sample in samples:
        if sample["kind"] == "gpu":
            key = (sample["tenant"], utc_month(sample))
            used[key] = used.get(key, Fraction(0)) + unit_hours(sample)
    crossings: set[Crossing] = set()
    for policy in TENANTS:
        limit = Fraction(policy["gpu_hours"])
        for (tenant, period), hours in used.items():
            if tenant != policy["tenant"]:
                continue
            for fraction in policy["warn_at"]:
                threshold = Fraction(str(fraction))
                if hours >= threshold * limit:
                    crossings.add((tenant, "gpu_hours", "warning", threshold, period))
            if hours >= limit:
                crossings.add((tenant, "gpu_hours", "exceeded", Fraction(1), period))
    return crossings


def stored_crossings(settings: Settings) -> list[Crossing]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        sql = "SELECT tenant, metric, level, threshold, period FROM quota_events FINAL"
        rows = client.query(sql).result_rows
    finally:
        client.close()
    return [(tenant, metric, level, Fraction(Decimal(threshold)), period)
            for tenant, metric, level, threshold, period in rows]


VICTIMS = [
    pytest.param("samples leader", id="samples-partition-leader"),
    pytest.param("group coordinator", id="group-coordinator"),
    pytest.param("ledger changelog leader", id="ledger-changelog-leader"),
]


@pytest.mark.parametrize("victim", VICTIMS)
def test_a_broker_killed_mid_stream_loses_nothing_and_bills_nothing_twice(
    victim: str, cluster: LocalKafkaCluster, cluster_settings: Settings,
    worker_factory: Callable[..., WorkerProcess], tmp_path: Path,
) -> None:
    settings = cluster_settings
    workers = [worker_factory(settings, "first"), worker_factory(settings, "second")]
    fleet = FleetRun(settings, seed=len(victim))
    fleet.start()
    wait_until(lambda: count_rows(settings, "SELECT count() FROM rated_usage") >= 500, 180,
               "the workers stored nothing")
    node_id = victim_node(victim, settings)
    broker = brokers.node(cluster, node_id)
    assert fleet.is_alive(), "the fleet finished before the kill: nothing to test"
    windows_at_kill, acknowledged_at_kill = fleet.windows, fleet.acknowledged
    brokers.kill9(broker)
    time.sleep(DOWN_SECONDS)
    windows_while_down = fleet.windows - windows_at_kill
    acknowledged_while_down = fleet.acknowledged - acknowledged_at_kill
    brokers.restart(cluster, broker)
    fleet.stop_after(WINDOWS_AFTER_RESTART)
    fleet.join(timeout=180)
    assert not fleet.is_alive() and fleet.error is None, fleet.error

    # The fleet kept publishing, and was acknowledged, while the node was down.
    assert windows_while_down > 0 and acknowledged_while_down > 0
    assert fleet.failures == []
    brokers.wait_back_in_sync(settings.kafka, [*brokers.topics_under(settings.kafka), brokers.OFFSETS_TOPIC],
                              node_id, timeout=180)
    drained = run_cli(settings, "drain", "--timeout", "300")
    assert drained.returncode == 0, drained.stderr + "\n".join(w.log_tail() for w in workers)
    assert all(worker.alive() for worker in workers), "\n".join(w.log_tail() for w in workers)

    published = first_copies(fleet.samples)
    assert len(published) == fleet.publisher.published  # the fleet sends no id twice
    assert_every_sample_stored_once(settings, published)
    expected = reference_invoices(published, shipped_rate_card_documents(), TENANTS)
    assert_invoices_match(produced_invoices(settings, {p for _, p in expected}, tmp_path / "out"), expected)
    crossings = stored_crossings(settings)
    assert sorted(crossings) == sorted(expected_crossings(published))  # each once, none missing


AGENT_TENANTS = [f"tenant-{index:02d}" for index in range(24)]  # spread over every samples partition


def agent_window(n: int) -> list[UsageSample]:
    """Window ``n`` of one node: a pod of each tenant, one H100 each, with the agent's event ids."""
    start = datetime(2026, 11, 3, 10, 0, tzinfo=UTC) + timedelta(seconds=15 * n)
    return [
        usage_sample(event_id("c", "gpu-node-1", f"uid-{tenant}", "gpu", "GPU-0", start), cluster="c",
                     node="gpu-node-1", tenant=tenant, namespace=tenant, pod=f"pod-{tenant}",
                     pod_uid=f"uid-{tenant}", start=start, seconds=15, capacity_type=OMIT, mig_profile=OMIT)
        for tenant in AGENT_TENANTS
    ]


def partitions_of(settings: KafkaSettings, keys: list[str]) -> dict[str, int]:
    """The samples partition each key goes to, as the producer's partitioner picks it."""
    producer = kafka.make_producer(settings)
    try:
        return {key: producer.send(settings.topic(topics.SAMPLES), key=key.encode(), value=b"probe")
                .get(timeout=60).partition for key in keys}
    finally:
        producer.close()


def stored_event_ids(settings: KafkaSettings) -> set[str]:
    consumer = kafka.make_consumer(settings, settings.topic(topics.SAMPLES), auto_offset_reset="earliest",
                                   enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        return {json.loads(line)["event_id"] for message in consumer
                for line in split(message.value) if line != b"probe"}
    finally:
        consumer.close()


def single_copy_settings(cluster_settings: Settings) -> KafkaSettings:
    """The test's namespace with topics of one replica each: a broker lost takes its partitions
    offline until it is back (no other replica can lead them), the others stay writable."""
    single = KafkaSettings.model_validate({
        **cluster_settings.kafka.model_dump(), "topic_prefix": cluster_settings.kafka.topic_prefix + "r1.",
        "replication_factor": 1, "min_insync_replicas": 1})
    kafka.ensure_topics(single)
    return single


def test_the_agent_keeps_publishing_the_partitions_that_are_up_while_one_is_not(
    cluster: LocalKafkaCluster, cluster_settings: Settings, tmp_path: Path, namespaces: Namespaces,
) -> None:
    settings = single_copy_settings(cluster_settings)
    namespaces.add(cluster_settings.model_copy(update={"kafka": settings}), database=False)
    partition = partitions_of(settings, AGENT_TENANTS)
    samples_topic = settings.topic(topics.SAMPLES)
    publisher = Publisher(settings, Spool(tmp_path / "spool"), send_timeout=5.0, retry_seconds=2.0)
    windows = [agent_window(n) for n in range(5)]
    try:
        assert publisher.publish(windows[0]).sent == len(AGENT_TENANTS)
        victim = brokers.partition_leader(settings, samples_topic, partition[AGENT_TENANTS[0]])
        led_by_victim = {p for (topic, p), replicas in brokers.describe(settings, [samples_topic]).items()
                         if replicas.leader == victim}
        up = [tenant for tenant in AGENT_TENANTS if partition[tenant] not in led_by_victim]
        assert up, "every partition is led by one node: nothing to test"
        down = len(AGENT_TENANTS) - len(up)
        broker = brokers.node(cluster, victim)
        brokers.kill9(broker)
        try:
            for window in windows[1:3]:  # two windows while the victim's partitions are offline
                during = publisher.publish(window)
                assert (during.sent, during.spooled, during.dropped) == (len(up), down, 0)
                assert publisher.kafka_up
                time.sleep(publisher.retry_seconds)  # the agent's next window comes an interval later
        finally:
            brokers.restart(cluster, broker)

        def spool_empty_after_a_replay() -> bool:
            publisher.publish([])
            return publisher.spool.records == 0

        wait_until(spool_empty_after_a_replay, timeout=120, interval=publisher.retry_seconds,
                   message="the spool never emptied after the restart")
        assert publisher.publish(windows[3]).sent == len(AGENT_TENANTS)
    finally:
        publisher.close()
    every = {sample.event_id for window in windows[:4] for sample in window}
    assert stored_event_ids(settings) == every  # nothing lost (a replayed copy may be there twice)


def test_the_agent_loses_nothing_while_acks_all_waits_for_the_replicas_to_shrink(
    cluster: LocalKafkaCluster, cluster_settings: Settings, tmp_path: Path,
) -> None:
    """Replication 3, min ISR 2, acks=all: when a broker dies, every partition it follows holds
    produce requests until the leaders drop it from their ISR (replica.lag.time.max.ms, 30 s by
    default), so a window may be spooled whole; once leadership and ISR have moved, the spool
    empties and every window is stored."""
    settings = cluster_settings.kafka
    partition = partitions_of(settings, AGENT_TENANTS)
    samples_topic = settings.topic(topics.SAMPLES)
    publisher = Publisher(settings, Spool(tmp_path / "spool"), send_timeout=5.0, retry_seconds=2.0)
    windows = iter(agent_window(n) for n in range(1000))
    published = []
    try:
        first = next(windows)
        published.append(first)
        assert publisher.publish(first).sent == len(AGENT_TENANTS)
        victim = brokers.partition_leader(settings, samples_topic, partition[AGENT_TENANTS[0]])
        broker = brokers.node(cluster, victim)
        brokers.kill9(broker)
        try:
            def a_whole_window_goes_out() -> bool:
                window = next(windows)
                published.append(window)
                result = publisher.publish(window)
                assert result.dropped == 0 and result.sent + result.spooled == len(window)
                return result.sent == len(window) and publisher.spool.records == 0

            wait_until(a_whole_window_goes_out, timeout=180, interval=publisher.retry_seconds,
                       message="the agent never published a whole window with one broker down")
        finally:
            brokers.restart(cluster, broker)
        last = next(windows)
        published.append(last)
        assert publisher.publish(last).sent == len(AGENT_TENANTS)
    finally:
        publisher.close()
    every = {sample.event_id for window in published for sample in window}
    assert stored_event_ids(settings) == every  # nothing lost (a replayed copy may be there twice)
