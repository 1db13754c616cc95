"""The test control plane is real: scheduling, evictions/PDBs and Volcano CRDs.

Uses the fixtures of tests/kube/fixtures.py (binaries from `make testbin`).
Expectations are derived from the objects the tests create, never from the
system under test; waits are bounded polls, never timing assertions.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpumeter.core.kube import CAPACITY_TYPE_LABEL, GPU_RESOURCE
from testkit.kube_cluster import (
    GPU_PRODUCT_LABEL,
    TOPOLOGY_ANNOTATION,
    VOLCANO_GROUP,
    VOLCANO_VERSION,
    Kube,
    has_condition,
)
from tests.kube.fixtures import CreateGpuNodes, StartScheduler
from tests.kube.pods import POOL_LABEL, pod_manifest
from tests.support.polling import eventually

pytestmark = pytest.mark.kube



@pytest.fixture
def api(kube: Kube) -> Iterator[k8s.ApiClient]:
    with kube.api_client() as client:
        yield client


@pytest.fixture
def core(api: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api)


def pod_is_ready(pod: k8s.V1Pod) -> bool:
    return pod.status is not None and has_condition(pod.status.conditions, "Ready")


def pod_running_and_ready(core: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    pod = core.read_namespaced_pod(name, namespace)
    return pod.status is not None and pod.status.phase == "Running" and pod_is_ready(pod)


def pod_node(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
    spec = core.read_namespaced_pod(name, namespace).spec
    return spec.node_name if spec else None


def pod_gone(core: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def free_gpus(core: k8s.CoreV1Api, node_name: str) -> int:
    """Allocatable GPUs minus GPU requests of the non-terminated pods bound to the node."""
    status = core.read_node(node_name).status
    assert status is not None and status.allocatable is not None
    allocatable = int(status.allocatable.get(GPU_RESOURCE, "0"))
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
    used = 0
    for pod in pods:
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            continue  # terminated pods no longer hold devices
        for container in pod.spec.containers if pod.spec else []:
            requests = (container.resources.requests if container.resources else None) or {}
            used += int(requests.get(GPU_RESOURCE, "0"))
    return allocatable - used


def as_dict(obj: object) -> dict[str, Any]:
    """CustomObjectsApi returns untyped JSON objects."""
    assert isinstance(obj, dict)
    return obj


def evict(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace))
    core.create_namespaced_pod_eviction(name, namespace, body=body)


# --------------------------------------------------------------------------


def test_simulated_gpu_nodes_look_like_gpu_nodes(core: k8s.CoreV1Api, gpu_nodes: CreateGpuNodes) -> None:
    [name] = gpu_nodes(
        1, gpus_per_node=4, gpu_model="A100-SXM-40GB", capacity_type="spot", topology=[[0, 1], [2, 3]]
    )
    node = core.read_node(name)
    assert node.status is not None and node.metadata is not None
    assert (node.status.allocatable or {})[GPU_RESOURCE] == "4"
    assert (node.status.capacity or {})[GPU_RESOURCE] == "4"
    labels = node.metadata.labels or {}
    assert labels[GPU_PRODUCT_LABEL] == "A100-SXM-40GB"
    assert labels[CAPACITY_TYPE_LABEL] == "spot"
    topology = json.loads((node.metadata.annotations or {})[TOPOLOGY_ANNOTATION])
    assert topology["nvlink_domains"] == [[0, 1], [2, 3]]
    assert has_condition(node.status.conditions, "Ready")


def test_gpu_pod_is_bound_by_kube_scheduler_to_a_node_with_room(
    core: k8s.CoreV1Api,
    kube_namespace: str,
    kube_scheduler: StartScheduler,
    gpu_nodes: CreateGpuNodes,
) -> None:
    pool = kube_namespace  # unique per test: keeps the pods on this test's nodes
    full, roomy = gpu_nodes(2, gpus_per_node=4, labels={POOL_LABEL: pool})
    # Occupy 3 of the 4 GPUs of `full` by binding directly (no scheduler needed),
    # so only `roomy` can fit a 2-GPU pod.
    core.create_namespaced_pod(kube_namespace, pod_manifest("filler", gpus=3, node_name=full))
    eventually(lambda: pod_running_and_ready(core, kube_namespace, "filler"), "filler Running")

    expected = {node for node in (full, roomy) if free_gpus(core, node) >= 2}
    assert expected == {roomy}

    kube_scheduler()  # default profile, default-scheduler
    core.create_namespaced_pod(kube_namespace, pod_manifest("trainer", gpus=2, pool=pool))
    bound = eventually(lambda: pod_node(core, kube_namespace, "trainer"), "trainer bound")
    assert bound in expected
    eventually(lambda: pod_running_and_ready(core, kube_namespace, "trainer"), "trainer Running under KWOK")

    # A pod no node can hold (5 > 4 GPUs per node) must be left unschedulable, not bound.
    core.create_namespaced_pod(kube_namespace, pod_manifest("too-big", gpus=5, pool=pool))

    def unschedulable_message() -> str | None:
        status = core.read_namespaced_pod("too-big", kube_namespace).status
        for c in (status.conditions if status else None) or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return c.message or "?"
        return None

    message = eventually(unschedulable_message, "too-big marked Unschedulable")
    assert f"Insufficient {GPU_RESOURCE}" in message
    assert pod_node(core, kube_namespace, "too-big") is None


def test_eviction_api_honours_pod_disruption_budgets(
    api: k8s.ApiClient,
    core: k8s.CoreV1Api,
    kube_namespace: str,
    gpu_nodes: CreateGpuNodes,
) -> None:
    ns = kube_namespace
    [node] = gpu_nodes(1)
    for name in ("lone", "guarded-0", "guarded-1"):
        app = "lone" if name == "lone" else "guarded"
        core.create_namespaced_pod(ns, pod_manifest(name, gpus=1, labels={"app": app}, node_name=node))
    for name in ("lone", "guarded-0", "guarded-1"):
        eventually(functools.partial(pod_running_and_ready, core, ns, name), f"{name} Running")

    # No PDB covers "lone": the eviction is accepted and the pod goes away.
    evict(core, ns, "lone")
    eventually(lambda: pod_gone(core, ns, "lone"), "evicted pod removed")

    # A PDB requiring every currently ready "guarded" pod to stay up.
    guarded = core.list_namespaced_pod(ns, label_selector="app=guarded").items
    ready_guarded = sum(1 for pod in guarded if pod_is_ready(pod))
    assert ready_guarded == 2
    policy = k8s.PolicyV1Api(api)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": ready_guarded, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    policy.create_namespaced_pod_disruption_budget(ns, k8s.V1PodDisruptionBudget.model_validate(pdb))

    def pdb_status(allowed: int) -> bool:
        current = policy.read_namespaced_pod_disruption_budget("guard", ns)
        status = current.status
        return bool(
            status is not None
            and current.metadata is not None
            and status.observed_generation == current.metadata.generation
            and status.current_healthy == ready_guarded
            and status.disruptions_allowed == allowed
        )

    # The disruption controller (kube-controller-manager) must have computed it.
    eventually(lambda: pdb_status(0), "PDB status computed with 0 disruptions allowed")
    with pytest.raises(k8s.ApiException) as refused:
        evict(core, ns, "guarded-0")
    assert refused.value.status == 429
    # 429 is also API Priority and Fairness throttling: check it is the budget speaking.
    causes = json.loads(refused.value.body or "{}").get("details", {}).get("causes", [])
    assert any(cause.get("reason") == "DisruptionBudget" for cause in causes), causes
    assert not pod_gone(core, ns, "guarded-0")

    # Positive control: loosen the budget by one and the same eviction succeeds.
    policy.patch_namespaced_pod_disruption_budget("guard", ns, {"spec": {"minAvailable": ready_guarded - 1}})
    eventually(lambda: pdb_status(1), "PDB status recomputed with 1 disruption allowed")
    evict(core, ns, "guarded-0")
    eventually(lambda: pod_gone(core, ns, "guarded-0"), "evicted guarded pod removed")


def test_volcano_queue_create_read_patch(api: k8s.ApiClient) -> None:
    custom = k8s.CustomObjectsApi(api)
    name = "gpumeter-test-queue"
    body = {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": 1, "reclaimable": True, "capability": {GPU_RESOURCE: "8"}},
    }
    custom.create_cluster_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, "queues", body)
    try:
        read = as_dict(custom.get_cluster_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, "queues", name))
        assert read["spec"] == body["spec"]

        custom.patch_cluster_custom_object(
            VOLCANO_GROUP,
            VOLCANO_VERSION,
            "queues",
            name,
            {"spec": {"weight": 3, "capability": {GPU_RESOURCE: "16"}}},
        )
        patched = as_dict(custom.get_cluster_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, "queues", name))
        # Merge patch: changed keys replaced, untouched keys kept.
        assert patched["spec"] == {"weight": 3, "reclaimable": True, "capability": {GPU_RESOURCE: "16"}}
        assert int(patched["metadata"]["generation"]) == int(read["metadata"]["generation"]) + 1
    finally:
        custom.delete_cluster_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, "queues", name)


def test_volcano_podgroup_is_namespaced(api: k8s.ApiClient, kube_namespace: str) -> None:
    custom = k8s.CustomObjectsApi(api)
    body = {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": "pg"},
        "spec": {"minMember": 2, "queue": "default"},
    }
    custom.create_namespaced_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, kube_namespace, "podgroups", body)
    read = as_dict(
        custom.get_namespaced_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, kube_namespace, "podgroups", "pg")
    )
    assert read["metadata"]["namespace"] == kube_namespace
    assert read["spec"] == body["spec"]


def test_admin_kubeconfig_works_with_standard_loader(kube: Kube) -> None:
    # The kubeconfig is what other processes (CLI, extender, actuator) will be given.
    with k8s_config.new_client_from_config(config_file=str(kube.kubeconfig)) as client:
        names = {ns.metadata.name for ns in k8s.CoreV1Api(client).list_namespace().items if ns.metadata}
    assert {"default", "kube-system"} <= names


def test_authentication_and_rbac_are_enforced(kube: Kube, core: k8s.CoreV1Api, kube_namespace: str) -> None:
    # A ServiceAccount token (signed with the fixture's keys) authenticates but has no RBAC grants.
    request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[]))
    issued = core.create_namespaced_service_account_token("default", kube_namespace, request)
    assert issued.status is not None and issued.status.token
    for token, expected_status in ((issued.status.token, 403), ("not-a-valid-token", 401)):
        configuration = k8s.Configuration(
            host=kube.server,
            api_key={"BearerToken": token},
            api_key_prefix={"BearerToken": "Bearer"},
            ssl_ca_cert=str(kube.ca_file),
        )
        with k8s.ApiClient(configuration) as client, pytest.raises(k8s.ApiException) as denied:
            k8s.CoreV1Api(client).list_node()
        assert denied.value.status == expected_status
