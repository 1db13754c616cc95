"""The GPU check of issue 13: the agent's NVML code against a real NVIDIA GPU, in under five minutes.

    .venv/bin/pytest tests/gpu -rs

On a machine without a driver every test SKIPS with the reason (NOT RUN, NOT COVERED: the
stand-in tests under tests/unit/collectors/agent/ cover the logic, not the hardware). Checks:
the model name mapping of the boards found, energy from the counter within 5 % of the integral
of power (under a load when torch or cupy can make one, idle otherwise), a GPU process listed
with its memory (when one can be started), per-link NVLink state and remote type, MIG mode read
without toggling it, and a collector fed the real UUID whole and as ``::0..3`` replicas billing
1 and 0.25. Nothing here changes the GPU's configuration.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from collectors.agent.collector import NodeCollector
from collectors.agent.nvml_inventory import gpu_model_name
from collectors.agent.nvml_source import NvmlSource
from collectors.agent.podmeta import StaticPodMetadata
from collectors.agent.podresources import PodResourcesClient
from testkit.cluster_state import pod
from testkit.podresources_server import ContainerSpec, Lister, PodSpec, serve
from tests.gpu.real_nvml import started_source

pytestmark = [pytest.mark.agent, pytest.mark.gpu]

ENERGY_SECONDS = 20.0
POWER_PERIOD_S = 0.05
LOAD_SCRIPT = """
import sys, time
seconds = float(sys.argv[1])
try:
    import torch
    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        a = (a @ a).tanh()
    torch.cuda.synchronize()
except ImportError:
    import cupy
    a = cupy.random.rand(4096, 4096, dtype=cupy.float32)
    end = time.time() + seconds
    while time.time() < end:
        a = cupy.tanh(a @ a)
    cupy.cuda.Device().synchronize()
"""


@pytest.fixture(scope="module")
def source() -> Iterator[NvmlSource]:
    with started_source(require_gpu=True) as real:
        yield real


def nvml() -> Any:
    import pynvml

    return pynvml


def can_load() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in ("torch", "cupy"))


def start_load(seconds: float) -> subprocess.Popen[bytes] | None:
    """A process keeping GPU 0 busy (CUDA_VISIBLE_DEVICES=0) for ``seconds``, or None without torch/cupy."""
    if not can_load():
        return None
    env = {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(seconds)], env=env)


def test_the_boards_found_map_to_rate_card_model_names(source: NvmlSource) -> None:
    for gpu in source.inventory:
        assert gpu.model == gpu_model_name(gpu.name, gpu.memory_total_bytes)
        assert gpu.model and not gpu.model.upper().startswith(("NVIDIA", "TESLA")), gpu.model
        assert " " not in gpu.model and len(gpu.model) <= 128
        print(f"GPU {gpu.index}: {gpu.name!r} -> {gpu.model}, NUMA {gpu.numa_node}, MIG {gpu.mig_enabled}")


def test_energy_from_the_counter_matches_the_integral_of_power(source: NvmlSource) -> None:
    lib = nvml()
    gpu = source.inventory[0]
    handle = lib.nvmlDeviceGetHandleByIndex(gpu.index)
    try:
        start_mj = int(lib.nvmlDeviceGetTotalEnergyConsumption(handle))
    except lib.NVMLError as exc:
        pytest.skip(f"NOT RUN: GPU {gpu.index} has no energy counter ({exc}); the agent integrates power")
    load = start_load(ENERGY_SECONDS + 5)
    try:
        time.sleep(2.0 if load else 0.0)  # let the load ramp before measuring
        start_mj = int(lib.nvmlDeviceGetTotalEnergyConsumption(handle))
        began = previous_t = time.monotonic()
        previous_w = lib.nvmlDeviceGetPowerUsage(handle) / 1000.0
        integral = 0.0
        while time.monotonic() - began < ENERGY_SECONDS:
            time.sleep(POWER_PERIOD_S)
            now, watts = time.monotonic(), lib.nvmlDeviceGetPowerUsage(handle) / 1000.0
            integral += (previous_w + watts) / 2 * (now - previous_t)
            previous_t, previous_w = now, watts
        counted = (int(lib.nvmlDeviceGetTotalEnergyConsumption(handle)) - start_mj) / 1000.0
    finally:
        if load is not None:
            load.wait(timeout=60)
    print(f"energy over {ENERGY_SECONDS:.0f} s ({'loaded' if load else 'idle'}): counter {counted:.1f} J, "
          f"power integral {integral:.1f} J")
    assert counted > 0
    assert abs(counted - integral) <= 0.05 * integral


def test_a_gpu_process_is_listed_with_its_memory(source: NvmlSource) -> None:
    load = start_load(15.0)
    if load is None:
        pytest.skip("NOT RUN: no way to start a GPU process here (install torch or cupy)")
    try:
        deadline = time.monotonic() + 12.0
        found = None
        while found is None and time.monotonic() < deadline:
            time.sleep(0.5)
            reading = source.read()[source.inventory[0].uuid]
            found = next((p for p in reading.processes if p.pid == load.pid), None)
        assert found is not None, "the load's PID was never listed (hostPID? permissions?)"
        assert found.used_bytes is None or found.used_bytes > 64 * 1024 * 1024
    finally:
        load.wait(timeout=60)


def test_nvlink_state_and_remote_type_per_link(source: NvmlSource) -> None:
    lib = nvml()
    kinds = {
        lib.NVML_NVLINK_DEVICE_TYPE_GPU: "GPU",
        lib.NVML_NVLINK_DEVICE_TYPE_IBMNPU: "IBMNPU",
        lib.NVML_NVLINK_DEVICE_TYPE_SWITCH: "SWITCH",
    }
    active: dict[int, list[str]] = {}
    for gpu in source.inventory:
        handle = lib.nvmlDeviceGetHandleByIndex(gpu.index)
        for link in range(lib.NVML_NVLINK_MAX_LINKS):
            try:
                state = lib.nvmlDeviceGetNvLinkState(handle, link)
            except lib.NVMLError as exc:
                if exc.value in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT):
                    break  # no NVLink, or past the last link
                raise
            if state != lib.NVML_FEATURE_ENABLED:
                continue
            try:
                kind = kinds.get(lib.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link), "UNKNOWN")
            except lib.NVMLError as exc:
                assert exc.value == lib.NVML_ERROR_NOT_SUPPORTED, exc
                kind = "not supported"
            active.setdefault(gpu.index, []).append(kind)
    print(f"active NVLinks by GPU: {active or 'none'}")
    topology = source.topology("gpu-check", "this-node")
    for device in topology.gpus:
        kinds_of = active.get(device.index, [])
        if kinds_of and all(k == "SWITCH" for k in kinds_of) and len(topology.gpus) > 1:
            # An NVSwitch board: every other GPU with switch links is an NVLink peer.
            assert device.nvlink_peers, f"GPU {device.index} has only switch links but no NVLink peer"
        if not kinds_of:
            assert device.nvlink_peers == []


def test_mig_mode_is_read_without_toggling_it(source: NvmlSource) -> None:
    lib = nvml()
    for gpu in source.inventory:
        handle = lib.nvmlDeviceGetHandleByIndex(gpu.index)
        try:
            current, pending = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError as exc:
            assert exc.value == lib.NVML_ERROR_NOT_SUPPORTED, exc  # a board without MIG
            assert not gpu.mig_enabled
            continue
        assert gpu.mig_enabled == (current == lib.NVML_DEVICE_MIG_ENABLE)
        assert (current, pending) == tuple(lib.nvmlDeviceGetMigMode(handle))  # unchanged by reading
        for mig in gpu.mig_instances:
            assert mig.uuid.startswith("MIG-") and 0 < mig.share <= 1 and mig.profile
    assert not [call for call, _device in source.errors.counts if call == "nvmlDeviceGetMigMode"]


def test_a_collector_bills_the_real_uuid_whole_and_as_replicas(source: NvmlSource) -> None:
    gpu = next((g for g in source.inventory if not g.mig_enabled), None)
    if gpu is None:
        pytest.skip("NOT RUN: every GPU here is in MIG mode")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    end = start + timedelta(seconds=15)
    resource = "nvidia.com/gpu"
    replicas = [f"{gpu.uuid}::{n}" for n in range(4)]
    whole = [PodSpec("t", "whole", [ContainerSpec("c", {resource: [gpu.uuid]})])]
    shared = [PodSpec("t", f"r{n}", [ContainerSpec("c", {resource: [replicas[n]]})]) for n in range(4)]
    cases: list[tuple[list[PodSpec], dict[str, list[str]], dict[str, Decimal]]] = [
        (whole, {}, {"whole": Decimal(1)}),
        (shared, {resource: replicas}, {f"r{n}": Decimal("0.25") for n in range(4)}),
    ]
    for kubelet, allocatable, expected in cases:
        socket_path = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp")) / "kubelet.sock"
        metadata = StaticPodMetadata([pod("t", name, f"uid-{name}") for name in expected])
        with serve(socket_path, Lister(kubelet, allocatable)), PodResourcesClient(str(socket_path)) as client:
            collector = NodeCollector(
                cluster="gpu-check", node="this-node", interval=15, nvml=source,
                allocations=client, metadata=metadata, proc_root=None,
            )
            samples = [s for s in collector.collect(start, end) if s.kind == "gpu"]
        assert {s.pod: s.quantity for s in samples} == expected
        assert {s.gpu_model for s in samples} == {gpu.model}
