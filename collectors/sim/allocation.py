"""Which GPU indices a simulated pod gets: the device plugin's best-connected free set.

NVIDIA's device plugin (best-effort policy of go-gpuallocator) hands a k-GPU container the
free GPUs that talk fastest to each other, preferring to leave well-connected GPUs together
for later requests. The simulated fleet does the same, so its allocation records
(contract 8) look like a real node's and the extender's scores have something to reason about.

Order of preference between k-subsets of the free GPUs (the scorer in
``scheduler_hooks/cluster/placement.py`` assumes the same order; the two are compared by a test):

1. the best worst pair: all NVLink (more links better) > PIX > PXB > PHB > NODE > SYS;
2. the most link weight inside the set;
3. the most link weight left among the GPUs that stay free;
4. the lowest indices.

On an all-to-all NVLink board every set ties, so the lowest free indices win.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpumeter.core.models import NodeTopology

# Tiers of the nvidia-smi classes, worst first; NVLink above them all.
_PCIE_TIERS = {"SYS": 0, "NODE": 1, "PHB": 2, "PXB": 3, "PIX": 4}
_NVLINK_TIER = 5
_SELF = (6, 0)  # a set of fewer than two GPUs has no pair to slow it down
# Beyond this many candidate sets the search grows sets greedily (only boards > 8 GPUs).
EXACT_LIMIT = 4096

_Rank = tuple[int, int]
_SetKey = tuple[_Rank, int, int]


def link_rank(label: str) -> _Rank:
    """(tier, NVLink count) of a class such as ``NV12`` or ``PIX``; unknown classes rank as SYS."""
    text = label.strip().upper()
    if text in _PCIE_TIERS:
        return (_PCIE_TIERS[text], 0)
    if text.startswith("NV") and text[2:].isdigit() and int(text[2:]) > 0:
        return (_NVLINK_TIER, int(text[2:]))
    return (0, 0)


def _weight(rank: _Rank) -> int:
    tier, links = rank
    return 10 + links if tier == _NVLINK_TIER else tier + 1


@dataclass(frozen=True)
class LinkTable:
    """Pair ranks and weights of one node, keyed by (smaller index, larger index)."""

    ranks: Mapping[tuple[int, int], _Rank]

    @classmethod
    def from_topology(cls, topology: NodeTopology) -> LinkTable:
        ranks: dict[tuple[int, int], _Rank] = {}
        for key, label in topology.links.items():
            left, _, right = key.partition("-")
            a, b = int(left), int(right)
            ranks[(min(a, b), max(a, b))] = link_rank(label)
        return cls(ranks)

    def rank(self, a: int, b: int) -> _Rank:
        return self.ranks.get((a, b) if a < b else (b, a), (0, 0))

    def weight(self, a: int, b: int) -> int:
        return _weight(self.rank(a, b))


def best_free_set(free: Sequence[int], k: int, links: LinkTable) -> tuple[int, ...] | None:
    """The k free GPUs the device plugin would hand out (module docstring), ascending; None if
    fewer than k are free."""
    pool = sorted(free)
    if k < 0 or len(pool) < k:
        return None
    if k == 0:
        return ()
    incident = {g: sum(links.weight(g, h) for h in pool if h != g) for g in pool}

    def key(chosen: Sequence[int]) -> _SetKey:
        pairs = list(itertools.combinations(chosen, 2))
        worst = min((links.rank(a, b) for a, b in pairs), default=_SELF)
        inside = sum(links.weight(a, b) for a, b in pairs)
        # Weight left among the rest = total - Σ incident(chosen) + inside; total is constant.
        return worst, inside, inside - sum(incident[g] for g in chosen)

    if math.comb(len(pool), k) > EXACT_LIMIT:
        return _greedy(pool, k, links, key)
    best: tuple[int, ...] | None = None
    best_key: _SetKey | None = None
    for candidate in itertools.combinations(pool, k):  # lexicographic: the first of equals wins
        candidate_key = key(candidate)
        if best_key is None or candidate_key > best_key:
            best, best_key = candidate, candidate_key
    return best


def _greedy(
    pool: list[int], k: int, links: LinkTable, key: Callable[[Sequence[int]], _SetKey]
) -> tuple[int, ...]:
    """Large boards: from every seed, add the GPU with the best worst link to the set so far."""
    best: tuple[int, ...] | None = None
    best_key: _SetKey | None = None
    for seed in pool:
        chosen = [seed]
        while len(chosen) < k:
            rest = [g for g in pool if g not in chosen]
            chosen.append(
                max(
                    rest,
                    key=lambda g: (
                        min(links.rank(g, c) for c in chosen),
                        sum(links.weight(g, c) for c in chosen),
                        -g,
                    ),
                )
            )
        candidate = tuple(sorted(chosen))
        candidate_key = key(candidate)
        if best_key is None or candidate_key > best_key:
            best, best_key = candidate, candidate_key
    assert best is not None
    return best
