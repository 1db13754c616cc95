"""NVML source: the node agent's one entry to NVML (pynvml): lifecycle, GPU inventory
(nvml_inventory.py), per-device telemetry (nvml_telemetry.py) and topology (nvml_topology.py).

Every NVML call goes through :meth:`NvmlCalls.call` (nvml_calls.py), which turns an
``NVMLError`` into ``None`` and a count in :attr:`NvmlSource.errors` keyed by
(call, error name). A GPU that fell off the bus (``NVML_ERROR_GPU_IS_LOST``) is
marked lost for the rest of the read and skipped; ``NVML_ERROR_NOT_SUPPORTED``
on a field leaves that field empty. Nothing here stops the agent.

The pynvml module is injected (``NvmlSource(nvml=...)``, default the real
``pynvml`` from nvidia-ml-py) so tests can drive this code with a stand-in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from collectors.agent.nvml_calls import NvmlCalls, NvmlErrors, nvml_text
from collectors.agent.nvml_inventory import DeviceInventory, GpuInfo, MigInstance
from collectors.agent.nvml_telemetry import DeviceReading, EnergyMeter, Telemetry
from collectors.agent.nvml_topology import TopologyReader
from gpumeter.core.models import NodeTopology

log = logging.getLogger(__name__)


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
        self._calls = NvmlCalls(nvml)
        self._devices = DeviceInventory(self._calls, sys_root)
        self._telemetry = Telemetry(self._calls, clock)
        self._topology = TopologyReader(self._calls)
        self._started = False
        self.driver_version: str | None = None

    @property
    def errors(self) -> NvmlErrors:
        return self._calls.errors

    @property
    def energy(self) -> EnergyMeter:
        return self._telemetry.energy

    @property
    def unsupported(self) -> set[tuple[str, str]]:
        """(call, device) NVML answered NOT_SUPPORTED for where that is what the hardware says."""
        return self._calls.unsupported

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> list[GpuInfo]:
        """nvmlInit and a first inventory. Raises NvmlUnavailable when NVML cannot start."""
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {self._calls.describe(exc)}") from exc
        self._started = True
        version = self._calls.call(
            "nvmlSystemGetDriverVersion", "system", self._nvml.nvmlSystemGetDriverVersion
        )
        self.driver_version = nvml_text(version) if version is not None else None
        return self.refresh_inventory()

    def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown: %s", self._calls.describe(exc))

    def __enter__(self) -> NvmlSource:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inventory, telemetry, topology ------------------------------------------------------------

    @property
    def inventory(self) -> list[GpuInfo]:
        return self._devices.gpus

    def refresh_inventory(self) -> list[GpuInfo]:
        """Enumerate GPUs and MIG devices again (done on start and when devices change)."""
        return self._devices.refresh()

    def device(self, uuid: str) -> tuple[GpuInfo, MigInstance | None] | None:
        """The GPU (and MIG instance) a UUID names, from the last inventory."""
        return self._devices.device(uuid)

    def read(self, window: tuple[datetime, datetime] | None = None) -> dict[str, DeviceReading]:
        """One read of every GPU and MIG device, keyed by UUID (nvml_telemetry.Telemetry.read)."""
        inventory, handles = self._devices.snapshot()
        return self._telemetry.read(inventory, handles, window)

    def topology(self, cluster: str, node: str, at: datetime | None = None) -> NodeTopology:
        """GPU layout for the scheduler extender (nvml_topology.TopologyReader.topology)."""
        inventory, handles = self._devices.snapshot()
        return self._topology.topology(inventory, handles, cluster, node, at)

    def error_counts(self) -> dict[tuple[str, str], int]:
        return dict(self.errors.counts)

