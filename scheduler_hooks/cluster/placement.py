"""Topology-aware GPU placement scoring (contract 8): a pure rule module.

Inputs are the agent's ``NodeTopology`` (per GPU pair the ``nvidia-smi topo -m`` class) and
``NodeAllocation`` (which indices the kubelet has assigned) records; outputs are the free set
the device plugin would pick for a k-GPU pod and a 0..10 extender score.

Link classes rank: every pair on NVLink best (``NV<n>``, more links better), then ``PIX``,
``PXB``, ``PHB``, ``NODE``, ``SYS``. A set of GPUs is as good as its worst pair.

Score (0..10, kube-scheduler's MaxExtenderPriority):

- k <= 0 (no GPU): 0 on every node, no preference.
- k == 1: packing only, best fit: ``round(10 * 1 / free)`` (1 free -> 10, 2 -> 5, 8 -> 1).
- k >= 2: the link class of the best free k-set picks a band, packing (``k / free``, best
  fit: take from the node the pod fills, keeping large free sets elsewhere intact) moves
  within the band. Bands never overlap, so the link class always dominates:
  all NVLink 6..10 (inside: half NVLink count ``min(n, 18) / 18``, half packing), PIX 4..5,
  PXB 3, PHB 2, NODE 1, SYS 0.
- A node without link information (no topology record, or a record with no pair classes)
  gets the neutral band 4..6 from its free count alone; with no free count either, 5.
- A time-sliced GPU (contract 8: ``replicas`` > 1) is that many schedulable units, as the
  kubelet counts the device plugin's replicas; each assignment listing its index holds one.
  A node with such GPUs is scored from its free unit count alone: replicas of one GPU share
  the device, so link classes say nothing about them.

``PlacementIndex`` keeps one entry per node with its free count and its scores per k,
computed lazily and shared between nodes with the same layout and allocation. For each GPU
count a request has asked for, a ``FitTable`` holds every node's answer and is updated on
every topology, allocation or capacity change, so a request is one C-level ``map`` of a dict
lookup over its node names: no placement search and no Python loop per node.

A node that fails the filter says why (issue 33), one reason object per (free, MIG) count and
k, made when the table changes, never per request: ``gpumeter: capacity: node has <free> free
GPUs, pod needs <k>``, or ``gpumeter: topology: node has <free> free whole GPUs and <m> in MIG
mode, pod needs <k>`` when its MIG-mode GPUs (never whole GPUs) are what leaves it short. Link
classes never fail a node: they only rank (prioritize).
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpumeter.core.kube import schedulable_units
from gpumeter.core.models import NodeAllocation, NodeTopology
from scheduler_hooks.cluster.json_pieces import KnownHosts, failed_piece, host_piece

try:
    from gpumeter_native import FitPieces
except ImportError:  # not built (`make install` builds it): the extender answers in Python
    FitPieces = None  # type: ignore[assignment,misc]

MAX_SCORE = 10
NEUTRAL_SCORE = 5
# Up to this many k-subsets of the free GPUs the search is exhaustive; beyond (only boards with
# more than 8 GPUs and a mixed layout) it grows sets greedily: bounded cost, same class on real layouts.
EXACT_LIMIT = 512
NVLINK_CAP = 18  # NV18 (H100 SXM) counts as full NVLink strength

_TIER_SYS, _TIER_NODE, _TIER_PHB, _TIER_PXB, _TIER_PIX, _TIER_NV, _TIER_SELF = range(7)
_TIER_NAMES = {"SYS": _TIER_SYS, "NODE": _TIER_NODE, "PHB": _TIER_PHB, "PXB": _TIER_PXB, "PIX": _TIER_PIX}
# Older nvidia-smi releases printed SOC for SYS and PSB for PXB.
_ALIASES = {"SOC": "SYS", "PSB": "PXB"}
# Score band (low, high) per tier for k >= 2.
_BANDS = {
    _TIER_NV: (6, 10),
    _TIER_PIX: (4, 5),
    _TIER_PXB: (3, 3),
    _TIER_PHB: (2, 2),
    _TIER_NODE: (1, 1),
    _TIER_SYS: (0, 0),
}
_NEUTRAL_BAND = (4, 6)


@dataclass(frozen=True, slots=True, order=True)
class LinkClass:
    """One ``nvidia-smi topo -m`` class; ordering is quality (greater is better)."""

    tier: int
    nvlinks: int = 0

    @classmethod
    def parse(cls, text: str) -> LinkClass:
        """``NV12``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS`` (``X`` is a GPU itself)."""
        label = text.strip().upper()
        label = _ALIASES.get(label, label)
        if label == "X":
            return SELF
        if label in _TIER_NAMES:
            return cls(_TIER_NAMES[label])
        if label.startswith("NV") and label[2:].isdigit() and int(label[2:]) > 0:
            return cls(_TIER_NV, int(label[2:]))
        raise ValueError(f"unknown GPU link class {text!r}")

    @property
    def is_nvlink(self) -> bool:
        return self.tier == _TIER_NV

    @property
    def label(self) -> str:
        if self.tier == _TIER_NV:
            return f"NV{self.nvlinks}"
        if self.tier == _TIER_SELF:
            return "X"
        return next(name for name, tier in _TIER_NAMES.items() if tier == self.tier)

    @property
    def weight(self) -> int:
        """Additive pair weight for tie-breaks between sets of the same worst class."""
        return 10 + self.nvlinks if self.tier == _TIER_NV else self.tier + 1

    def __str__(self) -> str:
        return self.label


SYS = LinkClass(_TIER_SYS)
NODE = LinkClass(_TIER_NODE)
PHB = LinkClass(_TIER_PHB)
PXB = LinkClass(_TIER_PXB)
PIX = LinkClass(_TIER_PIX)
SELF = LinkClass(_TIER_SELF)  # a set of fewer than two GPUs has no pair to be slowed by


def nvlink(count: int) -> LinkClass:
    return LinkClass(_TIER_NV, count)


def parse_pair(key: str) -> tuple[int, int] | None:
    """``"0-1"`` -> (0, 1), smaller index first; None for a malformed or self pair."""
    left, sep, right = key.partition("-")
    if not sep:
        return None
    try:
        a, b = int(left.strip()), int(right.strip())
    except ValueError:
        return None
    if a == b or a < 0 or b < 0:
        return None
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """One node's GPUs, their pairwise link classes and which are allocated.

    A pair missing from ``links`` (while others are present) counts as SYS: nothing shows it
    is better. ``free`` is derived: indices not allocated, ascending.
    """

    node: str
    indices: tuple[int, ...]
    links: Mapping[tuple[int, int], LinkClass] = field(hash=False)
    allocated: frozenset[int] = frozenset()
    free: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        free = tuple(i for i in sorted(set(self.indices)) if i not in self.allocated)
        object.__setattr__(self, "free", free)

    @classmethod
    def from_records(cls, topology: NodeTopology, allocation: NodeAllocation | None = None) -> NodeGpus:
        """Build from the two contract-8 records. Unknown class strings count as SYS."""
        if allocation is not None and allocation.node != topology.node:
            raise ValueError(f"allocation of node {allocation.node!r} given for node {topology.node!r}")
        # MIG-mode GPUs are handed out as MIG devices: never part of a whole-GPU set.
        indices = tuple(sorted({gpu.index for gpu in topology.gpus if not gpu.mig_enabled}))
        return cls(
            node=topology.node,
            indices=indices,
            links=parse_links(topology.links, indices),
            allocated=allocated_indices(allocation) & frozenset(indices),
        )

    @property
    def has_links(self) -> bool:
        """Link information is known: some pair class is recorded, or there is no pair at all."""
        return bool(self.links) or len(self.indices) < 2

    def link(self, a: int, b: int) -> LinkClass:
        if a == b:
            return SELF
        return self.links.get((a, b) if a < b else (b, a), SYS)

    def with_allocated(self, allocated: Iterable[int]) -> NodeGpus:
        return NodeGpus(self.node, self.indices, self.links, frozenset(allocated) & frozenset(self.indices))


def parse_links(links: Mapping[str, str], indices: Sequence[int] = ()) -> dict[tuple[int, int], LinkClass]:
    """NodeTopology.links (``{"0-1": "NV18"}``) keyed by index pair; pairs of unknown GPUs dropped."""
    known = set(indices)
    parsed: dict[tuple[int, int], LinkClass] = {}
    for key, text in links.items():
        pair = parse_pair(key)
        if pair is None or (known and not (pair[0] in known and pair[1] in known)):
            continue
        try:
            parsed[pair] = LinkClass.parse(text)
        except ValueError:
            parsed[pair] = SYS
    return parsed


def time_sliced_units(topology: NodeTopology) -> dict[int, int] | None:
    """Schedulable units per GPU index when the node time-slices its GPUs, else None."""
    units = {gpu.index: schedulable_units(gpu) for gpu in topology.gpus}
    if all(count <= 1 for count in units.values()):
        return None
    return {index: count for index, count in units.items() if count > 0}


def holders(allocation: NodeAllocation | None) -> Counter[int]:
    """How many assignments hold each GPU index (a time-sliced GPU: one replica apiece)."""
    if allocation is None:
        return Counter()
    return Counter(i for assignment in allocation.assignments for i in assignment.gpu_indices)


def free_units(units: Mapping[int, int], held: Mapping[int, int]) -> int:
    return sum(count - min(count, held.get(index, 0)) for index, count in units.items())


def replica_pick(units: Mapping[int, int], held: Mapping[int, int], k: int) -> list[int]:
    """GPU indices (one per replica, repeated for several of one GPU) for a k-replica pod: the
    least held GPUs first; fewer than k when fewer replicas are free."""
    taken = dict(held)
    picked: list[int] = []
    for _ in range(k):
        free = [(taken.get(i, 0) - count, i) for i, count in units.items() if taken.get(i, 0) < count]
        if not free:
            break
        index = min(free)[1]
        taken[index] = taken.get(index, 0) + 1
        picked.append(index)
    return picked


def allocated_indices(allocation: NodeAllocation | None) -> frozenset[int]:
    if allocation is None:
        return frozenset()
    return frozenset(i for assignment in allocation.assignments for i in assignment.gpu_indices)


def set_class(node: NodeGpus, gpus: Iterable[int]) -> LinkClass:
    """The worst pair class of a set (SELF for fewer than two GPUs)."""
    members = sorted(gpus)
    return min((node.link(a, b) for a, b in itertools.combinations(members, 2)), default=SELF)


def best_set(node: NodeGpus, k: int) -> tuple[frozenset[int], LinkClass] | None:
    """The best-connected free set of k GPUs and its class; None when fewer than k are free.

    Order: best worst-pair class; then the most total link weight inside the set (more NVLinks);
    then the best-connected remainder (take the GPUs whose partners are already gone, keep
    well-connected free groups intact); then the lowest indices.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    free = node.free
    if len(free) < k:
        return None
    if k == 0:
        return frozenset(), SELF
    weight = {(a, b): node.link(a, b).weight for a, b in itertools.combinations(free, 2)}
    incident = dict.fromkeys(free, 0)
    for (a, b), w in weight.items():
        incident[a] += w
        incident[b] += w
    if k == 1:
        # The remainder keeps the most link weight when the taken GPU has the least.
        chosen = min(free, key=lambda g: (incident[g], g))
        return frozenset((chosen,)), SELF
    classes = sorted({node.link(a, b) for a, b in weight}, reverse=True)
    if len(classes) == 1:
        return frozenset(free[:k]), classes[0]
    search = _best_clique if math.comb(len(free), k) <= EXACT_LIMIT else _greedy_clique
    for threshold in classes:
        found = search(node, free, k, threshold, weight, incident)
        if found is not None:
            return found, threshold
    raise AssertionError("the worst class always admits a set")  # pragma: no cover


def _admissible(node: NodeGpus, free: tuple[int, ...], threshold: LinkClass) -> dict[int, set[int]]:
    return {g: {h for h in free if h != g and node.link(g, h) >= threshold} for g in free}


def _set_key(chosen: Sequence[int], inside: int, incident: Mapping[int, int]) -> tuple[int, int]:
    # Remainder weight = inside(R) = total - sum(incident(S)) + inside(S); total is constant.
    return inside, inside - sum(incident[g] for g in chosen)


def _best_clique(
    node: NodeGpus,
    free: tuple[int, ...],
    k: int,
    threshold: LinkClass,
    weight: Mapping[tuple[int, int], int],
    incident: Mapping[int, int],
) -> frozenset[int] | None:
    """Best k-set whose every pair is at least ``threshold``: exhaustive backtracking."""
    neighbours = _admissible(node, free, threshold)
    best: tuple[int, int] | None = None
    best_members: tuple[int, ...] | None = None

    def extend(chosen: list[int], candidates: list[int], inside: int) -> None:
        nonlocal best, best_members
        if len(chosen) == k:
            key = _set_key(chosen, inside, incident)
            if best is None or key > best:
                best, best_members = key, tuple(chosen)
            return
        need = k - len(chosen)
        for position, g in enumerate(candidates):
            if len(candidates) - position < need:
                break
            rest = [h for h in candidates[position + 1 :] if h in neighbours[g]]
            if len(rest) + 1 < need:
                continue
            added = sum(weight[(c, g)] for c in chosen)  # chosen < g: candidates ascend
            chosen.append(g)
            extend(chosen, rest, inside + added)
            chosen.pop()

    extend([], list(free), 0)
    return frozenset(best_members) if best_members is not None else None


def _greedy_clique(
    node: NodeGpus,
    free: tuple[int, ...],
    k: int,
    threshold: LinkClass,
    weight: Mapping[tuple[int, int], int],
    incident: Mapping[int, int],
) -> frozenset[int] | None:
    """Large boards: grow a set from every seed, adding the best-linked admissible GPU.

    Exact for the layouts hardware has (each class threshold splits the GPUs into groups that
    are complete inside: NVSwitch domains, PCIe switches, sockets); an approximation otherwise.
    """
    neighbours = _admissible(node, free, threshold)
    best: tuple[int, int] | None = None
    best_members: tuple[int, ...] | None = None
    for seed in free:
        chosen, inside, candidates = [seed], 0, set(neighbours[seed])
        while len(chosen) < k and len(candidates) >= k - len(chosen):
            gains = {g: sum(weight[(min(g, c), max(g, c))] for c in chosen) for g in candidates}
            g = max(candidates, key=lambda h: (gains[h], -incident[h], -h))
            chosen.append(g)
            inside += gains[g]
            candidates &= neighbours[g]
        if len(chosen) == k:
            key = _set_key(chosen, inside, incident)
            if best is None or key > best:
                best, best_members = key, tuple(chosen)
    return frozenset(best_members) if best_members is not None else None


def _scale(fraction: float, band: tuple[int, int]) -> int:
    low, high = band
    return low + int(fraction * (high - low) + 0.5)


def packing_score(free: int, k: int) -> int | None:
    """Score from the free count alone, for a node with no link information."""
    if k <= 0:
        return 0
    if free < k:
        return None
    if k == 1:
        return _scale(1 / free, (0, MAX_SCORE))
    return _scale(k / free, _NEUTRAL_BAND)


def score(node: NodeGpus, k: int) -> int | None:
    """0..10 for a k-GPU pod on this node (module docstring); None when fewer than k are free."""
    free = len(node.free)
    if k <= 0:
        return 0
    if free < k:
        return None
    if k == 1 or not node.has_links:
        return packing_score(free, k)
    found = best_set(node, k)
    assert found is not None
    link = found[1]
    packing = k / free
    if link.tier == _TIER_NV:
        strength = min(link.nvlinks, NVLINK_CAP) / NVLINK_CAP
        return _scale((strength + packing) / 2, _BANDS[_TIER_NV])
    return _scale(packing, _BANDS[link.tier])


class _ScoreTable(dict[int, "int | None"]):
    """Scores per k for one (layout, allocation); shared by nodes that are alike (weakly held)."""

    __slots__ = ("__weakref__",)


_MISSING = object()
# Distinct GPU counts with a fit table (pods ask for 1, 2, 4, 8 in practice); each table costs
# every later node update one score lookup, so a flood of odd counts must not pile them up.
_MAX_CACHED_K = 64


class NodeEntry:
    """What the extender knows about one node: free GPUs and its lazily computed scores."""

    __slots__ = ("_table", "free", "gpus", "mig", "node")

    def __init__(self, node: str, gpus: NodeGpus | None, free: int | None, table: _ScoreTable,
                 mig: int = 0) -> None:
        self.node = node
        self.gpus = gpus
        self.free = free  # None: unknown (no topology and no GPU count)
        self.mig = mig  # GPUs in MIG mode: never whole GPUs, so not in ``free``
        self._table = table

    def score(self, k: int) -> int | None:
        """0..10; None when the node is known to have fewer than k free GPUs."""
        cached = self._table.get(k, _MISSING)
        if cached is _MISSING:
            cached = self._compute(k)
            self._table[k] = cached
        return cached  # type: ignore[return-value]

    def _compute(self, k: int) -> int | None:
        if self.gpus is not None:
            return score(self.gpus, k)
        if k <= 0:
            return 0
        if self.free is None:
            return NEUTRAL_SCORE
        return packing_score(self.free, k)


def capacity_message(free: int, needed: int) -> str:
    """Why a node fails the filter for lack of free GPUs (the filter's FailedNodes reason)."""
    return f"gpumeter: capacity: node has {free} free GPUs, pod needs {needed}"


def topology_message(free: int, mig: int, needed: int) -> str:
    """Why a node fails the filter because of its layout: it has the GPUs, but some are in MIG
    mode (handed out as MIG devices, never whole) and the whole ones free are too few."""
    return f"gpumeter: topology: node has {free} free whole GPUs and {mig} in MIG mode, pod needs {needed}"


def short_message(free: int, mig: int, needed: int) -> str:
    """The FailedNodes reason of a node with ``free`` whole GPUs free and ``mig`` in MIG mode:
    topology when the MIG-mode GPUs would have made room, else capacity (issue 33: every
    refusal says which it is)."""
    if mig and free + mig >= needed:
        return topology_message(free, mig, needed)
    return capacity_message(free, needed)


class FitTable:
    """Every known node's answer for one GPU count k, as plain dicts for C-level lookups.

    ``scores``: node -> 0..10 (0 where fewer than k GPUs are free, as prioritize answers);
    ``short``: node -> ``short_message`` (capacity, or topology when MIG-mode GPUs would have
    made room), only for nodes known to have fewer than k free
    (the filter's failures; one string object per free count). A node absent from both is
    unknown to the index: it passes and scores ``NEUTRAL_SCORE``. ``hosts`` is the same
    answer as the kube wire's JSON pieces (``json_pieces``): every node's
    ``{"Host":..,"Score":..}`` (an unknown name answers the neutral piece); ``failed``: for
    the nodes of ``short``, their FailedNodes member ``"<node>":"<reason>"``. ``native``: the
    same host and FailedNodes pieces in the native extension (``FitPieces``, None without it),
    which answers NodeNames requests from their raw bodies (wire_kube). ``PlacementIndex``
    keeps them all current; readers must not mutate them.
    """

    __slots__ = ("_reasons", "failed", "hosts", "k", "native", "scores", "short")

    def __init__(self, k: int) -> None:
        self.k = k
        self.scores: dict[str, int] = {}
        self.short: dict[str, str] = {}
        self.hosts = KnownHosts(NEUTRAL_SCORE)
        self.failed: dict[str, bytes] = {}
        self._reasons: dict[tuple[int, int], str] = {}  # (free, mig) -> the one reason object
        self.native = None if FitPieces is None else FitPieces(NEUTRAL_SCORE)

    def set(self, node: str, entry: NodeEntry) -> None:
        value = entry.score(self.k)
        if value is None:
            free = entry.free or 0  # score() is None only when the free count is known and below k
            reason = self._reasons.get((free, entry.mig))
            if reason is None:
                reason = self._reasons[free, entry.mig] = short_message(free, entry.mig, self.k)
            if self.short.get(node) is not reason:
                self.failed[node] = failed_piece(node, reason)
            self.short[node] = reason
            value = 0
        else:
            self.short.pop(node, None)
            self.failed.pop(node, None)
        if self.scores.get(node) != value or node not in self.hosts:
            self.hosts[node] = host_piece(node, value)
        self.scores[node] = value
        if self.native is not None:
            # The node's pieces as they now stand, whichever of them changed above.
            self.native.set(node, self.hosts[node], self.failed.get(node))

    def forget(self, node: str) -> None:
        for answers in (self.scores, self.short, self.hosts, self.failed):
            answers.pop(node, None)
        if self.native is not None:
            self.native.forget(node)


class PlacementIndex:
    """Per-node placement answers kept current from topology and allocation records.

    Not locked: one thread (the event loop) makes every update and answers every request, as
    ``HooksState`` does; entries are replaced whole, and a lazily filled score cache gets the
    same value whoever fills it. An unchanged allocation (the agent republishes every window)
    keeps the node's cached scores and leaves the fit tables alone.
    """

    def __init__(self) -> None:
        self._entries: dict[str, NodeEntry] = {}
        self._free: dict[str, int] = {}  # known free counts only
        self._fits: dict[int, FitTable] = {}  # k -> every node's answer, kept current
        self._keys: dict[str, str] = {}  # node -> the name object every fit table is keyed by
        self._topologies: dict[str, tuple[tuple[int, ...], dict[tuple[int, int], LinkClass]]] = {}
        self._replicas: dict[str, dict[int, int]] = {}  # time-sliced nodes: units per GPU index
        self._mig: dict[str, int] = {}  # nodes with GPUs in MIG mode: how many
        self._allocated: dict[str, Counter[int]] = {}  # GPU index -> assignments holding it
        self._capacity: dict[str, int] = {}
        self._tables: weakref.WeakValueDictionary[tuple[object, ...], _ScoreTable] = (
            weakref.WeakValueDictionary()
        )

    # -- updates ---------------------------------------------------------------------------
    def update_topology(self, topology: NodeTopology) -> None:
        # MIG-mode GPUs are handed out as MIG devices: never part of a whole-GPU set.
        indices = tuple(sorted({gpu.index for gpu in topology.gpus if not gpu.mig_enabled}))
        layout = (indices, parse_links(topology.links, indices))
        replicas = time_sliced_units(topology)
        if self._topologies.get(topology.node) == layout and self._replicas.get(topology.node) == replicas:
            return
        self._topologies[topology.node] = layout
        mig = sum(1 for gpu in topology.gpus if gpu.mig_enabled)
        if mig:
            self._mig[topology.node] = mig
        else:
            self._mig.pop(topology.node, None)
        if replicas is None:
            self._replicas.pop(topology.node, None)
        else:
            self._replicas[topology.node] = replicas
        self._rebuild(topology.node)

    def update_allocation(self, allocation: NodeAllocation) -> None:
        allocated = holders(allocation)
        if self._allocated.get(allocation.node) == allocated:
            return
        self._allocated[allocation.node] = allocated
        self._rebuild(allocation.node)

    def set_capacity(self, node: str, gpus: int | None) -> None:
        """GPU count of a node from elsewhere (its Node object); used only without a topology."""
        if gpus is None:
            self._capacity.pop(node, None)
        elif self._capacity.get(node) == gpus:
            return
        else:
            self._capacity[node] = gpus
        self._rebuild(node)

    def remove(self, node: str) -> None:
        self._entries.pop(node, None)
        self._refresh_fits(node)
        self._free.pop(node, None)
        self._topologies.pop(node, None)
        self._replicas.pop(node, None)
        self._mig.pop(node, None)
        self._allocated.pop(node, None)
        self._capacity.pop(node, None)

    # -- reads -----------------------------------------------------------------------------
    @property
    def entries(self) -> Mapping[str, NodeEntry]:
        return self._entries

    @property
    def free_counts(self) -> Mapping[str, int]:
        """Free GPUs per node, for the nodes whose count is known."""
        return self._free

    def entry(self, node: str) -> NodeEntry | None:
        return self._entries.get(node)

    def free(self, node: str) -> int | None:
        found = self._entries.get(node)
        return None if found is None else found.free

    def score(self, node: str, k: int) -> int | None:
        """Like NodeEntry.score; a node the index has never heard of scores neutral."""
        found = self._entries.get(node)
        if found is None:
            return 0 if k <= 0 else NEUTRAL_SCORE
        return found.score(k)

    def scores(self, nodes: Iterable[str], k: int) -> list[int | None]:
        """``score`` for many nodes at once (from the fit table of k)."""
        if k <= 0:
            return [0 for _ in nodes]
        table = self.fit(k)
        return [None if node in table.short else table.scores.get(node, NEUTRAL_SCORE) for node in nodes]

    def fit(self, k: int) -> FitTable:
        """Every node's answer for a k-GPU pod (k >= 1): the request path.

        Built on the first request for k (one score lookup per node, most shared between
        alike nodes), then kept current by every update, so the tables are never stale.
        """
        table = self._fits.get(k)
        if table is None:
            if len(self._fits) >= _MAX_CACHED_K:
                self._fits.clear()
            table = self._fits[k] = FitTable(k)
            for node in sorted(self._entries):
                table.set(self._key(node), self._entries[node])
        return table

    @property
    def fitted(self) -> tuple[int, ...]:
        """The GPU counts with a fit table now, ascending."""
        return tuple(sorted(self._fits))

    def __contains__(self, node: object) -> bool:
        return node in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # -- internals -------------------------------------------------------------------------
    def _key(self, node: str) -> str:
        """The node's name as fit tables store it: a copy of its own, made when first needed.

        A request's names are fresh strings, so each lookup compares them with the stored key
        (equal hashes, different objects): keys that are node names held by the records lie
        scattered over the heap, a cache miss apiece; copies made one after another lie
        together (measured: a 5,000-name lookup pass 0.87 -> 0.23 ms).
        """
        key = self._keys.get(node)
        if key is None:
            key = self._keys[node] = (node + "\0")[:-1]  # a new object, not node itself
        return key

    def _refresh_fits(self, node: str) -> None:
        entry = self._entries.get(node)
        if entry is None:
            for table in self._fits.values():
                table.forget(node)
            self._keys.pop(node, None)
            return
        if not self._fits:
            return
        key = self._key(node)
        for table in self._fits.values():
            table.set(key, entry)

    def _rebuild(self, node: str) -> None:
        self._rebuild_entry(node)
        self._refresh_fits(node)

    def _rebuild_entry(self, node: str) -> None:
        held = self._allocated.get(node, Counter())
        allocated = frozenset(held)
        layout = self._topologies.get(node)
        replicas = self._replicas.get(node)
        if layout is not None and replicas is not None:
            units = free_units(replicas, held)
            self._entries[node] = NodeEntry(node, None, units, self._table(("count", units)))
            self._free[node] = units
            return
        if layout is not None:
            indices, links = layout
            gpus = NodeGpus(node, indices, links, allocated & frozenset(indices))
            key: tuple[object, ...] = ("topology", indices, tuple(sorted(links.items())), gpus.allocated)
            self._entries[node] = NodeEntry(node, gpus, len(gpus.free), self._table(key),
                                            self._mig.get(node, 0))
            self._free[node] = len(gpus.free)
            return
        capacity = self._capacity.get(node)
        free = None if capacity is None else max(0, capacity - held.total())
        if capacity is None and node not in self._allocated:
            self._entries.pop(node, None)
            self._free.pop(node, None)
            return
        self._entries[node] = NodeEntry(node, None, free, self._table(("count", free)))
        if free is None:
            self._free.pop(node, None)
        else:
            self._free[node] = free

    def _table(self, key: tuple[object, ...]) -> _ScoreTable:
        table = self._tables.get(key)
        if table is None:
            table = _ScoreTable()
            self._tables[key] = table
        return table
