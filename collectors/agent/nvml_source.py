"""NVML source: GPU inventory, per-device telemetry and topology through pynvml.

Every NVML call goes through :meth:`NvmlSource._call`, which turns an
``NVMLError`` into ``None`` and a count in :attr:`NvmlSource.errors` keyed by
(call, error name). A GPU that fell off the bus (``NVML_ERROR_GPU_IS_LOST``) is
marked lost for the rest of the read and skipped; ``NVML_ERROR_NOT_SUPPORTED``
on a field leaves that field empty. Nothing here stops the agent.

The pynvml module is injected (``NvmlSource(nvml=...)``, default the real
``pynvml`` from nvidia-ml-py) so tests can drive this code with a stand-in.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from collectors.agent.mig import MigProfile, profile_in_name
from gpumeter.core.models import GpuDevice, NodeTopology

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
GIB = 1024 * MIB
# Energy counter: uint64 millijoules since the driver loaded.
ENERGY_COUNTER_MODULUS = 2**64
# No single GPU draws this much; a larger apparent draw means the counter was reset or is garbage.
MAX_PLAUSIBLE_WATTS = 5000

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi topo -m names (the extender's link classes).
TOPOLOGY_CLASSES = {
    0: "X",  # NVML_TOPOLOGY_INTERNAL: same board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE: several PCIe switches
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE: the CPU's host bridge
    40: "NODE",  # NVML_TOPOLOGY_NODE: host bridges within one NUMA node
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM: across the socket interconnect
}

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
_SAMPLE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
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


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    used_bytes: int | None


@dataclass
class DeviceReading:
    """One read of one device (GPU or MIG instance); a None field was unreadable or unsupported."""

    uuid: str
    index: int
    utilization: Decimal | None = None  # fraction of time a kernel ran, 0..1
    memory_used_bytes: int | None = None
    power_watts: Decimal | None = None
    energy_joules: Decimal | None = None  # since the previous read of this device
    processes: tuple[ProcessMemory, ...] = ()
    lost: bool = False


@dataclass
class _EnergyState:
    millijoules: int | None = None
    power_watts: Decimal | None = None
    at: float = 0.0


class EnergyMeter:
    """Energy between reads from NVML's cumulative millijoule counter.

    A counter that went backwards was reset (driver reload, GPU reset) unless it
    was just below 2^64, which is a wrap. After a reset the energy since the
    reset is what the counter holds: a lower bound for the interval. A delta
    no GPU could draw in the elapsed time is discarded and counted.
    """

    def __init__(self) -> None:
        self._state: dict[str, _EnergyState] = {}
        self.resets = 0
        self.wraps = 0
        self.implausible = 0

    def forget(self, uuid: str) -> None:
        self._state.pop(uuid, None)

    def from_counter(self, uuid: str, millijoules: int, now: float) -> Decimal | None:
        state = self._state.setdefault(uuid, _EnergyState())
        previous, previous_at = state.millijoules, state.at
        state.millijoules, state.at = millijoules, now
        if previous is None:
            return None
        if millijoules >= previous:
            delta = millijoules - previous
        elif previous > ENERGY_COUNTER_MODULUS - 2**40:
            self.wraps += 1
            delta = ENERGY_COUNTER_MODULUS - previous + millijoules
        else:
            self.resets += 1
            delta = millijoules
        elapsed = max(now - previous_at, 1e-3)
        if delta > MAX_PLAUSIBLE_WATTS * 1000 * elapsed:
            self.implausible += 1
            return None
        return Decimal(delta).scaleb(-3)

    def from_power(self, uuid: str, watts: Decimal | None, now: float) -> Decimal | None:
        """Trapezoid integral of power readings, for GPUs without the energy counter (pre-Volta)."""
        state = self._state.setdefault(uuid, _EnergyState())
        previous, previous_at = state.power_watts, state.at
        state.power_watts, state.at = watts, now
        if previous is None or watts is None or previous_at == 0.0:
            return None
        elapsed = Decimal(str(round(now - previous_at, 6)))
        return ((previous + watts) / 2 * elapsed).quantize(Decimal("0.001"))


@dataclass
class NvmlErrors:
    """NVML error counts by (call, error name), with a log line the first time each is seen per device."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)

    def record(self, call: str, error: str, device: str, detail: str) -> None:
        self.counts[(call, error)] += 1
        key = (call, error, device)
        if key not in self._seen:
            self._seen.add(key)
            log.warning("NVML %s on %s: %s (%s)", call, device, error, detail)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _DeviceLost(Exception):
    pass


class NvmlUnavailable(RuntimeError):
    """nvmlInit failed: no driver, no library, or no permission."""


class NvmlSource:
    """GPU inventory, telemetry and topology of this node from NVML."""

    def __init__(
        self,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sys_root: Path = Path("/sys"),
    ) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._clock = clock
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}  # uuid -> handle (GPUs and MIG devices)
        self._inventory: list[GpuInfo] = []
        self._mig_handles: dict[str, Any] = {}
        self._lost: set[str] = set()
        self._started = False
        self.errors = NvmlErrors()
        self.energy = EnergyMeter()
        self.driver_version: str | None = None
        self._error_names = self._error_name_table()
        self._lost_code = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._not_supported = int(getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3))
        self._not_found = int(getattr(nvml, "NVML_ERROR_NOT_FOUND", 6))
        # The PCI devices of sysfs: a GPU's NUMA node where NVML does not report it (x86).
        self.sys_root = sys_root
        # (call, device) NVML answered NOT_SUPPORTED for where that is what the hardware says: not errors.
        self.unsupported: set[tuple[str, str]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> list[GpuInfo]:
        """nvmlInit and a first inventory. Raises NvmlUnavailable when NVML cannot start."""
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {self._describe(exc)}") from exc
        self._started = True
        version = self._call("nvmlSystemGetDriverVersion", "system", self._nvml.nvmlSystemGetDriverVersion)
        self.driver_version = _text(version) if version is not None else None
        return self.refresh_inventory()

    def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown: %s", self._describe(exc))

    def __enter__(self) -> NvmlSource:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- error handling ----------------------------------------------------------------------------

    def _error_name_table(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for attribute in dir(self._nvml):
            if attribute.startswith("NVML_ERROR_"):
                value = getattr(self._nvml, attribute)
                if isinstance(value, int) and value not in names:
                    names[value] = attribute.removeprefix("NVML_ERROR_")
        return names

    def _describe(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        name = self._error_names.get(code, f"code {code}") if isinstance(code, int) else "unknown"
        try:
            text = str(exc)
        except Exception:  # pynvml's __str__ itself calls into the library
            text = name
        return f"{name}: {text}"

    def _call(
        self, call: str, device: str, fn: Callable[..., T], *args: Any, quiet: tuple[int, ...] = ()
    ) -> T | None:
        """Run one NVML call; an NVMLError becomes None and a count. GPU_IS_LOST raises _DeviceLost.

        Codes in ``quiet`` are answers, not errors (NOT_SUPPORTED where the hardware lacks the
        feature): None, noted in :attr:`unsupported`, never counted or logged.
        """
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in quiet:
                self.unsupported.add((call, device))
                return None
            name = self._error_names.get(code, f"code_{code}") if isinstance(code, int) else "UNKNOWN"
            self.errors.record(call, name, device, self._describe(exc))
            if code == self._lost_code:
                raise _DeviceLost(device) from exc
            return None

    # -- inventory ---------------------------------------------------------------------------------

    @property
    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    def refresh_inventory(self) -> list[GpuInfo]:
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
            except _DeviceLost:
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
        uuid = _text(uuid)
        name = _text(self._call("nvmlDeviceGetName", label, nvml.nvmlDeviceGetName, handle) or "unknown")
        memory = self._call("nvmlDeviceGetMemoryInfo", label, nvml.nvmlDeviceGetMemoryInfo, handle)
        memory_total = int(memory.total) if memory is not None else None
        pci = self._call("nvmlDeviceGetPciInfo", label, nvml.nvmlDeviceGetPciInfo, handle)
        bus_id = _normalize_bus_id(_text(pci.busId)) if pci is not None else None
        numa = None
        if hasattr(nvml, "nvmlDeviceGetNumaNodeId"):
            # Supported where the GPU's memory is a NUMA node of its own (Grace); NOT_SUPPORTED on x86.
            numa_value = self._call(
                "nvmlDeviceGetNumaNodeId",
                label,
                nvml.nvmlDeviceGetNumaNodeId,
                handle,
                quiet=(self._not_supported,),
            )
            numa = int(numa_value) if numa_value is not None and int(numa_value) >= 0 else None
        if numa is None and pci is not None:
            numa = sysfs_numa_node(self.sys_root, _text(pci.busId))
        mig_enabled = False
        # NOT_SUPPORTED on boards without MIG (L4, L40S, T4, ...): MIG is off, not an error.
        mode = self._call(
            "nvmlDeviceGetMigMode",
            label,
            nvml.nvmlDeviceGetMigMode,
            handle,
            quiet=(self._not_supported,),
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
                self._call("nvmlDeviceGetMigDeviceHandleByIndex", mig_label, _raise, exc)
                continue
            mig_uuid = self._call("nvmlDeviceGetUUID", mig_label, nvml.nvmlDeviceGetUUID, mig)
            if mig_uuid is None:
                continue
            mig_uuid = _text(mig_uuid)
            name = self._call("nvmlDeviceGetName", mig_label, nvml.nvmlDeviceGetName, mig)
            attributes = self._call("nvmlDeviceGetAttributes", mig_label, nvml.nvmlDeviceGetAttributes, mig)
            memory = self._call("nvmlDeviceGetMemoryInfo", mig_label, nvml.nvmlDeviceGetMemoryInfo, mig)
            gi = self._call("nvmlDeviceGetGpuInstanceId", mig_label, nvml.nvmlDeviceGetGpuInstanceId, mig)
            ci = self._call(
                "nvmlDeviceGetComputeInstanceId", mig_label, nvml.nvmlDeviceGetComputeInstanceId, mig
            )
            memory_total = int(memory.total) if memory is not None else None
            profile = _mig_profile(_text(name) if name is not None else "", attributes)
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

    # -- telemetry ---------------------------------------------------------------------------------

    def read(self, window: tuple[datetime, datetime] | None = None) -> dict[str, DeviceReading]:
        """One read of every GPU and MIG device, keyed by UUID. Lost GPUs come back with ``lost=True``.

        With ``window``, a GPU's utilization is the average of the driver's utilization samples
        taken inside it (``nvmlDeviceGetSamples``); without samples (none kept for the window, or
        a GPU that does not support them) it is the driver's current reading.
        """
        with self._lock:
            inventory = list(self._inventory)
            handles = dict(self._handles)
        readings: dict[str, DeviceReading] = {}
        now = self._clock()
        for gpu in inventory:
            handle = handles.get(gpu.uuid)
            label = f"gpu{gpu.index}"
            try:
                readings[gpu.uuid] = self._read_gpu(gpu, handle, label, now, window)
                for mig in gpu.mig_instances:
                    mig_handle = handles.get(mig.uuid)
                    mig_label = f"{label}/mig{mig.mig_index}"
                    readings[mig.uuid] = self._read_mig(gpu, mig, mig_handle, mig_label)
            except _DeviceLost:
                self.energy.forget(gpu.uuid)
                readings[gpu.uuid] = DeviceReading(uuid=gpu.uuid, index=gpu.index, lost=True)
                for mig in gpu.mig_instances:
                    readings[mig.uuid] = DeviceReading(uuid=mig.uuid, index=gpu.index, lost=True)
        return readings

    def _read_gpu(
        self, gpu: GpuInfo, handle: Any, label: str, now: float, window: tuple[datetime, datetime] | None
    ) -> DeviceReading:
        nvml = self._nvml
        reading = DeviceReading(uuid=gpu.uuid, index=gpu.index)
        if handle is None:
            return reading
        if not gpu.mig_enabled:  # in MIG mode NVML has no utilization for the GPU (nor its slices)
            reading.utilization = self._window_utilization(handle, label, window)
            if reading.utilization is None:
                rates = self._call(
                    "nvmlDeviceGetUtilizationRates", label, nvml.nvmlDeviceGetUtilizationRates, handle
                )
                if rates is not None:
                    reading.utilization = (Decimal(int(rates.gpu)) / 100).quantize(Decimal("0.01"))
        memory = self._call("nvmlDeviceGetMemoryInfo", label, nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            reading.memory_used_bytes = int(memory.used)
        milliwatts = self._call("nvmlDeviceGetPowerUsage", label, nvml.nvmlDeviceGetPowerUsage, handle)
        if milliwatts is not None:
            reading.power_watts = Decimal(int(milliwatts)).scaleb(-3)
        counter = self._call(
            "nvmlDeviceGetTotalEnergyConsumption", label, nvml.nvmlDeviceGetTotalEnergyConsumption, handle
        )
        if counter is not None:
            reading.energy_joules = self.energy.from_counter(gpu.uuid, int(counter), now)
        else:
            reading.energy_joules = self.energy.from_power(gpu.uuid, reading.power_watts, now)
        if not gpu.mig_enabled:
            reading.processes = self._processes(handle, label)
        return reading

    def _window_utilization(
        self, handle: Any, label: str, window: tuple[datetime, datetime] | None
    ) -> Decimal | None:
        """Mean of the GPU-utilization samples the driver took inside ``window`` (None: no samples)."""
        nvml = self._nvml
        call = "nvmlDeviceGetSamples"
        if window is None or not hasattr(nvml, call) or (call, label) in self.unsupported:
            return None
        start_us = int(window[0].timestamp() * 1_000_000)
        end_us = int(window[1].timestamp() * 1_000_000)
        kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", 1)
        try:
            # Samples after the given timestamp (microseconds, CPU clock): from the window's start on.
            value_type, samples = nvml.nvmlDeviceGetSamples(handle, kind, start_us - 1)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == self._not_supported:
                self.unsupported.add((call, label))  # this GPU has no sample buffer: never ask again
            elif code != self._not_found:  # NOT_FOUND: no sample since then, not an error
                self._call(call, label, _raise, exc)
            return None
        field_name = _SAMPLE_FIELDS.get(int(value_type), "uiVal")
        values = [
            Decimal(getattr(sample.sampleValue, field_name))
            for sample in samples
            if start_us <= int(sample.timeStamp) < end_us
        ]
        if not values:
            return None
        mean: Decimal = sum(values, Decimal(0)) / len(values) / 100
        return mean.quantize(Decimal("0.000001"))

    def _read_mig(self, gpu: GpuInfo, mig: MigInstance, handle: Any, label: str) -> DeviceReading:
        # Power, energy and utilization belong to the whole GPU; a MIG device reports memory and processes.
        reading = DeviceReading(uuid=mig.uuid, index=gpu.index)
        if handle is None:
            return reading
        memory = self._call("nvmlDeviceGetMemoryInfo", label, self._nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            reading.memory_used_bytes = int(memory.used)
        reading.processes = self._processes(handle, label)
        return reading

    def _processes(self, handle: Any, label: str) -> tuple[ProcessMemory, ...]:
        nvml = self._nvml
        running = self._call(
            "nvmlDeviceGetComputeRunningProcesses", label, nvml.nvmlDeviceGetComputeRunningProcesses, handle
        )
        if not running:
            return ()
        out = []
        for process in running:
            raw = getattr(process, "usedGpuMemory", None)
            # NVML reports "not available" (e.g. without permission) as None or as 2^64-1.
            used = int(raw) if raw is not None else None
            if used is not None and not 0 <= used < 2**63:
                used = None
            out.append(ProcessMemory(pid=int(process.pid), used_bytes=used))
        return tuple(out)

    # -- topology ----------------------------------------------------------------------------------

    def topology(self, cluster: str, node: str, at: datetime | None = None) -> NodeTopology:
        """GPU layout for the scheduler extender: NVLink peers and pairwise link class.

        A pair joined by NVLink is ``NV<links>`` as ``nvidia-smi topo -m`` prints it:
        direct links counted per peer (NVLink bridges, hybrid cube mesh), or, on
        NVSwitch systems where every link ends at a switch, the smaller of the
        two GPUs' switch-link counts when NVML confirms NVLink P2P between them.
        Other pairs get the PCIe common-ancestor class (PIX, PXB, PHB, NODE, SYS).
        """
        with self._lock:
            inventory = list(self._inventory)
            handles = dict(self._handles)
        by_bus = {gpu.pci_bus_id: gpu.index for gpu in inventory if gpu.pci_bus_id}
        direct: dict[int, Counter[int]] = {}
        switched: dict[int, int] = {}
        for gpu in inventory:
            try:
                direct[gpu.index], switched[gpu.index] = self._nvlinks(gpu, handles.get(gpu.uuid), by_bus)
            except _DeviceLost:
                direct[gpu.index], switched[gpu.index] = Counter(), 0
        links: dict[str, str] = {}
        peers: dict[int, set[int]] = {gpu.index: set() for gpu in inventory}
        for position, first in enumerate(inventory):
            for second in inventory[position + 1 :]:
                key = f"{first.index}-{second.index}"
                h1, h2 = handles.get(first.uuid), handles.get(second.uuid)
                count = max(direct[first.index][second.index], direct[second.index][first.index])
                fabric = bool(switched[first.index] and switched[second.index])
                if not count and fabric and self._p2p_nvlink(first.index, h1, h2):
                    count = min(switched[first.index], switched[second.index])
                if count:
                    links[key] = f"NV{count}"
                    peers[first.index].add(second.index)
                    peers[second.index].add(first.index)
                    continue
                if h1 is None or h2 is None:
                    continue
                try:
                    level = self._call(
                        "nvmlDeviceGetTopologyCommonAncestor",
                        f"gpu{first.index}",
                        self._nvml.nvmlDeviceGetTopologyCommonAncestor,
                        h1,
                        h2,
                    )
                except _DeviceLost:
                    continue
                if level is not None:
                    links[key] = TOPOLOGY_CLASSES.get(int(level), "SYS")
        devices = [
            GpuDevice(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                nvlink_peers=sorted(peers[gpu.index]),
                numa_node=gpu.numa_node,
                memory_bytes=gpu.memory_total_bytes,
                pci_bus_id=gpu.pci_bus_id,
                mig_enabled=gpu.mig_enabled,
            )
            for gpu in inventory
        ]
        return NodeTopology(cluster=cluster, node=node, gpus=devices, links=links, at=at or datetime.now(UTC))

    def _p2p_nvlink(self, index: int, h1: Any, h2: Any) -> bool:
        nvml = self._nvml
        if h1 is None or h2 is None:
            return False
        if not hasattr(nvml, "nvmlDeviceGetP2PStatus"):
            return True  # both GPUs have active switch links: on an NVSwitch fabric they reach each other
        try:
            status = self._call(
                "nvmlDeviceGetP2PStatus",
                f"gpu{index}",
                nvml.nvmlDeviceGetP2PStatus,
                h1,
                h2,
                getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2),
            )
        except _DeviceLost:
            return False
        return status is not None and int(status) == int(getattr(nvml, "NVML_P2P_STATUS_OK", 0))

    def _nvlinks(self, gpu: GpuInfo, handle: Any, by_bus: dict[str, int]) -> tuple[Counter[int], int]:
        """Active NVLink links of one GPU: (links per peer GPU index, links ending at a switch)."""
        nvml = self._nvml
        peers: Counter[int] = Counter()
        switch_links = 0
        if handle is None or not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
            return peers, 0
        label = f"gpu{gpu.index}"
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        end_of_scan = (
            getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2),
            getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
        )
        for link in range(max_links):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in end_of_scan:
                    break  # past the last link, or no NVLink on this board: the normal end of the scan
                self._call("nvmlDeviceGetNvLinkState", label, _raise, exc)
                continue
            if int(state) != int(getattr(nvml, "NVML_FEATURE_ENABLED", 1)):
                continue
            remote_type = self._remote_type(handle, label, link)
            if remote_type == int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)):
                switch_links += 1
                continue
            remote = self._call(
                "nvmlDeviceGetNvLinkRemotePciInfo", label, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link
            )
            if remote is None:
                continue
            peer = by_bus.get(_normalize_bus_id(_text(remote.busId)))
            if peer is not None and peer != gpu.index:
                peers[peer] += 1
            elif peer is None and remote_type is None:
                # No remote-type call (older driver): a far end that is no GPU of this node is
                # taken for an NVSwitch. With the call, a GPU missing from the inventory (lost, or
                # failing to enumerate) is known to be a GPU and joins no fabric.
                switch_links += 1
        return peers, switch_links

    def _remote_type(self, handle: Any, label: str, link: int) -> int | None:
        """nvmlNvLinkDeviceType_t of a link's far end (GPU, IBMNPU, SWITCH); None when not supported."""
        nvml = self._nvml
        call = "nvmlDeviceGetNvLinkRemoteDeviceType"
        if not hasattr(nvml, call) or (call, label) in self.unsupported:
            return None
        value = self._call(
            call, label, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link, quiet=(self._not_supported,)
        )
        if value is None or int(value) == int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_UNKNOWN", 0xFF)):
            return None
        return int(value)

    def error_counts(self) -> dict[tuple[str, str], int]:
        return dict(self.errors.counts)


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


def _raise(exc: BaseException) -> Any:
    raise exc


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _normalize_bus_id(bus_id: str) -> str:
    """NVML bus ids come as 00000000:3B:00.0 or 0000:3b:00.0; compare on domain-less lower case."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        parts = parts[1:]
    return ":".join(parts)


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
