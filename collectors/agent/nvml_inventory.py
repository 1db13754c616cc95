"""The node's GPUs and MIG devices as NVML enumerates them, with their rate-card model names."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from collectors.agent.mig import MigProfile, profile_in_name
from collectors.agent.nvml_calls import DeviceLost, NvmlCalls, normalize_bus_id, nvml_text, reraise

MIB = 1024 * 1024
GIB = 1024 * MIB

# NVML product names -> the rate-card model names of DESIGN.md (e.g. H100-SXM-80GB).
_KNOWN_MODELS = {
    "NVIDIA H100 80GB HBM3": "H100-SXM-80GB",
    "NVIDIA H100 SXM5 80GB": "H100-SXM-80GB",
    "NVIDIA H100 PCIe": "H100-PCIE-80GB",
    "NVIDIA H100 NVL": "H100-NVL-94GB",
    "NVIDIA H200": "H200-SXM-141GB",
    "NVIDIA B200": "B200-SXM-180GB",  # the simulated fleet's and the rate cards' name
    "NVIDIA A100-SXM4-40GB": "A100-SXM-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-SXM-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIE-40GB",
    "NVIDIA A100 80GB PCIe": "A100-PCIE-80GB",
    "NVIDIA L40S": "L40S-48GB",
    "NVIDIA L4": "L4-24GB",
    "Tesla T4": "T4-16GB",
}
# nvmlValueType_t -> the member of the c_nvmlValue_t union holding a sample.
_VENDOR_PREFIX = re.compile(r"^(NVIDIA|Tesla|Quadro|GeForce)\s+", re.IGNORECASE)



def gpu_model_name(product: str, memory_total_bytes: int | None = None) -> str:
    """A stable rate-card model name for an NVML product name.

    Known products map to DESIGN.md's names (``NVIDIA A100-SXM4-40GB`` ->
    ``A100-SXM-40GB``); others become the product name without the vendor word,
    spaces as dashes, SXMn as SXM, with the memory size appended when the name
    lacks one (``NVIDIA RTX 6000 Ada Generation`` + 48 GiB -> ``RTX-6000-Ada-Generation-48GB``).
    """
    product = product.strip()
    if product in _KNOWN_MODELS:
        return _KNOWN_MODELS[product]
    name = product
    while True:
        stripped = _VENDOR_PREFIX.sub("", name)
        if stripped == name:
            break
        name = stripped
    name = re.sub(r"SXM\d", "SXM", name)
    name = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "unknown"
    if memory_total_bytes and not re.search(r"\d+GB", name, re.IGNORECASE):
        name = f"{name}-{round(memory_total_bytes / GIB)}GB"
    return name[:128]


@dataclass(frozen=True)
class MigInstance:
    """One MIG device carved out of a GPU."""

    uuid: str
    parent_uuid: str
    parent_index: int
    mig_index: int
    profile: str | None  # NVML's spelling, e.g. "1g.10gb", "1c.2g.20gb", "1g.10gb+me"
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_bytes: int | None
    slices: int | None  # compute slices of its GPU instance
    share: Decimal  # fraction of the parent GPU held: compute slices held / the parent's slice count
    compute_slices: int | None = None  # of those, the ones this device's compute instance uses


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    name: str  # NVML product name
    model: str  # rate-card model name
    memory_total_bytes: int | None
    pci_bus_id: str | None
    numa_node: int | None
    mig_enabled: bool
    mig_instances: tuple[MigInstance, ...] = ()
    minor_number: int | None = None  # /dev/nvidia<minor>; DRA names devices by it
    mig_slices: int | None = None  # compute slices of the GPU (its max MIG devices), MIG mode only




class DeviceInventory:
    """The last enumeration of GPUs and MIG devices, with their handles (refreshed on start and when
    devices change); readers take a consistent snapshot of both."""

    def __init__(self, calls: NvmlCalls, sys_root: Path) -> None:
        self._calls = calls
        self._call = calls.call
        self._nvml = calls.nvml
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}  # uuid -> handle (GPUs and MIG devices)
        self._inventory: list[GpuInfo] = []
        self._mig_handles: dict[str, Any] = {}
        self._lost: set[str] = set()
        # The PCI devices of sysfs: a GPU's NUMA node where NVML does not report it (x86).
        self.sys_root = sys_root

    @property
    def gpus(self) -> list[GpuInfo]:
        return list(self._inventory)

    def snapshot(self) -> tuple[list[GpuInfo], dict[str, Any]]:
        """The GPUs and the handles of every device (GPUs and MIG devices) by UUID."""
        with self._lock:
            return list(self._inventory), dict(self._handles)

    def refresh(self) -> list[GpuInfo]:
        """Enumerate GPUs and MIG devices again (done on start and when devices change)."""
        nvml = self._nvml
        count = self._call("nvmlDeviceGetCount", "system", nvml.nvmlDeviceGetCount) or 0
        inventory: list[GpuInfo] = []
        handles: dict[str, Any] = {}
        lost: set[str] = set()
        self._mig_handles = {}
        for index in range(count):
            label = f"gpu{index}"
            try:
                handle = self._call(
                    "nvmlDeviceGetHandleByIndex", label, nvml.nvmlDeviceGetHandleByIndex, index
                )
                if handle is None:
                    continue
                info = self._describe_gpu(index, handle)
            except DeviceLost:
                lost.add(label)
                continue
            if info is None:
                continue
            handles[info.uuid] = handle
            inventory.append(info)
            for mig in info.mig_instances:
                mig_handle = self._mig_handles.get(mig.uuid)
                if mig_handle is not None:
                    handles[mig.uuid] = mig_handle
        with self._lock:
            self._inventory = inventory
            self._handles = handles
            self._lost = lost
        return list(inventory)

    def _describe_gpu(self, index: int, handle: Any) -> GpuInfo | None:
        nvml = self._nvml
        label = f"gpu{index}"
        uuid = self._call("nvmlDeviceGetUUID", label, nvml.nvmlDeviceGetUUID, handle)
        if uuid is None:
            return None
        uuid = nvml_text(uuid)
        name = nvml_text(self._call("nvmlDeviceGetName", label, nvml.nvmlDeviceGetName, handle) or "unknown")
        memory = self._call("nvmlDeviceGetMemoryInfo", label, nvml.nvmlDeviceGetMemoryInfo, handle)
        memory_total = int(memory.total) if memory is not None else None
        pci = self._call("nvmlDeviceGetPciInfo", label, nvml.nvmlDeviceGetPciInfo, handle)
        bus_id = normalize_bus_id(nvml_text(pci.busId)) if pci is not None else None
        numa = None
        if hasattr(nvml, "nvmlDeviceGetNumaNodeId"):
            # Supported where the GPU's memory is a NUMA node of its own (Grace); NOT_SUPPORTED on x86.
            numa_value = self._call(
                "nvmlDeviceGetNumaNodeId",
                label,
                nvml.nvmlDeviceGetNumaNodeId,
                handle,
                quiet=(self._calls.not_supported,),
            )
            numa = int(numa_value) if numa_value is not None and int(numa_value) >= 0 else None
        if numa is None and pci is not None:
            numa = sysfs_numa_node(self.sys_root, nvml_text(pci.busId))
        mig_enabled = False
        # NOT_SUPPORTED on boards without MIG (L4, L40S, T4, ...): MIG is off, not an error.
        mode = self._call(
            "nvmlDeviceGetMigMode",
            label,
            nvml.nvmlDeviceGetMigMode,
            handle,
            quiet=(self._calls.not_supported,),
        )
        if mode is not None:
            current = mode[0] if isinstance(mode, list | tuple) else mode
            mig_enabled = int(current) == int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
        instances: tuple[MigInstance, ...] = ()
        slices: int | None = None
        if mig_enabled:
            slots = self._call(
                "nvmlDeviceGetMaxMigDeviceCount", label, nvml.nvmlDeviceGetMaxMigDeviceCount, handle
            )
            slices = int(slots) if slots else None
            instances = self._describe_migs(index, uuid, handle, slices) if slices else ()
        minor = None
        if hasattr(nvml, "nvmlDeviceGetMinorNumber"):
            minor_value = self._call("nvmlDeviceGetMinorNumber", label, nvml.nvmlDeviceGetMinorNumber, handle)
            minor = int(minor_value) if minor_value is not None else None
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            model=gpu_model_name(name, memory_total),
            memory_total_bytes=memory_total,
            pci_bus_id=bus_id,
            numa_node=numa,
            mig_enabled=mig_enabled,
            mig_instances=instances,
            minor_number=minor,
            mig_slices=slices,
        )

    def _describe_migs(
        self, index: int, parent_uuid: str, handle: Any, total_slices: int
    ) -> tuple[MigInstance, ...]:
        # The smallest profile is one slice, so the max MIG device count is the GPU's slice count.
        nvml = self._nvml
        instances = []
        for mig_index in range(total_slices):
            mig_label = f"gpu{index}/mig{mig_index}"
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6):
                    continue  # an empty MIG slot: normal, not an error
                self._call("nvmlDeviceGetMigDeviceHandleByIndex", mig_label, reraise, exc)
                continue
            mig_uuid = self._call("nvmlDeviceGetUUID", mig_label, nvml.nvmlDeviceGetUUID, mig)
            if mig_uuid is None:
                continue
            mig_uuid = nvml_text(mig_uuid)
            name = self._call("nvmlDeviceGetName", mig_label, nvml.nvmlDeviceGetName, mig)
            attributes = self._call("nvmlDeviceGetAttributes", mig_label, nvml.nvmlDeviceGetAttributes, mig)
            memory = self._call("nvmlDeviceGetMemoryInfo", mig_label, nvml.nvmlDeviceGetMemoryInfo, mig)
            gi = self._call("nvmlDeviceGetGpuInstanceId", mig_label, nvml.nvmlDeviceGetGpuInstanceId, mig)
            ci = self._call(
                "nvmlDeviceGetComputeInstanceId", mig_label, nvml.nvmlDeviceGetComputeInstanceId, mig
            )
            memory_total = int(memory.total) if memory is not None else None
            profile = _mig_profile(nvml_text(name) if name is not None else "", attributes)
            # Compute slices held: the GPU instance's, or the compute instance's part of it when
            # several compute instances share one GPU instance (1c.2g.20gb: one of two slices).
            slices = int(attributes.gpuInstanceSliceCount) if attributes is not None else None
            compute = _positive(getattr(attributes, "computeInstanceSliceCount", None))
            if profile is not None:
                slices = slices or profile.gpu_slices
                compute = compute or profile.compute_slices
            compute = compute or slices
            share = Decimal(compute or 1) / Decimal(total_slices)
            self._mig_handles[mig_uuid] = mig
            instances.append(
                MigInstance(
                    uuid=mig_uuid,
                    parent_uuid=parent_uuid,
                    parent_index=index,
                    mig_index=mig_index,
                    profile=profile.name if profile is not None else None,
                    gpu_instance_id=int(gi) if gi is not None else None,
                    compute_instance_id=int(ci) if ci is not None else None,
                    memory_total_bytes=memory_total,
                    slices=slices,
                    compute_slices=compute,
                    share=share,
                )
            )
        return tuple(instances)

    def device(self, uuid: str) -> tuple[GpuInfo, MigInstance | None] | None:
        """The GPU (and MIG instance) a UUID names, from the last inventory."""
        for gpu in self._inventory:
            if gpu.uuid == uuid:
                return gpu, None
            for mig in gpu.mig_instances:
                if mig.uuid == uuid:
                    return gpu, mig
        return None


def sysfs_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0`` (16-bit domain, lower case)."""
    parts = nvml_bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        domain = int(parts[0], 16)
    except ValueError:
        return None
    return f"{domain:04x}:{parts[1]}:{parts[2]}"


def sysfs_numa_node(sys_root: Path, nvml_bus_id: str) -> int | None:
    """The NUMA node the kernel gives the GPU's PCI device (``-1``: none, e.g. one socket)."""
    bus = sysfs_bus_id(nvml_bus_id)
    if bus is None:
        return None
    try:
        value = int((sys_root / "bus" / "pci" / "devices" / bus / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None



def _positive(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _mig_profile(name: str, attributes: Any) -> MigProfile | None:
    """``NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb`` -> that profile; else built from the device's slice
    counts and memory (a name without the profile, e.g. an older driver's)."""
    named = profile_in_name(name)
    if named is not None:
        return named
    if attributes is None:
        return None
    slices = _positive(getattr(attributes, "gpuInstanceSliceCount", None))
    memory_mb = _positive(getattr(attributes, "memorySizeMB", None))
    if slices is None or memory_mb is None:
        return None
    compute = _positive(getattr(attributes, "computeInstanceSliceCount", None))
    return MigProfile(
        gpu_slices=slices,
        memory_gb=round(memory_mb / 1024),
        compute_slices=compute if compute is not None and compute != slices else None,
    )
