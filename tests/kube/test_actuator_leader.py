"""Two actuators, one Lease (contract 9; issue 30 point 1 and its faults line), on the real
kube-apiserver with real Kafka and ClickHouse.

Each actuator is a ``gpumeter hooks --role actuator`` process with its settings in the
environment and a kubeconfig holding a token of the hooks ServiceAccount (so its Lease calls
are also a check of the chart's actuator RBAC). Which process did what is read from the cluster,
never from the actuators' own word: the Lease's holderIdentity, the eviction notices every pod
ever carried (a watch), the pods' Events (their ``reportingInstance`` is the actuator's Lease
identity) and the preemption records in ClickHouse. The cluster helpers, the quota-event
publisher and the record readers are test_actuator.py's.

Lease timings are shortened (duration 8 s, renew deadline 5 s, retry 1 s) to keep the test
short; the only time bound asserted is the functional one: the follower took the Lease no later
than the lease duration plus two retry periods after the dead leader's last renewal, with a
margin for a loaded machine.
"""

from __future__ import annotations

import contextlib
import functools
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client as k8s

from gpumeter.core.settings import Settings, settings_env
from testkit.kube_cluster import Kube, write_kubeconfig
from tests.kube.fixtures import CreateGpuNodes
from tests.kube.test_actuator import (  # noqa: F401  (cluster: a fixture used by name)
    Cluster,
    PodWatch,
    cluster,
    decisions,
    eventually,
    handled_everything,
    publish,
    quota_event,
    stored_records,
    write_tenants,
)
from tests.kube.test_rbac import SA_NAMESPACE, service_account_token

pytestmark = [pytest.mark.kube, pytest.mark.integration]

LEASE_DURATION, RENEW_DEADLINE, RETRY = 8, 5.0, 1.0
# A loaded 2-core machine: process stalls and API latency on top of the protocol's own bound.
TAKEOVER_MARGIN_S = 10.0
REPO = Path(__file__).resolve().parents[2]


# -- a loopback TCP proxy whose link can be cut ---------------------------------------------------


class CuttableProxy:
    """127.0.0.1:<port> forwarded to the API server; ``cut()`` closes every connection and stops
    listening (connections are refused, as for a partitioned node), ``heal()`` listens again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.heal()

    def heal(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            doomed, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                inbound, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                outbound = socket.create_connection(self.target, timeout=10)
            except OSError:
                inbound.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    inbound.close()
                    outbound.close()
                    return
                self._sockets.update((inbound, outbound))
            threading.Thread(target=self._pump, args=(inbound, outbound), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()


# -- actuator processes -------------------------------------------------------------------------


class ActuatorProcess:
    """``gpumeter hooks --role actuator``; its Lease identity is read from its first line."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpumeter.app.cli", "hooks", "--role", "actuator"],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        self.identity: str = eventually(self._identity, f"actuator identity in {log_path.name}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _identity(self) -> str | None:
        assert self.process.poll() is None, self.log()
        found = re.search(r"actuator (\S+) waiting for lease", self.log())
        return found.group(1) if found else None

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


StartActuator = Callable[..., ActuatorProcess]


@pytest.fixture
def actuators(settings: Settings, cluster: Cluster, tmp_path: Path) -> Iterator[StartActuator]:  # noqa: F811
    started: list[ActuatorProcess] = []
    token = service_account_token(cluster.api)

    def start(name: str, tenants: Path, lease: str, server: str | None = None) -> ActuatorProcess:
        kubeconfig = tmp_path / f"{name}.kubeconfig"
        write_kubeconfig(kubeconfig, server or cluster.kube.server, cluster.kube.ca_file, token)
        env = settings_env(settings) | {
            "KUBECONFIG": str(kubeconfig),
            "GPUMETER_TENANTS": str(tenants),
            "GPUMETER_HOOKS_LEASE_NAME": lease,
            "GPUMETER_HOOKS_LEASE_NAMESPACE": SA_NAMESPACE,
            "GPUMETER_HOOKS_LEASE_DURATION_SECONDS": str(LEASE_DURATION),
            "GPUMETER_HOOKS_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE),
            "GPUMETER_HOOKS_RETRY_PERIOD_SECONDS": str(RETRY),
            "GPUMETER_HOOKS_EVICTION_MAX_BACKOFF_SECONDS": "1",
        }
        running = ActuatorProcess(env, tmp_path / f"{name}.log")
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
        print(f"--- {running.log_path.name} ---\n{running.log()[-6000:]}")  # shown when the test fails


# -- reading the cluster -------------------------------------------------------------------------


def lease_spec(api: k8s.ApiClient, name: str) -> dict[str, Any]:
    try:
        lease = k8s.CoordinationV1Api(api).read_namespaced_lease(name, SA_NAMESPACE)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    spec = lease.spec
    if spec is None:
        return {}
    return {"holder": spec.holder_identity, "renewed": spec.renew_time, "acquired": spec.acquire_time,
            "transitions": spec.lease_transitions}


def held_by(api: k8s.ApiClient, lease: str, identity: str) -> dict[str, Any] | None:
    spec = lease_spec(api, lease)
    return spec if spec.get("holder") == identity else None


def pod_events(core: k8s.CoreV1Api, namespace: str, reason: str) -> dict[str, list[str]]:
    """Pod name -> reportingInstance of every Event with ``reason`` on it."""
    found: dict[str, list[str]] = {}
    for event in core.list_namespaced_event(namespace).items:
        if event.reason == reason and event.involved_object is not None:
            found.setdefault(str(event.involved_object.name), []).append(str(event.reporting_instance))
    return found


def seconds_between(earlier: datetime, later: datetime) -> float:
    return (later - earlier).total_seconds()


# -- tests ----------------------------------------------------------------------------------------


def test_leader_killed_mid_plan_every_victim_evicted_exactly_once_by_whoever_leads(
    settings: Settings,
    cluster: Cluster,  # noqa: F811
    gpu_nodes: CreateGpuNodes,
    actuators: StartActuator,
    tmp_path: Path,
) -> None:
    tag = secrets.token_hex(3)
    team, bystander = f"lk-{tag}", f"lb-{tag}"
    lease = f"actuator-{tag}"
    cluster.forget_queues(team, bystander)
    tenants = write_tenants(
        tmp_path / "tenants.yaml",
        [
            {"tenant": team, "gpu_hours": "10", "on_exceed": "preempt", "grace_seconds": 3},
            {"tenant": bystander, "gpu_hours": "100", "on_exceed": "preempt", "grace_seconds": 0},
        ],
    )
    [node] = gpu_nodes(1, gpus_per_node=8)
    ns, ns_b = cluster.namespace(team), cluster.namespace(bystander)
    victims = ["v-1", "v-2", "v-budget"]
    for name in victims:
        cluster.pod(ns, name, node=node, labels={"app": "budgeted"} if name == "v-budget" else None)
    cluster.pod(ns_b, "b-1", node=node)
    for namespace, name in [*((ns, v) for v in victims), (ns_b, "b-1")]:
        eventually(functools.partial(cluster.running, namespace, name), f"{name} Running")
    policy = k8s.PolicyV1Api(cluster.api)
    policy.create_namespaced_pod_disruption_budget(ns, k8s.V1PodDisruptionBudget.model_validate({
        "metadata": {"name": "budget"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "budgeted"}}},
    }))

    def budget_allows_none() -> bool:
        status = policy.read_namespaced_pod_disruption_budget("budget", ns).status
        return status is not None and status.current_healthy == 1 and status.disruptions_allowed == 0

    eventually(budget_allows_none, "PDB computed: no disruption allowed")

    watch = PodWatch(cluster.core, [ns, ns_b])
    try:
        first = actuators("first", tenants, lease)
        eventually(lambda: held_by(cluster.api, lease, first.identity), "first leads")
        second = actuators("second", tenants, lease)
        assert held_by(cluster.api, lease, first.identity)  # the follower does not take a live lease

        exceeded = quota_event(team, "gpu_hours", "exceeded", limit="10.000000", used="10.500000")
        publish(settings, exceeded)
        # Mid-plan: two victims evicted, the third refused by its budget and being retried.
        for name in ("v-1", "v-2"):
            eventually(functools.partial(cluster.gone, ns, name), f"{name} evicted")
        eventually(lambda: ("v-budget", "pdb_refused") in decisions(settings), "PDB refusal recorded")
        first.kill9()
        last_renewal = lease_spec(cluster.api, lease)  # none can come after the kill
        assert last_renewal["holder"] == first.identity
        policy.patch_namespaced_pod_disruption_budget(
            "budget", ns, {"spec": {"minAvailable": 0}}, _content_type="application/merge-patch+json")

        taken = eventually(lambda: held_by(cluster.api, lease, second.identity),
                           "second takes the lease")
        assert taken["transitions"] == last_renewal["transitions"] + 1
        waited = seconds_between(last_renewal["renewed"], taken["acquired"])
        assert waited <= LEASE_DURATION + 2 * RETRY + TAKEOVER_MARGIN_S, waited
        assert waited >= LEASE_DURATION - RETRY, waited  # it did wait for the lease to run out

        eventually(lambda: cluster.gone(ns, "v-budget"), "v-budget evicted by the new leader")
        eventually(lambda: handled_everything(settings), "event committed")
        def eviction_of_the_last_posted() -> dict[str, list[str]] | None:
            found = pod_events(cluster.core, ns, "Evicted")
            return found if found.get("v-budget") else None

        evicted_by = eventually(eviction_of_the_last_posted, "Evicted event of v-budget")
        for name in victims:
            [text] = watch.noticed(ns, name)  # noticed once, never again by the new leader
            assert exceeded.event_id in text
            assert len(evicted_by.get(name, [])) <= 1, evicted_by
        assert evicted_by["v-budget"] == [second.identity]
        assert watch.noticed(ns_b, "b-1") == [] and cluster.alive(ns_b, "b-1")
    finally:
        watch.close()
    rows = stored_records(settings)
    assert {(pod, action) for _id, pod, action, _cause, _n in rows} == {
        *((name, action) for name in victims for action in ("noticed", "evicted")),
        ("v-budget", "pdb_refused"),
        (f"gpumeter-{team}", "queue_closed"),
    }
    assert all(copies == 1 for *_rest, copies in rows), rows


def test_a_partitioned_leader_stops_acting_and_the_other_takes_over(
    settings: Settings,
    cluster: Cluster,  # noqa: F811
    gpu_nodes: CreateGpuNodes,
    actuators: StartActuator,
    kube: Kube,
    tmp_path: Path,
) -> None:
    tag = secrets.token_hex(3)
    team = f"lp-{tag}"
    lease = f"actuator-{tag}"
    cluster.forget_queues(team)
    # The deadline falls after the partition heals: an old leader that had not stopped would
    # still be counting down to it, and evict.
    tenants = write_tenants(
        tmp_path / "tenants.yaml",
        [{"tenant": team, "gpu_hours": "10", "on_exceed": "preempt", "grace_seconds": 40}],
    )
    [node] = gpu_nodes(1, gpus_per_node=4)
    ns = cluster.namespace(team)
    victims = ["v-1", "v-2"]
    for name in victims:
        cluster.pod(ns, name, node=node)
    for name in victims:
        eventually(functools.partial(cluster.running, ns, name), f"{name} Running")
    target = urlsplit(kube.server)
    proxy = CuttableProxy((str(target.hostname), int(target.port or 443)))
    watch = PodWatch(cluster.core, [ns])
    try:
        cut_off = actuators("partitioned", tenants, lease, server=f"https://127.0.0.1:{proxy.port}")
        eventually(lambda: held_by(cluster.api, lease, cut_off.identity), "it leads")
        other = actuators("other", tenants, lease)

        exceeded = quota_event(team, "gpu_hours", "exceeded", limit="10.000000", used="11.000000")
        publish(settings, exceeded)
        for name in victims:
            eventually(functools.partial(watch.noticed, ns, name), f"{name} noticed")
        eventually(lambda: handled_everything(settings), "event committed by the leader")

        proxy.cut()
        eventually(lambda: "lost lease" in cut_off.log(), "the cut-off leader stops acting")
        eventually(lambda: held_by(cluster.api, lease, other.identity), "the other takes over")
        proxy.heal()  # back in touch, deadline still ahead: it must stay a follower and do nothing

        for name in victims:
            eventually(functools.partial(cluster.gone, ns, name), f"{name} evicted", timeout=120)

        def every_eviction_posted() -> dict[str, list[str]] | None:
            found = pod_events(cluster.core, ns, "Evicted")
            return found if len(found) == len(victims) else None

        evicted_by = eventually(every_eviction_posted, "Evicted events")
        noticed_by = pod_events(cluster.core, ns, "EvictionNotice")
        assert cut_off.process.poll() is None  # alive and connected again, yet it evicted nobody
    finally:
        watch.close()
        proxy.cut()
    assert evicted_by == {name: [other.identity] for name in victims}
    assert noticed_by == {name: [cut_off.identity] for name in victims}
    for name in victims:
        [text] = watch.noticed(ns, name)  # the new leader kept the original notice and deadline
        assert exceeded.event_id in text
    assert decisions(settings) == {
        *((name, action) for name in victims for action in ("noticed", "evicted")),
        (f"gpumeter-{team}", "queue_closed"),
    }
