"""The local Kafka broker of `gpumeter up`: one KRaft broker+controller from Maven Central jars."""

from __future__ import annotations

import base64
import re
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpumeter.app.runtime.process import log_tail, read_pid, spawn, stop, stop_together
from gpumeter.core.settings import KafkaSettings, cache_dir, is_loopback

KAFKA_VERSION = "4.1.1"
# A broker's controlled shutdown moves its partition leaders away first; past this it is killed.
STOP_TIMEOUT_SECONDS = 40.0


class RuntimeSetupError(RuntimeError):
    """A local service could not be installed or started; the message says why."""


def _resource(name: str) -> Path:
    return Path(str(resources.files("gpumeter.app.runtime") / name))


def jar_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


def ensure_jars() -> Path:
    """Fetch the broker and its dependencies with Maven into the cache, once."""
    target = jar_dir()
    marker = target / ".complete"
    if marker.exists():
        return target
    if shutil.which("mvn") is None:
        raise RuntimeSetupError("Maven (mvn) is needed once to fetch the Kafka broker jars; install Maven")
    target.mkdir(parents=True, exist_ok=True)
    command = [
        "mvn", "-q", "-B", "-f", str(_resource("kafka-pom.xml")),
        f"-Dkafka.version={KAFKA_VERSION}", "dependency:copy-dependencies",
        f"-DoutputDirectory={target}", "-DincludeScope=runtime",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        raise RuntimeSetupError("fetching Kafka jars with Maven failed: " + " | ".join(detail))
    marker.write_text(KAFKA_VERSION)
    return target


def java_major() -> int:
    java = shutil.which("java")
    if java is None:
        raise RuntimeSetupError("Java 17+ is needed for the local Kafka broker; `java` is not on PATH")
    output = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not match:
        raise RuntimeSetupError(f"cannot tell the Java version from: {output.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@dataclass(frozen=True)
class ClientListener:
    """A SASL_SSL listener for clients beside the brokers' own plaintext one: what a managed
    cluster presents (SCRAM users, a server certificate signed by a CA the clients trust). The
    brokers keep talking to each other on ``INTERNAL`` (loopback, plaintext)."""

    port: int
    certificate_file: Path  # PEM: the server's private key (PKCS#8, unencrypted) and certificate
    ca_file: Path  # PEM: the CA clients verify the server with
    users: tuple[tuple[str, str], ...]  # (name, password) SCRAM-SHA-512 credentials, set at format
    mechanism: str = "SCRAM-SHA-512"
    # Kafka ACLs enforced (StandardAuthorizer): a principal without ACLs reaches nothing, the
    # ``super_users`` (user names of ``users``) everything, e.g. an administrator granting ACLs.
    authorize: bool = False
    super_users: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocalBroker:
    """One KRaft node (broker + controller). Several of them with one ``voters`` string and one
    cluster id form a cluster (LocalKafkaCluster)."""

    home: Path  # data_dir/kafka, or data_dir/kafka/node-<id> in a cluster
    host: str
    port: int
    controller_port: int
    heap: str = "768m"
    node_id: int = 1
    voters: str = ""  # "1@127.0.0.1:9095,2@..."; empty: this node alone
    replication: int = 1  # of the internal topics (offsets, transactions)
    min_insync: int = 1
    client_listener: ClientListener | None = None

    @classmethod
    def from_settings(cls, data_dir: Path, kafka: KafkaSettings) -> LocalBroker:
        host, port = _first_address(kafka.bootstrap)
        return cls(data_dir / "kafka", host, port, kafka.controller_port, kafka.heap)

    @property
    def bootstrap(self) -> str:
        """Where clients connect: the SASL_SSL listener when there is one."""
        port = self.client_listener.port if self.client_listener is not None else self.port
        return f"{self.host}:{port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "kafka.log"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def _listeners(self) -> list[str]:
        controller = f"CONTROLLER://127.0.0.1:{self.controller_port}"
        if self.client_listener is None:
            return [
                f"listeners=PLAINTEXT://{self.host}:{self.port},{controller}",
                f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
            ]
        client = self.client_listener
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return [
            f"listeners=INTERNAL://{self.host}:{self.port},CLIENT://{self.host}:{client.port},{controller}",
            f"advertised.listeners=INTERNAL://{self.host}:{self.port},CLIENT://{self.host}:{client.port}",
            "listener.security.protocol.map=INTERNAL:PLAINTEXT,CLIENT:SASL_SSL,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=INTERNAL",
            f"sasl.enabled.mechanisms={client.mechanism}",
            f"listener.name.client.{client.mechanism.lower()}.sasl.jaas.config={jaas}",
            "listener.name.client.ssl.keystore.type=PEM",
            f"listener.name.client.ssl.keystore.location={client.certificate_file}",
            "listener.name.client.ssl.truststore.type=PEM",
            f"listener.name.client.ssl.truststore.location={client.ca_file}",
            *self._authorizer(client),
        ]

    def _authorizer(self, client: ClientListener) -> list[str]:
        if not client.authorize:
            return []
        # The nodes reach each other over INTERNAL and CONTROLLER, plaintext and so
        # unauthenticated: their principal is User:ANONYMOUS, which must be a super user for
        # replication and the metadata quorum to be allowed. (KRaft keeps SCRAM credentials in
        # the metadata log, so the controller listener cannot use SCRAM itself.) That is safe
        # only because both listeners bind to loopback and clients are only ever given CLIENT
        # (``bootstrap``); a node on any other address is refused here.
        if not is_loopback(self.host):
            raise RuntimeSetupError(f"Kafka ACLs with an unauthenticated internal listener need a loopback "
                                    f"host, not {self.host}")
        principals = ["User:ANONYMOUS", *(f"User:{name}" for name in client.super_users)]
        return [
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users={';'.join(principals)}",
        ]

    def _write_properties(self) -> Path:
        data = self.home / "data"
        properties = self.home / "server.properties"
        voters = self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}"
        properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={self.node_id}",
                    f"controller.quorum.voters={voters}",
                    *self._listeners(),
                    "controller.listener.names=CONTROLLER",
                    f"log.dirs={data}",
                    "num.partitions=3",
                    f"default.replication.factor={self.replication}",
                    f"min.insync.replicas={self.min_insync}",
                    f"offsets.topic.replication.factor={self.replication}",
                    "offsets.topic.num.partitions=6",
                    f"transaction.state.log.replication.factor={self.replication}",
                    f"transaction.state.log.min.isr={self.min_insync}",
                    f"share.coordinator.state.topic.replication.factor={self.replication}",
                    f"share.coordinator.state.topic.min.isr={self.min_insync}",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    "log.retention.hours=168",
                    "",
                ]
            )
        )
        return properties

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = str(ensure_jars() / "*")
        return [
            "java", f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={_resource('log4j2.xml')}", "-cp", classpath, main, *args,
        ]

    def start(self, cluster_id: str | None = None) -> bool:
        """Start the node unless one already answers; True when this call started it. Storage is
        formatted once, with ``cluster_id`` (the same for every node of a cluster)."""
        if self.answers():
            return False
        if java_major() < 17:
            raise RuntimeSetupError("Kafka 4 needs Java 17 or newer")
        self.home.mkdir(parents=True, exist_ok=True)
        properties = self._write_properties()
        if not (self.home / "data" / "meta.properties").exists():
            self._format(properties, cluster_id or new_cluster_id())
        spawn(self._java("kafka.Kafka", str(properties)), self.log_file, self.pid_file, self.home)
        return True

    def _format(self, properties: Path, cluster_id: str) -> None:
        # --cluster-id=ID, not "-t ID": a base64 id may start with "-" and read as an option.
        arguments = ["format", f"--cluster-id={cluster_id}", f"--config={properties}"]
        if self.client_listener is not None:
            # SCRAM credentials are written into the metadata log at format time (KRaft has no
            # ZooKeeper to hold them). This local tool's command line is the one place they pass.
            mechanism = self.client_listener.mechanism
            for name, password in self.client_listener.users:
                arguments += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        result = subprocess.run(self._java("kafka.tools.StorageTool", *arguments),
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeSetupError(f"formatting Kafka storage failed: {result.stdout}{result.stderr}")

    def stop(self) -> bool:
        return stop(self.pid_file, timeout=STOP_TIMEOUT_SECONDS)

    def failure_detail(self) -> str:
        return f"see {self.log_file}:\n{log_tail(self.log_file)}"



def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _first_address(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not port.isdigit():
        raise RuntimeSetupError(f"kafka.bootstrap {bootstrap!r} needs host:port")
    return host or "127.0.0.1", int(port)


@dataclass(frozen=True)
class LocalKafkaCluster:
    """``gpumeter up --brokers N`` (contract 9): N combined KRaft nodes on loopback. Node i
    (from 1) listens on the bootstrap port + i - 1 and its controller on the first free run
    after them; internal topics are replicated min(3, N) times with min ISR min(2, N), as
    the registry's topics are. One node is the single broker the runtime always had (same
    home, same ports), so an existing data directory keeps working."""

    nodes: tuple[LocalBroker, ...]

    @classmethod
    def from_settings(cls, data_dir: Path, kafka: KafkaSettings,
                      count: int | None = None) -> LocalKafkaCluster:
        count = count if count is not None else recorded_node_count(data_dir)
        if count == 1:
            return cls((LocalBroker.from_settings(data_dir, kafka),))
        host, port = _first_address(kafka.bootstrap)
        return cls.on_ports(data_dir / "kafka", host, [port + i for i in range(count)],
                            [max(kafka.controller_port, port + count) + i for i in range(count)], kafka.heap)

    @classmethod
    def on_ports(cls, home: Path, host: str, ports: list[int], controller_ports: list[int], heap: str,
                 listeners: list[ClientListener] | None = None) -> LocalKafkaCluster:
        count = len(ports)
        voters = ",".join(f"{i + 1}@127.0.0.1:{controller_ports[i]}" for i in range(count))
        return cls(tuple(
            LocalBroker(home / f"node-{i + 1}", host, ports[i], controller_ports[i], heap, node_id=i + 1,
                        voters=voters, replication=replication_for(count), min_insync=min_insync_for(count),
                        client_listener=listeners[i] if listeners else None)
            for i in range(count)))

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> list[LocalBroker]:
        """Start the nodes that do not answer; returns them. Nodes formatted together share
        one cluster id, kept beside them so a node formatted later (a wiped disk) joins."""
        id_file = self.nodes[0].home.parent / "cluster.id" if len(self.nodes) > 1 else None
        cluster_id = None
        if id_file is not None:
            id_file.parent.mkdir(parents=True, exist_ok=True)
            if not id_file.exists():
                id_file.write_text(new_cluster_id())
            cluster_id = id_file.read_text().strip()
        return [node for node in self.nodes if node.start(cluster_id)]

    def stop(self) -> list[LocalBroker]:
        """Stop every node at once (one by one, the last would find no quorum to leave and be
        killed); returns those that were running."""
        stopped = stop_together([node.pid_file for node in self.nodes], timeout=STOP_TIMEOUT_SECONDS)
        return [node for node in self.nodes if node.pid_file in stopped]


def replication_for(nodes: int) -> int:
    return min(3, nodes)


def min_insync_for(nodes: int) -> int:
    return min(2, nodes)


def _count_file(data_dir: Path) -> Path:
    return data_dir / "kafka" / "nodes"


def recorded_node_count(data_dir: Path) -> int:
    """How many nodes `gpumeter up` last started in this data directory (1 when never said)."""
    try:
        return max(1, int(_count_file(data_dir).read_text().strip()))
    except (OSError, ValueError):
        return 1


def record_node_count(data_dir: Path, count: int) -> None:
    path = _count_file(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{count}\n")
