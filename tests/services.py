"""Real Kafka and ClickHouse for the tests, found in this order (DESIGN.md, "Tests"):

1. env vars pointing at running services: GPUMETER_TEST_KAFKA_BOOTSTRAP and
   GPUMETER_TEST_CLICKHOUSE_DSN (test-only names, so a shell configured for a real
   deployment never points the suite at it by accident);
2. testcontainers, where a Docker daemon answers;
3. the local runtime of `gpumeter up` (Kafka broker from Maven jars, chdb's ClickHouse
   server) on free loopback ports in a temporary directory.

The tables' topology (contract 9) comes from GPUMETER_TEST_CLICKHOUSE_CLUSTER,
GPUMETER_TEST_CLICKHOUSE_REPLICATED and GPUMETER_TEST_CLICKHOUSE_SHARDED (1/true): every test's
settings carry it and its database is migrated for it. With GPUMETER_TEST_CLICKHOUSE_DSN unset,
GPUMETER_TEST_CLICKHOUSE_TOPOLOGY=two-shards runs the local ClickHouse as two shards
(testkit/clickhouse_cluster.py) with clickhouse.sharded on. docs/operations.md, "Running the tests
against a ClickHouse cluster".
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpumeter.app.runtime.chserver import LocalClickHouse
from gpumeter.app.runtime.kafka_broker import LocalBroker
from gpumeter.app.runtime.process import log_tail
from gpumeter.core.settings import KafkaSettings, Settings, settings_env
from gpumeter.infra import clickhouse
from gpumeter.infra import kafka as gkafka
from gpumeter.infra.tables import SINGLE_NODE, Topology

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # any failure means: no usable daemon
        return False


@dataclass
class Endpoints:
    kafka_bootstrap: str
    clickhouse_url: str  # http://host:port, no database
    origin: str  # env | testcontainers | local
    stop_callbacks: list[object] = field(default_factory=list)
    topology: Topology = SINGLE_NODE


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def env_topology() -> Topology:
    """The topology the tests' databases get (module docstring); one node by default."""
    cluster = os.environ.get("GPUMETER_TEST_CLICKHOUSE_CLUSTER") or None
    return Topology(cluster, _flag("GPUMETER_TEST_CLICKHOUSE_REPLICATED"),
                    _flag("GPUMETER_TEST_CLICKHOUSE_SHARDED"))


def start_local_broker(home: Path) -> LocalBroker:
    broker = LocalBroker(home, "127.0.0.1", free_port(), free_port(), heap="512m")
    broker.start()
    try:
        gkafka.wait_for_broker(broker.bootstrap, timeout=90)
    except gkafka.KafkaUnavailable:
        broker.stop()
        raise RuntimeError(f"local Kafka broker did not start: {log_tail(broker.log_file)}") from None
    return broker


def start_local_clickhouse(home: Path) -> LocalClickHouse:
    server = LocalClickHouse(home, "127.0.0.1", free_port(), free_port())
    server.start(timeout=90)
    return server


@contextlib.contextmanager
def session_endpoints(tmp: Path) -> Iterator[Endpoints]:
    env_kafka = os.environ.get("GPUMETER_TEST_KAFKA_BOOTSTRAP")
    env_ch = os.environ.get("GPUMETER_TEST_CLICKHOUSE_DSN")
    if env_kafka and env_ch:
        yield Endpoints(env_kafka, env_ch.rstrip("/"), "env", topology=env_topology())
        return
    if docker_answers():
        from testcontainers.community.clickhouse import ClickHouseContainer
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka_c, ClickHouseContainer() as ch_c:
            host = ch_c.get_container_host_ip()
            url = f"http://{ch_c.username}:{ch_c.password}@{host}:{ch_c.get_exposed_port(8123)}"
            yield Endpoints(kafka_c.get_bootstrap_server(), url, "testcontainers")
        return
    broker = start_local_broker(tmp / "kafka")
    try:
        if os.environ.get("GPUMETER_TEST_CLICKHOUSE_TOPOLOGY") == "two-shards":
            from testkit.clickhouse_cluster import two_shards

            with two_shards(tmp / "clickhouse", [(free_port(), free_port()) for _ in range(2)]) as cluster:
                yield Endpoints(broker.bootstrap, cluster.url, "local", topology=cluster.topology)
            return
        server = start_local_clickhouse(tmp / "clickhouse")
        try:
            yield Endpoints(broker.bootstrap, server.url, "local")
        finally:
            server.stop()
    finally:
        broker.stop()


def prepared(settings: Settings) -> Settings:
    """``settings`` with its topics created and its database migrated, as `gpumeter up` leaves them."""
    from gpumeter.app import schema

    gkafka.ensure_topics(settings.kafka)
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        schema.migrate(client, schema.topology(settings.clickhouse))
    finally:
        client.close()
    return settings


def isolated_settings(endpoints: Endpoints, data_dir: Path, clickhouse_url: str | None = None) -> Settings:
    """Settings for one test: its own topic prefix and ClickHouse database on the shared services."""
    tag = uuid.uuid4().hex[:10]
    kafka = KafkaSettings(bootstrap=endpoints.kafka_bootstrap, topic_prefix=f"t{tag}.")
    settings = Settings(data_dir=data_dir, kafka=kafka)
    settings.clickhouse.dsn = f"{clickhouse_url or endpoints.clickhouse_url}/t_{tag}"
    if clickhouse_url is None:  # a server of the test's own is one node
        topology = endpoints.topology
        settings.clickhouse.cluster = topology.cluster
        settings.clickhouse.replicated = topology.replicated
        settings.clickhouse.sharded = topology.sharded
    settings.worker.sink_batch_size = 500
    settings.worker.sink_batch_seconds = 0.2
    settings.worker.sink_max_backoff_seconds = 2.0
    settings.worker.metrics_port = 0  # workers of several tests must not compete for one port
    return settings


def delete_topics(kafka: KafkaSettings) -> None:
    """Delete a test's topics (those under its prefix), best effort.

    Left behind, they make every full metadata request (``list_topics``, each admin client's
    bootstrap, which ``ensure_topics`` and every worker's start-up make) slower for all later
    tests: 0.42 s per ``list_topics`` at 4,600 topics. The broker deletes asynchronously; a
    failure here is logged, never a test error (the broker may be the one a test stopped).
    """
    try:
        client = gkafka.admin(kafka)
    except gkafka.KafkaUnavailable as exc:
        log.warning("topics of %s not deleted: %s", kafka.topic_prefix, exc)
        return
    try:
        gkafka.delete_topics_under(kafka, client)
    except Exception as exc:  # cleanup only: what it leaves costs speed, not correctness
        log.warning("topics of %s not deleted: %s", kafka.topic_prefix, exc)
    finally:
        client.close()


class Namespaces:
    """Databases and topic prefixes of a test, removed once everything using them has stopped.

    ``worker_factory`` depends on this fixture, so its workers are stopped before the removal
    (a worker still running would create its database again on its next connection).
    """

    def __init__(self) -> None:
        self.databases: list[tuple[str, str | None]] = []
        self.topics: list[KafkaSettings] = []

    def add(self, settings: Settings, database: bool = True, topics: bool = True) -> None:
        """Remove this database and these topics after the test (either may be left out when it
        lives on a server of the test's own); copied now, as the test may change its settings."""
        if database:
            self.databases.append((settings.clickhouse.dsn, settings.clickhouse.cluster))
        if topics:
            self.topics.append(settings.kafka.model_copy())

    def remove(self) -> None:
        # Every MergeTree table keeps background tasks scheduled on the server (merge selection,
        # cleanup) whether or not anything is written to it: left behind, the databases of a
        # few hundred tests kept the shared ClickHouse server at 30-50 % of a core while idle,
        # taken from whatever ran next on a 2-core machine.
        for dsn, cluster in self.databases:
            clickhouse.drop_database(dsn, cluster)
        for kafka_settings in self.topics:
            delete_topics(kafka_settings)


def run_cli(settings: Settings, *args: str, stdin: bytes | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumeter.app.cli", *args], env=settings_env(settings), cwd=REPO,
        input=stdin.decode() if stdin is not None else None, capture_output=True, text=True,
        timeout=timeout, check=False,
    )


def wait_until(predicate: object, timeout: float, message: str, interval: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s: {message}")


@contextlib.contextmanager
def running_api(settings: Settings, log_path: Path) -> Iterator[str]:
    """`gpumeter api` as its own process on ``settings.api.listen``, answering ``/healthz``:
    its base URL, until the block ends (its output goes to ``log_path``)."""
    import httpx

    url = f"http://{settings.api.listen}"
    with log_path.open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "gpumeter.app.cli", "api"],
                                  env=settings_env(settings), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            assert server.poll() is None, log_path.read_text()
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(healthy, 60, "gpumeter api answers /healthz")
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)
