"""Per-device readings through NVML: utilization, memory, power, energy and processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from collectors.agent.nvml_calls import DeviceLost, NvmlCalls, reraise
from collectors.agent.nvml_inventory import GpuInfo, MigInstance

# Energy counter: uint64 millijoules since the driver loaded.
ENERGY_COUNTER_MODULUS = 2**64
# No single GPU draws this much; a larger apparent draw means the counter was reset or is garbage.
MAX_PLAUSIBLE_WATTS = 5000
# nvmlValueType_t -> the member of the c_nvmlValue_t union holding a sample.
_SAMPLE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

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




class Telemetry:
    """Reads every device of an inventory snapshot; energy between reads from each GPU's counter."""

    def __init__(self, calls: NvmlCalls, clock: Callable[[], float] = time.monotonic) -> None:
        self._calls = calls
        self._call = calls.call
        self._nvml = calls.nvml
        self._clock = clock
        self.energy = EnergyMeter()

    def read(
        self, inventory: list[GpuInfo], handles: dict[str, Any],
        window: tuple[datetime, datetime] | None = None,
    ) -> dict[str, DeviceReading]:
        """One read of every GPU and MIG device of ``inventory`` (``handles``: by UUID), keyed by
        UUID. Lost GPUs come back with ``lost=True``.

        With ``window``, a GPU's utilization is the average of the driver's utilization samples
        taken inside it (``nvmlDeviceGetSamples``); without samples (none kept for the window, or
        a GPU that does not support them) it is the driver's current reading.
        """
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
            except DeviceLost:
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
        if window is None or not hasattr(nvml, call) or (call, label) in self._calls.unsupported:
            return None
        start_us = int(window[0].timestamp() * 1_000_000)
        end_us = int(window[1].timestamp() * 1_000_000)
        kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", 1)
        try:
            # Samples after the given timestamp (microseconds, CPU clock): from the window's start on.
            value_type, samples = nvml.nvmlDeviceGetSamples(handle, kind, start_us - 1)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == self._calls.not_supported:
                self._calls.unsupported.add((call, label))  # this GPU has no sample buffer: never ask again
            elif code != self._calls.not_found:  # NOT_FOUND: no sample since then, not an error
                self._call(call, label, reraise, exc)
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

