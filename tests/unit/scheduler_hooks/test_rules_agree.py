"""The agent, the extender and the actuator read the same pods, nodes and namespaces alike.

Each case goes through every component's own entry point (no shared helper called directly),
so a copy of a rule drifting in one of them fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from collectors.agent.podmeta import pod_info
from gpumeter.core.kube import NO_TENANT
from scheduler_hooks.cluster.kube_objects import namespace_labels, node_view, pod_view, tenants_of
from scheduler_hooks.cluster.state import HooksState, watched_namespace, watched_node, watched_pod
from scheduler_hooks.extender.wire_kube import pod_request

GPU = "nvidia.com/gpu"


def _container(name: str, gpus: int, cpu: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {"requests": {GPU: str(gpus), "cpu": cpu}, "limits": {GPU: str(gpus)}},
        **extra,
    }


def test_a_native_sidecars_gpu_counts_beside_the_app_everywhere() -> None:
    app_gpus, sidecar_gpus = 2, 1
    pod = {
        "metadata": {"namespace": "team-a", "name": "trainer", "uid": "u-1"},
        "spec": {
            "nodeName": "n1",
            "containers": [_container("app", app_gpus, "2")],
            "initContainers": [_container("proxy", sidecar_gpus, "1", restartPolicy="Always")],
        },
        "status": {"phase": "Running"},
    }
    # The kubelet's rule: a sidecar keeps running beside the app containers; no regular init
    # container here, so the effective request is their sum.
    expected = app_gpus + sidecar_gpus
    assert pod_request(pod).gpus == expected  # extender, a pod being scheduled
    watched = watched_pod(pod)
    assert watched is not None and watched.gpus == expected  # extender, pods it holds GPUs for
    assert pod_view(pod, "team-a").gpus == expected  # actuator
    assert pod_info(pod).requests.cpu_cores == 3  # agent: the same rule over cpu (2 + 1)


def test_the_explicit_capacity_label_wins_over_a_cloud_spot_label_everywhere() -> None:
    labels = {"gpumeter.io/capacity-type": "reserved", "karpenter.sh/capacity-type": "spot"}
    node = {"metadata": {"name": "n1", "labels": labels}, "status": {"allocatable": {GPU: "8"}}}
    pod = {"metadata": {"namespace": "team-a", "name": "p", "uid": "u-1"}, "spec": {"nodeName": "n1"}}
    assert pod_info(pod, {}, labels).capacity_type == "reserved"  # agent
    extender_node = watched_node(node)
    assert extender_node is not None and extender_node.capacity_type == "reserved"  # extender
    assert node_view(node).capacity_type == "reserved"  # actuator: the node
    assert pod_view(pod, "team-a", labels).capacity_type == "reserved"  # actuator: the pod's class


@pytest.mark.parametrize(
    ("name", "labels", "tenant"),
    [
        pytest.param("ml-research", {}, "ml-research", id="name"),
        pytest.param("ml-research", {"gpumeter.io/tenant": "team-a"}, "team-a", id="label"),
        # Not a tenant id: no tenant anywhere (never folded into team-a-prod): the agent bills
        # no one (None), the hooks keep NO_TENANT, which matches no tenant's quota or pods.
        pytest.param("ns-1", {"gpumeter.io/tenant": "Team_A.Prod"}, None, id="label-not-folded"),
        pytest.param("ns-1", {"gpumeter.io/tenant": "  "}, None, id="blank-label-no-tenant"),
    ],
)
def test_the_tenant_of_a_namespace_is_the_agents_everywhere(
    name: str, labels: dict[str, str], tenant: str | None
) -> None:
    namespace = {"metadata": {"name": name, "labels": labels}}
    pod = {"metadata": {"namespace": name, "name": "p", "uid": "u-1"}, "spec": {}}
    assert pod_info(pod, labels).tenant == tenant  # agent
    hooks_tenant = NO_TENANT if tenant is None else tenant
    watched = watched_namespace(namespace)
    assert watched is not None and (watched.name, watched.tenant) == (name, hooks_tenant)  # extender
    assert tenants_of(namespace_labels([namespace])) == {name: hooks_tenant}  # actuator


@pytest.mark.parametrize(
    ("namespace_labels_", "annotations", "protected"),
    [
        pytest.param({"gpumeter.io/protection-allowed": "true"}, {"gpumeter.io/protected": "true"}, True,
                     id="allowed-namespace"),
        pytest.param({}, {"gpumeter.io/protected": "true"}, False, id="unlabelled-namespace"),
        pytest.param({"gpumeter.io/protection-allowed": "True"}, {"gpumeter.io/protected": "true"}, False,
                     id="label-value-is-exact"),
        pytest.param({"gpumeter.io/protection-allowed": "false"}, {"gpumeter.io/protected": "true"}, False,
                     id="label-false"),
        pytest.param({"gpumeter.io/protection-allowed": "true"}, {}, False, id="not-annotated"),
    ],
)
@pytest.mark.security
def test_a_pod_is_protected_alike_for_the_extender_and_the_actuator(
    namespace_labels_: dict[str, str], annotations: dict[str, str], protected: bool
) -> None:
    namespace = {"metadata": {"name": "ns-1", "labels": namespace_labels_}}
    pod = {"metadata": {"namespace": "ns-1", "name": "p", "uid": "u-1", "annotations": annotations},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    state = HooksState()
    watched_ns, watched = watched_namespace(namespace), watched_pod(pod)
    assert watched_ns is not None and watched is not None
    state.upsert_watched_namespace(watched_ns)
    state.upsert_pod(watched)
    assert state.pods["u-1"].protected is protected  # extender, a watched pod
    assert state.view.protected("ns-1", annotations) is protected  # extender, a pod on the wire
    labels = namespace_labels([namespace])["ns-1"]
    assert pod_view(pod, "ns-1", None, labels).protected is protected  # actuator
