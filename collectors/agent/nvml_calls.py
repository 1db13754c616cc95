"""Every NVML call of the node agent goes through :meth:`NvmlCalls.call`, which turns an
``NVMLError`` into ``None`` and a count in :attr:`NvmlCalls.errors` keyed by (call, error name).
A GPU that fell off the bus (``NVML_ERROR_GPU_IS_LOST``) raises :class:`DeviceLost`: the reader
marks it lost for the rest of the read and skips it; ``NVML_ERROR_NOT_SUPPORTED`` on a field
leaves that field empty. Nothing here stops the agent.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


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



class DeviceLost(Exception):
    pass



class NvmlCalls:
    """The pynvml module (injected: tests drive it with a stand-in) and what its calls answered."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors = NvmlErrors()
        self._error_names = self._error_name_table()
        self._lost_code = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self.not_supported = int(getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3))
        self.not_found = int(getattr(nvml, "NVML_ERROR_NOT_FOUND", 6))
        # (call, device) NVML answered NOT_SUPPORTED for where that is what the hardware says: not errors.
        self.unsupported: set[tuple[str, str]] = set()

    def _error_name_table(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for attribute in dir(self.nvml):
            if attribute.startswith("NVML_ERROR_"):
                value = getattr(self.nvml, attribute)
                if isinstance(value, int) and value not in names:
                    names[value] = attribute.removeprefix("NVML_ERROR_")
        return names

    def describe(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        name = self._error_names.get(code, f"code {code}") if isinstance(code, int) else "unknown"
        try:
            text = str(exc)
        except Exception:  # pynvml's __str__ itself calls into the library
            text = name
        return f"{name}: {text}"

    def call(
        self, call: str, device: str, fn: Callable[..., T], *args: Any, quiet: tuple[int, ...] = ()
    ) -> T | None:
        """Run one NVML call; an NVMLError becomes None and a count. GPU_IS_LOST raises DeviceLost.

        Codes in ``quiet`` are answers, not errors (NOT_SUPPORTED where the hardware lacks the
        feature): None, noted in :attr:`unsupported`, never counted or logged.
        """
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in quiet:
                self.unsupported.add((call, device))
                return None
            name = self._error_names.get(code, f"code_{code}") if isinstance(code, int) else "UNKNOWN"
            self.errors.record(call, name, device, self.describe(exc))
            if code == self._lost_code:
                raise DeviceLost(device) from exc
            return None



def reraise(exc: BaseException) -> Any:
    """For :meth:`NvmlCalls.call` on an error a caller caught first (to tell an answer from a failure)."""
    raise exc


def nvml_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str) -> str:
    """NVML bus ids come as 00000000:3B:00.0 or 0000:3b:00.0; compare on domain-less lower case."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        parts = parts[1:]
    return ":".join(parts)

