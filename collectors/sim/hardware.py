"""Hardware catalogue of the simulated fleet: GPU models, MIG layouts and node topology.

Numbers are plausible public figures (board power, memory) rounded for readability; they
drive simulated telemetry only and are never presented as NVML readings.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from gpumeter.core.models import GpuDevice, NodeTopology

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Static facts about one GPU model as the simulator uses them."""

    model: str
    short: str  # node-name fragment, e.g. "h100"
    tdp_watts: int
    idle_watts: int
    memory_bytes: int
    host_cores_per_gpu: int  # CPU cores a whole-GPU pod typically requests per GPU
    host_memory_gib_per_gpu: int  # host memory a whole-GPU pod typically requests per GPU
    nvlink: str | None  # link class between every GPU pair ("NV18"), or None for PCIe-only boards
    mig_profile: str | None = None  # the one MIG profile the simulator partitions this model into
    mig_slices: int = 0  # slices of ``mig_profile`` per partitioned GPU


GPU_SPECS: dict[str, GpuSpec] = {
    spec.model: spec
    for spec in (
        GpuSpec("H100-SXM-80GB", "h100", 700, 75, 80 * GIB, 24, 240, "NV18", "1g.10gb", 7),
        GpuSpec("A100-SXM-40GB", "a100", 400, 55, 40 * GIB, 16, 120, "NV12", "1g.5gb", 7),
        GpuSpec("L40S-48GB", "l40s", 350, 35, 48 * GIB, 12, 96, None),
    )
}

# PCIe-only boards: GPUs 2k and 2k+1 share a PCIe switch (PIX); every other pair crosses
# the host bridge / socket interconnect (SYS).
PCIE_PAIR_LINK = "PIX"
PCIE_FAR_LINK = "SYS"


def gpu_uuid(namespace: uuid.UUID, node: str, index: int) -> str:
    """Stable NVML-style UUID string for a simulated GPU."""
    return f"GPU-{uuid.uuid5(namespace, f'gpu/{node}/{index}')}"


def node_topology(
    *,
    cluster: str,
    node: str,
    spec: GpuSpec,
    gpus_per_node: int,
    namespace: uuid.UUID,
    at: datetime,
) -> NodeTopology:
    """The GPU layout of one simulated node.

    NVLink boards (H100 SXM: NV18, A100 SXM: NV12) are all-to-all through NVSwitch, so
    every pair carries the board's link class and every GPU lists all others as NVLink
    peers. PCIe boards (L40S) have no NVLink peers; pairs (0,1), (2,3), ... are ``PIX``,
    all other pairs ``SYS``. GPUs 0..n/2-1 sit on NUMA node 0, the rest on NUMA node 1.
    """
    half = max(1, gpus_per_node // 2)
    indices = range(gpus_per_node)
    gpus = [
        GpuDevice(
            index=i,
            uuid=gpu_uuid(namespace, node, i),
            model=spec.model,
            nvlink_peers=[j for j in indices if j != i] if spec.nvlink else [],
            numa_node=i // half,
        )
        for i in indices
    ]
    links: dict[str, str] = {}
    for i in indices:
        for j in range(i + 1, gpus_per_node):
            if spec.nvlink:
                links[f"{i}-{j}"] = spec.nvlink
            else:
                links[f"{i}-{j}"] = PCIE_PAIR_LINK if i // 2 == j // 2 else PCIE_FAR_LINK
    return NodeTopology(cluster=cluster, node=node, gpus=gpus, links=links, at=at)
