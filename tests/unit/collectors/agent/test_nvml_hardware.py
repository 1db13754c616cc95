"""NvmlSource against what real boards answer (the stand-in answers as they do): no NUMA node from NVML
on x86 (sysfs has it), no MIG mode on boards without MIG, utilization samples for a window average,
the far end of an NVLink told by its remote device type."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pynvml
import pytest

from collectors.agent.nvml_source import NvmlSource
from testkit.cluster_state import pod
from testkit.nvml_standin import GIB, NvmlStandIn, StandInGpu, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, PodSpec

from .node_rig import END, GPU, START, gpu_samples, node

pytestmark = pytest.mark.agent


def l4(index: int, numa: int) -> StandInGpu:
    return StandInGpu(
        uuid=gpu_uuid(index),
        name="NVIDIA L4",
        memory_total=24 * GIB,
        bus_id=f"00000000:{0x30 + 0x20 * index:02X}:00.0",
        numa_node=numa,
    )


def test_a_board_without_mig_reads_no_mig_mode_and_counts_no_error() -> None:
    standin = NvmlStandIn([l4(0, 0), l4(1, 0)])
    source = NvmlSource(nvml=standin)
    source.start()
    source.refresh_inventory()
    source.refresh_inventory()
    assert [gpu.mig_enabled for gpu in source.inventory] == [False, False]
    assert standin.calls["nvmlDeviceGetMigMode"] == 6  # 3 inventories x 2 GPUs, each NOT_SUPPORTED
    assert source.errors.total == 0, source.errors.counts


def test_x86_numa_nodes_come_from_the_pci_devices_in_sysfs(tmp_path: Path) -> None:
    standin = NvmlStandIn([l4(0, 0), l4(1, 1)])
    with NvmlSource(nvml=standin, sys_root=standin.write_sysfs(tmp_path)) as source:
        assert [gpu.numa_node for gpu in source.inventory] == [0, 1]
        assert source.errors.total == 0
        assert ("nvmlDeviceGetNumaNodeId", "gpu0") in source.unsupported
    # What the kernel writes for the second GPU's device, by hand: 0000:50:00.0 -> node 1.
    assert (tmp_path / "bus/pci/devices/0000:50:00.0/numa_node").read_text().strip() == "1"


def test_a_single_node_machine_and_grace_boards(tmp_path: Path) -> None:
    # One socket: the kernel writes -1 (no NUMA affinity): no node, not node -1.
    standin = NvmlStandIn([l4(0, -1)])
    with NvmlSource(nvml=standin, sys_root=standin.write_sysfs(tmp_path)) as source:
        assert source.inventory[0].numa_node is None
    # Grace Hopper: NVML knows the node (the GPU's memory is one); no sysfs needed.
    gh200 = StandInGpu(uuid=gpu_uuid(0), name="NVIDIA GH200 480GB", numa_node=1, numa_via_nvml=True)
    with NvmlSource(nvml=NvmlStandIn([gh200]), sys_root=tmp_path / "absent") as source:
        assert source.inventory[0].numa_node == 1


def us(offset_seconds: float) -> int:
    return int((START + timedelta(seconds=offset_seconds)).timestamp() * 1_000_000)


def test_utilization_is_the_mean_of_the_drivers_samples_inside_the_window() -> None:
    gpu = nvswitch_node(1)[0]
    gpu.utilization = 90  # what the driver says right now, after the window: not the window's
    gpu.utilization_samples = [
        (us(-1), 100),  # before the window
        (us(1), 20),
        (us(4), 40),
        (us(8), 60),
        (us(12), 40),
        (us(15.1), 100),  # after it
    ]
    kubelet = [PodSpec("team-a", "trainer", [ContainerSpec("c", {GPU: [gpu_uuid(0)]})])]
    with node(NvmlStandIn([gpu]), kubelet, [pod("team-a", "trainer", "uid-t")]) as rig:
        samples, _ = rig.window()
    (sample,) = gpu_samples(samples)
    assert sample.utilization == Decimal("0.4")  # (20 + 40 + 60 + 40) / 4 = 40 %


def test_without_samples_the_current_reading_stands_in_and_unsupported_is_asked_once() -> None:
    old = nvswitch_node(1)[0]
    old.utilization, old.samples_supported = 70, False
    standin = NvmlStandIn([old])
    with NvmlSource(nvml=standin) as source:
        first = source.read(window=(START, END))
        source.read(window=(END, END + timedelta(seconds=15)))
        assert first[gpu_uuid(0)].utilization == Decimal("0.7")
        assert standin.calls["nvmlDeviceGetSamples"] == 1 and source.errors.total == 0
    quiet = nvswitch_node(1)[0]
    quiet.utilization = 30  # samples supported, none kept for the window: NOT_FOUND, not an error
    with NvmlSource(nvml=NvmlStandIn([quiet])) as source:
        assert source.read(window=(START, END))[gpu_uuid(0)].utilization == Decimal("0.3")
        assert source.errors.total == 0


def bridged_pairs() -> NvmlStandIn:
    """Four PCIe GPUs joined in pairs (0-1, 2-3) by four-link NVLink bridges, all on NUMA node 0."""
    gpus = [l4(i, 0) for i in range(4)]
    for first, second in ((0, 1), (2, 3)):
        gpus[first].nvlinks = {link: gpus[second].bus_id for link in range(4)}
        gpus[second].nvlinks = {link: gpus[first].bus_id for link in range(4)}
    return NvmlStandIn(gpus)


def test_a_link_to_a_gpu_missing_from_the_inventory_is_not_an_nvswitch() -> None:
    standin = bridged_pairs()
    # GPUs 1 and 3 do not enumerate (their UUID read fails): 0 and 2 see links to unknown bus ids.
    standin.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    standin.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_UNKNOWN, gpu=3)
    with NvmlSource(nvml=standin) as source:
        topology = source.topology("prod", "gpu-node-1")
    assert [g.index for g in topology.gpus] == [0, 2]
    # The far ends are GPUs, so 0 and 2 share no NVSwitch fabric: PCIe within one NUMA node.
    assert topology.links == {"0-2": "NODE"}
    assert [g.nvlink_peers for g in topology.gpus] == [[], []]


def test_an_older_driver_without_the_remote_type_falls_back_quietly() -> None:
    standin = NvmlStandIn(nvswitch_node(4))
    standin.fail("nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.NVML_ERROR_NOT_SUPPORTED)
    with NvmlSource(nvml=standin) as source:
        topology = source.topology("prod", "gpu-node-1")
        assert set(topology.links.values()) == {"NV18"} and len(topology.links) == 6
        assert source.errors.total == 0
        assert standin.calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == 4  # once per GPU, then remembered
