"""Placement rules: link classes, the best free set, scores and the per-node index.

Expected scores are worked out by hand from the rules in placement's docstring:
``band_low + int(x * (band_high - band_low) + 0.5)`` with x = packing (k / free), or for an
all-NVLink set x = (min(n, 18) / 18 + packing) / 2 in the band 6..10.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpumeter.core.models import NodeTopology
from scheduler_hooks.cluster.placement import (
    NEUTRAL_SCORE,
    NODE,
    PHB,
    PIX,
    PXB,
    SELF,
    SYS,
    LinkClass,
    NodeGpus,
    PlacementIndex,
    best_set,
    capacity_message,
    nvlink,
    parse_pair,
    score,
    set_class,
)
from tests.unit.scheduler_hooks.builders import (
    a100,
    allocation,
    h100,
    l40s,
    pcie_with_bridge,
    shared_allocation,
    time_sliced_l4,
    topology,
)


def gpus(topo: NodeTopology, *allocated: int) -> NodeGpus:
    return NodeGpus.from_records(topo, allocation(topo.node, *allocated))


# -- link classes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NV18", nvlink(18)),
        ("nv12", nvlink(12)),
        (" NV1 ", nvlink(1)),
        ("PIX", PIX),
        ("PXB", PXB),
        ("PHB", PHB),
        ("NODE", NODE),
        ("SYS", SYS),
        ("SOC", SYS),  # old nvidia-smi name
        ("PSB", PXB),  # old nvidia-smi name
        ("X", SELF),
    ],
    ids=lambda value: str(value).strip() or "blank",
)
def test_link_class_parse(text: str, expected: LinkClass) -> None:
    assert LinkClass.parse(text) == expected


@pytest.mark.parametrize("text", ["NV", "NV0", "NVX", "PCI", ""], ids=["NV", "NV0", "NVX", "PCI", "empty"])
def test_link_class_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="unknown GPU link class"):
        LinkClass.parse(text)


def test_link_classes_rank_all_nvlink_first_then_pcie_distance() -> None:
    ranked = [nvlink(18), nvlink(12), nvlink(2), nvlink(1), PIX, PXB, PHB, NODE, SYS]
    assert sorted(reversed(ranked), reverse=True) == ranked
    assert [c.label for c in ranked] == ["NV18", "NV12", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]


@pytest.mark.parametrize(
    ("key", "expected"),
    [("0-1", (0, 1)), ("3-2", (2, 3)), (" 4 - 7 ", (4, 7)), ("1-1", None), ("a-b", None), ("01", None)],
    ids=["plain", "reversed", "spaces", "self", "letters", "no-dash"],
)
def test_parse_pair(key: str, expected: tuple[int, int] | None) -> None:
    assert parse_pair(key) == expected


# -- records -> NodeGpus ---------------------------------------------------------------------


def test_from_records_derives_free_and_ignores_unknown_indices() -> None:
    node = NodeGpus.from_records(h100("n"), allocation("n", 0, 3, 9))  # GPU 9 does not exist
    assert node.allocated == frozenset({0, 3})
    assert node.free == (1, 2, 4, 5, 6, 7)


def test_from_records_refuses_another_nodes_allocation() -> None:
    with pytest.raises(ValueError, match="allocation of node 'other'"):
        NodeGpus.from_records(h100("n"), allocation("other", 1))


def test_missing_or_unknown_pair_class_counts_as_sys() -> None:
    topo = topology("n", "X", 3, lambda a, b: "NV4")
    links = dict(topo.links)
    del links["0-2"]
    links["1-2"] = "NVSOMETHING"
    node = NodeGpus.from_records(topo.model_copy(update={"links": links}))
    assert node.link(0, 1) == nvlink(4)
    assert node.link(2, 0) == SYS
    assert node.link(1, 2) == SYS
    assert node.has_links


def test_topology_without_pair_classes_has_no_link_information() -> None:
    topo = topology("n", "X", 4, lambda a, b: "NV4").model_copy(update={"links": {}})
    assert not NodeGpus.from_records(topo).has_links


# -- best_set --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BestCase:
    id: str
    node: NodeGpus
    k: int
    expected: tuple[frozenset[int], LinkClass] | None


def _hybrid() -> NodeGpus:
    """DGX-1 style quad: (0,1) and (2,3) NV2, (0,2) and (1,3) NV1, diagonals SYS."""
    classes = {(0, 1): "NV2", (2, 3): "NV2", (0, 2): "NV1", (1, 3): "NV1"}
    return NodeGpus.from_records(topology("hyb", "V100", 4, lambda a, b: classes.get((a, b), "SYS")))


BEST_CASES = [
    BestCase("h100-free-pair", gpus(h100()), 2, (frozenset({0, 1}), nvlink(18))),
    BestCase("h100-after-three-taken", gpus(h100(), 0, 1, 2), 3, (frozenset({3, 4, 5}), nvlink(18))),
    BestCase("l40s-switch-pair", gpus(l40s()), 2, (frozenset({0, 1}), PIX)),
    BestCase("l40s-intact-pair-when-0-taken", gpus(l40s(), 0), 2, (frozenset({2, 3}), PIX)),
    BestCase("l40s-single-takes-orphan", gpus(l40s(), 0), 1, (frozenset({1}), SELF)),
    BestCase("l40s-single-all-free-lowest", gpus(l40s()), 1, (frozenset({0}), SELF)),
    BestCase("l40s-three-crosses-sockets", gpus(l40s()), 3, (frozenset({0, 1, 2}), SYS)),
    BestCase("l40s-split-pairs", gpus(l40s(), 1, 3), 2, (frozenset({0, 2}), SYS)),
    BestCase("nvlink-pair-beats-pcie-pair", gpus(pcie_with_bridge()), 2, (frozenset({2, 3}), nvlink(4))),
    BestCase("pcie-pair-when-bridge-broken", gpus(pcie_with_bridge(), 2), 2, (frozenset({0, 1}), PIX)),
    BestCase("more-nvlinks-win", _hybrid(), 2, (frozenset({0, 1}), nvlink(2))),
    BestCase("zero-gpus", gpus(h100()), 0, (frozenset(), SELF)),
    BestCase("too-few-free", gpus(l40s(), 0, 1, 2), 2, None),
]


@pytest.mark.parametrize("case", BEST_CASES, ids=lambda case: case.id)
def test_best_set(case: BestCase) -> None:
    assert best_set(case.node, case.k) == case.expected


def _sixteen(*allocated: int) -> NodeGpus:
    """16 GPUs: NVLink (NV4) quads, PIX within each half, SYS across halves."""

    def link(a: int, b: int) -> str:
        return "NV4" if a // 4 == b // 4 else "PIX" if a // 8 == b // 8 else "SYS"

    return gpus(topology("big", "X", 16, link), *allocated)


@pytest.mark.parametrize(
    ("allocated", "k", "expected_class"),
    [
        ((), 4, nvlink(4)),  # a whole quad
        ((), 5, PIX),  # more than a quad: one half (greedy path: C(16,5) > limit)
        ((), 8, PIX),  # exactly a half
        ((), 9, SYS),  # more than a half
        ((0, 5, 9, 14), 3, nvlink(4)),  # three left in a quad
        ((0, 5, 9, 14), 4, PIX),  # no quad intact
        ((0, 5, 9, 14), 7, SYS),  # a half has only 6 free
    ],
    ids=["quad", "five", "half", "nine", "three-left", "no-quad", "seven-of-six"],
)
def test_best_set_on_a_large_mixed_board(
    allocated: tuple[int, ...], k: int, expected_class: LinkClass
) -> None:
    node = _sixteen(*allocated)
    found = best_set(node, k)
    assert found is not None
    members, link = found
    assert link == expected_class
    assert len(members) == k and not members & node.allocated
    assert set_class(node, members) == expected_class


# -- score -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreCase:
    id: str
    node: NodeGpus
    k: int
    expected: int | None


SCORE_CASES = [
    # k = 1: packing only, int(10 / free + 0.5)
    ScoreCase("one-gpu-on-8-free", gpus(h100()), 1, 1),
    ScoreCase("one-gpu-on-2-free", gpus(h100(), 0, 1, 2, 3, 4, 5), 1, 5),
    ScoreCase("one-gpu-on-last-free", gpus(h100(), 0, 1, 2, 3, 4, 5, 6), 1, 10),
    # all NVLink: 6 + int(4 * (strength + packing) / 2 + 0.5)
    ScoreCase("nv18-pair-exact-fit", gpus(h100(), 0, 1, 2, 3, 4, 5), 2, 10),  # (1 + 1) / 2 = 1
    ScoreCase("nv18-pair-of-8-free", gpus(h100()), 2, 9),  # (1 + .25) / 2 = .625 -> 2.5 + .5
    ScoreCase("nv18-four-exact-fit", gpus(h100(), 0, 1, 2, 3), 4, 10),
    ScoreCase("nv12-four-exact-fit", gpus(a100(), 0, 1, 2, 3), 4, 9),  # (.667 + 1) / 2 -> 3.33 + .5
    ScoreCase("nv12-four-of-8-free", gpus(a100()), 4, 8),  # (.667 + .5) / 2 -> 2.33 + .5
    ScoreCase("nv18-whole-node", gpus(h100()), 8, 10),
    ScoreCase("nv4-bridge-pair-of-4-free", gpus(pcie_with_bridge()), 2, 7),  # (.222 + .5) / 2 -> 1.44 + .5
    # PCIe bands: PIX 4..5, PXB 3, PHB 2, NODE 1, SYS 0
    ScoreCase("pix-pair-exact-fit", gpus(l40s(), 2, 3), 2, 5),
    ScoreCase("pix-pair-of-4-free", gpus(l40s()), 2, 5),  # 4 + int(.5 + .5)
    ScoreCase("pix-pair-of-3-free", gpus(l40s(), 3), 2, 5),  # 4 + int(.667 + .5)
    ScoreCase("whole-l40s-crosses-sys", gpus(l40s()), 4, 0),
    ScoreCase("whole-l40s-crosses-node", gpus(l40s(across="NODE")), 4, 1),
    ScoreCase("split-pairs-sys", gpus(l40s(), 1, 3), 2, 0),
    # edges
    ScoreCase("no-gpus-requested", gpus(h100()), 0, 0),
    ScoreCase("too-few-free", gpus(l40s(), 0, 1), 3, None),
    ScoreCase(
        "no-link-information-neutral-band",  # 4 + int(2 * .5 + .5)
        NodeGpus.from_records(l40s().model_copy(update={"links": {}})),
        2,
        5,
    ),
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=lambda case: case.id)
def test_score(case: ScoreCase) -> None:
    assert score(case.node, case.k) == case.expected


def test_two_gpu_pod_prefers_the_node_it_fills_on_an_nvlink_pair() -> None:
    exact_pair = gpus(h100("a"), 0, 1, 2, 3, 4, 5)
    wide_open = gpus(h100("b"))
    assert score(exact_pair, 2) == 10
    assert score(wide_open, 2) == 9
    assert score(exact_pair, 2) > score(wide_open, 2)  # type: ignore[operator]


def test_two_gpu_pod_prefers_an_nvlink_pair_to_a_pcie_pair_even_against_packing() -> None:
    nvlink_wide_open = gpus(h100())  # pair of 8 free: worst packing
    pcie_exact = gpus(l40s(), 2, 3)  # pair of 2 free: best packing
    assert score(nvlink_wide_open, 2) > score(pcie_exact, 2)  # type: ignore[operator]


def test_weakest_nvlink_still_outranks_the_best_pcie_placement() -> None:
    nv1_wide_open = gpus(topology("nv1", "X", 8, lambda a, b: "NV1"))  # (1/18 + .25) / 2 -> 6 + 1
    assert score(nv1_wide_open, 2) == 7
    assert score(gpus(l40s(), 2, 3), 2) == 5


def test_four_gpu_pod_on_half_allocated_a100_scores_below_four_free_nvswitch_h100() -> None:
    # Both leave nothing free (same packing), so only the link class separates them: NV12 < NV18.
    half_a100 = gpus(a100(), 0, 2, 4, 6)
    half_h100 = gpus(h100(), 1, 3, 5, 7)
    assert best_set(half_a100, 4) == (frozenset({1, 3, 5, 7}), nvlink(12))
    assert score(half_a100, 4) == 9
    assert score(half_h100, 4) == 10
    # Against the same board with 4 free it ties: on NVSwitch every 4-set is all NVLink, so a
    # half-allocated A100 *is* a node with 4 free all-NVLink GPUs.
    assert score(half_a100, 4) == score(gpus(a100("b"), 4, 5, 6, 7), 4)
    # Against a fully free A100 it scores above: packing keeps the 8-GPU node whole.
    assert score(gpus(a100("c")), 4) == 8


# -- PlacementIndex --------------------------------------------------------------------------


def test_index_unknown_node_is_neutral() -> None:
    index = PlacementIndex()
    assert index.entry("nowhere") is None
    assert index.free("nowhere") is None
    assert index.score("nowhere", 2) == NEUTRAL_SCORE
    assert index.score("nowhere", 0) == 0


def test_index_follows_topology_and_allocation() -> None:
    index = PlacementIndex()
    index.update_topology(h100("n"))
    assert index.free("n") == 8
    assert index.score("n", 2) == 9
    index.update_allocation(allocation("n", 0, 1, 2, 3, 4, 5))
    assert index.free("n") == 2
    assert index.score("n", 2) == 10
    assert index.score("n", 3) is None


def test_index_keeps_cached_scores_when_records_repeat() -> None:
    index = PlacementIndex()
    index.update_topology(h100("n"))
    index.update_allocation(allocation("n", 0, 1))
    before = index.entry("n")
    assert before is not None and before.score(2) == 9  # (1 + 2/6) / 2 = .667 -> 2.67 + .5
    index.update_allocation(allocation("n", 1, 0, pod="same-gpus-other-pod"))  # same indices
    index.update_topology(h100("n").model_copy(update={"at": h100().at.replace(hour=13)}))
    assert index.entry("n") is before
    index.update_allocation(allocation("n", 0))
    after = index.entry("n")
    assert after is not before and after is not None and after.free == 7


def test_index_allocation_before_topology() -> None:
    index = PlacementIndex()
    index.update_allocation(allocation("n", 0, 1, 2))
    assert index.free("n") is None  # GPU count unknown yet
    index.update_topology(l40s("n"))
    assert index.free("n") == 1


def test_index_node_without_topology_scores_from_its_gpu_count() -> None:
    index = PlacementIndex()
    index.set_capacity("n", 8)
    index.update_allocation(allocation("n", 0, 1, 2, 3))
    assert index.free("n") == 4
    assert index.score("n", 1) == 3  # int(10 / 4 + .5)
    assert index.score("n", 2) == 5  # neutral band 4..6: 4 + int(2 * .5 + .5)
    assert index.score("n", 4) == 6  # exact fit, top of the neutral band
    assert index.score("n", 5) is None
    index.set_capacity("n", None)
    assert index.free("n") is None
    assert index.score("n", 2) == NEUTRAL_SCORE


def test_index_remove() -> None:
    index = PlacementIndex()
    index.update_topology(h100("n"))
    index.remove("n")
    assert "n" not in index and len(index) == 0


def test_index_alike_nodes_answer_alike() -> None:
    index = PlacementIndex()
    for i in range(50):
        index.update_topology(a100(f"a{i}"))
        index.update_allocation(allocation(f"a{i}", *range(i % 8)))
    for i in range(50):
        free = 8 - i % 8
        assert index.free(f"a{i}") == free
        assert index.score(f"a{i}", 1) == int(10 / free + 0.5)


def test_mig_mode_gpus_are_never_free_for_a_whole_gpu_pod() -> None:
    """Contract 8's MIG mode: a partitioned GPU is handed out as MIG devices, so an idle one
    must not count as a free whole GPU (nor anchor a well-connected set)."""
    topo = a100()
    partitioned = topo.model_copy(update={"gpus": [
        gpu.model_copy(update={"mig_enabled": gpu.index < 3}) for gpu in topo.gpus]})
    node = NodeGpus.from_records(partitioned, allocation("a100-0", 3))
    assert sorted(node.free) == [4, 5, 6, 7]
    assert best_set(node, 5) is None
    chosen = best_set(node, 4)
    assert chosen is not None and sorted(chosen[0]) == [4, 5, 6, 7]


# -- time-sliced GPUs (contract 8: replicas) ---------------------------------------------------


@pytest.mark.parametrize(
    ("k", "fits"),
    [
        pytest.param(1, True, id="one-replica"),
        pytest.param(3, True, id="three-of-four-replicas"),
        pytest.param(4, True, id="all-four-replicas"),
        pytest.param(5, False, id="more-than-the-replicas"),
    ],
)
def test_a_gpu_time_sliced_four_ways_is_four_schedulable_units(k: int, fits: bool) -> None:
    index = PlacementIndex()
    index.update_topology(time_sliced_l4("l4-ts", replicas=4))
    assert index.free("l4-ts") == 4
    table = index.fit(k)
    if fits:
        assert "l4-ts" not in table.short
        assert table.scores["l4-ts"] > 0
    else:
        assert table.short["l4-ts"] == capacity_message(4, k)


def test_each_pod_on_a_time_sliced_gpu_takes_one_of_its_replicas() -> None:
    index = PlacementIndex()
    index.update_topology(time_sliced_l4("l4-ts", replicas=4, count=2))
    index.update_allocation(shared_allocation("l4-ts", ("a", [0]), ("b", [0]), ("c", [1])))
    assert index.free("l4-ts") == 8 - 3
    assert "l4-ts" not in index.fit(5).short
    assert index.fit(6).short["l4-ts"] == capacity_message(5, 6)


def test_an_old_topology_without_replicas_is_whole_gpus() -> None:
    index = PlacementIndex()
    record = time_sliced_l4("l4-0", replicas=4).model_dump(mode="json")
    for gpu in record["gpus"]:
        del gpu["replicas"]
    index.update_topology(NodeTopology.model_validate(record))
    assert index.free("l4-0") == 1
    assert index.fit(2).short["l4-0"] == capacity_message(1, 2)
