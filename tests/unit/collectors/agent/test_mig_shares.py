"""What a MIG device bills: its GPU instance's slices of the GPU, the compute instance's part of a shared
GPU instance, and 1/replicas of that when the device plugin time-slices it; profile names as NVML
spells them, media extensions (``+me``) included."""

from __future__ import annotations

from decimal import Decimal

import pytest

from collectors.agent.podresources import mig_profile_of
from testkit.cluster_state import pod
from testkit.nvml_standin import GIB, NvmlStandIn, StandInGpu, StandInMig
from testkit.podresources_server import ContainerSpec, PodSpec

from .node_rig import gpu_samples, node

pytestmark = pytest.mark.agent

TWELVE_PLACES = Decimal("1e-12")  # a sample quantity's precision (contract 1 storage)


def a100(*migs: StandInMig) -> StandInGpu:
    return StandInGpu(
        uuid="GPU-a100",
        name="NVIDIA A100-SXM4-40GB",
        memory_total=40 * GIB,
        bus_id="00000000:07:00.0",
        mig_enabled=True,
        max_mig=7,
        migs=list(migs),
    )


def test_a_time_sliced_mig_device_bills_its_slice_divided_by_the_replicas() -> None:
    standin = NvmlStandIn([a100(StandInMig("MIG-a", "1g.5gb", 1, 5 * GIB))])
    resource = "nvidia.com/mig-1g.5gb"
    replicas = [f"MIG-a::{n}" for n in range(4)]
    kubelet = [
        PodSpec("team-a", "p0", [ContainerSpec("c", {resource: [replicas[0]]})]),
        PodSpec("team-b", "p2", [ContainerSpec("c", {resource: [replicas[2]]})]),
    ]
    api = [pod("team-a", "p0", "uid-0"), pod("team-b", "p2", "uid-2")]
    with node(standin, kubelet, api, allocatable={resource: replicas}) as rig:
        samples, _ = rig.window()
    # One slice of seven, shared four ways: 1/28 of the GPU each.
    expected = (Decimal(1) / 28).quantize(TWELVE_PLACES)
    assert [(s.pod, s.quantity, s.mig_profile) for s in gpu_samples(samples)] == [
        ("p0", expected, "1g.5gb"),
        ("p2", expected, "1g.5gb"),
    ]


def test_compute_instances_sharing_a_gpu_instance_each_bill_their_part() -> None:
    # One 2-slice GPU instance (A100-40GB 2g.10gb) split into two 1-slice compute instances.
    standin = NvmlStandIn(
        [
            a100(
                StandInMig("MIG-c0", "1c.2g.10gb", 2, 10 * GIB, compute_slices=1, compute_instance_id=0),
                StandInMig("MIG-c1", "1c.2g.10gb", 2, 10 * GIB, compute_slices=1, compute_instance_id=1),
            )
        ]
    )
    resource = "nvidia.com/mig-1c.2g.10gb"
    kubelet = [
        PodSpec("team-a", "a", [ContainerSpec("c", {resource: ["MIG-c0"]})]),
        PodSpec("team-b", "b", [ContainerSpec("c", {resource: ["MIG-c1"]})]),
    ]
    with node(standin, kubelet, [pod("team-a", "a", "uid-a"), pod("team-b", "b", "uid-b")]) as rig:
        samples, _ = rig.window()
    # Half of a 2/7 instance each: 1/7 of the GPU, the two together the instance's 2/7.
    half_instance = (Decimal(2) / 7 / 2).quantize(TWELVE_PLACES)
    billed = [(s.pod, s.quantity, s.mig_profile) for s in gpu_samples(samples)]
    assert billed == [("a", half_instance, "1c.2g.10gb"), ("b", half_instance, "1c.2g.10gb")]


def test_media_extension_profiles_are_recognised_in_both_spellings() -> None:
    h100 = StandInGpu(
        uuid="GPU-h100",
        name="NVIDIA H100 80GB HBM3",
        bus_id="00000000:18:00.0",
        mig_enabled=True,
        max_mig=7,
        migs=[StandInMig("MIG-me", "1g.10gb+me", 1, 10 * GIB)],
    )
    # The device plugin advertises "1g.10gb+me" as nvidia.com/mig-1g.10gb.me (no "+" in resource names).
    kubelet = [PodSpec("team-a", "video", [ContainerSpec("c", {"nvidia.com/mig-1g.10gb.me": ["MIG-me"]})])]
    with node(NvmlStandIn([h100]), kubelet, [pod("team-a", "video", "uid-v")]) as rig:
        samples, _ = rig.window()
        (mig,) = rig.nvml.inventory[0].mig_instances
    assert mig.profile == "1g.10gb+me"
    (sample,) = gpu_samples(samples)
    assert sample.mig_profile == "1g.10gb+me"
    assert sample.quantity == (Decimal(1) / 7).quantize(TWELVE_PLACES)


def test_resource_names_map_to_nvml_profile_names() -> None:
    assert mig_profile_of("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"
    assert mig_profile_of("nvidia.com/mig-1g.10gb.me.shared") == "1g.10gb+me"
    assert mig_profile_of("nvidia.com/mig-1c.2g.20gb") == "1c.2g.20gb"
