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

from gpumeter.app.runtime.process import log_tail, read_pid, spawn, stop
from gpumeter.core.settings import KafkaSettings, cache_dir

KAFKA_VERSION = "4.1.1"


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
class LocalBroker:
    home: Path  # data_dir/kafka
    host: str
    port: int
    controller_port: int
    heap: str = "768m"

    @classmethod
    def from_settings(cls, data_dir: Path, kafka: KafkaSettings) -> LocalBroker:
        host, _, port = kafka.bootstrap.split(",")[0].rpartition(":")
        if not port.isdigit():
            raise RuntimeSetupError(f"kafka.bootstrap {kafka.bootstrap!r} needs host:port")
        return cls(data_dir / "kafka", host or "127.0.0.1", int(port), kafka.controller_port, kafka.heap)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

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

    def _write_properties(self) -> Path:
        data = self.home / "data"
        properties = self.home / "server.properties"
        properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://{self.host}:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={data}",
                    "num.partitions=3",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=6",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
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

    def start(self) -> bool:
        """Start the broker unless one already answers; True when this call started it."""
        if self.answers():
            return False
        if java_major() < 17:
            raise RuntimeSetupError("Kafka 4 needs Java 17 or newer")
        self.home.mkdir(parents=True, exist_ok=True)
        properties = self._write_properties()
        if not (self.home / "data" / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            result = subprocess.run(
                # --cluster-id=ID, not "-t ID": a base64 id may start with "-" and read as an option.
                self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                           f"--config={properties}"),
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                raise RuntimeSetupError(f"formatting Kafka storage failed: {result.stdout}{result.stderr}")
        spawn(self._java("kafka.Kafka", str(properties)), self.log_file, self.pid_file, self.home)
        return True

    def stop(self) -> bool:
        return stop(self.pid_file, timeout=40)

    def failure_detail(self) -> str:
        return f"see {self.log_file}:\n{log_tail(self.log_file)}"
