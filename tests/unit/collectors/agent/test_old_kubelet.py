"""A kubelet without PodResources GetAllocatableResources (before 1.23, or its feature gate off): it is
asked once, its UNIMPLEMENTED remembered and logged once, and time-sliced replicas still bill their
share, counted from the device IDs and the node object instead."""

from __future__ import annotations

import logging
from decimal import Decimal

import pytest

from collectors.agent.podresources import PodResourcesClient
from testkit.cluster_state import pod
from testkit.nvml_standin import NvmlStandIn, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, Lister, PodSpec, serve

from .node_rig import GPU, gpu_samples, node, socket_path

pytestmark = pytest.mark.agent

OLD_KUBELET = {"allocatable_unimplemented": True}


def test_replica_ids_bound_the_replica_count_and_allocatable_is_asked_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Replicas ::1 and ::3 are handed out: the device has at least four.
    lister = Lister(
        [
            PodSpec("t", "a", [ContainerSpec("c", {GPU: ["GPU-aaaa::1"]})]),
            PodSpec("t", "b", [ContainerSpec("c", {GPU: ["GPU-aaaa::3"]})]),
        ]
    )
    lister.allocatable_unimplemented = True
    path = socket_path()
    with caplog.at_level(logging.WARNING), serve(path, lister), PodResourcesClient(str(path)) as client:
        cycles = [client.gpu_allocations() for _ in range(3)]
    quarter = Decimal("0.25")
    for allocations in cycles:
        assert sorted((a.pod, a.share) for a in allocations) == [("a", quarter), ("b", quarter)]
    assert lister.allocatable_calls == 1 and client.allocatable_supported is False
    warnings = [r for r in caplog.records if "GetAllocatableResources" in r.getMessage()]
    assert len(warnings) == 1


def test_the_nodes_capacity_over_its_gpus_gives_the_replica_count() -> None:
    # Two whole GPUs, eight nvidia.com/gpu advertised: four replicas each. Only ::0 is handed out,
    # so the IDs alone would not tell.
    kubelet = [PodSpec("team-a", "nb", [ContainerSpec("c", {GPU: [f"{gpu_uuid(0)}::0"]})])]
    with node(
        NvmlStandIn(nvswitch_node(2)),
        kubelet,
        [pod("team-a", "nb", "uid-nb")],
        node_capacity={"cpu": "64", GPU: "8"},
        lister_options=OLD_KUBELET,
    ) as rig:
        samples, _ = rig.window()
    (sample,) = gpu_samples(samples)
    assert sample.quantity == Decimal("0.25")


def test_gpu_feature_discoverys_replicas_label_gives_it_for_renamed_shared_resources() -> None:
    shared = "nvidia.com/gpu.shared"  # the device plugin's renameByDefault
    kubelet = [PodSpec("team-a", "nb", [ContainerSpec("c", {shared: [f"{gpu_uuid(1)}::0"]})])]
    with node(
        NvmlStandIn(nvswitch_node(2)),
        kubelet,
        [pod("team-a", "nb", "uid-nb")],
        node_labels={"nvidia.com/gpu.replicas": "5"},
        node_capacity={shared: "10"},
        lister_options=OLD_KUBELET,
    ) as rig:
        samples, _ = rig.window()
    (sample,) = gpu_samples(samples)
    assert sample.quantity == Decimal("0.2")


def test_replica_hints_from_the_node() -> None:
    from collectors.agent.podresources import replicas_from_node

    devices = {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 7}.get
    assert replicas_from_node({}, {GPU: "8", "cpu": "64"}, lambda r: devices(r, 0)) == {GPU: 4}
    # Capacity that does not divide evenly over the devices says nothing.
    assert replicas_from_node({}, {GPU: "7"}, lambda r: devices(r, 0)) == {}
    assert replicas_from_node({}, {"nvidia.com/mig-1g.10gb": "14"}, lambda r: devices(r, 0)) == {
        "nvidia.com/mig-1g.10gb": 2
    }
    labels = {"nvidia.com/mig-1g.10gb.replicas": "3"}
    assert replicas_from_node(labels, {"nvidia.com/mig-1g.10gb": "14"}, lambda r: devices(r, 0)) == {
        "nvidia.com/mig-1g.10gb": 3
    }


@pytest.mark.parametrize(
    ("capacity", "labels", "replicas"),
    [
        pytest.param({GPU: "2"}, {}, [1, 1], id="not-shared"),
        pytest.param({GPU: "8"}, {}, [4, 4], id="capacity-over-the-gpus"),
        pytest.param({GPU: "2"}, {"nvidia.com/gpu.replicas": "3"}, [3, 3], id="discovery-label"),
    ],
)
def test_the_topology_carries_the_replicas_the_node_tells(
    capacity: dict[str, str], labels: dict[str, str], replicas: list[int]
) -> None:
    with node(
        NvmlStandIn(nvswitch_node(2)), [], [], node_labels=labels, node_capacity=capacity,
        lister_options=OLD_KUBELET,
    ) as rig:
        rig.window()
        topology = rig.collector.topology()
    assert [gpu.replicas for gpu in topology.gpus] == replicas


def test_a_current_kubelets_allocatable_list_gives_the_replicas_per_gpu() -> None:
    # GPU 0 is time-sliced four ways, GPU 1 is not shared; the node's capacity hint (5 replicas
    # of each) loses to what the kubelet lists.
    allocatable = {GPU: [f"{gpu_uuid(0)}::{n}" for n in range(4)] + [gpu_uuid(1)]}
    with node(
        NvmlStandIn(nvswitch_node(2)), [], [], allocatable=allocatable, node_capacity={GPU: "10"}
    ) as rig:
        rig.window()
        topology = rig.collector.topology()
    assert [(gpu.uuid, gpu.replicas) for gpu in topology.gpus] == [(gpu_uuid(0), 4), (gpu_uuid(1), 1)]
