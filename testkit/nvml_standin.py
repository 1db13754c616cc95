"""NvmlStandIn: a test stand-in for the pynvml module's functions, driven by declared values.

It is NOT NVML and produces no real readings: tests (and benchmarks/agent.py)
pass it to ``NvmlSource(nvml=NvmlStandIn(...))`` to exercise our NVML code
paths, error handling included, on machines without an NVIDIA driver. Errors
are the real ``pynvml.NVMLError`` classes so our handling of them is the one
that runs against the real library.
"""

# Method names mirror the pynvml module, which is what this stands in for.
# ruff: noqa: N802

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3


@dataclass
class StandInMig:
    uuid: str
    profile: str  # as NVML names it: "1g.10gb", "1c.2g.20gb" (compute instance), "1g.10gb+me"
    slices: int  # compute slices of the GPU instance
    memory_total: int
    memory_used: int = 0
    gpu_instance_id: int = 1
    compute_instance_id: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    compute_slices: int | None = None  # of the GPU instance's slices, this compute instance's (None: all)


@dataclass
class StandInGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GIB
    memory_used: int = 0
    utilization: int = 0  # percent
    power_mw: int = 100_000
    energy_mj: int = 0
    bus_id: str = "00000000:00:00.0"
    numa_node: int = 0
    # link index -> remote bus id (a GPU's, or an NVSwitch's)
    nvlinks: dict[int, str] = field(default_factory=dict)
    max_mig: int = 7
    mig_enabled: bool = False
    migs: list[StandInMig | None] = field(default_factory=list)  # None = empty MIG slot
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    minor: int | None = None  # /dev/nvidia<minor>; None: the same as the index (the usual case)
    # nvmlDeviceGetNumaNodeId answers only where GPU memory is a NUMA node (Grace: GH200, GB200);
    # on x86 it is NOT_SUPPORTED and the node is in sysfs (write_sysfs).
    numa_via_nvml: bool = False
    # Boards with MIG (A100, A30, H100, H200, B200, ...); None: decided from the name.
    mig_capable: bool | None = None
    # The driver's GPU-utilization sample buffer: (CPU timestamp in microseconds, percent).
    utilization_samples: list[tuple[int, int]] = field(default_factory=list)
    samples_supported: bool = True


_MIG_BOARDS = ("A100", "A30", "H100", "H200", "H20", "B200", "B300", "GB200", "GB300")


def mig_capable(gpu: StandInGpu) -> bool:
    if gpu.mig_capable is not None:
        return gpu.mig_capable
    return any(board in gpu.name for board in _MIG_BOARDS)


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None


class NvmlStandIn:
    """Module-shaped stand-in: the pynvml functions NvmlSource calls, plus error injection."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[StandInGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = False
        # (call name, gpu index or None for any) -> NVML error code
        self.failures: dict[tuple[str, int | None], int] = {}
        self.lost: set[int] = set()
        self.calls: Counter[str] = Counter()
        self.ancestors: dict[tuple[int, int], int] = {}
        self.p2p_nvlink: set[tuple[int, int]] | None = None  # None: every switch-connected pair is OK
        for name in dir(pynvml):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(pynvml, name))

    # -- control -----------------------------------------------------------------------------------

    def write_sysfs(self, root: Path) -> Path:
        """A sysfs tree with each GPU's PCI device and its ``numa_node`` (as the kernel shows it:
        ``-1`` when the machine has a single node); returns ``root`` for ``NvmlSource(sys_root=...)``."""
        for gpu in self.gpus:
            device = root / "bus" / "pci" / "devices" / sysfs_bus_id(gpu.bus_id)
            device.mkdir(parents=True, exist_ok=True)
            (device / "numa_node").write_text(f"{gpu.numa_node}\n")
        return root

    def fail(self, call: str, code: int, gpu: int | None = None) -> None:
        self.failures[(call, gpu)] = code

    def lose(self, gpu: int) -> None:
        """The GPU fell off the bus: every call on it raises NVML_ERROR_GPU_IS_LOST."""
        self.lost.add(gpu)

    def _check(self, call: str, handle: _Handle | None = None) -> None:
        self.calls[call] += 1
        if not self.initialized and call != "nvmlInit":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        index = handle.gpu if handle is not None else None
        if index is not None and index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        for key in ((call, index), (call, None)):
            if key in self.failures:
                raise pynvml.NVMLError(self.failures[key])

    def _gpu(self, handle: _Handle) -> StandInGpu:
        return self.gpus[handle.gpu]

    def _mig(self, handle: _Handle) -> StandInMig:
        assert handle.mig is not None
        mig = self.gpus[handle.gpu].migs[handle.mig]
        assert mig is not None
        return mig

    # -- library -----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return "stand-in"

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(index)
        self._check("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return self._mig(handle).uuid if handle.mig is not None else self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetName", handle)
        gpu = self._gpu(handle)
        if handle.mig is not None:
            return f"{gpu.name} MIG {self._mig(handle).profile}"
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig is not None:
            mig = self._mig(handle)
            return SimpleNamespace(
                total=mig.memory_total, used=mig.memory_used, free=mig.memory_total - mig.memory_used
            )
        gpu = self._gpu(handle)
        return SimpleNamespace(
            total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
        )

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        self._check("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=self._gpu(handle).bus_id)

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetMinorNumber", handle)
        minor = self._gpu(handle).minor
        return handle.gpu if minor is None else minor

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetNumaNodeId", handle)
        gpu = self._gpu(handle)
        if not gpu.numa_via_nvml:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle)
        gpu = self._gpu(handle)
        if not mig_capable(gpu):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = 1 if gpu.mig_enabled else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return self._gpu(handle).max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        migs = self._gpu(handle).migs
        if index >= len(migs) or migs[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, index)

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> Any:
        self._check("nvmlDeviceGetAttributes", handle)
        mig = self._mig(handle)
        return SimpleNamespace(
            gpuInstanceSliceCount=mig.slices,
            computeInstanceSliceCount=mig.compute_slices if mig.compute_slices is not None else mig.slices,
            memorySizeMB=mig.memory_total // (1024 * 1024),
        )

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        return self._mig(handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetComputeInstanceId", handle)
        return self._mig(handle).compute_instance_id

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig is not None or self._gpu(handle).mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=self._gpu(handle).utilization, memory=0)

    def nvmlDeviceGetSamples(
        self, handle: _Handle, sampling_type: int, last_seen: int
    ) -> tuple[int, list[Any]]:
        """Samples newer than ``last_seen``; NOT_FOUND when there are none, NOT_SUPPORTED in MIG mode.
        Only GPU-utilization samples are modelled (other sampling types answer NOT_SUPPORTED)."""
        self._check("nvmlDeviceGetSamples", handle)
        gpu = self._gpu(handle)
        if handle.mig is not None or gpu.mig_enabled or not gpu.samples_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        newer = [(ts, value) for ts, value in gpu.utilization_samples if ts > last_seen]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        samples = [
            pynvml.c_nvmlSample_t(timeStamp=ts, sampleValue=pynvml.c_nvmlValue_t(uiVal=value))
            for ts, value in newer
        ]
        return int(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT), samples

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return self._gpu(handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self._gpu(handle).energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        source = self._mig(handle).processes if handle.mig is not None else self._gpu(handle).processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in source]

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", handle)
        gpu = self._gpu(handle)
        if not gpu.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link > max(gpu.nvlinks):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in gpu.nvlinks else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        """GPU when the link's far end is one of this node's GPUs (lost ones included), else SWITCH."""
        self._check("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        remote = _bus_key(self._gpu(handle).nvlinks[link])
        if any(_bus_key(gpu.bus_id) == remote for gpu in self.gpus):
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> Any:
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        return SimpleNamespace(busId=self._gpu(handle).nvlinks[link])

    def nvmlDeviceGetP2PStatus(self, first: _Handle, second: _Handle, capability: int) -> int:
        self._check("nvmlDeviceGetP2PStatus", first)
        pair = (min(first.gpu, second.gpu), max(first.gpu, second.gpu))
        if self.p2p_nvlink is None or pair in self.p2p_nvlink:
            return int(pynvml.NVML_P2P_STATUS_OK)
        return int(pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)

    def nvmlDeviceGetTopologyCommonAncestor(self, first: _Handle, second: _Handle) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", first)
        self._check("nvmlDeviceGetTopologyCommonAncestor", second)
        pair = (min(first.gpu, second.gpu), max(first.gpu, second.gpu))
        if pair in self.ancestors:
            return self.ancestors[pair]
        a, b = self.gpus[first.gpu], self.gpus[second.gpu]
        return int(pynvml.NVML_TOPOLOGY_NODE if a.numa_node == b.numa_node else pynvml.NVML_TOPOLOGY_SYSTEM)


def _bus_key(bus_id: str) -> str:
    return bus_id.lower().split(":", 1)[-1]


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as the kernel names the PCI device: ``0000:3b:00.0``."""
    domain, bus, device = bus_id.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{device}"


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-{index:012x}"


def nvswitch_node(count: int = 8, links: int = 18, name: str = "NVIDIA H100 80GB HBM3") -> list[StandInGpu]:
    """An HGX-style board: every GPU's NVLinks end at NVSwitches; half the GPUs per NUMA node."""
    gpus = []
    for index in range(count):
        gpus.append(
            StandInGpu(
                uuid=gpu_uuid(index),
                name=name,
                bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                numa_node=0 if index < count // 2 else 1,
                nvlinks={link: f"00000000:{0xA0 + link % 4:02X}:00.0" for link in range(links)},
                utilization=50 + index,
                memory_used=(index + 1) * GIB,
                power_mw=300_000 + index * 1000,
                energy_mj=1_000_000 * (index + 1),
            )
        )
    return gpus
