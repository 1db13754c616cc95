"""A Kafka cluster as platforms run it (contract 9; issue 28, points 1-2): three KRaft nodes of
the local runtime, clients over SASL_SSL only (SCRAM-SHA-512, a CA made in the test), topics
replicated 3 times with min ISR 2, and topic verification for managed clusters."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumeter.core import topics
from gpumeter.core.settings import KafkaSettings, Partitions, Settings
from gpumeter.infra import kafka
from testkit.secure_kafka import SecureKafka, secure_kafka
from tests.services import free_port, run_cli

pytestmark = pytest.mark.integration

USER = "gpumeter-worker"


class SecureCluster:
    """The cluster, with settings of one user under a topic prefix of their own per call."""

    def __init__(self, secure: SecureKafka) -> None:
        self.secure = secure

    def settings(self, **changes: object) -> KafkaSettings:
        values: dict[str, object] = {"compression": "zstd", "topic_prefix": f"t{time.monotonic_ns()}."}
        values.update(changes)
        return self.secure.settings(USER, **values)

    def password(self) -> str:
        return self.secure.password_files[USER].read_text().strip()


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    with secure_kafka(tmp_path_factory.mktemp("kafka-cluster"), [USER], nodes=3) as secure:
        yield SecureCluster(secure)


def test_topics_are_created_with_the_configured_replication_and_min_isr(
    secure_cluster: SecureCluster,
) -> None:
    settings = secure_cluster.settings()
    created = kafka.ensure_topics(settings)
    assert sorted(created) == sorted(settings.topic(spec.name) for spec in topics.ALL)
    client = kafka.admin(settings)
    try:
        described = client.describe_topics(created)
    finally:
        client.close()
    for topic in described:
        assert {len(p["replica_nodes"]) for p in topic["partitions"]} == {3}, topic["name"]
    assert kafka.topic_mismatches(settings) == []


def test_create_topics_false_verifies_and_names_each_topic_that_differs(
    secure_cluster: SecureCluster,
) -> None:
    settings = secure_cluster.settings()
    kafka.ensure_topics(settings)
    managed = settings.model_copy(update={"create_topics": False, "partitions": Partitions(samples=12)})
    with pytest.raises(kafka.TopicMismatch) as raised:
        kafka.ensure_topics(managed)
    lines = str(raised.value).splitlines()
    assert lines == [f"{settings.topic(topics.SAMPLES)}: 6 partitions, settings say 12"]

    elsewhere = settings.model_copy(update={"create_topics": False, "topic_prefix": "never-created."})
    with pytest.raises(kafka.TopicMismatch) as missing:
        kafka.ensure_topics(elsewhere)
    assert len(str(missing.value).splitlines()) == len(topics.ALL)
    assert all(": missing" in line for line in str(missing.value).splitlines())

    stricter = settings.model_copy(update={"create_topics": False, "min_insync_replicas": 3})
    problems = kafka.topic_mismatches(stricter)
    assert len(problems) == len(topics.ALL)
    assert all("min.insync.replicas 2, settings say 3" in line for line in problems)


def test_records_go_through_sasl_ssl_compressed_and_acknowledged_by_all(
    secure_cluster: SecureCluster,
) -> None:
    settings = secure_cluster.settings()
    kafka.ensure_topics(settings)
    topic = settings.topic(topics.SAMPLES)
    producer = kafka.make_producer(settings)
    try:
        for index in range(50):
            producer.send(topic, key=b"team-a", value=f"sample-{index}".encode()).get(timeout=60)
    finally:
        producer.close()
    consumer = kafka.make_consumer(settings, topic, auto_offset_reset="earliest", enable_auto_commit=False,
                                   consumer_timeout_ms=10_000)
    try:
        values = [message.value for message in consumer]
    finally:
        consumer.close()
    assert values == [f"sample-{index}".encode() for index in range(50)]


def test_a_wrong_password_fails_at_once_with_one_line_that_never_shows_a_password(
    secure_cluster: SecureCluster, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    settings = secure_cluster.settings(sasl_password_file=wrong)
    started = time.monotonic()
    with pytest.raises(kafka.KafkaAuthenticationFailed) as raised:
        kafka.wait_for_broker(settings, timeout=120)
    # Functional bound, not a benchmark: waiting out the 120 s would be the hang this forbids.
    assert time.monotonic() - started < 60
    message = str(raised.value)
    assert "\n" not in message and USER in message
    assert "not-the-password" not in message and secure_cluster.password() not in message


def free_port_run(length: int) -> int:
    """The first of ``length`` consecutive free loopback ports."""
    for _ in range(50):
        first = free_port()
        if first + length < 65535 and all(_port_free(first + i) for i in range(length)):
            return first
    raise RuntimeError(f"no run of {length} free ports")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_gpumeter_up_brokers_3_and_status_json(tmp_path: Path) -> None:
    """Contract 9's local runtime through the CLI: three nodes, topics replicated 3 times with min
    ISR 2, `status --json` naming each node, `down` stopping them all."""
    first = free_port_run(6)  # 3 broker ports, then 3 controller ports
    settings = Settings(data_dir=tmp_path / "data")
    settings.kafka.bootstrap = f"127.0.0.1:{first}"
    settings.kafka.controller_port = first + 3
    settings.kafka.heap = "384m"
    settings.clickhouse.dsn = f"http://127.0.0.1:{free_port()}/gpumeter"
    try:
        up = run_cli(settings, "up", "--brokers", "3", timeout=400)
        assert up.returncode == 0, up.stderr
        nodes = f"127.0.0.1:{first},127.0.0.1:{first + 1},127.0.0.1:{first + 2}"
        assert f"GPUMETER_KAFKA_BOOTSTRAP={nodes}" in up.stdout
        status = run_cli(settings, "status", "--json")
        assert status.returncode == 0, status.stderr
        document = json.loads(status.stdout)
        assert [(n["node_id"], n["port"], n["alive"]) for n in document["kafka"]] == [
            (1, first, True), (2, first + 1, True), (3, first + 2, True)]
        assert all(isinstance(n["pid"], int) for n in document["kafka"])
        assert document["clickhouse"]["alive"] is True and document["clickhouse"]["url"].startswith("http://")
        cluster = settings.kafka.model_copy(update={
            "bootstrap": f"127.0.0.1:{first},127.0.0.1:{first + 1}", "replication_factor": 3,
            "min_insync_replicas": 2})
        assert kafka.topic_mismatches(cluster) == []
        again = run_cli(settings, "status", "--json")  # the node count is remembered, no flag needed
        assert len(json.loads(again.stdout)["kafka"]) == 3
    finally:
        down = run_cli(settings, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped Kafka node 1, node 2, node 3" in down.stdout
    after = json.loads(run_cli(settings, "status", "--json").stdout)
    assert [n["alive"] for n in after["kafka"]] == [False, False, False]
    # Each node shut down cleanly: Kafka leaves this marker in its log directory only then, and a
    # node killed instead recovers every log at its next start. Nodes stopped one by one fail
    # this: the last one has no quorum left to leave and is killed.
    homes = [tmp_path / "data" / "kafka" / f"node-{node}" for node in (1, 2, 3)]
    assert [(home / "data" / ".kafka_cleanshutdown").exists() for home in homes] == [True, True, True]
