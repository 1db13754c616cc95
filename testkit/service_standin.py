"""A stand-in for a ClusterIP Service and kube-proxy, on loopback.

The test control plane (testkit/kube_cluster.py) has no kube-proxy and no pod network, so a
Service's virtual IP routes nowhere. Where a test needs what the Service gives a caller - one
address in front of several replicas, of which only the Ready ones get new connections - this
plays that part, at the same layer kube-proxy does:

- L4 only: bytes are copied, never parsed (TLS passes through to the replica, as it does
  through a real Service; the caller's keep-alive connection stays on the replica it reached).
- Each new connection goes to the next Ready endpoint, round robin (kube-proxy's ipvs ``rr``;
  iptables mode picks at random - either spreads connections, neither balances requests).
- Readiness is re-checked every ``check_every`` seconds by the caller's probe, as the kubelet's
  readiness probe feeds the EndpointSlice; an endpoint leaves the rotation only when a check
  fails. Until then a connection sent to a dead endpoint fails as it would on a cluster where
  the pod's process died and its address is still listed: the connect is refused, so the
  caller's connection is reset.
- No Ready endpoint: the connection is reset (kube-proxy REJECTs a Service without endpoints).

What it is not: no per-node conntrack, no session affinity, no topology hints, and the
removal delay is ``check_every`` plus one probe, not the kubelet's ``periodSeconds x
failureThreshold`` plus the EndpointSlice round trip (docs/operations.md gives those numbers).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Endpoint = tuple[str, int]
Probe = Callable[[Endpoint], bool]


@dataclass
class EndpointStats:
    connections: int = 0  # connections sent to it
    refused: int = 0  # of those, refused (the endpoint was listed but dead)
    open: int = 0  # connections to it open now
    cut_mid_request: int = 0  # connections closed by the endpoint while a request was unanswered


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a refused connect through kube-proxy looks to the caller."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class ServiceStandIn:
    """``127.0.0.1:port`` in front of ``endpoints``; ``start()``, then ``stop()``."""

    def __init__(self, endpoints: Sequence[Endpoint], probe: Probe, *, check_every: float = 1.0,
                 connect_timeout: float = 2.0) -> None:
        self.endpoints = list(endpoints)
        self.probe = probe
        self.check_every = check_every
        self.connect_timeout = connect_timeout
        self.stats = {endpoint: EndpointStats() for endpoint in self.endpoints}
        self._lock = threading.Lock()
        self._ready: list[Endpoint] = []
        self._next = 0
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._on_request: dict[Endpoint, Callable[[], None]] = {}
        self._routed: dict[Endpoint, int] = {}
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> ServiceStandIn:
        self._check_all()  # Ready endpoints known before the first connection
        for target, name in ((self._check_loop, "readiness"), (self._accept_loop, "accept")):
            thread = threading.Thread(target=target, name=f"service-standin-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            doomed, self._sockets = self._sockets, set()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(10)

    # -- what the test reads ---------------------------------------------------------------------
    @property
    def ready(self) -> list[Endpoint]:
        with self._lock:
            return list(self._ready)

    def snapshot(self) -> dict[Endpoint, EndpointStats]:
        with self._lock:
            return {endpoint: EndpointStats(**vars(stats)) for endpoint, stats in self.stats.items()}

    def on_next_request(self, endpoint: Endpoint, action: Callable[[], None]) -> None:
        """Run ``action`` (say, kill the replica) when the caller next sends bytes to ``endpoint``
        on an open connection, before they are forwarded: the request is then in flight, sent by
        the caller and never answered by that replica."""
        with self._lock:
            self._on_request[endpoint] = action

    def route_next_connections(self, endpoint: Endpoint, count: int = 1) -> None:
        """Send the next ``count`` new connections to ``endpoint`` and keep it listed until they
        have gone, whatever its probe says meanwhile: the worst case of a dead endpoint still in
        the EndpointSlice (on a cluster, up to the probe's ``periodSeconds x failureThreshold``)
        met by the caller's next connections, made deterministic instead of left to the race
        between this stand-in's one-second check and the caller's retry."""
        with self._lock:
            self._routed[endpoint] = count
            if endpoint not in self._ready:
                self._ready.append(endpoint)

    # -- readiness (the EndpointSlice's part) ----------------------------------------------------
    def _check_all(self) -> None:
        ready = []
        for endpoint in self.endpoints:
            try:
                if self.probe(endpoint):
                    ready.append(endpoint)
            except Exception:  # a probe that raises is a failed probe
                pass
        with self._lock:
            ready += [e for e, left in self._routed.items() if left > 0 and e not in ready]
            self._ready = ready

    def _check_loop(self) -> None:
        while not self._stopping.wait(self.check_every):
            self._check_all()

    # -- connections (kube-proxy's part) ---------------------------------------------------------
    def _pick(self) -> Endpoint | None:
        with self._lock:
            routed = [e for e, left in self._routed.items() if left > 0]
            if routed:
                endpoint = routed[0]
                self._routed[endpoint] -= 1
            elif not self._ready:
                return None
            else:
                endpoint = self._ready[self._next % len(self._ready)]
                self._next += 1
            self.stats[endpoint].connections += 1
            return endpoint

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            endpoint = self._pick()
            if endpoint is None:
                _reset(inbound)
                continue
            try:
                outbound = socket.create_connection(endpoint, timeout=self.connect_timeout)
            except OSError:
                with self._lock:
                    self.stats[endpoint].refused += 1
                _reset(inbound)
                continue
            outbound.settimeout(None)
            with self._lock:
                self._sockets.update((inbound, outbound))
                self.stats[endpoint].open += 1
            threading.Thread(target=self._pump, args=(endpoint, inbound, outbound), daemon=True,
                             name="service-standin-pump").start()

    def _pump(self, endpoint: Endpoint, inbound: socket.socket, outbound: socket.socket) -> None:
        peers = {inbound: outbound, outbound: inbound}
        unanswered = False  # the caller sent bytes the endpoint has not answered yet
        try:
            while not self._stopping.is_set():
                readable, _, _ = select.select([inbound, outbound], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        if sock is outbound and unanswered:
                            with self._lock:
                                self.stats[endpoint].cut_mid_request += 1
                        return
                    if sock is inbound:
                        unanswered = True
                        with self._lock:
                            action = self._on_request.pop(endpoint, None)
                        if action is not None:
                            action()  # the request is dropped: the replica is gone before it
                            continue
                    else:
                        unanswered = False
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            if unanswered:
                with self._lock:
                    self.stats[endpoint].cut_mid_request += 1
        finally:
            with self._lock:
                self.stats[endpoint].open -= 1
                self._sockets.difference_update((inbound, outbound))
            # The replica's side is gone: the caller's connection ends too, as the replica's
            # kernel resetting it would end it.
            for sock in (outbound, inbound):
                with contextlib.suppress(OSError):
                    sock.close()
