"""Large extender requests never starve the event loop the actuator shares (contract 6, issue 31).

``gpumeter hooks --role all`` runs the extender and the actuator on one asyncio loop: while a
request is decoded and checked on that loop, the actuator (and every other request, /healthz
included) waits. The server here is the production app on a loop of its own (testkit.live_hooks)
with a 5,000-node cluster loaded; a ticking task on that same loop stands in for the actuator.

Assertions are about order and counts, never about durations: every body is answered correctly,
the loop task kept ticking, and for bodies whose checking costs seconds (tens of thousands of
victim pods or containers, each one's GPU request worked out), ``/healthz`` requests sent after the
whole body was on the wire are answered before the big answer: the loop was free while the big
request was being handled.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gpumeter.core.models import GpuDevice, NodeTopology
from scheduler_hooks.extender.server import MAX_BODY_BYTES
from testkit.live_hooks import LiveHooks

pytestmark = [pytest.mark.integration, pytest.mark.security]

AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
NODE_COUNT = 5_000
MIB = 1024 * 1024
JUST_UNDER_LIMIT = MAX_BODY_BYTES - 64 * 1024
NAMES = [f"gpu-node-{i:05d}" for i in range(NODE_COUNT)]


def load(state: Any) -> None:
    """5,000 nodes of 8 free GPUs."""
    links = {f"{a}-{b}": "NV18" for a in range(8) for b in range(a + 1, 8)}
    for i, name in enumerate(NAMES):
        gpus = [GpuDevice(index=g, uuid=f"GPU-{i}-{g}", model="H100", numa_node=0) for g in range(8)]
        state.apply_topology(NodeTopology(cluster="c", node=name, gpus=gpus, links=links, at=AT))


@pytest.fixture(scope="module")
def hooks() -> Iterator[LiveHooks]:
    live = LiveHooks().start()
    live.call(lambda: load(live.state))
    yield live
    live.stop()


def pod(*, annotation: str = "", containers: int = 1, uid: str = "uid-trainer") -> dict[str, Any]:
    """A pod asking for 2 GPUs in each of its containers."""
    container = {"name": "main", "image": "trainer:1", "resources": {"limits": {GPU: "2"}}}
    return {
        "metadata": {"name": "trainer", "namespace": "team-a", "uid": uid,
                     "annotations": {"note": annotation} if annotation else {}},
        "spec": {"containers": [container] * containers, "priority": 0},
    }


def node(name: str, padding: int) -> dict[str, Any]:
    """A v1.Node as the scheduler sends it in full Nodes mode, ``padding`` bytes of labels."""
    return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "z" * padding}},
            "status": {"capacity": {GPU: "8"}, "allocatable": {GPU: "8"}}}


def padded_to(size: int, build: Callable[[int], dict[str, Any]]) -> bytes:
    """``build(padding)`` encoded, with padding chosen so the body is within 1% under ``size``."""
    base = len(json.dumps(build(0)))
    body = json.dumps(build(max(0, (size - base) * 99 // 100))).encode()
    assert size * 0.97 <= len(body) <= min(size, MAX_BODY_BYTES), len(body)
    return body


def names_body(size: int) -> bytes:
    return padded_to(size, lambda pad: {"Pod": pod(annotation="a" * pad), "NodeNames": NAMES})


def nodes_body(size: int) -> bytes:
    per_node = max(0, size // NODE_COUNT - 180)
    body = json.dumps({"Pod": pod(), "Nodes": {"items": [node(n, per_node) for n in NAMES]}}).encode()
    assert size * 0.9 <= len(body) <= min(size, MAX_BODY_BYTES), len(body)
    return body


def victims_body(size: int) -> bytes:
    """ExtenderPreemptionArgs with full victim pods (a scheduler not nodeCacheCapable): every
    victim's GPU request is checked, the costliest bytes the kube wire takes."""
    one = len(json.dumps(pod(uid="u-00000-00"))) + 2
    per_node = max(1, size // NODE_COUNT // one - 1)
    victims = {n: {"Pods": [pod(uid=f"u-{i:05d}-{j:02d}") for j in range(per_node)], "NumPDBViolations": 0}
               for i, n in enumerate(NAMES)}
    body = json.dumps({"Pod": pod(), "NodeNameToVictims": victims}).encode()
    assert size * 0.8 <= len(body) <= min(size, MAX_BODY_BYTES), len(body)
    return body


def containers_body(size: int) -> bytes:
    """A pod with tens of thousands of containers (the API server would refuse it; the wire
    must still answer it without holding everything else)."""
    one = len(json.dumps(pod()["spec"]["containers"][0])) + 2
    return json.dumps({"Pod": pod(containers=(size - 400_000) // one), "NodeNames": NAMES[:100]}).encode()


def check_filter(answer: dict[str, Any]) -> None:
    passed = answer["NodeNames"] if answer["NodeNames"] is not None else [
        item["metadata"]["name"] for item in answer["Nodes"]["items"]]
    assert passed == NAMES  # every node has 8 free GPUs, the pod asks for 2
    assert answer["FailedNodes"] == {} and answer["Error"] == ""


def check_preempt(answer: dict[str, Any]) -> None:
    victims = answer["NodeNameToMetaVictims"]
    assert sorted(victims) == NAMES  # no victim is protected: every node is offered
    assert all(entry["Pods"] and entry["NumPDBViolations"] == 0 for entry in victims.values())


def check_containers(answer: dict[str, Any]) -> None:
    # Each container asks for 2 GPUs: the pod needs thousands, no node of 8 fits it.
    assert answer["NodeNames"] == [] and sorted(answer["FailedNodes"]) == sorted(NAMES[:100])


@dataclass
class Case:
    route: str
    body: Callable[[], bytes]
    check: Callable[[dict[str, Any]], None]
    # Checking this body costs seconds of Python work: the loop must answer /healthz meanwhile.
    costly: bool = False


CASES = {
    "filter-names-1MB": Case("/kube/filter", lambda: names_body(1 * MIB), check_filter),
    "filter-names-16MB": Case("/kube/filter", lambda: names_body(JUST_UNDER_LIMIT), check_filter),
    "filter-nodes-1MB": Case("/kube/filter", lambda: nodes_body(1 * MIB), check_filter),
    "filter-nodes-16MB": Case("/kube/filter", lambda: nodes_body(JUST_UNDER_LIMIT), check_filter),
    "preempt-full-victims-16MB": Case("/kube/preempt", lambda: victims_body(JUST_UNDER_LIMIT),
                                      check_preempt, True),
    "filter-pod-of-containers-8MB": Case("/kube/filter", lambda: containers_body(8 * MIB),
                                         check_containers, True),
}


@dataclass
class Probes:
    """A ticking task on the server's loop (the actuator's stand-in) and /healthz round trips."""

    ticks: list[float] = field(default_factory=list)
    health: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, answered, status)
    stop: threading.Event = field(default_factory=threading.Event)


def _tick(probes: Probes) -> Callable[[], Any]:
    async def run() -> None:
        while not probes.stop.is_set():
            probes.ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    return run


def _ping(hooks: LiveHooks, probes: Probes, start: threading.Event) -> None:
    start.wait()
    while not probes.stop.is_set():
        connection = http.client.HTTPConnection("127.0.0.1", hooks.port, timeout=120)
        sent = time.monotonic()
        try:
            connection.request("GET", "/healthz")
            status = connection.getresponse().status
        finally:
            connection.close()
        probes.health.append((sent, time.monotonic(), status))


@pytest.mark.parametrize("name", list(CASES))
def test_a_large_body_is_answered_while_the_loop_keeps_serving(hooks: LiveHooks, name: str) -> None:
    case = CASES[name]
    body = case.body()
    probes = Probes()
    ticking = asyncio.run_coroutine_threadsafe(_tick(probes)(), hooks.loop)
    uploaded = threading.Event()
    pinger = threading.Thread(target=_ping, args=(hooks, probes, uploaded), daemon=True)
    pinger.start()
    connection = http.client.HTTPConnection("127.0.0.1", hooks.port, timeout=300)
    try:
        connection.request("POST", case.route, body=body, headers={"Content-Type": "application/json"})
        sent = time.monotonic()  # the whole body is in the socket: the server reads and handles it
        uploaded.set()
        response = connection.getresponse()
        answered = time.monotonic()
        status, payload = response.status, response.read()
    finally:
        connection.close()
        probes.stop.set()
        pinger.join(120)
        ticking.result(30)
    assert status == 200, payload[:300]
    case.check(json.loads(payload))
    assert all(code == 200 for _, _, code in probes.health)
    if case.costly:
        # Once the body is on the wire the server only reads its tail and then handles it: the
        # loop task keeps ticking and fresh /healthz connections are served all along.
        ticks = [t for t in probes.ticks if sent <= t <= answered]
        during = [h for h in probes.health if h[0] >= sent and h[1] <= answered]
        assert len(during) >= 10 and len(ticks) >= 10, (
            f"{len(during)} /healthz answered and {len(ticks)} loop ticks while {len(body):,} bytes "
            f"were being handled ({len(probes.health)} /healthz in all): the request held the event loop")


@functools.cache
def gzip_bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` bytes of a JSON array of zeros, about a thousandth that size."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    chunk = b"0," * (512 * 1024)
    parts = [packer.compress(b"[")]
    parts += [packer.compress(chunk) for _ in range(inflated // len(chunk))]
    return b"".join([*parts, packer.compress(b"0]"), packer.flush()])


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP"])
def test_a_compressed_body_is_refused_unread_never_inflated(hooks: LiveHooks, encoding: str) -> None:
    """Neither scheduler compresses an extender request (Go's http.Client sends bodies as they are).
    aiohttp inflated one before the handler saw it: 2 MB of gzip became 2 GB of work on the event
    loop before the 413. Now a request body with any Content-Encoding is 415, inflated by nobody."""
    bomb = gzip_bomb(2 * 1024**3)
    assert len(bomb) < 4 * 1024**2
    status, answer = hooks.request("POST", "/kube/filter", bomb, {"Content-Encoding": encoding})
    assert status == 415, answer[:200]
    assert "Content-Encoding" in json.loads(answer)["error"]
    # The next request on the same server is served as ever.
    assert hooks.request("GET", "/healthz")[0] == 200
