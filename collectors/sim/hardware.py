"""Hardware catalogue of the simulated fleet: GPU models, MIG layouts and node topology.

Numbers are plausible public figures (board power, memory) rounded for readability; they
drive simulated telemetry only and are never presented as NVML readings.

Layouts (contract 8, the classes ``nvidia-smi topo -m`` prints):

* H100 SXM (HGX/DGX H100) and H200 SXM (HGX H200, the same baseboard): 8 GPUs, 18 NVLinks each
  into 4 NVSwitches: every pair ``NV18``.
* B200 (HGX B200): 8 GPUs, 18 fifth-generation NVLinks each into 2 NVSwitch chips: every pair
  ``NV18``.
* A100 SXM (HGX/DGX A100 8-GPU): 12 NVLinks per GPU into 6 NVSwitches: every pair ``NV12``,
  as a DGX A100 reports it. (The 4-GPU HGX A100 board links GPUs directly, NV4 per pair;
  the simulator models the 8-GPU board.)
* L40S (8 per node, kept so for the demo's capacity): no NVLink. Pairs (0,1), (2,3), ... share
  a PCIe switch (``PIX``); each switch hangs off its own NUMA node of a dual-socket host (AMD
  EPYC with two NUMA nodes per socket), so every other pair crosses NUMA nodes (``SYS``).
* L4 (4 per node, a single-socket host): pairs (0,1) and (2,3) share a PCIe switch (``PIX``);
  the two switches sit on different host bridges of one NUMA node (``NODE``).

:class:`PcieLayout` describes the PCIe-only boards and also yields ``PXB`` (leaf switches
under one upstream switch) for layouts that have it.

MIG (the profiles of NVIDIA's MIG user guide; every one of these boards has 7 compute slices):
a partitioned GPU is split by the ``all-balanced`` layout of nvidia-mig-parted, two 1-slice,
one 2-slice and one 3-slice instance (A100-40GB: ``1g.5gb`` x2, ``2g.10gb``, ``3g.20gb``; H100-80GB:
``1g.10gb`` x2, ``2g.20gb``, ``3g.40gb``; H200: ``1g.18gb``/``2g.35gb``/``3g.71gb``; B200:
``1g.23gb``/``2g.45gb``/``3g.90gb``). A MIG device's share of its GPU is its compute slices / 7,
as the node agent bills it.

Model names are the rate-card names the node agent derives from NVML product names
(collectors/agent/nvml_inventory.py ``_KNOWN_MODELS``, which names an ``NVIDIA B200``
``B200-SXM-180GB`` as the fleet here does).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from gpumeter.core.models import GpuDevice, NodeTopology

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class PcieLayout:
    """Where the GPUs of a PCIe-only board sit, GPUs numbered in PCIe bus order.

    Consecutive GPUs fill a leaf PCIe switch (``gpus_per_switch``); consecutive leaf switches
    share an upstream switch (``switches_per_tree``; one tree per host bridge); consecutive
    trees share a NUMA node (``trees_per_numa``). Pair classes follow: same leaf switch
    ``PIX``, same tree ``PXB``, same NUMA node ``NODE``, else ``SYS``.
    """

    gpus_per_switch: int = 2
    switches_per_tree: int = 1
    trees_per_numa: int = 1

    def __post_init__(self) -> None:
        if min(self.gpus_per_switch, self.switches_per_tree, self.trees_per_numa) < 1:
            raise ValueError("PcieLayout counts must be >= 1")

    @property
    def gpus_per_tree(self) -> int:
        return self.gpus_per_switch * self.switches_per_tree

    @property
    def gpus_per_numa(self) -> int:
        return self.gpus_per_tree * self.trees_per_numa

    def link(self, a: int, b: int) -> str:
        if a // self.gpus_per_switch == b // self.gpus_per_switch:
            return "PIX"
        if a // self.gpus_per_tree == b // self.gpus_per_tree:
            return "PXB"
        if a // self.gpus_per_numa == b // self.gpus_per_numa:
            return "NODE"
        return "SYS"

    def numa_node(self, index: int) -> int:
        return index // self.gpus_per_numa


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile: NVML's name, the compute slices it holds, its memory."""

    name: str
    slices: int
    memory_gb: int


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
    # A partitioned GPU's MIG devices (the all-balanced layout), smallest first; () = no MIG.
    mig_layout: tuple[MigProfile, ...] = ()
    mig_slices: int = 0  # compute slices of the whole GPU (the denominator of a MIG share)
    pcie: PcieLayout | None = None  # PCIe-only boards: where the GPUs sit (None with NVLink)
    board_gpus: int | None = None  # GPUs per node when fixed by the server type; None: the fleet's

    @property
    def mig_profiles(self) -> tuple[MigProfile, ...]:
        """The distinct profiles of the layout, smallest first."""
        seen: dict[str, MigProfile] = {}
        for profile in self.mig_layout:
            seen.setdefault(profile.name, profile)
        return tuple(seen.values())


def balanced(small: int, medium: int, large: int) -> tuple[MigProfile, ...]:
    """nvidia-mig-parted's ``all-balanced``: 2 x 1g, 1 x 2g, 1 x 3g (7 compute slices)."""
    one = MigProfile(f"1g.{small}gb", 1, small)
    return (one, one, MigProfile(f"2g.{medium}gb", 2, medium), MigProfile(f"3g.{large}gb", 3, large))


# L40S: dual socket, one PCIe switch (two GPUs) per NUMA node, two NUMA nodes per socket.
L40S_LAYOUT = PcieLayout(gpus_per_switch=2, switches_per_tree=1, trees_per_numa=1)
# L4: single socket, two PCIe switches (two GPUs each) on two host bridges of NUMA node 0.
L4_LAYOUT = PcieLayout(gpus_per_switch=2, switches_per_tree=1, trees_per_numa=2)

GPU_SPECS: dict[str, GpuSpec] = {
    spec.model: spec
    for spec in (
        GpuSpec("H100-SXM-80GB", "h100", 700, 75, 80 * GIB, 24, 240, "NV18", balanced(10, 20, 40), 7),
        GpuSpec("H200-SXM-141GB", "h200", 700, 80, 141 * GIB, 24, 240, "NV18", balanced(18, 35, 71), 7),
        GpuSpec("B200-SXM-180GB", "b200", 1000, 120, 180 * GIB, 28, 256, "NV18", balanced(23, 45, 90), 7),
        GpuSpec("A100-SXM-40GB", "a100", 400, 55, 40 * GIB, 16, 120, "NV12", balanced(5, 10, 20), 7),
        GpuSpec("L40S-48GB", "l40s", 350, 35, 48 * GIB, 12, 96, None, pcie=L40S_LAYOUT),
        GpuSpec("L4-24GB", "l4", 72, 16, 24 * GIB, 12, 48, None, pcie=L4_LAYOUT, board_gpus=4),
    )
}

NVLINK_NUMA_NODES = 2  # SXM boards: the first half of the GPUs on NUMA node 0, the rest on 1


def _host(node: str, generation: int) -> str:
    # A reclaimed spot node comes back under its name on another machine: other GPUs, other UUIDs.
    return node if generation == 0 else f"{node}#{generation}"


def gpu_uuid(namespace: uuid.UUID, node: str, index: int, generation: int = 0) -> str:
    """Stable NVML-style UUID string for a simulated GPU."""
    return f"GPU-{uuid.uuid5(namespace, f'gpu/{_host(node, generation)}/{index}')}"


def mig_uuid(namespace: uuid.UUID, node: str, index: int, slot: int, generation: int = 0) -> str:
    """Stable NVML-style UUID of MIG device ``slot`` of GPU ``index`` (what the kubelet hands out)."""
    return f"MIG-{uuid.uuid5(namespace, f'mig/{_host(node, generation)}/{index}/{slot}')}"


def pair_link(spec: GpuSpec, a: int, b: int) -> str:
    """The ``nvidia-smi topo -m`` class between GPUs ``a`` and ``b`` of one node of ``spec``."""
    if spec.nvlink:
        return spec.nvlink
    return (spec.pcie or PcieLayout()).link(a, b)


def numa_node(spec: GpuSpec, index: int, gpus_per_node: int) -> int:
    if spec.nvlink or spec.pcie is None:
        return index // max(1, gpus_per_node // NVLINK_NUMA_NODES)
    return spec.pcie.numa_node(index)


def node_topology(
    *,
    cluster: str,
    node: str,
    spec: GpuSpec,
    gpus_per_node: int,
    namespace: uuid.UUID,
    at: datetime,
    mig_gpus: int = 0,
    generation: int = 0,
    replicas: int = 1,
) -> NodeTopology:
    """The GPU layout of one simulated node (module docstring).

    NVLink boards list every other GPU as an NVLink peer; PCIe boards list none. ``replicas``
    is the time-slicing replica count of every GPU of a time-sliced node (1: not shared).
    """
    indices = range(gpus_per_node)
    gpus = [
        GpuDevice(
            index=i,
            uuid=gpu_uuid(namespace, node, i, generation),
            model=spec.model,
            nvlink_peers=[j for j in indices if j != i] if spec.nvlink else [],
            numa_node=numa_node(spec, i, gpus_per_node),
            memory_bytes=spec.memory_bytes,
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            mig_enabled=i < mig_gpus,  # the fleet partitions the first mig_gpus GPUs of a node
            replicas=replicas,
        )
        for i in indices
    ]
    links = {f"{i}-{j}": pair_link(spec, i, j) for i in indices for j in range(i + 1, gpus_per_node)}
    return NodeTopology(cluster=cluster, node=node, gpus=gpus, links=links, at=at)
