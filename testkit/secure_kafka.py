"""A Kafka cluster as platforms run it (contract 9), for tests: N KRaft nodes of the local
runtime, clients over SASL_SSL only (SCRAM-SHA-512 users, a CA made here), optionally Kafka
ACLs enforced and granted from gpumeter/core/kafka_acls.py.

The nodes reach each other over plaintext loopback listeners that no client is given:
``settings()`` names only the SASL_SSL listeners.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)
from kafka.protocol.admin import DescribeAclsRequest

from gpumeter.app.runtime.kafka_broker import ClientListener, LocalKafkaCluster
from gpumeter.core.kafka_acls import KafkaAcl, Operation, Resource
from gpumeter.core.settings import KafkaSettings
from gpumeter.infra import kafka
from testkit.certs import CertificateAuthority

# Granted everything (a super user) when ACLs are on: creates the topics and grants the ACLs.
ADMIN = "gpumeter-admin"
MECHANISM = "SCRAM-SHA-512"

_RESOURCES: dict[Resource, ResourceType] = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}
_OPERATIONS: dict[Operation, ACLOperation] = {
    "read": ACLOperation.READ,
    "write": ACLOperation.WRITE,
    "create": ACLOperation.CREATE,
    "describe": ACLOperation.DESCRIBE,
    "describe_configs": ACLOperation.DESCRIBE_CONFIGS,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kafka_acl(user: str, entry: KafkaAcl) -> ACL:
    """One entry of the ACL list as kafka-python's ACL: ALLOW for ``User:<user>`` from any host."""
    return ACL(principal=f"User:{user}", host="*", operation=_OPERATIONS[entry.operation],
               permission_type=ACLPermissionType.ALLOW,
               resource_pattern=ResourcePattern(_RESOURCES[entry.resource], entry.name,
                                                ACLResourcePatternType.LITERAL))


@dataclass(frozen=True)
class SecureKafka:
    cluster: LocalKafkaCluster
    ca_file: Path
    password_files: dict[str, Path]

    @property
    def plaintext_ports(self) -> set[int]:
        """The nodes' plaintext loopback listeners, INTERNAL and CONTROLLER: no client is given them."""
        return {port for node in self.cluster.nodes for port in (node.port, node.controller_port)}

    @property
    def client_ports(self) -> set[int]:
        """The SASL_SSL listeners."""
        return {node.client_listener.port for node in self.cluster.nodes if node.client_listener is not None}

    def settings(self, user: str = ADMIN, **changes: object) -> KafkaSettings:
        """KafkaSettings of ``user`` over SASL_SSL: the client listeners only."""
        count = len(self.cluster.nodes)
        values: dict[str, object] = {
            "bootstrap": self.cluster.bootstrap, "security_protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM, "sasl_username": user,
            "sasl_password_file": self.password_files[user], "ssl_cafile": self.ca_file,
            "replication_factor": min(3, count), "min_insync_replicas": min(2, count),
        }
        values.update(changes)
        return KafkaSettings.model_validate(values)

    def grant(self, user: str, entries: Iterable[KafkaAcl]) -> None:
        """Grant ``entries`` to ``user`` (as the administrator) and wait until every node
        enforces them."""
        wanted = [kafka_acl(user, entry) for entry in entries]
        if not wanted:
            return
        client = kafka.admin(self.settings(ADMIN))
        try:
            result = client.create_acls(wanted)
            if result["failed"]:
                raise RuntimeError(f"granting ACLs to {user} failed: {result['failed']}")
            self._wait_until_enforced(client, user, len(wanted))
        finally:
            client.close()

    def _wait_until_enforced(self, client: object, user: str, count: int, timeout: float = 30.0) -> None:
        # CreateAcls answers once the controllers committed the ACLs; each node's authorizer
        # takes them when it replays the metadata log. Ask every node for what it holds
        # (kafka-python's describe_acls asks any one node, hence its manager here).
        manager = client._manager  # type: ignore[attr-defined]
        request = DescribeAclsRequest(
            resource_type_filter=ResourceType.ANY, resource_name_filter=None,
            pattern_type_filter=ACLResourcePatternType.ANY, principal_filter=f"User:{user}", host_filter=None,
            operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY)
        deadline = time.monotonic() + timeout
        waiting = [node.node_id for node in self.cluster.nodes]
        while waiting:
            response = manager.run(manager.send, request, waiting[0])
            held = sum(len(resource.acls) for resource in response.resources)
            if held >= count:
                waiting.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {waiting[0]} holds {held} of {count} ACLs of {user}")
            time.sleep(0.1)


@contextlib.contextmanager
def secure_kafka(home: Path, users: Sequence[str], *, nodes: int = 3, authorize: bool = False,
                 heap: str = "384m") -> Iterator[SecureKafka]:
    """Start ``nodes`` KRaft nodes whose clients connect over SASL_SSL as one of ``users`` (each
    with a random password in a file of its own; ``ADMIN`` is always one of them). With
    ``authorize``, Kafka's StandardAuthorizer enforces ACLs and ``ADMIN`` is a super user."""
    names = tuple(dict.fromkeys([ADMIN, *users]))
    passwords = {name: secrets.token_urlsafe(24) for name in names}
    authority = CertificateAuthority(home / "tls")
    server = authority.issue("kafka-broker")
    listeners = [ClientListener(_free_port(), server.bundle, authority.certificate, tuple(passwords.items()),
                                MECHANISM, authorize=authorize, super_users=(ADMIN,) if authorize else ())
                 for _ in range(nodes)]
    cluster = LocalKafkaCluster.on_ports(home / "kafka", "127.0.0.1", [_free_port() for _ in range(nodes)],
                                         [_free_port() for _ in range(nodes)], heap, listeners)
    secrets_dir = home / "secrets"
    secrets_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, password in passwords.items():
        files[name] = secrets_dir / f"{name}.password"
        files[name].write_text(password + "\n")
        files[name].chmod(0o600)
    cluster.start()
    try:
        secure = SecureKafka(cluster, authority.certificate, files)
        kafka.wait_for_broker(secure.settings(ADMIN), timeout=120)
        yield secure
    finally:
        cluster.stop()


def remote_ports(pid: int) -> set[int]:
    """The remote ports of process ``pid``'s established TCP connections (Linux ``/proc``)."""
    inodes = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and inode in inodes:  # 01: ESTABLISHED
                ports.add(int(remote.rsplit(":", 1)[1], 16))
    return ports
