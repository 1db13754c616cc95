"""An extender replica lost while kube-scheduler calls it (contract 9; issue 30, "Faults").

Two ``gpumeter hooks --role extender`` processes with the chart's TLS (serving certificate for
the Service's DNS name, client certificates required), reading the real Kafka and the real
kube-apiserver of tests/kube. kube-scheduler runs the chart's own kube-scheduler-config.yaml
(deploy/rendered/gpumeter.yaml) with only the address it dials and the certificate paths
changed: the test control plane has no kube-proxy, so the Service is played by
testkit/service_standin.py (L4, round robin over the endpoints whose /readyz answers,
re-checked every second; a connection sent to a dead endpoint is refused until then), and the
scheduler still verifies the replicas' certificate against the Service's DNS name.

GPU pods are created continuously on KWOK GPU nodes; one replica is SIGKILLed at the moment the
scheduler sends it a request (that call is lost), its address stays listed for the scheduler's
next connection (refused, as before readiness catches up on a cluster), and pods keep coming.
Expected: every pod is bound, each within a
few scheduling attempts (kube-scheduler's own histogram), never to the node the extenders' policy
refuses (the agent reports all its GPUs held); a blocked tenant's pod is refused by the
surviving replica with gpumeter's message. No timing is asserted: bounded polls only.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import secrets
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml
from kubernetes import client as k8s

from gpumeter.core import topics
from gpumeter.core.kube import TENANT_LABEL
from gpumeter.core.models import GpuAssignment, NodeAllocation, QuotaEvent
from gpumeter.core.settings import Settings, settings_env
from gpumeter.infra import kafka as gkafka
from testkit.certs import CertificateAuthority, Issued
from testkit.kube_cluster import Kube, free_port, wait_for_default_service_account
from testkit.service_standin import Endpoint, ServiceStandIn
from tests.kube.chart import PRODUCTION_VALUES, render
from tests.kube.fixtures import CreateGpuNodes, StartScheduler
from tests.kube.pods import POOL_LABEL, pod_manifest
from tests.kube.test_extender_e2e import THIS_MONTH, shipped_scheduler_config, topology
from tests.support import polling
from tests.support.rendered import NAMESPACE, find, rendered

pytestmark = pytest.mark.kube

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 180.0
PODS = 36
BLOCKED = "team-blocked"
# kube-scheduler's pod_scheduling_attempts buckets are 1, 2, 4, 8, 16. A pod meets the lost
# replica at most while the dead endpoint is still listed (one readiness period here), and its
# back-off (1 s, then doubling) spaces its attempts: 4 is already generous.
MAX_ATTEMPTS = 4
AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)

eventually = polling.eventually


# -- the chart's side ------------------------------------------------------------------------------


def go_duration_seconds(text: str) -> float:
    """A Go duration as the scheduler config carries it ("2s", "500ms", "1m30s")."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


@dataclass(frozen=True)
class ExtenderService:
    name: str
    namespace: str
    port: int
    cluster_ip: str | None

    @property
    def dns_name(self) -> str:
        return f"{self.name}.{self.namespace}.svc"


def extender_service(docs: list[dict[str, Any]], release: str = "gpumeter") -> ExtenderService:
    service = find(docs, "Service", f"{release}-extender")
    [port] = service["spec"]["ports"]
    return ExtenderService(service["metadata"]["name"], service["metadata"]["namespace"], port["port"],
                           service["spec"].get("clusterIP"))


def kube_scheduler_extender(docs: list[dict[str, Any]], release: str = "gpumeter") -> dict[str, Any]:
    configmap = find(docs, "ConfigMap", f"{release}-scheduler-config")
    [extender] = yaml.safe_load(configmap["data"]["kube-scheduler-config.yaml"])["extenders"]
    result: dict[str, Any] = extender
    return result


def test_the_shipped_scheduler_configuration_calls_the_service_and_waits_for_it() -> None:
    """The kube-scheduler extender configuration the chart renders names the Service (never a
    pod), refuses to carry on without gpumeter, and bounds each call."""
    docs = rendered()
    service = extender_service(docs)
    extender = kube_scheduler_extender(docs)
    assert extender["urlPrefix"] == f"https://{service.dns_name}:{service.port}/kube"
    assert extender["tlsConfig"]["serverName"] == service.dns_name
    assert extender["ignorable"] is False
    # Long enough for a filter over thousands of nodes on a busy replica (milliseconds), short
    # enough that a replica hung mid-call stalls the scheduling cycle for seconds, not the
    # scheduler's 5 s default.
    assert 0.5 <= go_duration_seconds(extender["httpTimeout"]) <= 5.0
    # What makes "the other answers" true: two replicas, at most one down by choice, never on
    # one node, and the Service selects the Deployment's pods on the port the container serves.
    deployment = find(docs, "Deployment", service.name)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    [term] = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    assert find(docs, "PodDisruptionBudget", service.name)["spec"] == {
        "minAvailable": 1, "selector": deployment["spec"]["selector"]}
    selected = find(docs, "Service", service.name)["spec"]
    assert selected["selector"].items() <= labels.items()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [port] = selected["ports"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]] == service.port
    assert container["command"] == ["gpumeter", "hooks", "--role", "extender"]


def test_with_a_fixed_service_address_the_scheduler_dials_it_and_still_checks_the_dns_name() -> None:
    """A static-pod kube-scheduler (host network, no cluster DNS) is given the Service's fixed
    ClusterIP (production example values); the certificate is still checked for the DNS name."""
    docs = render("gpumeter", NAMESPACE, [PRODUCTION_VALUES])
    service = extender_service(docs)
    extender = kube_scheduler_extender(docs)
    assert service.cluster_ip
    assert extender["urlPrefix"] == f"https://{service.cluster_ip}:{service.port}/kube"
    assert extender["tlsConfig"]["serverName"] == service.dns_name
    assert extender["ignorable"] is False


# -- replicas and the Service stand-in -------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    authority: CertificateAuthority
    server: Issued
    scheduler: Issued
    probe: Issued


def certificates(directory: Path, service: ExtenderService) -> Certificates:
    """What cert-manager would issue for the chart: one CA signing the replicas' serving
    certificate (the Service's DNS name; 127.0.0.1 too, which the in-pod probe dials) and the
    clients' (the scheduler's, the readiness probe's)."""
    authority = CertificateAuthority(directory)
    return Certificates(
        authority,
        authority.issue("gpumeter-extender", hosts=(service.dns_name, "127.0.0.1")),
        authority.issue("kube-scheduler", server=False),
        authority.issue("readiness-probe", server=False),
    )


def client_context(certs: Certificates, client: Issued) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.authority.certificate))
    context.load_cert_chain(str(client.certificate), str(client.key))
    return context


class Replica:
    """One ``gpumeter hooks --role extender`` process (one pod of the Deployment)."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path, port: int,
                 context: ssl.SSLContext, server_name: str) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self.context = context
        self.server_name = server_name
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpumeter.app.cli", "hooks", "--role", "extender"],
                env=env | {"GPUMETER_HOOKS_LISTEN": f"127.0.0.1:{port}"}, cwd=REPO, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def endpoint(self) -> Endpoint:
        return ("127.0.0.1", self.port)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, bytes]:
        """GET over TLS with the probe's client certificate; (0, b"") when nothing answers."""
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=3, context=self.context)
        try:
            connection.request("GET", path, headers={"Host": self.server_name})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, ssl.SSLError, http.client.HTTPException):
            return 0, b""
        finally:
            connection.close()

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def filter_calls(self) -> float:
        status, body = self.get("/metrics")
        assert status == 200, f"{self.name} /metrics: {status}"
        for line in body.decode().splitlines():
            if line.startswith('gpumeter_hooks_requests_total{code="200",verb="kube.filter"}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

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


# -- the cluster's side ----------------------------------------------------------------------------


@contextlib.contextmanager
def labelled_namespace(kube: Kube, core: k8s.CoreV1Api, tenant: str) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    meta = k8s.V1ObjectMeta(name=name, labels={TENANT_LABEL: tenant})
    core.create_namespace(k8s.V1Namespace(metadata=meta))
    try:
        with kube.api_client() as api:
            wait_for_default_service_account(api, name, kube.processes)
        yield name
    finally:
        core.delete_namespace(name)


def bound_node(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
    spec = core.read_namespaced_pod(name, namespace).spec
    return spec.node_name if spec else None


def failures(core: k8s.CoreV1Api, namespace: str) -> dict[str, list[str]]:
    """Pod name -> the messages of its FailedScheduling events."""
    found: dict[str, list[str]] = {}
    for event in core.list_namespaced_event(namespace).items:
        if event.reason == "FailedScheduling" and event.involved_object is not None:
            found.setdefault(str(event.involved_object.name), []).append(str(event.message))
    return found


def scheduling_attempts(kube: Kube, port: int) -> dict[str, float]:
    """kube-scheduler's pod_scheduling_attempts histogram: {"le": cumulative count, ..., "count": n}."""
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {kube.token}"})
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        bucket = re.match(r'scheduler_pod_scheduling_attempts_bucket\{le="([^"]+)"\} (\S+)', line)
        if bucket:
            found[bucket.group(1)] = float(bucket.group(2))
        elif line.startswith("scheduler_pod_scheduling_attempts_count "):
            found["count"] = float(line.split()[1])
    return found


def publish(settings: Settings, topic: str, key: str, value: str) -> None:
    producer = gkafka.make_producer(settings.kafka)
    try:
        producer.send(settings.kafka.topic(topic), key=key.encode(), value=value.encode())
        producer.flush(30)
    finally:
        producer.close(5)


# -- the fault -------------------------------------------------------------------------------------


@pytest.mark.integration
def test_an_extender_replica_killed_mid_call_the_other_answers_every_pod(
    settings: Settings,
    kube: Kube,
    kube_namespace: str,
    gpu_nodes: CreateGpuNodes,
    kube_scheduler: StartScheduler,
    tmp_path: Path,
) -> None:
    service = extender_service(rendered())
    certs = certificates(tmp_path / "ca", service)
    pool = kube_namespace
    with kube.api_client() as api, labelled_namespace(kube, k8s.CoreV1Api(api), BLOCKED) as blocked_ns:
        core = k8s.CoreV1Api(api)
        allowed = gpu_nodes(3, gpus_per_node=16, labels={POOL_LABEL: pool}, name_prefix="allowed")
        # The agent on this node reports every GPU held (by a process the kubelet assigned them
        # to; kube still counts 8 free): the extenders' placement refuses it, kube would not.
        [refused] = gpu_nodes(1, gpus_per_node=8, labels={POOL_LABEL: pool}, name_prefix="held")
        held = NodeAllocation(cluster="test", node=refused, at=AT, assignments=[GpuAssignment(
            namespace="outside", pod="outside", pod_uid="outside-uid", gpu_indices=list(range(8)))])
        layout = topology(refused, 8, lambda a, b: "NV18")
        publish(settings, topics.TOPOLOGY, refused, layout.model_dump_json())
        publish(settings, topics.ALLOCATION, refused, held.model_dump_json())
        exceeded = QuotaEvent(event_id=f"{BLOCKED}-exceeded", tenant=BLOCKED, metric="gpu_hours",
                              level="exceeded", threshold="1", used="10.5", limit="10",
                              period=THIS_MONTH, at=AT)
        publish(settings, topics.QUOTA_EVENTS, BLOCKED, exceeded.model_dump_json())
        tenants = tmp_path / "tenants.yaml"
        policy = {"tenant": BLOCKED, "gpu_hours": 10, "on_exceed": "block"}
        tenants.write_text(yaml.safe_dump({"tenants": [policy]}))

        # The chart's wiring of the extender container (extender.tls.enabled, the default).
        env = settings_env(settings) | {
            "KUBECONFIG": str(kube.kubeconfig),
            "GPUMETER_TENANTS": str(tenants),
            "GPUMETER_HOOKS_TLS_CERT": str(certs.server.certificate),
            "GPUMETER_HOOKS_TLS_KEY": str(certs.server.key),
            "GPUMETER_HOOKS_CLIENT_CA": str(certs.authority.certificate),
        }
        probe = client_context(certs, certs.probe)
        replicas = [Replica(name, env, tmp_path / f"{name}.log", free_port(), probe, service.dns_name)
                    for name in ("extender-a", "extender-b")]
        standin: ServiceStandIn | None = None
        creator: threading.Thread | None = None
        try:
            for replica in replicas:
                def up(replica: Replica = replica) -> bool:
                    assert replica.process.poll() is None, replica.log()
                    return replica.ready()

                eventually(up, f"{replica.name} ready", timeout=WAIT_S)
            by_endpoint = {replica.endpoint: replica for replica in replicas}
            standin = ServiceStandIn(list(by_endpoint), lambda e: by_endpoint[e].ready()).start()
            assert sorted(standin.ready) == sorted(by_endpoint)

            config = shipped_scheduler_config()
            config.pop("clientConnection")  # the fixture points it at the test cluster
            [extender] = config["extenders"]
            shipped = urlsplit(extender["urlPrefix"])
            assert (shipped.hostname, shipped.port) == (service.dns_name, service.port)
            extender["urlPrefix"] = urlunsplit(shipped._replace(netloc=f"127.0.0.1:{standin.port}"))
            extender["tlsConfig"].update(certFile=str(certs.scheduler.certificate),
                                         keyFile=str(certs.scheduler.key),
                                         caFile=str(certs.authority.certificate))
            scheduler = kube_scheduler(config)

            names = [f"p-{i:03d}" for i in range(PODS)]
            created: list[str] = []

            def create_continuously() -> None:
                for name in names:
                    core.create_namespaced_pod(pool, pod_manifest(name, gpus=1, pool=pool))
                    created.append(name)
                    time.sleep(0.25)

            core.create_namespaced_pod(blocked_ns, pod_manifest("blocked-before", gpus=1, pool=pool))
            creator = threading.Thread(target=create_continuously, name="pod-creator", daemon=True)
            creator.start()

            # Mid-stream: pods are being scheduled through one replica's connection; that replica
            # dies the moment the scheduler next sends it a request.
            eventually(lambda: sum(bound_node(core, pool, n) is not None for n in list(created)) >= 4,
                       "the first pods bound", timeout=WAIT_S)
            carrying = eventually(
                lambda: [e for e, stats in standin.snapshot().items() if stats.open > 0],
                "a replica carrying the scheduler's connection")
            victim = by_endpoint[carrying[0]]
            [survivor] = [replica for replica in replicas if replica is not victim]
            survivor_calls_before = survivor.filter_calls()
            def lose_the_victim() -> None:
                victim.kill9()
                # Its address stays listed for the scheduler's next connection (the next call,
                # for this pod or the next one): that connection is refused, as on a cluster
                # before readiness catches up. Then only the probe decides.
                standin.route_next_connections(victim.endpoint, 1)

            standin.on_next_request(victim.endpoint, lose_the_victim)
            eventually(lambda: victim.process.poll() is not None, f"{victim.name} killed mid-call",
                       timeout=WAIT_S)
            assert len(created) < PODS, "the kill came after the last pod: make the stream longer"
            eventually(lambda: standin.ready == [survivor.endpoint], "the dead endpoint out of rotation")

            creator.join(WAIT_S)
            assert not creator.is_alive()
            core.create_namespaced_pod(blocked_ns, pod_manifest("blocked-after", gpus=1, pool=pool))

            def everything_bound() -> dict[str, str] | None:
                placed = {name: bound_node(core, pool, name) for name in names}
                return {k: v for k, v in placed.items() if v} if all(placed.values()) else None

            placed = eventually(everything_bound, f"all {PODS} pods bound", timeout=WAIT_S)
            assert set(placed.values()) <= set(allowed), placed  # never the node the policy refuses

            quota_refusal = f"gpumeter: tenant {BLOCKED} over gpu_hours quota"
            eventually(lambda: any(quota_refusal in message
                                   for message in failures(core, blocked_ns).get("blocked-after", [])),
                       "blocked-after refused by the surviving replica", timeout=WAIT_S)
            for name in ("blocked-before", "blocked-after"):
                assert bound_node(core, blocked_ns, name) is None
            assert survivor.filter_calls() > survivor_calls_before

            attempts = scheduling_attempts(kube, scheduler.port)
            # Every pod bound through this scheduler took at most MAX_ATTEMPTS attempts.
            assert attempts["count"] >= PODS, attempts
            assert attempts[str(MAX_ATTEMPTS)] == attempts["count"], (attempts, failures(core, pool))
            stats = standin.snapshot()
            assert stats[victim.endpoint].cut_mid_request >= 1, stats  # the call it died in
            assert stats[victim.endpoint].refused >= 1, stats  # the connection sent to it dead
            print(f"stand-in: {stats}; attempts: {attempts}; failures: {failures(core, pool)}")
        finally:
            if creator is not None:
                creator.join(WAIT_S)
            if standin is not None:
                standin.stop()
            for replica in replicas:
                replica.stop()
                print(f"--- {replica.name} ---\n{replica.log()[-4000:]}")
