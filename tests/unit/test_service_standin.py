"""testkit/service_standin.py, the loopback stand-in for a Service + kube-proxy that
tests/kube/test_extender_replicas.py puts in front of two extender replicas: real sockets,
tiny replicas that answer each line with their name."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from testkit.service_standin import Endpoint, ServiceStandIn
from tests.support.polling import eventually


class Replica(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self, name: bytes) -> None:
        super().__init__(("127.0.0.1", 0), Answer)
        self.name = name
        self.connections: list[socket.socket] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> Endpoint:
        return ("127.0.0.1", self.server_address[1])

    def die(self) -> None:
        """As a killed process: its port refuses, its connections end."""
        self.shutdown()
        self.server_close()
        for sock in self.connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class Answer(socketserver.StreamRequestHandler):
    server: Replica

    def handle(self) -> None:
        self.server.connections.append(self.connection)
        for _ in self.rfile:
            self.wfile.write(self.server.name + b"\n")


@pytest.fixture
def replicas() -> Iterator[dict[bytes, Replica]]:
    started = {name: Replica(name) for name in (b"a", b"b")}
    yield started
    for replica in started.values():
        with contextlib.suppress(OSError):
            replica.die()


def ask(port: int) -> bytes:
    """One request on a new connection: the answering replica's name, b"" if reset."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"who\n")
            return sock.makefile("rb").readline().strip()
    except ConnectionError:
        return b""


def test_connections_alternate_and_a_dead_endpoint_resets_until_its_check_fails(
        replicas: dict[bytes, Replica]) -> None:
    alive = dict.fromkeys(replicas, True)
    names = {replica.endpoint: name for name, replica in replicas.items()}
    standin = ServiceStandIn(list(names), lambda e: alive[names[e]], check_every=0.2).start()
    try:
        assert sorted(ask(standin.port) for _ in range(4)) == [b"a", b"a", b"b", b"b"]

        dead = replicas[b"a"]
        dead.die()  # its port refuses now, yet it is still listed
        standin.route_next_connections(dead.endpoint, 1)
        assert ask(standin.port) == b""  # reset, as a listed dead endpoint is
        assert standin.snapshot()[dead.endpoint].refused == 1

        alive[b"a"] = False
        eventually(lambda: standin.ready == [replicas[b"b"].endpoint], "a out of rotation", timeout=10)
        assert [ask(standin.port) for _ in range(3)] == [b"b", b"b", b"b"]
    finally:
        standin.stop()


def test_a_replica_lost_mid_request_ends_the_callers_connection(replicas: dict[bytes, Replica]) -> None:
    replica = replicas[b"a"]
    standin = ServiceStandIn([replica.endpoint], lambda e: True).start()
    try:
        with socket.create_connection(("127.0.0.1", standin.port), timeout=5) as sock:
            reader = sock.makefile("rb")
            sock.sendall(b"who\n")
            assert reader.readline().strip() == b"a"
            standin.on_next_request(replica.endpoint, replica.die)
            sock.sendall(b"who\n")
            assert reader.readline() == b""  # closed, never answered
        assert standin.snapshot()[replica.endpoint].cut_mid_request == 1
    finally:
        standin.stop()
