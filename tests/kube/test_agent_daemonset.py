"""The chart's agent against a real apiserver and kube-scheduler: its GKE variant
(agent.gkeDriverFromHost) is accepted as helm renders it, and the agent's pod lands on a tainted
GPU node that only its cloud labels (no GPU feature discovery) mark, never on a CPU node.

The test control plane runs no DaemonSet controller, so the test creates the pod that controller
would: the template, pinned to one node by the same ``metadata.name`` node-affinity field the
controller adds, ANDed with each of the template's own terms (the controller runs a pod only where
the template's affinity and tolerations admit it)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client as k8s

from testkit.kube_cluster import Kube
from tests.kube.chart import render
from tests.kube.fixtures import CreateGpuNodes, StartScheduler
from tests.support.polling import eventually
from tests.support.rendered import rendered

pytestmark = [pytest.mark.agent, pytest.mark.kube]


def the_daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return found


def test_the_gke_variant_renders_and_is_accepted(kube: Kube, kube_namespace: str) -> None:
    daemonset = the_daemonset(render("gpumeter", "gpumeter-system", sets={"agent.gkeDriverFromHost": True}))
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert env["GPUMETER_CONFIG"]  # the settings every variant reads
    assert {"mountPath": "/usr/local/nvidia", "name": "nvidia-driver", "readOnly": True} in container[
        "volumeMounts"
    ]
    daemonset["metadata"]["namespace"] = kube_namespace
    with kube.api_client() as api:
        created = k8s.AppsV1Api(api).create_namespaced_daemon_set(
            kube_namespace, k8s.V1DaemonSet.model_validate(daemonset), dry_run="All"
        )
    pod_spec = created.spec.template.spec if created.spec else None
    security = pod_spec.containers[0].security_context if pod_spec else None
    assert security is not None and security.privileged is True


def pod_for_node(template: dict[str, Any], node: str, name: str) -> dict[str, Any]:
    spec = copy.deepcopy(template["spec"])
    spec.pop("serviceAccountName", None)  # the test namespace has only "default"
    node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    for term in required.setdefault("nodeSelectorTerms", [{}]):
        term["matchFields"] = [pin]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_the_agent_lands_on_tainted_cloud_labelled_gpu_nodes_and_not_on_cpu_nodes(
    kube: Kube, kube_scheduler: StartScheduler, gpu_nodes: CreateGpuNodes, kube_namespace: str
) -> None:
    kube_scheduler()
    # A GKE spot pool dedicated to one tenant: GKE's labels and taints, no GPU feature discovery.
    (gke,) = gpu_nodes(
        1,
        gpus_per_node=1,
        gpu_model="L4-24GB",
        labels={"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-spot": "true"},
        taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"},
            {"key": "tenant", "value": "team-x", "effect": "NoExecute"},
        ],
    )
    (cpu,) = gpu_nodes(1, gpus_per_node=0, name_prefix="cpu-node")
    daemonset = the_daemonset(rendered())
    template = daemonset["spec"]["template"]
    with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        for node in (gke, cpu):  # the simulated nodes carry GFD's label; these two must not
            core.patch_node(node, {"metadata": {"labels": {"nvidia.com/gpu.present": None}}})
        for node, name in ((gke, "agent-gke"), (cpu, "agent-cpu")):
            pod = k8s.V1Pod.model_validate(pod_for_node(template, node, name))
            core.create_namespaced_pod(kube_namespace, pod)

        def bound() -> str | None:
            pod = core.read_namespaced_pod("agent-gke", kube_namespace)
            return pod.spec.node_name if pod.spec else None

        assert eventually(bound, "the agent's pod bound to the GKE node") == gke

        def refused() -> bool:
            pod = core.read_namespaced_pod("agent-cpu", kube_namespace)
            conditions = (pod.status.conditions if pod.status else None) or []
            return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

        assert eventually(refused, "the scheduler to refuse the CPU node")
        unplaced = core.read_namespaced_pod("agent-cpu", kube_namespace).spec
        assert unplaced is not None and unplaced.node_name is None
