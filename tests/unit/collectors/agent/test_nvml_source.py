"""NvmlSource driven through NvmlStandIn (a declared stand-in for pynvml's functions, not NVML)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pynvml
import pytest

from collectors.agent.nvml_inventory import gpu_model_name
from collectors.agent.nvml_source import NvmlSource, NvmlUnavailable
from collectors.agent.nvml_telemetry import EnergyMeter
from testkit.nvml_standin import GIB, NvmlStandIn, StandInGpu, StandInMig, gpu_uuid, nvswitch_node

pytestmark = pytest.mark.agent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def a100_mig_gpu() -> StandInGpu:
    return StandInGpu(
        uuid="GPU-a100-0",
        name="NVIDIA A100-SXM4-40GB",
        memory_total=40 * GIB,
        bus_id="00000000:07:00.0",
        mig_enabled=True,
        max_mig=7,
        migs=[
            StandInMig("MIG-a", "1g.5gb", 1, 5 * GIB, memory_used=GIB, processes=[(4242, GIB)]),
            None,  # an empty slot is normal, not an error
            StandInMig("MIG-b", "3g.20gb", 3, 20 * GIB, gpu_instance_id=2),
        ],
    )


def test_inventory_lists_gpus_and_mig_instances_with_profiles(tmp_path: Path) -> None:
    standin = NvmlStandIn([*nvswitch_node(2), a100_mig_gpu()])
    # x86: NVML has no NUMA node for the GPU, the kernel's PCI device does.
    with NvmlSource(nvml=standin, sys_root=standin.write_sysfs(tmp_path)) as source:
        inventory = source.inventory
    assert [g.index for g in inventory] == [0, 1, 2]
    h100 = inventory[0]
    assert (h100.uuid, h100.name, h100.model) == (gpu_uuid(0), "NVIDIA H100 80GB HBM3", "H100-SXM-80GB")
    assert h100.memory_total_bytes == 80 * GIB and not h100.mig_enabled and h100.numa_node == 0
    a100 = inventory[2]
    assert a100.model == "A100-SXM-40GB" and a100.mig_enabled
    assert [(m.uuid, m.profile, m.slices, m.share) for m in a100.mig_instances] == [
        ("MIG-a", "1g.5gb", 1, Decimal(1) / 7),
        ("MIG-b", "3g.20gb", 3, Decimal(3) / 7),
    ]
    assert a100.mig_instances[1].gpu_instance_id == 2
    assert source.device("MIG-b") == (a100, a100.mig_instances[1])
    assert source.errors.total == 0
    assert not standin.initialized  # nvmlShutdown on exit


def test_readings_per_device_and_energy_from_counter_deltas() -> None:
    clock = Clock()
    standin = NvmlStandIn([*nvswitch_node(2), a100_mig_gpu()])
    source = NvmlSource(nvml=standin, clock=clock)
    source.start()
    standin.gpus[0].processes = [(100, 2 * GIB), (101, None), (102, 2**64 - 1)]
    first = source.read()
    assert first[gpu_uuid(0)].energy_joules is None  # no previous counter yet
    assert first[gpu_uuid(0)].utilization == Decimal("0.50")
    assert first[gpu_uuid(0)].memory_used_bytes == GIB
    assert first[gpu_uuid(0)].power_watts == Decimal("300")
    assert [(p.pid, p.used_bytes) for p in first[gpu_uuid(0)].processes] == [
        (100, 2 * GIB),
        (101, None),
        (102, None),
    ]
    clock.now += 15
    standin.gpus[0].energy_mj += 4_500_000  # 4500 J in 15 s = 300 W
    second = source.read()
    assert second[gpu_uuid(0)].energy_joules == Decimal("4500.000")
    # MIG devices: memory and processes; utilization is NOT_SUPPORTED under MIG and is not asked for
    assert second["MIG-a"].memory_used_bytes == GIB
    assert [p.pid for p in second["MIG-a"].processes] == [4242]
    assert second["MIG-a"].utilization is None and second["MIG-a"].power_watts is None
    assert source.errors.total == 0


def test_energy_counter_reset_and_wrap() -> None:
    meter = EnergyMeter()
    assert meter.from_counter("g", 10_000_000, 0.0) is None
    assert meter.from_counter("g", 13_000_000, 15.0) == Decimal("3000.000")
    # driver reload: counter restarts near zero; energy since the reset is what we can know
    assert meter.from_counter("g", 2_000_000, 30.0) == Decimal("2000.000")
    assert meter.resets == 1
    # wrap at 2^64
    meter.from_counter("w", 2**64 - 1_000_000, 0.0)
    assert meter.from_counter("w", 500_000, 15.0) == Decimal("1500.000")
    assert meter.wraps == 1
    # an impossible jump (more than 5 kW) is discarded, not billed as telemetry
    assert meter.from_counter("g", 2_000_000 + 10**12, 45.0) is None
    assert meter.implausible == 1


def test_energy_counter_reset_through_the_source() -> None:
    clock = Clock()
    standin = NvmlStandIn(nvswitch_node(1))
    source = NvmlSource(nvml=standin, clock=clock)
    source.start()
    source.read()
    clock.now += 15
    standin.gpus[0].energy_mj = 750_000  # reset
    assert source.read()[gpu_uuid(0)].energy_joules == Decimal("750.000")
    assert source.energy.resets == 1


def test_not_supported_fields_stay_empty_and_are_counted() -> None:
    clock = Clock()
    standin = NvmlStandIn(nvswitch_node(2))
    standin.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    standin.fail("nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=0)
    source = NvmlSource(nvml=standin, clock=clock)
    source.start()
    source.read()
    clock.now += 10
    readings = source.read()
    assert readings[gpu_uuid(1)].power_watts is None
    assert readings[gpu_uuid(1)].utilization == Decimal("0.51")  # other fields still read
    # no energy counter on GPU 0 (pre-Volta style): energy integrates power instead
    assert readings[gpu_uuid(0)].energy_joules == Decimal("3000.000")
    counts = source.error_counts()
    assert counts[("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED")] == 2
    assert counts[("nvmlDeviceGetTotalEnergyConsumption", "NOT_SUPPORTED")] == 2


def test_lost_gpu_is_marked_and_the_others_keep_reporting() -> None:
    standin = NvmlStandIn(nvswitch_node(3))
    source = NvmlSource(nvml=standin)
    source.start()
    standin.lose(1)
    readings = source.read()
    assert readings[gpu_uuid(1)].lost
    assert readings[gpu_uuid(1)].utilization is None
    assert not readings[gpu_uuid(0)].lost and readings[gpu_uuid(0)].utilization is not None
    assert not readings[gpu_uuid(2)].lost and readings[gpu_uuid(2)].power_watts is not None
    assert source.error_counts()[("nvmlDeviceGetUtilizationRates", "GPU_IS_LOST")] == 1
    # topology and a new inventory survive it too
    topology = source.topology("c", "n")
    assert [g.index for g in topology.gpus] == [0, 1, 2]
    inventory = source.refresh_inventory()
    assert [g.index for g in inventory] == [0, 2]


def test_lost_gpu_during_inventory_is_skipped() -> None:
    standin = NvmlStandIn(nvswitch_node(2))
    standin.lose(0)
    source = NvmlSource(nvml=standin)
    inventory = source.start()
    assert [g.uuid for g in inventory] == [gpu_uuid(1)]


def test_unknown_error_on_one_call_is_counted_without_stopping() -> None:
    standin = NvmlStandIn(nvswitch_node(2))
    standin.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_UNKNOWN)
    source = NvmlSource(nvml=standin)
    source.start()
    readings = source.read()
    assert readings[gpu_uuid(0)].processes == ()
    assert source.error_counts()[("nvmlDeviceGetComputeRunningProcesses", "UNKNOWN")] == 2


def test_init_failure_raises_nvml_unavailable() -> None:
    source = NvmlSource(nvml=NvmlStandIn([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(NvmlUnavailable, match="DRIVER_NOT_LOADED"):
        source.start()


def test_topology_nvswitch_board_is_all_to_all_nv18(tmp_path: Path) -> None:
    standin = NvmlStandIn(nvswitch_node(8))
    source = NvmlSource(nvml=standin, sys_root=standin.write_sysfs(tmp_path))
    source.start()
    topology = source.topology("prod", "gpu-node-1")
    assert topology.node == "gpu-node-1" and len(topology.gpus) == 8
    assert topology.gpus[0].nvlink_peers == [1, 2, 3, 4, 5, 6, 7]
    assert len(topology.links) == 28 and set(topology.links.values()) == {"NV18"}
    assert topology.gpus[5].numa_node == 1


def test_topology_direct_nvlink_bridges_and_pcie_classes() -> None:
    gpus = [
        StandInGpu(
            uuid=gpu_uuid(i),
            name="NVIDIA L40S",
            memory_total=48 * GIB,
            bus_id=f"00000000:{i + 1:02X}:00.0",
            numa_node=i // 2,
        )
        for i in range(4)
    ]
    # an NVLink bridge with 4 links between GPU 0 and GPU 1 only
    gpus[0].nvlinks = {k: gpus[1].bus_id for k in range(4)}
    gpus[1].nvlinks = {k: gpus[0].bus_id for k in range(4)}
    standin = NvmlStandIn(gpus)
    standin.ancestors[(2, 3)] = pynvml.NVML_TOPOLOGY_SINGLE
    source = NvmlSource(nvml=standin)
    source.start()
    topology = source.topology("c", "n")
    assert topology.links["0-1"] == "NV4"
    assert topology.links["2-3"] == "PIX"
    assert topology.links["0-2"] == "SYS"  # across NUMA nodes
    assert topology.gpus[0].nvlink_peers == [1] and topology.gpus[2].nvlink_peers == []
    assert topology.gpus[0].model == "L40S-48GB"
    assert source.errors.total == 0  # NOT_SUPPORTED on boards without NVLink ends the scan, no error


def test_gpu_model_names() -> None:
    assert gpu_model_name("NVIDIA H100 80GB HBM3") == "H100-SXM-80GB"
    assert gpu_model_name("NVIDIA A100-SXM4-80GB") == "A100-SXM-80GB"
    assert gpu_model_name("NVIDIA B200", 179 * GIB) == "B200-SXM-180GB"  # not named from its memory
    assert gpu_model_name("NVIDIA RTX 6000 Ada Generation", 48 * GIB) == "RTX-6000-Ada-Generation-48GB"
    assert gpu_model_name("Tesla V100-SXM2-16GB") == "V100-SXM-16GB"
    assert gpu_model_name("NVIDIA GeForce RTX 4090", 24 * GIB) == "RTX-4090-24GB"
