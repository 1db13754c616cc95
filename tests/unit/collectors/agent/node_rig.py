"""One node for the agent's billing tests: the NVML stand-in, a real PodResources gRPC server
(testkit), static pod metadata, and a NodeCollector over them. Expected values stay in the tests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from collectors.agent.collector import NodeCollector
from collectors.agent.nvml_source import NvmlSource
from collectors.agent.podmeta import StaticPodMetadata
from collectors.agent.podresources import PodResourcesClient
from gpumeter.core.models import NodeAllocation, UsageSample
from testkit.nvml_standin import GIB, NvmlStandIn, StandInGpu, StandInMig
from testkit.podresources_server import Lister, PodSpec, serve

START = datetime(2026, 11, 3, 10, 15, 0, tzinfo=UTC)
INTERVAL = 15
END = START + timedelta(seconds=INTERVAL)
GPU = "nvidia.com/gpu"


def socket_path() -> Path:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp paths can be longer.
    return Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp")) / "kubelet.sock"


def a100_in_mig_mode(*migs: StandInMig) -> StandInGpu:
    """An A100-SXM4-40GB in MIG mode holding ``migs``, on a bus after an NVSwitch board's."""
    return StandInGpu(
        uuid="GPU-a100",
        name="NVIDIA A100-SXM4-40GB",
        memory_total=40 * GIB,
        bus_id="00000000:C0:00.0",
        mig_enabled=True,
        migs=list(migs),
    )


def collector_over(
    nvml: NvmlSource, socket: Path, metadata: StaticPodMetadata, *, interval: int = INTERVAL, **options: Any
) -> NodeCollector:
    """Node gpu-node-1 of cluster prod, its allocations from the PodResources server at ``socket``."""
    return NodeCollector(
        cluster="prod",
        node="gpu-node-1",
        interval=interval,
        nvml=nvml,
        allocations=PodResourcesClient(str(socket)),
        metadata=metadata,
        proc_root=None,
        **options,
    )


def finished(pod: dict[str, Any], phase: str, finished_at: str | None) -> dict[str, Any]:
    """A pod API object moved to a terminal phase, its container ended at ``finished_at``."""
    status = pod["status"]
    status["phase"] = phase
    if finished_at is not None:
        exit_code = 0 if phase == "Succeeded" else 1
        status["containerStatuses"] = [
            {
                "name": "main",
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "startedAt": status.get("startTime"),
                        "finishedAt": finished_at,
                    }
                },
            }
        ]
    return pod


@dataclass
class Node:
    standin: NvmlStandIn
    nvml: NvmlSource
    lister: Lister
    client: PodResourcesClient
    collector: NodeCollector

    def window(self, start: datetime = START) -> tuple[list[UsageSample], list[NodeAllocation]]:
        samples = self.collector.collect(start, start + timedelta(seconds=INTERVAL))
        return samples, self.collector.node_allocations()


@contextmanager
def node(
    standin: NvmlStandIn,
    kubelet_pods: Sequence[PodSpec],
    api_pods: Sequence[dict[str, Any]],
    *,
    allocatable: Mapping[str, list[str]] | None = None,
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    node_labels: Mapping[str, str] | None = None,
    node_capacity: Mapping[str, str] | None = None,
    nvml_options: Mapping[str, Any] | None = None,
    client_options: Mapping[str, Any] | None = None,
    lister_options: Mapping[str, Any] | None = None,
) -> Iterator[Node]:
    nvml = NvmlSource(nvml=standin, **dict(nvml_options or {}))
    nvml.start()
    lister = Lister(list(kubelet_pods), dict(allocatable) if allocatable is not None else None)
    for key, value in (lister_options or {}).items():
        setattr(lister, key, value)
    path = socket_path()
    # Only when given: the rig also runs against the committed code (which lacks node_capacity).
    extra: dict[str, Any] = {"node_capacity": node_capacity} if node_capacity is not None else {}
    metadata = StaticPodMetadata(api_pods, namespaces=namespaces, node_labels=node_labels, **extra)
    with serve(path, lister), PodResourcesClient(str(path), **dict(client_options or {})) as client:
        collector = NodeCollector(
            cluster="prod",
            node="gpu-node-1",
            interval=INTERVAL,
            nvml=nvml,
            allocations=client,
            metadata=metadata,
            proc_root=None,
        )
        try:
            yield Node(standin, nvml, lister, client, collector)
        finally:
            nvml.stop()


def gpu_samples(samples: Sequence[UsageSample]) -> list[UsageSample]:
    return sorted((s for s in samples if s.kind == "gpu"), key=lambda s: (s.pod, s.labels["gpu_uuid"]))
