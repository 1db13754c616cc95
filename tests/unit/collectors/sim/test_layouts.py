"""The simulated fleet's GPU layouts and allocation records (contract 8).

Expected matrices are written out by hand the way ``nvidia-smi topo -m`` prints them, from the
hardware each model stands for (collectors/sim/hardware.py), never read back from the code.
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from collectors.sim.allocation import LinkTable, best_free_set
from collectors.sim.fleet import FleetConfig, SimulatedFleet, TenantSpec
from collectors.sim.hardware import GPU_SPECS, PcieLayout, node_topology
from gpumeter.core import jsonio
from gpumeter.core.models import NodeAllocation, NodeTopology
from scheduler_hooks.cluster.placement import NodeGpus, best_set

START = datetime(2026, 10, 30, tzinfo=UTC)
EVERY_MODEL = {
    "H100-SXM-80GB": 2, "H200-SXM-141GB": 1, "B200-SXM-180GB": 1,
    "A100-SXM-40GB": 2, "L40S-48GB": 2, "L4-24GB": 3,
}


def matrix(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def nv_all(label: str, n: int = 8) -> list[list[str]]:
    return [["X" if i == j else label for j in range(n)] for i in range(n)]


H100 = nv_all("NV18")
A100 = nv_all("NV12")
# One PCIe switch per NUMA node (dual socket, two NUMA nodes per socket).
L40S = matrix("""
X    PIX  SYS  SYS  SYS  SYS  SYS  SYS
PIX  X    SYS  SYS  SYS  SYS  SYS  SYS
SYS  SYS  X    PIX  SYS  SYS  SYS  SYS
SYS  SYS  PIX  X    SYS  SYS  SYS  SYS
SYS  SYS  SYS  SYS  X    PIX  SYS  SYS
SYS  SYS  SYS  SYS  PIX  X    SYS  SYS
SYS  SYS  SYS  SYS  SYS  SYS  X    PIX
SYS  SYS  SYS  SYS  SYS  SYS  PIX  X
""")
# Single socket: two PCIe switches on two host bridges of NUMA node 0.
L4 = matrix("""
X    PIX  NODE NODE
PIX  X    NODE NODE
NODE NODE X    PIX
NODE NODE PIX  X
""")
# A PLX tree per socket: two leaf switches of two GPUs under one upstream switch.
PLX_TREE = matrix("""
X    PIX  PXB  PXB  SYS  SYS  SYS  SYS
PIX  X    PXB  PXB  SYS  SYS  SYS  SYS
PXB  PXB  X    PIX  SYS  SYS  SYS  SYS
PXB  PXB  PIX  X    SYS  SYS  SYS  SYS
SYS  SYS  SYS  SYS  X    PIX  PXB  PXB
SYS  SYS  SYS  SYS  PIX  X    PXB  PXB
SYS  SYS  SYS  SYS  PXB  PXB  X    PIX
SYS  SYS  SYS  SYS  PXB  PXB  PIX  X
""")
EXPECTED_NUMA = {
    "H100-SXM-80GB": [0, 0, 0, 0, 1, 1, 1, 1],
    "H200-SXM-141GB": [0, 0, 0, 0, 1, 1, 1, 1],
    "B200-SXM-180GB": [0, 0, 0, 0, 1, 1, 1, 1],
    "A100-SXM-40GB": [0, 0, 0, 0, 1, 1, 1, 1],
    "L40S-48GB": [0, 0, 1, 1, 2, 2, 3, 3],
    "L4-24GB": [0, 0, 0, 0],
}


def topo_matrix(topology: NodeTopology) -> list[list[str]]:
    """The topology as ``nvidia-smi topo -m`` prints it; a pair recorded twice or not at all fails."""
    n = len(topology.gpus)
    table = [["X" if i == j else "" for j in range(n)] for i in range(n)]
    for key, label in topology.links.items():
        a, b = (int(part) for part in key.split("-"))
        assert a < b, key  # one key per unordered pair, smaller index first
        assert table[a][b] == "" and table[b][a] == "", f"pair {key} recorded twice"
        table[a][b] = table[b][a] = label
    assert all(cell for row in table for cell in row), "a pair has no class"
    return table


def fleet_topologies() -> dict[str, NodeTopology]:
    fleet = SimulatedFleet(FleetConfig(nodes=EVERY_MODEL))
    return {t.gpus[0].model: t for t in fleet.topology()}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        pytest.param("H100-SXM-80GB", H100, id="H100"),
        pytest.param("H200-SXM-141GB", H100, id="H200"),  # the same HGX baseboard: NV18 between every pair
        # HGX B200: 18 NVLink 5 links per GPU into the NVSwitches
        pytest.param("B200-SXM-180GB", H100, id="B200"),
        pytest.param("A100-SXM-40GB", A100, id="A100"),
        pytest.param("L40S-48GB", L40S, id="L40S"),
        pytest.param("L4-24GB", L4, id="L4"),
    ],
)
def test_layout_matrices(model: str, expected: list[list[str]]) -> None:
    topology = fleet_topologies()[model]
    table = topo_matrix(topology)
    assert table == expected
    assert all(table[i][j] == table[j][i] for i in range(len(table)) for j in range(len(table)))
    assert [gpu.index for gpu in topology.gpus] == list(range(len(expected)))
    assert [gpu.numa_node for gpu in topology.gpus] == EXPECTED_NUMA[model]
    # NVLink peers are exactly the NV pairs, and symmetric.
    for gpu in topology.gpus:
        assert gpu.nvlink_peers == [j for j, label in enumerate(table[gpu.index]) if label.startswith("NV")]
    assert len({gpu.uuid for gpu in topology.gpus}) == len(topology.gpus)


def test_pcie_classes_agree_with_numa_nodes() -> None:
    """SYS exactly when the pair crosses NUMA nodes (nvidia-smi's meaning), on every PCIe board."""
    boards = [t for t in fleet_topologies().values() if not t.gpus[0].nvlink_peers]
    plx = node_topology(
        cluster="c",
        node="plx",
        spec=replace(GPU_SPECS["L40S-48GB"], pcie=PcieLayout(2, 2, 1)),
        gpus_per_node=8,
        namespace=uuid.NAMESPACE_URL,
        at=START,
    )
    assert topo_matrix(plx) == PLX_TREE
    for topology in [*boards, plx]:
        numa = {gpu.index: gpu.numa_node for gpu in topology.gpus}
        for key, label in topology.links.items():
            a, b = (int(part) for part in key.split("-"))
            assert (label == "SYS") == (numa[a] != numa[b]), (topology.node, key, label)


def test_gpus_per_node_follows_the_server_type_and_the_override() -> None:
    fleet = SimulatedFleet(FleetConfig(nodes={"L4-24GB": 1, "H100-SXM-80GB": 1}))
    assert {t.node: len(t.gpus) for t in fleet.topology()} == {"l4-node-00": 4, "h100-node-00": 8}
    wide = SimulatedFleet(FleetConfig(nodes={"L4-24GB": 1}, gpus_per_node_by_model={"L4-24GB": 8}))
    assert [len(t.gpus) for t in wide.topology()] == [8]
    with pytest.raises(ValueError, match="gpus_per_node_by_model"):
        FleetConfig(gpus_per_node_by_model={"B300": 4})
    with pytest.raises(ValueError, match="mig_gpus_per_node"):
        FleetConfig(gpus_per_node_by_model={"A100-SXM-40GB": 2}, mig_gpus_per_node={"A100-SXM-40GB": 3})


# -- the device plugin's choice ------------------------------------------------------------------------


def links_of(model: str) -> LinkTable:
    return LinkTable.from_topology(fleet_topologies()[model])


@pytest.mark.parametrize(
    ("model", "free", "k", "chosen"),
    [
        # the PIX pair, not the lowest indices (1, 2: SYS)
        pytest.param("L40S-48GB", [1, 2, 3], 2, (2, 3), id="L40S PIX pair over lowest"),
        # GPU 5's switch partner is taken: keep both pairs whole
        pytest.param("L40S-48GB", [0, 1, 2, 3, 5], 1, (5,), id="L40S keep switch pairs whole"),
        # all SYS: lowest indices
        pytest.param("L40S-48GB", [0, 2, 4, 6], 2, (0, 2), id="L40S all SYS lowest"),
        pytest.param("L4-24GB", [0, 1, 2, 3], 2, (0, 1), id="L4 two of four"),
        pytest.param("L4-24GB", [0, 2, 3], 2, (2, 3), id="L4 pair 2-3"),
        pytest.param("L4-24GB", [0, 2, 3], 1, (0,), id="L4 one of three"),
        pytest.param("L4-24GB", [1, 2, 3], 1, (1,), id="L4 one lowest"),
        pytest.param("L4-24GB", [0, 1, 2, 3], 3, (0, 1, 2), id="L4 three of four"),
        # NVSwitch: every set ties, lowest indices
        pytest.param("H100-SXM-80GB", [3, 5, 6], 2, (3, 5), id="H100 ties lowest"),
        pytest.param("A100-SXM-40GB", [2, 3, 4, 5, 6, 7], 4, (2, 3, 4, 5), id="A100 four of six"),
        pytest.param("H100-SXM-80GB", [0, 1], 3, None, id="H100 not enough free"),  # not enough free
    ],
)
def test_best_connected_free_set(model: str, free: list[int], k: int, chosen: tuple[int, ...] | None) -> None:
    assert best_free_set(free, k, links_of(model)) == chosen


def test_plx_tree_keeps_a_job_inside_one_switch_tree() -> None:
    links = LinkTable.from_topology(
        NodeTopology(
            cluster="c",
            node="n",
            gpus=[],
            links={f"{i}-{j}": PLX_TREE[i][j] for i in range(8) for j in range(i + 1, 8)},
            at=START,
        )
    )
    assert best_free_set(range(8), 4, links) == (0, 1, 2, 3)
    assert best_free_set([0, 2, 3, 4, 5, 6, 7], 4, links) == (4, 5, 6, 7)  # PXB beats a SYS set
    assert best_free_set([0, 2, 3, 4, 5, 6, 7], 2, links) == (2, 3)  # a PIX pair, leaving 4-7 whole


def test_the_fleet_picks_what_the_extender_assumes_the_device_plugin_picks() -> None:
    """Every free subset of every layout, every k: the fleet's choice is the set
    scheduler_hooks.cluster.placement.best_set predicts (an independent implementation)."""
    # The link layouts only: the fleet's MIG-mode GPUs (never whole-GPU candidates) are compared too.
    topologies = [
        topology.model_copy(
            update={"gpus": [gpu.model_copy(update={"mig_enabled": False}) for gpu in topology.gpus]})
        for topology in fleet_topologies().values()
    ]
    compared = 0
    for topology in topologies:
        links = LinkTable.from_topology(topology)
        indices = [gpu.index for gpu in topology.gpus]
        for size in range(len(indices) + 1):
            for free in itertools.combinations(indices, size):
                node = NodeGpus.from_records(topology).with_allocated(set(indices) - set(free))
                for k in range(1, size + 1):
                    predicted = best_set(node, k)
                    assert predicted is not None
                    chosen = best_free_set(free, k, links)
                    assert chosen == tuple(sorted(predicted[0])), (topology.node, free, k)
                    compared += 1
    # Σ over free sets of their size: n·2^(n-1) per board; five 8-GPU boards and one 4-GPU board.
    assert compared == 5 * 8 * 2**7 + 4 * 2**3


# -- allocation records over a run ---------------------------------------------------------------------

REPLICAS = FleetConfig().time_slice_replicas
MIG_DEVICES = len(GPU_SPECS["A100-SXM-40GB"].mig_layout)  # the all-balanced layout: 4 devices
SHARED_NODE = "l4-node-00"  # time-sliced by default


@dataclass
class Window:
    start: datetime
    samples: list[dict[str, Any]]
    records: list[NodeAllocation]
    running: dict[str, tuple[str, list[int]]]  # pod_uid -> node, indices: pods running after the step


@pytest.fixture(scope="module")
def run() -> list[Window]:
    """300 ten-minute windows of a fleet with every model (MIG on the A100s, one time-sliced L4 node),
    busy enough to fill nodes, with frequent spot reclaims and agent outages."""
    fleet = SimulatedFleet(
        FleetConfig(seed=13, window_seconds=600, nodes=EVERY_MODEL, mig_gpus_per_node={"A100-SXM-40GB": 2},
                    spot_reclaims_per_day=2.0, agent_outages_per_day=0.5)
    )
    windows = []
    for _ in range(300):
        start = fleet.clock
        samples = fleet.step_dicts()
        running = {p["pod_uid"]: (p["node"], p["gpu_indices"]) for p in fleet.running_pods()}
        windows.append(Window(start, samples, fleet.allocations(), running))
    assert fleet.stats.spot_reclaims > 0 and fleet.stats.agent_outages > 0
    return windows


def reported(window: Window) -> list[dict[str, Any]]:
    """The window's own samples (not the backfill of earlier windows that came with it)."""
    return [s for s in window.samples if s["window_start"] == window.start.isoformat()]


def test_one_record_per_reporting_node_every_window(run: list[Window]) -> None:
    nodes = [t.node for t in SimulatedFleet(FleetConfig(nodes=EVERY_MODEL)).topology()]
    missing = 0
    for window in run:
        names = [r.node for r in window.records]
        assert names == [n for n in nodes if n in names]  # in node order, each once
        assert {s["node"] for s in window.samples} <= set(names)  # a node with samples reported
        end = window.start + timedelta(seconds=600)
        assert {(r.cluster, r.at) for r in window.records} == {("sim-cluster", end)}
        missing += len(nodes) - len(names)
    assert missing > 0  # reclaimed and silent nodes publish nothing


def test_allocations_never_overlap_nor_exceed_the_node(run: list[Window]) -> None:
    sizes = {t.node: len(t.gpus) for t in SimulatedFleet(FleetConfig(nodes=EVERY_MODEL)).topology()}
    full = 0
    for window in run:
        mig_pods = {s["pod_uid"] for s in window.samples if s["kind"] == "gpu" and s["mig_profile"]}
        for record in window.records:
            whole: list[int] = []
            slices: dict[int, int] = defaultdict(int)
            replicas: dict[int, int] = defaultdict(int)
            for assignment in record.assignments:
                assert set(assignment.gpu_indices) <= set(range(sizes[record.node]))
                if assignment.pod_uid in mig_pods:
                    (parent,) = assignment.gpu_indices
                    slices[parent] += 1
                elif record.node == SHARED_NODE:
                    (gpu,) = assignment.gpu_indices
                    replicas[gpu] += 1
                else:
                    whole.extend(assignment.gpu_indices)
            assert len(whole) == len(set(whole)), record  # no GPU handed out twice
            assert not set(whole) & set(slices)  # a MIG GPU is never handed out whole
            assert all(count <= MIG_DEVICES for count in slices.values())
            assert all(count <= REPLICAS for count in replicas.values())
            held = len(set(whole) | set(slices) | set(replicas))
            assert held <= sizes[record.node]
            full += held == sizes[record.node]
    assert full > 0  # nodes do fill up


def test_allocations_match_the_samples_pod_by_pod(run: list[Window]) -> None:
    """A reporting node's record lists exactly its running pods, each with the GPU indices its gpu
    samples name; a pod with samples but no assignment ended inside the window (the agent lists a
    finished pod's GPUs as free)."""
    ended = 0
    for window in run:
        assigned = {a.pod_uid: (r.node, a) for r in window.records for a in r.assignments}
        reporting = {r.node for r in window.records}
        assert set(assigned) == {uid for uid, (node, _) in window.running.items() if node in reporting}
        gpu_indices: dict[str, set[int]] = defaultdict(set)
        for sample in (s for s in reported(window) if s["kind"] == "gpu"):
            gpu_indices[sample["pod_uid"]].add(int(sample["labels"]["gpu_index"]))
        for uid, (node, assignment) in assigned.items():
            assert assignment.container == "main"
            assert assignment.gpu_indices == sorted(gpu_indices[uid]), (node, uid)
            assert assignment.gpu_indices == window.running[uid][1]
        gone = set(gpu_indices) - set(assigned)
        assert not gone & set(window.running)
        ended += len(gone)
    assert ended > 0


def test_pcie_pods_get_connected_sets_and_keep_them(run: list[Window]) -> None:
    """A 2-GPU pod starting alone on an L4 node whose free GPUs include a whole PCIe switch gets
    that PIX pair; a pod keeps its GPUs while it runs; a finished pod never comes back."""
    previous: dict[str, NodeAllocation] = {}
    held: dict[str, tuple[str, list[int]]] = {}
    finished: set[str] = set()
    checked = 0
    for window in run:
        current = window.running
        assert not finished & set(current)
        for uid, where in current.items():
            assert held.get(uid, where) == where, "a pod's GPUs never change while it runs"
        for record in (r for r in window.records if r.node.startswith("l4-") and r.node != SHARED_NODE):
            before = previous.get(record.node)
            if before is None:
                continue
            known = {a.pod_uid for a in before.assignments}
            new = [a for a in record.assignments if a.pod_uid not in known]
            staying = {i for a in record.assignments if a.pod_uid in known for i in a.gpu_indices}
            free = set(range(4)) - staying  # what the one new pod was placed from
            if len(new) == 1 and len(new[0].gpu_indices) == 2 and ({0, 1} <= free or {2, 3} <= free):
                a, b = new[0].gpu_indices
                assert a // 2 == b // 2, (record.node, sorted(free), new[0].gpu_indices)  # PIX
                checked += 1
        previous = {r.node: r for r in window.records}
        finished |= set(held) - set(current)
        held = dict(current)
    assert checked > 0 and finished


def test_an_idle_node_reports_an_empty_list() -> None:
    fleet = SimulatedFleet(
        FleetConfig(
            nodes={"L4-24GB": 4},
            tenants=(TenantSpec("solo", arrivals_per_hour=0.0, size_weights=(1.0, 0.0, 0.0, 0.0)),),
            warm_start_jobs=1,
            mig_gpus_per_node={},
            time_sliced_nodes={},
            spot_reclaims_per_day=0.0,
            agent_outages_per_day=0.0,
        )
    )
    assert [r.assignments for r in fleet.allocations()] == [[], [], [], []]  # before the first window
    fleet.step()
    records = fleet.allocations()
    assert [len(r.assignments) for r in records] == [1, 0, 0, 0]
    (pod,) = fleet.running_pods()
    assert records[0].assignments[0].gpu_indices == pod["gpu_indices"] == [0]
    fleet.evict(pod["pod_uid"])
    fleet.step()
    assert [r.assignments for r in fleet.allocations()] == [[], [], [], []]  # the freed GPU is free


def test_dict_and_model_paths_agree_and_are_deterministic() -> None:
    config = FleetConfig(seed=9, nodes=EVERY_MODEL)
    one, two = SimulatedFleet(config), SimulatedFleet(config)
    for _ in range(40):
        one.step_dicts()
        two.step_dicts()
        dicts = one.allocation_dicts()
        assert [jsonio.loads(jsonio.dumps(r.model_dump())) for r in two.allocations()] == dicts
        assert [NodeAllocation.model_validate(d) for d in dicts] == two.allocations()
