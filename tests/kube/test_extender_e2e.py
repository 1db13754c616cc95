"""End to end: the real kube-scheduler calling gpumeter's extender over HTTP (contract 6).

The scheduler runs the chart's kube-scheduler-config.yaml (ConfigMap gpumeter-scheduler-config in
deploy/rendered/gpumeter.yaml) itself, with only its urlPrefix
pointed at a local server (plain HTTP on 127.0.0.1) and the cluster-specific client settings
dropped. The extender is the production server and state, fed by the production Kubernetes
watches (namespaces, nodes, pods) against the test apiserver; quota events and the agent's
topology/allocation records are handed to the state directly (the Kafka feed has its own
integration test). Nodes are KWOK's; each test keeps its pods on its own nodes with a pool
label. Waits are bounded polls on what the cluster reports, never timing assertions.
"""

from __future__ import annotations

import functools
import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from gpumeter.core import topics
from gpumeter.core.kube import GPU_PRODUCT_LABEL, GPU_RESOURCE, TENANT_LABEL, is_gpu_resource
from gpumeter.core.models import GpuAssignment, GpuDevice, NodeAllocation, NodeTopology, QuotaEvent
from gpumeter.core.settings import Settings, settings_env
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from gpumeter.infra import kafka as gkafka
from quota.periods import period_key
from scheduler_hooks.cluster.feeds import kube_feeds
from testkit.kube_cluster import Kube, free_port
from testkit.live_hooks import LiveHooks
from tests.kube.fixtures import CreateGpuNodes, StartScheduler
from tests.kube.pods import POOL_LABEL, pod_manifest
from tests.support import polling
from tests.support.rendered import find, rendered

pytestmark = pytest.mark.kube

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 90.0
AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
# The hooks trust a quota event of the current period only (contract 4, amendment "trust").
THIS_MONTH = period_key(datetime.now(UTC), "month")
TENANTS = TenantsFile(tenants=[TenantPolicy(tenant="team-blocked", gpu_hours=Decimal(10), on_exceed="block")])


eventually = functools.partial(polling.eventually, timeout=WAIT_S)


def shipped_scheduler_configmap() -> dict[str, Any]:
    return find(rendered(), "ConfigMap", "gpumeter-scheduler-config")


def shipped_scheduler_config() -> dict[str, Any]:
    text = shipped_scheduler_configmap()["data"]["kube-scheduler-config.yaml"]
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def scheduler_config(url_prefix: str, *, ignorable: bool | None = None) -> dict[str, Any]:
    """The shipped configuration, reaching the extender at ``url_prefix`` over plain HTTP."""
    config = shipped_scheduler_config()
    config.pop("clientConnection", None)  # the fixture points it at the test cluster
    [extender] = config["extenders"]
    extender["urlPrefix"] = url_prefix
    extender.pop("tlsConfig")
    extender["enableHTTPS"] = False
    if ignorable is not None:
        extender["ignorable"] = ignorable
    return config


def topology(node: str, count: int, link: Callable[[int, int], str]) -> NodeTopology:
    gpus = [
        GpuDevice(index=i, uuid=f"GPU-{node}-{i}", model="M", numa_node=i * 2 // count) for i in range(count)
    ]
    links = {f"{a}-{b}": link(a, b) for a in range(count) for b in range(a + 1, count)}
    return NodeTopology(cluster="test", node=node, gpus=gpus, links=links, at=AT)


def allocation(node: str, namespace: str, pod: str, uid: str, indices: list[int]) -> NodeAllocation:
    held = GpuAssignment(namespace=namespace, pod=pod, pod_uid=uid, gpu_indices=indices)
    return NodeAllocation(cluster="test", node=node, assignments=[held], at=AT)


@pytest.fixture
def core(kube: Kube) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


@dataclass(frozen=True)
class Pool:
    """A test's namespace, the GPU nodes labelled for it (its pods select them) and the
    kube-scheduler the test starts."""

    core: k8s.CoreV1Api
    namespace: str
    create_gpu_nodes: CreateGpuNodes
    start_scheduler: StartScheduler

    def gpu_nodes(self, count: int, **options: Any) -> list[str]:
        return self.create_gpu_nodes(count, labels={POOL_LABEL: self.namespace}, **options)

    def create_pod(self, name: str, **options: Any) -> None:
        self.core.create_namespaced_pod(self.namespace, pod_manifest(name, pool=self.namespace, **options))

    def bound_node(self, name: str) -> str | None:
        spec = self.core.read_namespaced_pod(name, self.namespace).spec
        return spec.node_name if spec else None

    def scheduling_failure(self, name: str) -> str | None:
        """The message of a FailedScheduling event for the pod, once there is one."""
        selector = f"involvedObject.name={name}"
        for event in self.core.list_namespaced_event(self.namespace, field_selector=selector).items:
            if event.reason == "FailedScheduling" and event.message:
                return str(event.message)
        return None


@pytest.fixture
def pool(
    core: k8s.CoreV1Api, kube_namespace: str, kube_scheduler: StartScheduler, gpu_nodes: CreateGpuNodes
) -> Pool:
    return Pool(core, kube_namespace, gpu_nodes, kube_scheduler)


@pytest.fixture
def extender(kube: Kube) -> Iterator[LiveHooks]:
    """gpumeter's extender on 127.0.0.1, watching the test cluster; ready when it answers."""
    api = kube.api_client()
    live = LiveHooks(TENANTS).start()
    live.add_feeds(live.call(lambda: kube_feeds(api, live.state, live.post)))
    eventually(lambda: live.request("GET", "/readyz")[0] == 200, "extender ready (kube lists loaded)")
    yield live
    live.stop()
    api.close()


def prioritize_calls(live: LiveHooks) -> float:
    _, body = live.request("GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith('gpumeter_hooks_requests_total{code="200",verb="kube.prioritize"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --------------------------------------------------------------------------


def test_blocked_tenant_gpu_pod_stays_pending_with_our_message(pool: Pool, extender: LiveHooks) -> None:
    nodes = pool.gpu_nodes(2, gpus_per_node=8)
    pool.core.patch_namespace(pool.namespace, {"metadata": {"labels": {TENANT_LABEL: "team-blocked"}}})
    eventually(
        lambda: extender.call(lambda: extender.state.view.tenant_of(pool.namespace)) == "team-blocked",
        "the namespace's tenant label watched",
    )
    exceeded = QuotaEvent(
        event_id="e2e-exceeded",
        tenant="team-blocked",
        metric="gpu_hours",
        level="exceeded",
        threshold="1",
        used="10.5",
        limit="10",
        period=THIS_MONTH,
        at=AT,
    )
    extender.call(lambda: extender.state.apply_quota_event(exceeded))
    pool.start_scheduler(scheduler_config(f"{extender.url}/kube"))

    pool.create_pod("trainer", gpus=2)
    message = eventually(lambda: pool.scheduling_failure("trainer"), "FailedScheduling event")
    assert "gpumeter: tenant team-blocked over gpu_hours quota" in message
    assert pool.bound_node("trainer") is None

    # The same pod schedules once the tenant recovers: the refusal was ours, nothing else.
    recovered = exceeded.model_copy(update={"event_id": "e2e-recovered", "level": "recovered",
                                            "used": Decimal("9.5")})
    extender.call(lambda: extender.state.apply_quota_event(recovered))
    # Pods refused by an extender go back to the queue on any cluster event: a node update.
    pool.core.patch_node(nodes[0], {"metadata": {"labels": {"gpumeter.io/nudge": "1"}}})
    assert eventually(lambda: pool.bound_node("trainer"), "trainer bound after recovery") in nodes


MIG_1G = "nvidia.com/mig-1g.10gb"


def test_blocked_tenant_mig_pod_stays_pending_until_it_recovers(pool: Pool, extender: LiveHooks) -> None:
    """Issue 33: a MIG pod asks nvidia.com/mig-<profile>, no nvidia.com/gpu. The shipped
    managedResources must send it to the extender and the extender must refuse it for a blocked
    tenant, or the tenant starts MIG pods whatever its quota."""
    [node] = pool.gpu_nodes(1, gpus_per_node=4)
    # The device plugin's mixed strategy advertises the MIG devices of the node's MIG GPUs.
    def allocatable() -> dict[str, str]:
        status = pool.core.read_node(node).status
        return dict((status.allocatable if status else None) or {})

    mig = {**allocatable(), MIG_1G: "4"}
    pool.core.patch_node_status(node, {"status": {"allocatable": mig, "capacity": mig}})
    eventually(lambda: allocatable().get(MIG_1G) == "4", "the node's MIG devices advertised")
    pool.core.patch_namespace(pool.namespace, {"metadata": {"labels": {TENANT_LABEL: "team-blocked"}}})
    eventually(
        lambda: extender.call(lambda: extender.state.view.tenant_of(pool.namespace)) == "team-blocked",
        "the namespace's tenant label watched",
    )
    exceeded = QuotaEvent(event_id="e2e-mig-exceeded", tenant="team-blocked", metric="gpu_hours",
                          level="exceeded", threshold="1", used="10.5", limit="10", period=THIS_MONTH, at=AT)
    extender.call(lambda: extender.state.apply_quota_event(exceeded))
    pool.start_scheduler(scheduler_config(f"{extender.url}/kube"))

    pool.create_pod("mig-notebook", extra={MIG_1G: "1"})
    message = eventually(lambda: pool.scheduling_failure("mig-notebook"), "FailedScheduling event")
    assert "gpumeter: tenant team-blocked over gpu_hours quota" in message
    assert pool.bound_node("mig-notebook") is None

    # It binds once the tenant recovers: the node has the device, the refusal was quota's.
    recovered = exceeded.model_copy(update={"event_id": "e2e-mig-recovered", "level": "recovered",
                                            "used": Decimal("9.5")})
    extender.call(lambda: extender.state.apply_quota_event(recovered))
    pool.core.patch_node(node, {"metadata": {"labels": {"gpumeter.io/nudge": "1"}}})
    assert eventually(lambda: pool.bound_node("mig-notebook"), "MIG pod bound after recovery") == node


def test_two_gpu_pod_lands_where_its_free_gpus_share_nvlink(pool: Pool, extender: LiveHooks) -> None:
    [nvlink] = pool.gpu_nodes(1, gpus_per_node=8, gpu_model="H100-SXM-80GB", name_prefix="h100")
    pcie = pool.gpu_nodes(3, gpus_per_node=4, gpu_model="L40S-48GB", name_prefix="l40s")
    # What the cluster and the agents agree on: on the H100 box 6 of 8 GPUs are taken, leaving
    # GPUs 6 and 7 (NV18, like every pair there); on each L40S box GPUs 1 and 3 are taken,
    # leaving 0 and 2, which sit under different CPU sockets (SYS). Every node has 2 free.
    holders = {nvlink: (6, [0, 1, 2, 3, 4, 5])} | {node: (2, [1, 3]) for node in pcie}
    for index, (node, (count, _)) in enumerate(holders.items()):
        pool.create_pod(f"holder-{index}", gpus=count, node_name=node)
    for index, (node, (_, indices)) in enumerate(holders.items()):
        meta = pool.core.read_namespaced_pod(f"holder-{index}", pool.namespace).metadata
        assert meta is not None and meta.uid
        uid = str(meta.uid)
        layout = (
            (lambda a, b: "NV18") if node == nvlink else (lambda a, b: "PIX" if a // 2 == b // 2 else "SYS")
        )
        records = (
            topology(node, 8 if node == nvlink else 4, layout),
            allocation(node, pool.namespace, f"holder-{index}", uid, indices),
        )

        def feed(records: tuple[NodeTopology, NodeAllocation] = records) -> None:
            extender.state.apply_topology(records[0])
            extender.state.apply_allocation(records[1])

        extender.call(feed)
    eventually(
        lambda: extender.call(lambda: all(extender.state.placement.free(n) == 2 for n in holders)),
        "holders watched: 2 free GPUs everywhere",
    )
    pool.start_scheduler(scheduler_config(f"{extender.url}/kube"))

    pool.create_pod("trainer", gpus=2)
    assert eventually(lambda: pool.bound_node("trainer"), "trainer bound") == nvlink
    assert prioritize_calls(extender) >= 1  # the choice went through our scores


def nvlink(a: int, b: int) -> str:
    return "NV18"


def across_sockets(a: int, b: int) -> str:
    return "SYS"


def test_a_pod_that_may_run_on_h100_or_a100_lands_on_a100_when_the_h100_budget_is_spent(
    pool: Pool, extender: LiveHooks
) -> None:
    """Contract 4 amendment "per-model limits" with contract 6: the tenant's H100 budget is
    exhausted, so the extender fails the H100 nodes (FailedNodes, with the reason) and the
    scheduler places the pod on the A100 node; a pod that may run on H100 only stays pending."""
    h100 = pool.gpu_nodes(2, gpus_per_node=8, gpu_model="H100-SXM-80GB", name_prefix="h100")
    [a100] = pool.gpu_nodes(1, gpus_per_node=8, gpu_model="A100-SXM-80GB", name_prefix="a100")
    # The agents' records: NVLink on the H100 boxes, PCIe across sockets on the A100 box, so a
    # 2-GPU pod scores higher on H100 (the control pod shows it) until that budget is spent.
    for node in [*h100, a100]:
        record = topology(node, 8, nvlink if node in h100 else across_sockets)

        def feed(record: NodeTopology = record) -> None:
            extender.state.apply_topology(record)

        extender.call(feed)
    tenant = "team-models"
    by_model = {"H100-": Decimal(10), "A100-": Decimal(10)}
    budgets = TenantsFile(tenants=[TenantPolicy(tenant=tenant, gpu_hours=Decimal(1000), on_exceed="block",
                                                gpu_hours_by_model=by_model)])
    extender.call(lambda: extender.state.set_tenants(budgets))
    pool.core.patch_namespace(pool.namespace, {"metadata": {"labels": {TENANT_LABEL: tenant}}})
    eventually(lambda: extender.call(lambda: (extender.state.view.tenant_of(pool.namespace),
                                              extender.state.view.node_models.get(a100)))
               == (tenant, "A100-SXM-80GB"), "the namespace's tenant and the nodes' models watched")
    pool.start_scheduler(scheduler_config(f"{extender.url}/kube"))

    pool.create_pod("control", gpus=2)
    assert eventually(lambda: pool.bound_node("control"), "control bound") in h100

    spent = QuotaEvent(event_id="e2e-h100-spent", tenant=tenant, metric="gpu_hours", level="exceeded",
                       threshold="1", used="10.5", limit="10", period=THIS_MONTH, at=AT, gpu_model="H100-")
    extender.call(lambda: extender.state.apply_quota_event(spent))
    pool.create_pod("trainer", gpus=2)
    assert eventually(lambda: pool.bound_node("trainer"), "trainer bound") == a100

    message = h100_only_pod_refused(pool)
    assert f"gpumeter: tenant {tenant} over gpu_hours quota: for H100- GPUs" in message
    assert pool.bound_node("h100-only") is None


def h100_only_pod_refused(pool: Pool) -> str:
    """A 2-GPU pod that may run on H100 nodes only: the scheduler's FailedScheduling message."""
    only_h100 = pod_manifest("h100-only", gpus=2, pool=pool.namespace)
    assert only_h100.spec is not None
    only_h100.spec.node_selector = {POOL_LABEL: pool.namespace, GPU_PRODUCT_LABEL: "H100-SXM-80GB"}
    pool.core.create_namespaced_pod(pool.namespace, only_h100)
    message: str = eventually(lambda: pool.scheduling_failure("h100-only"), "FailedScheduling event")
    return message


def test_a_pod_that_would_take_its_h100_key_above_max_gpus_lands_on_a100(
    pool: Pool, extender: LiveHooks
) -> None:
    """Contract 6 with the per-model amendment: max_gpus_by_model refuses a pod that *would*
    take the key above its limit on that key's nodes only (FailedNodes), as max_gpus refuses it
    everywhere, before any quota event: the real scheduler places it on the A100 node, and a
    pod that may run on H100 only stays pending with the reason."""
    [h100] = pool.gpu_nodes(1, gpus_per_node=8, gpu_model="H100-SXM-80GB", name_prefix="h100")
    [a100] = pool.gpu_nodes(1, gpus_per_node=8, gpu_model="A100-SXM-80GB", name_prefix="a100")
    tenant = "team-h100-cap"
    capped = TenantsFile(tenants=[TenantPolicy(tenant=tenant, on_exceed="notify",
                                               max_gpus_by_model={"H100-": Decimal(3)})])
    extender.call(lambda: extender.state.set_tenants(capped))
    pool.core.patch_namespace(pool.namespace, {"metadata": {"labels": {TENANT_LABEL: tenant}}})
    eventually(lambda: extender.call(lambda: (extender.state.view.tenant_of(pool.namespace),
                                              extender.state.view.node_models.get(h100)))
               == (tenant, "H100-SXM-80GB"), "the namespace's tenant and the nodes' models watched")
    # 2 H100 GPUs held: another 2 would make 4 > 3.
    pool.create_pod("holder", gpus=2, node_name=h100)
    eventually(lambda: extender.call(lambda: extender.state.view.held_by_key(tenant, ["H100-"]))
               == {"H100-": 2}, "the holder's GPUs counted on its H100 node")
    pool.start_scheduler(scheduler_config(f"{extender.url}/kube"))

    pool.create_pod("trainer", gpus=2)
    assert eventually(lambda: pool.bound_node("trainer"), "trainer bound") == a100

    message = h100_only_pod_refused(pool)
    assert f"gpumeter: tenant {tenant} over max_gpus quota: for H100- GPUs" in message
    assert "holds 2 GPUs, pod needs 2, limit 3" in message
    assert pool.bound_node("h100-only") is None


@pytest.mark.parametrize("ignorable", [False, True], ids=["ignorable-false", "ignorable-true"])
def test_extender_down(pool: Pool, ignorable: bool) -> None:
    pool.gpu_nodes(1, gpus_per_node=8)
    nobody = f"http://127.0.0.1:{free_port()}/kube"  # nothing listens there
    pool.start_scheduler(scheduler_config(nobody, ignorable=ignorable))

    pool.create_pod("gpu-pod", gpus=1)
    pool.create_pod("cpu-pod")
    # Pods without nvidia.com/gpu are never sent to the extender (managedResources).
    eventually(lambda: pool.bound_node("cpu-pod"), "cpu-pod bound")
    if ignorable:
        eventually(lambda: pool.bound_node("gpu-pod"), "gpu-pod bound without the extender")
    else:
        message = eventually(lambda: pool.scheduling_failure("gpu-pod"), "FailedScheduling event")
        assert "connection refused" in message, message
        assert pool.bound_node("gpu-pod") is None


@pytest.mark.integration
def test_gpumeter_hooks_process_answers_from_kafka_and_the_cluster(
    kube: Kube, settings: Settings, kube_namespace: str, tmp_path: Path
) -> None:
    """`gpumeter hooks` as deployed: a process reading Kafka and the API server (KUBECONFIG)."""
    tenant = kube_namespace  # unlabelled namespace: its name is the tenant
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        yaml.safe_dump({"tenants": [{"tenant": tenant, "gpu_hours": 1, "on_exceed": "block"}]})
    )
    settings.tenants = tenants
    settings.hooks.listen = f"127.0.0.1:{free_port()}"
    exceeded = QuotaEvent(
        event_id=f"{tenant}-exceeded",
        tenant=tenant,
        metric="gpu_hours",
        level="exceeded",
        threshold="1",
        used="1.5",
        limit="1",
        period=THIS_MONTH,
        at=AT,
    )
    producer = gkafka.make_producer(settings.kafka)
    producer.send(
        settings.kafka.topic(topics.QUOTA_EVENTS),
        key=tenant.encode(),
        value=exceeded.model_dump_json().encode(),
    )
    producer.send(
        settings.kafka.topic(topics.TOPOLOGY),
        key=b"cli-node",
        value=topology("cli-node", 8, lambda a, b: "NV18").model_dump_json().encode(),
    )
    producer.flush(30)
    producer.close(5)

    env = settings_env(settings) | {"KUBECONFIG": str(kube.kubeconfig)}
    log = (tmp_path / "hooks.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpumeter.app.cli", "hooks", "--dry-run"],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    port = int(settings.hooks.listen.rsplit(":", 1)[1])

    def request(method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request(method, path, body=body)
            response = connection.getresponse()
            return response.status, response.read()
        except OSError:
            return 0, b""
        finally:
            connection.close()

    try:

        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "hooks.log").read_text()
            return request("GET", "/readyz")[0] == 200

        eventually(ready, "gpumeter hooks ready")
        pod = {
            "metadata": {"name": "p", "namespace": kube_namespace, "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
        }
        status, body = request(
            "POST", "/kube/filter", json.dumps({"Pod": pod, "NodeNames": ["cli-node"]}).encode()
        )
        assert status == 200
        assert json.loads(body)["FailedAndUnresolvableNodes"] == {
            "cli-node": f"gpumeter: tenant {tenant} over gpu_hours quota"
        }
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
            log.close()
    assert code == 0, (tmp_path / "hooks.log").read_text()


def test_the_shipped_scheduler_configurations_name_our_routes() -> None:
    """Every verb both scheduler configurations the chart renders name is a route the server has.
    (tests/kube/test_helm_chart.py puts every rendered object before the apiserver.)"""
    from scheduler_hooks.extender.server import KUBE_VERBS, VOLCANO_VERBS

    [extender] = shipped_scheduler_config()["extenders"]
    kube_verbs = {extender[key] for key in ("filterVerb", "prioritizeVerb", "preemptVerb")}
    assert kube_verbs == set(KUBE_VERBS) and extender["urlPrefix"].endswith("/kube")
    [plugin] = yaml.safe_load(shipped_scheduler_configmap()["data"]["volcano-extender-plugin.yaml"])
    assert plugin["name"] == "extender"
    arguments = plugin["arguments"]
    verbs = {value for key, value in arguments.items() if key.endswith("Verb")}
    assert verbs == set(VOLCANO_VERBS)
    assert arguments["extender.urlPrefix"].endswith("/volcano")
    # Both send every GPU pod: nvidia.com/gpu, its shared rename and MIG devices (issue 33).
    managed = [item["name"] for item in extender["managedResources"]]
    assert arguments["extender.managedResources"] == managed
    assert {GPU_RESOURCE, f"{GPU_RESOURCE}.shared", MIG_1G} <= set(managed)
    assert all(is_gpu_resource(name) for name in managed)
    assert not any(item["ignoredByScheduler"] for item in extender["managedResources"])
