"""The real NVML source for the GPU tests, or a skip that says what was not run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from collectors.agent.nvml_source import NvmlSource, NvmlUnavailable


@contextmanager
def started_source(*, require_gpu: bool = False) -> Iterator[NvmlSource]:
    """A started NvmlSource over the real pynvml module, stopped on exit; skips when NVML does not
    start (no driver) or, with ``require_gpu``, reports no GPU."""
    real = NvmlSource()  # the real pynvml module
    try:
        real.start()
    except NvmlUnavailable as exc:
        pytest.skip(f"NOT RUN, NOT COVERED: needs a real NVIDIA GPU and driver; NVML did not start ({exc})")
    if require_gpu and not real.inventory:
        real.stop()
        pytest.skip("NOT RUN, NOT COVERED: NVML started but reports no GPU")
    try:
        yield real
    finally:
        real.stop()
