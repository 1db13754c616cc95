"""GPUs held through Dynamic Resource Allocation (PodResources ``dynamic_resources``, NVIDIA's driver
``gpu.nvidia.com``) are billed like device-plugin GPUs: resolved by minor number and MIG profile, and
split among the pods sharing a claim."""

from __future__ import annotations

from decimal import Decimal

import pytest

from testkit.cluster_state import pod
from testkit.nvml_standin import GIB, NvmlStandIn, StandInGpu, StandInMig, gpu_uuid, nvswitch_node
from testkit.podresources_server import ClaimSpec, ContainerSpec, PodSpec

from .node_rig import gpu_samples, node

pytestmark = pytest.mark.agent

DRIVER = "gpu.nvidia.com"
POOL = "gpu-node-1"  # NVIDIA's driver publishes one pool per node, named after it
TWELVE_PLACES = Decimal("1e-12")


def claim(name: str, *devices: str, namespace: str = "team-a", driver: str = DRIVER) -> ClaimSpec:
    return ClaimSpec(name, namespace, [(driver, POOL, device) for device in devices])


def two_gpus_with_minors() -> NvmlStandIn:
    # DRA names a GPU by its /dev/nvidia<minor>, which need not be its NVML index.
    gpus = nvswitch_node(2)
    gpus[0].minor, gpus[1].minor = 2, 3
    return NvmlStandIn(gpus)


def test_a_claimed_gpu_is_billed_to_its_pod_by_minor_number() -> None:
    kubelet = [PodSpec("team-a", "infer", [ContainerSpec("server", claims=[claim("infer-gpu", "gpu-3")])])]
    with node(two_gpus_with_minors(), kubelet, [pod("team-a", "infer", "uid-infer")]) as rig:
        samples, (record,) = rig.window()
    (sample,) = gpu_samples(samples)
    assert (sample.pod, sample.quantity, sample.labels["gpu_uuid"]) == ("infer", 1, gpu_uuid(1))
    assert sample.labels["gpu_index"] == "1" and sample.gpu_model == "H100-SXM-80GB"
    assert sample.power_watts == Decimal("301")  # the GPU is the pod's alone: its telemetry rides along
    assert [(a.pod, a.gpu_indices) for a in record.assignments] == [("infer", [1])]


def test_a_claim_shared_by_two_pods_bills_the_gpu_once_split_between_them() -> None:
    shared = claim("shared-gpu", "gpu-2")
    kubelet = [
        PodSpec("team-a", "a", [ContainerSpec("c", claims=[shared])]),
        PodSpec("team-a", "b", [ContainerSpec("c", claims=[shared]), ContainerSpec("d", claims=[shared])]),
    ]
    api = [pod("team-a", "a", "uid-a"), pod("team-a", "b", "uid-b")]
    with node(two_gpus_with_minors(), kubelet, api) as rig:
        samples, _ = rig.window()
    assert [(s.pod, s.quantity, s.labels["gpu_uuid"]) for s in gpu_samples(samples)] == [
        ("a", Decimal("0.5"), gpu_uuid(0)),
        ("b", Decimal("0.5"), gpu_uuid(0)),
    ]


def test_dra_mig_devices_bill_their_profiles_share() -> None:
    a100 = StandInGpu(
        uuid="GPU-a100",
        name="NVIDIA A100-SXM4-40GB",
        memory_total=40 * GIB,
        bus_id="00000000:07:00.0",
        mig_enabled=True,
        migs=[
            StandInMig("MIG-1a", "1g.5gb", 1, 5 * GIB, gpu_instance_id=13),
            StandInMig("MIG-1b", "1g.5gb", 1, 5 * GIB, gpu_instance_id=14),
            StandInMig("MIG-3", "3g.20gb", 3, 20 * GIB, memory_used=3 * GIB, gpu_instance_id=2),
        ],
    )
    kubelet = [
        # Names as the driver builds them: gpu-<parent minor>-mig-<profile, no dots>-<profile id>-<start>.
        PodSpec("team-a", "big", [ContainerSpec("c", claims=[claim("big", "gpu-0-mig-3g20gb-9-4")])]),
        PodSpec("team-a", "small", [ContainerSpec("c", claims=[claim("small", "gpu-0-mig-1g5gb-19-1")])]),
    ]
    api = [pod("team-a", "big", "uid-big"), pod("team-a", "small", "uid-small")]
    with node(NvmlStandIn([a100]), kubelet, api) as rig:
        samples, (record,) = rig.window()
    big, small = gpu_samples(samples)
    # The only 3g.20gb device: resolved to it, with its own memory reading.
    assert (big.pod, big.labels["gpu_uuid"], big.mig_profile) == ("big", "MIG-3", "3g.20gb")
    assert big.quantity == (Decimal(3) / 7).quantize(TWELVE_PLACES) and big.memory_used_bytes == 3 * GIB
    # Two 1g.5gb devices and no placement from NVML: the profile's share of the parent, no telemetry.
    assert (small.pod, small.labels["gpu_uuid"], small.mig_profile) == ("small", "GPU-a100", "1g.5gb")
    assert small.quantity == (Decimal(1) / 7).quantize(TWELVE_PLACES)
    assert small.memory_used_bytes is None and small.power_watts is None and small.utilization is None
    assert [(a.pod, a.gpu_indices) for a in record.assignments] == [("big", [0]), ("small", [0])]


def test_other_drivers_are_ignored_and_unknown_gpu_devices_are_counted() -> None:
    kubelet = [
        PodSpec(
            "team-a",
            "p",
            [
                ContainerSpec(
                    "c",
                    claims=[
                        claim("nic", "eth1", driver="sriovnetwork.k8snetworkplumbingwg.io"),
                        claim("gone", "gpu-9"),  # no GPU with minor 9 on this node
                    ],
                )
            ],
        )
    ]
    with node(two_gpus_with_minors(), kubelet, [pod("team-a", "p", "uid-p")]) as rig:
        samples, _ = rig.window()
        assert gpu_samples(samples) == []
        assert rig.collector.builder.stats.unknown_devices == 1
