"""run_agent end to end on stand-ins: NVML stand-in, a real PodResources gRPC server, static pod
metadata; Kafka unreachable, so every sample lands in the spool; /metrics reports it all."""

from __future__ import annotations

import itertools
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pynvml
import pytest

from collectors.agent.collector import AgentConfig, run_agent
from collectors.agent.nvml_source import NvmlSource
from collectors.agent.podmeta import StaticPodMetadata
from collectors.agent.publisher import Publisher, decode_message
from collectors.agent.spool import Spool
from gpumeter.core.models import parse_sample
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.infra.kafka import KafkaUnavailable
from testkit.cluster_state import pod
from testkit.nvml_standin import NvmlStandIn, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, Lister, PodSpec, serve
from tests.unit.collectors.agent import node_rig

pytestmark = pytest.mark.agent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def no_kafka() -> Any:
    raise KafkaUnavailable("no Kafka broker answers at 127.0.0.1:1")


def test_agent_loop_spools_samples_and_serves_metrics(tmp_path: Path) -> None:
    socket_path = node_rig.socket_path()
    standin = NvmlStandIn(nvswitch_node(2))
    standin.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    nvml = NvmlSource(nvml=standin)
    nvml.start()
    metadata = StaticPodMetadata(
        [pod("team-a", "trainer", "uid-trainer", cpu="4", memory="16Gi", gpus=2)],
        node_labels={"gpumeter.io/capacity-type": "reserved"},
    )
    lister = Lister(
        [
            PodSpec(
                "team-a", "trainer", [ContainerSpec("main", {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(1)]})]
            )
        ]
    )
    port = free_port()
    spool = Spool(tmp_path / "spool")
    publisher = Publisher(KafkaSettings(), spool, producer_factory=no_kafka, retry_seconds=60)
    stop = threading.Event()
    cycles: list[int] = []
    with serve(socket_path, lister):
        collector = node_rig.collector_over(nvml, socket_path, metadata, interval=1)
        config = AgentConfig(cluster="prod", node="gpu-node-1", interval=1, metrics_port=port)
        thread = threading.Thread(
            target=lambda: cycles.append(
                run_agent(
                    Settings(data_dir=tmp_path), collector, config=config, stop=stop, publisher=publisher
                )
            )
        )
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while spool.records < 8 and time.monotonic() < deadline:  # 4 samples a window: 2 gpu, cpu, memory
                time.sleep(0.2)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        finally:
            stop.set()
            thread.join(timeout=20)
    assert cycles and cycles[0] >= 2
    samples = [parse_sample(decode_message(p)[1]) for p in Spool(tmp_path / "spool").iter_records()]
    assert {s.kind for s in samples} == {"gpu", "cpu", "memory"}
    assert all(s.capacity_type == "reserved" and s.tenant == "team-a" for s in samples)
    windows = sorted({s.window_start for s in samples})
    assert len(windows) >= 2 and all((b - a).total_seconds() >= 1 for a, b in itertools.pairwise(windows))
    assert all(s.window_start.timestamp() % 1 == 0 for s in samples)

    def value(name: str) -> float:
        lines = [line for line in metrics.splitlines() if line.startswith(name)]
        assert lines, f"{name} missing from /metrics"
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    assert value('gpumeter_agent_samples_emitted_total{kind="gpu"}') >= 4
    assert value("gpumeter_agent_spool_records") >= 8
    assert value("gpumeter_agent_spool_bytes") > 0
    assert value("gpumeter_agent_spool_dropped_records_total") == 0
    assert (
        value('gpumeter_agent_nvml_errors_total{call="nvmlDeviceGetPowerUsage",error="NOT_SUPPORTED"}') >= 2
    )
    assert value("gpumeter_agent_cycle_seconds_count") >= 2
    assert value("gpumeter_agent_kafka_up") == 0
    assert value("gpumeter_agent_gpus") == 2
