"""KubePodMetadata against a real kube-apiserver: this node's pods only, live updates by watch."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from collectors.agent.podmeta import KubePodMetadata
from testkit.kube_cluster import Kube
from tests.support import polling

pytestmark = [pytest.mark.agent, pytest.mark.kube]

NODE = "agent-gpu-node"
PRIORITY_CLASS = "agent-test-priority"


eventually = functools.partial(polling.eventually, timeout=30.0)


def make_pod(namespace: str, name: str, node: str, labels: dict[str, str] | None = None) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels or {}),
        spec=k8s.V1PodSpec(
            node_name=node,
            priority_class_name=PRIORITY_CLASS if name == "trainer" else None,
            containers=[
                k8s.V1Container(
                    name="main",
                    image="registry.invalid/none",
                    resources=k8s.V1ResourceRequirements(requests={"cpu": "2", "memory": "4Gi"}),
                )
            ],
            volumes=[
                k8s.V1Volume(
                    name="data",
                    persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name="data"),
                )
            ],
        ),
    )


@pytest.fixture
def api(kube: Kube) -> Iterator[k8s.ApiClient]:
    with kube.api_client() as client:
        yield client


@pytest.fixture
def priority_class(api: k8s.ApiClient) -> Iterator[str]:
    scheduling = k8s.SchedulingV1Api(api)
    scheduling.create_priority_class(
        k8s.V1PriorityClass(metadata=k8s.V1ObjectMeta(name=PRIORITY_CLASS), value=7)
    )
    try:
        yield PRIORITY_CLASS
    finally:
        scheduling.delete_priority_class(PRIORITY_CLASS)


@pytest.fixture
def node(api: k8s.ApiClient, priority_class: str) -> Iterator[str]:
    core = k8s.CoreV1Api(api)
    core.create_node(
        k8s.V1Node(metadata=k8s.V1ObjectMeta(name=NODE, labels={"gpumeter.io/capacity-type": "spot"}))
    )
    try:
        yield NODE
    finally:
        core.delete_node(NODE)


def test_watches_this_nodes_pods_with_tenant_and_capacity(
    api: k8s.ApiClient, kube_namespace: str, node: str
) -> None:
    core = k8s.CoreV1Api(api)
    core.patch_namespace(kube_namespace, {"metadata": {"labels": {"gpumeter.io/tenant": "acme-corp"}}})
    core.create_namespaced_persistent_volume_claim(
        kube_namespace,
        k8s.V1PersistentVolumeClaim(
            metadata=k8s.V1ObjectMeta(name="data"),
            spec=k8s.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteOnce"],
                resources=k8s.V1VolumeResourceRequirements(requests={"storage": "20Gi"}),
            ),
        ),
    )
    core.create_namespaced_pod(kube_namespace, make_pod(kube_namespace, "trainer", node))
    core.create_namespaced_pod(kube_namespace, make_pod(kube_namespace, "elsewhere", "some-other-node"))
    metadata = KubePodMetadata(api, node)
    try:
        assert metadata.start(timeout=30)
        pods = eventually(
            lambda: [p for p in metadata.pods() if p.namespace == kube_namespace], "the trainer pod"
        )
        assert [p.name for p in pods] == ["trainer"]  # the field selector keeps other nodes' pods out
        trainer = pods[0]
        assert trainer.tenant == "acme-corp" and trainer.capacity_type == "spot" and trainer.priority == 7
        assert trainer.uid and trainer.node == node and trainer.pvc_claims == ("data",)
        assert trainer.requests.cpu_cores == 2
        claim = metadata.claim(kube_namespace, "data")
        assert claim is not None and claim.capacity_bytes == 20 * 1024**3

        core.create_namespaced_pod(kube_namespace, make_pod(kube_namespace, "notebook", node))
        eventually(
            lambda: (
                {p.name for p in metadata.pods() if p.namespace == kube_namespace} == {"trainer", "notebook"}
            ),
            "the new pod from the watch",
        )
        core.delete_namespaced_pod("trainer", kube_namespace, grace_period_seconds=0)
        eventually(
            lambda: {p.name for p in metadata.pods() if p.namespace == kube_namespace} == {"notebook"},
            "the deleted pod to go",
        )
        core.patch_namespace(kube_namespace, {"metadata": {"labels": {"gpumeter.io/tenant": "team-z"}}})
        eventually(
            lambda: {p.tenant for p in metadata.pods() if p.namespace == kube_namespace} == {"team-z"},
            "the namespace relabel",
        )
        # A label value that is no tenant id is no tenant (never folded into team-z).
        core.patch_namespace(kube_namespace, {"metadata": {"labels": {"gpumeter.io/tenant": "Team_Z"}}})
        eventually(
            lambda: {p.tenant for p in metadata.pods() if p.namespace == kube_namespace} == {None},
            "the relabel to a value that is no tenant id",
        )
    finally:
        metadata.stop()
