"""The real NVML source on a machine with an NVIDIA GPU and driver.

Only a GPU node runs these: elsewhere NVML cannot start and both tests are SKIPPED, which
covers nothing (the agent's NVML logic is covered by tests/unit/collectors/agent/
test_nvml_source.py against a declared stand-in, not by these). Run on a GPU node with
``.venv/bin/pytest tests/gpu -rs``; the skip reason says why they did not run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from collectors.agent.nvml_source import NvmlSource
from tests.gpu.real_nvml import started_source

pytestmark = [pytest.mark.agent, pytest.mark.gpu]


@pytest.fixture
def source() -> Iterator[NvmlSource]:
    with started_source() as real:
        yield real


def test_inventory_is_sane(source: NvmlSource) -> None:
    inventory = source.inventory
    assert inventory, "NVML started but reports no GPU"
    assert [g.index for g in inventory] == list(range(len(inventory)))
    for gpu in inventory:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.name and gpu.model
        assert gpu.memory_total_bytes is None or gpu.memory_total_bytes > 1024**3
        for mig in gpu.mig_instances:
            assert mig.uuid.startswith("MIG-") and 0 < mig.share <= 1


def test_a_window_of_readings_is_sane(source: NvmlSource) -> None:
    source.read()
    time.sleep(2.0)
    readings = source.read()
    for gpu in source.inventory:
        reading = readings[gpu.uuid]
        assert not reading.lost
        if reading.utilization is not None:
            assert 0 <= reading.utilization <= 1
        if reading.memory_used_bytes is not None and gpu.memory_total_bytes is not None:
            assert 0 <= reading.memory_used_bytes <= gpu.memory_total_bytes
        if reading.power_watts is not None:
            assert 0 < reading.power_watts < 2000
        if reading.energy_joules is not None:
            assert 0 <= reading.energy_joules < 2000 * 3  # < 2 kW over ~2 s (with slack)
    topology = source.topology("test", "this-node")
    assert len(topology.gpus) == len(source.inventory)
    n = len(topology.gpus)
    assert len(topology.links) <= n * (n - 1) // 2
