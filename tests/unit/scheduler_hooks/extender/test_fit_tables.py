"""Fit tables (the extender's per-GPU-count answers) stay current, the filter answers from
them, and the encoded prioritize answers what the plain one does.

Expected scores are worked out by hand from placement's module docstring, case by case:
for k >= 2 on an all-NVLink node, 6 + int(4 x (min(n, 18) / 18 + k / free) / 2 + 0.5);
k == 1: int(10 / free + 0.5); a node with no link information: 4 + int(2 x k / free + 0.5);
a node with fewer than k free fails with "gpumeter: capacity: node has <free> free GPUs, pod needs <k>".
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_hooks.cluster.json_pieces import HostPieces
from scheduler_hooks.cluster.kube_objects import quota_message
from scheduler_hooks.cluster.placement import PlacementIndex
from scheduler_hooks.cluster.state import ClusterView, HooksState, WatchedNode, WatchedPod
from scheduler_hooks.extender.policy import PodRequest, Policy
from scheduler_hooks.extender.server import encode
from scheduler_hooks.extender.wire_kube import (
    encode_host_priorities,
    filter_answer,
    handle_filter,
    handle_prioritize,
    handle_prioritize_encoded,
)
from tests.unit.scheduler_hooks.builders import allocation, h100, l40s, pod_json, sample_placement


def short(free: int, k: int) -> str:
    return f"gpumeter: capacity: node has {free} free GPUs, pod needs {k}"


def answer(index: PlacementIndex, node: str, k: int) -> tuple[int | None, str | None]:
    """(score, failure reason) of one node in the fit table of k; (None, None) when absent.

    Also checks the table's pieces say the same: the host piece carries the score (an absent
    node answers the neutral 5 without being stored), the FailedNodes member the reason.
    """
    table = index.fit(k)
    score, reason = table.scores.get(node), table.short.get(node)
    shown = 5 if score is None else score
    assert table.hosts[node] == b'{"Host":"%s","Score":%d}' % (node.encode(), shown)
    assert (node in table.hosts) == (score is not None)
    member = None if reason is None else b'"%s":"%s"' % (node.encode(), reason.encode())
    assert table.failed.get(node) == member
    return score, reason


# -- PlacementIndex ----------------------------------------------------------------------------


def test_a_fit_table_follows_topology_allocation_capacity_and_removal() -> None:
    index = PlacementIndex()
    table = index.fit(4)  # asked for before any node exists: filled as nodes arrive
    index.update_topology(h100("n"))
    assert answer(index, "n", 4) == (9, None)  # 8 free: (1 + 4/8) / 2 = .75 -> 6 + int(3.5)
    index.update_allocation(allocation("n", 0, 1, 2))
    assert answer(index, "n", 4) == (10, None)  # 5 free: (1 + .8) / 2 = .9 -> 6 + int(4.1)
    index.update_allocation(allocation("n", 0, 1, 2, 3, 4))
    assert answer(index, "n", 4) == (0, short(3, 4))  # 3 free: fails, prioritize says 0
    index.update_allocation(allocation("n"))  # everything freed
    assert answer(index, "n", 4) == (9, None)
    index.update_topology(l40s("n"))  # same name, another board: 4 PCIe GPUs, SYS across switches
    assert answer(index, "n", 4) == (0, None)  # fits, but its best 4-set is SYS: band 0
    index.remove("n")
    assert answer(index, "n", 4) == (None, None)  # unknown again: passes, scores neutral
    index.set_capacity("c", 8)
    index.update_allocation(allocation("c", 0, 1, 2, 3, 4, 5))
    assert answer(index, "c", 4) == (0, short(2, 4))
    index.set_capacity("c", None)  # the count is gone: free unknown, neutral 5 and passes
    assert answer(index, "c", 4) == (5, None)
    assert index.fit(4) is table  # kept current all along, never rebuilt


def test_a_table_built_late_starts_from_the_current_state() -> None:
    index = PlacementIndex()
    index.update_topology(h100("m"))
    index.update_allocation(allocation("m", 0, 1, 2, 3, 4, 5))
    index.set_capacity("plain", 8)
    assert answer(index, "m", 2) == (10, None)  # 2 free: (1 + 1) / 2 -> 10
    assert answer(index, "plain", 2) == (5, None)  # no layout, 8 free: 4 + int(2 x 2/8 + .5)
    assert answer(index, "m", 3) == (0, short(2, 3))


def test_more_gpu_counts_than_tables_kept_still_answer_right() -> None:
    # Past the table limit every table is dropped and rebuilt on demand; answers stay exact.
    index = PlacementIndex()
    index.update_topology(h100("n"))
    for k in range(1, 71):
        expected = (1, None) if k == 1 else (0, short(8, k)) if k > 8 else None
        if expected is not None:
            assert answer(index, "n", k) == expected, k  # k = 1: int(10 / 8 + .5) = 1
    index.update_allocation(allocation("n", 0, 1, 2, 3, 4, 5, 6))
    assert answer(index, "n", 1) == (10, None)  # 1 free: best fit
    assert answer(index, "n", 70) == (0, short(1, 70))
    assert answer(index, "n", 8) == (0, short(1, 8))


# -- HooksState: pods bound and gone change the tables -------------------------------------------


def pod(uid: str, node: str = "", gpus: int = 1) -> WatchedPod:
    return WatchedPod(uid=uid, namespace="ns-a", name=uid, node=node, gpus=gpus)


def test_pods_bound_and_gone_update_the_tables() -> None:
    state = HooksState()
    state.apply_topology(h100("h"))
    state.apply_allocation(allocation("h", 0, 1, 2, 3))
    index = state.placement
    assert answer(index, "h", 4) == (10, None)  # 4 free: exact fit
    assert answer(index, "h", 2) == (9, None)  # (1 + 2/4) / 2 = .75 -> 6 + int(3.5)
    state.upsert_pod(pod("new", node="h", gpus=2))  # bound since the agent's record: 2 left
    assert answer(index, "h", 4) == (0, short(2, 4))
    assert answer(index, "h", 2) == (10, None)
    filtered = Policy(state.view).filter(PodRequest("ns-a", "p", "u", gpus=4), ["h", "elsewhere"])
    assert (filtered.passed, filtered.failed) == (["elsewhere"], {"h": short(2, 4)})
    state.delete_pod("new")
    assert answer(index, "h", 4) == (10, None)
    assert answer(index, "h", 2) == (9, None)
    state.upsert_pod(pod("big", node="h", gpus=4))
    assert answer(index, "h", 4) == (0, short(0, 4))
    state.upsert_pod(WatchedPod(uid="big", namespace="ns-a", name="big", node="h", gpus=4, terminal=True))
    assert answer(index, "h", 4) == (10, None)  # finished: its GPUs are free again


def test_a_topology_tombstone_falls_back_to_the_node_count() -> None:
    state = HooksState()
    state.upsert_node(WatchedNode("h", None, 8))
    state.apply_topology(h100("h"))
    state.apply_allocation(allocation("h", 0, 1))
    assert answer(state.placement, "h", 2) == (9, None)  # 6 free: (1 + 2/6) / 2 -> 6 + int(3.17)
    state.remove_topology("h")
    assert answer(state.placement, "h", 2) == (5, None)  # no layout, 6 free: 4 + int(2/3 + .5)
    state.upsert_node(WatchedNode("h", None, 1))  # the node now lists one GPU, two held
    assert answer(state.placement, "h", 2) == (0, short(0, 2))


# -- Policy on the tables ---------------------------------------------------------------------

POLICY = Policy(ClusterView(placement=sample_placement(), blocked={"team-b": "gpu_hours"}))
REPEATED = ["l40s-b", "h100-a", "mystery", "h100-a", "l40s-b"]


def test_filter_keeps_repeats_only_when_asked() -> None:
    # sample_placement: h100-a 2 free, l40s-b 1 free, mystery unknown (passes).
    request = PodRequest("team-a", "p", "u", gpus=2)
    once = POLICY.filter(request, REPEATED)
    kept = POLICY.filter(request, REPEATED, distinct=False)
    assert (once.passed, once.failed) == (["h100-a", "mystery"], {"l40s-b": short(1, 2)})
    assert (kept.passed, kept.failed) == (["h100-a", "mystery", "h100-a"], {"l40s-b": short(1, 2)})


def test_prioritize_columns_name_each_node_once() -> None:
    request = PodRequest("team-a", "p", "u", gpus=2)
    names, scores = POLICY.prioritize_columns(request, REPEATED)
    assert (names, scores) == (["l40s-b", "h100-a", "mystery"], [0, 10, 5])
    refused = PodRequest("team-b", "p", "u", gpus=2)
    assert POLICY.prioritize_columns(refused, REPEATED) == (["l40s-b", "h100-a", "mystery"], [0, 0, 0])


# -- wire: filter and the encoded prioritize ---------------------------------------------------


def extender_args(names: list[str], namespace: str = "team-a") -> dict[str, Any]:
    return {"Pod": pod_json(namespace=namespace, gpus=2), "Nodes": None, "NodeNames": names}


def test_filter_answer_lists_a_repeated_name_as_often_as_sent() -> None:
    answer_ = filter_answer(extender_args(["h100-a", "l40s-b", "h100-a", "mystery"]), POLICY)
    assert answer_["NodeNames"] == ["h100-a", "h100-a", "mystery"]
    assert answer_["FailedNodes"] == {"l40s-b": short(1, 2)}
    assert answer_["Nodes"] is None


def test_encoded_filter_names_a_failing_node_sent_twice_once() -> None:
    encoded = handle_filter(extender_args(["l40s-b", "h100-a", "l40s-b", "h100-a"]), POLICY)
    assert encoded == (
        b'{"Nodes":null,"NodeNames":["h100-a","h100-a"],'
        b'"FailedNodes":{"l40s-b":"gpumeter: capacity: node has 1 free GPUs, pod needs 2"},'
        b'"FailedAndUnresolvableNodes":{},"Error":""}'
    )


ESCAPED = ['quo"te', "\u00fc-node", "\ud800x", "l40s-b", "back\\slash"]
REFUSED = quota_message("team-b", "gpu_hours")


# (names, namespace, GPUs) -> (NodeNames, FailedNodes, FailedAndUnresolvableNodes), from
# sample_placement: h100-a 2 free, h100-b 8, l40s-a 4, l40s-b 1, mystery unknown (passes);
# team-b is blocked on gpu_hours.
@pytest.mark.parametrize(("names", "namespace", "gpus", "expected"), [
    pytest.param(["l40s-b", "h100-a", "mystery", "l40s-a"], "team-a", 2,
                 (["h100-a", "mystery", "l40s-a"], {"l40s-b": short(1, 2)}, {}), id="some fail"),
    pytest.param(["h100-a", "h100-b", "mystery"], "team-a", 2,
                 (["h100-a", "h100-b", "mystery"], {}, {}), id="all pass"),
    pytest.param(["l40s-b", "h100-a"], "team-a", 4,
                 ([], {"l40s-b": short(1, 4), "h100-a": short(2, 4)}, {}), id="all fail"),
    pytest.param(REPEATED, "team-a", 2,
                 (["h100-a", "mystery", "h100-a"], {"l40s-b": short(1, 2)}, {}), id="repeats"),
    pytest.param(ESCAPED, "team-a", 2,
                 (['quo"te', "\u00fc-node", "\ud800x", "back\\slash"], {"l40s-b": short(1, 2)}, {}),
                 id="escapes"),
    pytest.param(["l40s-b", "h100-a"], "team-b", 2,
                 ([], {}, {"l40s-b": REFUSED, "h100-a": REFUSED}), id="refused tenant"),
    pytest.param([], "team-a", 2, ([], {}, {}), id="no names"),
    pytest.param(["l40s-b", "h100-a"], "team-a", 0, (["l40s-b", "h100-a"], {}, {}), id="pod without GPUs"),
])
def test_filter_answers_from_the_fit_tables(
    names: list[str], namespace: str, gpus: int, expected: tuple[list[str], dict[str, str], dict[str, str]]
) -> None:
    document = {"Pod": pod_json(namespace=namespace, gpus=gpus), "Nodes": None, "NodeNames": names}
    passed, failed, unresolvable = expected
    plain = filter_answer(document, POLICY)
    assert plain == {
        "Nodes": None, "NodeNames": passed, "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable, "Error": "",
    }
    # What the server sends (joined from the fit table's pieces where it can) is the plain
    # answer encoded, byte for byte.
    assert handle_filter(document, POLICY) == encode(plain)


def test_encoded_filter_follows_the_table_as_allocations_change() -> None:
    state = HooksState()
    for name in ("a", "b", "c"):
        state.apply_topology(h100(name))
    policy = Policy(state.view)
    document = extender_args(["a", "b", "c", "gone"])  # 2 GPUs
    state.apply_allocation(allocation("b", 0, 1, 2, 3, 4, 5, 6))  # 1 free
    first = json.loads(handle_filter(document, policy))
    assert (first["NodeNames"], first["FailedNodes"]) == (["a", "c", "gone"], {"b": short(1, 2)})
    state.apply_allocation(allocation("b"))  # all free again
    state.apply_allocation(allocation("c", 0, 1, 2, 3, 4, 5, 6, 7))  # none free
    then = json.loads(handle_filter(document, policy))
    assert (then["NodeNames"], then["FailedNodes"]) == (["a", "b", "gone"], {"c": short(0, 2)})
    state.placement.remove("c")  # unknown again: passes
    assert json.loads(handle_filter(document, policy))["NodeNames"] == ["a", "b", "c", "gone"]
    assert handle_filter(document, policy) == encode(filter_answer(document, policy))


def test_filter_json_as_the_server_sends_it() -> None:
    # Written out by hand; the lone surrogate makes orjson refuse the answer, so the standard
    # library writes it (ASCII escapes throughout).
    document = extender_args(["l40s-b", *ESCAPED[:3], "mystery", "l40s-b"])
    assert encode(handle_filter(document, POLICY)) == (
        b'{"Nodes":null,"NodeNames":["quo\\"te","\\u00fc-node","\\ud800x","mystery"],'
        b'"FailedNodes":{"l40s-b":"gpumeter: capacity: node has 1 free GPUs, pod needs 2"},'
        b'"FailedAndUnresolvableNodes":{},"Error":""}'
    )


def test_filter_with_full_nodes_answers_the_passing_items() -> None:
    items = [{"metadata": {"name": name}} for name in ("l40s-b", "h100-a")]
    document = {"Pod": pod_json(gpus=2), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    assert handle_filter(document, POLICY) == encode(filter_answer(document, POLICY))
    answer_ = filter_answer(document, POLICY)
    assert answer_["Nodes"] == {"metadata": {}, "items": [items[1]]}
    assert answer_["NodeNames"] is None
    assert answer_["FailedNodes"] == {"l40s-b": short(1, 2)}


def test_encoded_priorities_are_the_json_of_the_plain_answer() -> None:
    # Names a JSON writer must escape; none is known, so each scores neutral 5, except h100-a.
    names = ['quo"te', "back\\slash", "\u00fc-node", "\ud800x", "h100-a", 'quo"te']
    document = extender_args(names)
    encoded = handle_prioritize_encoded(document, POLICY)
    assert encoded == (
        b'[{"Host":"quo\\"te","Score":5},{"Host":"back\\\\slash","Score":5},'
        b'{"Host":"\xc3\xbc-node","Score":5},{"Host":"\\ud800x","Score":5},{"Host":"h100-a","Score":10}]'
    )
    assert json.loads(encoded) == handle_prioritize(document, POLICY)
    refused = handle_prioritize_encoded(extender_args(["h100-a"], namespace="team-b"), POLICY)
    assert refused == b'[{"Host":"h100-a","Score":0}]'
    assert encode_host_priorities([], []) == b"[]"


def test_host_pieces_stay_bounded() -> None:
    pieces = HostPieces(7, limit=2)
    assert [pieces[name] for name in ("a", "b", "c")] == [
        b'{"Host":"a","Score":7}', b'{"Host":"b","Score":7}', b'{"Host":"c","Score":7}']
    assert len(pieces) <= 2


def test_becoming_ready_builds_the_common_tables_once() -> None:
    state = HooksState()
    state.expect("topology", "pods")
    state.apply_topology(h100("h"))
    state.loaded("topology")
    assert state.placement.fitted == ()  # still waiting for the pods
    state.loaded("pods")
    assert state.placement.fitted == (1, 2, 4, 8)
    assert answer(state.placement, "h", 8) == (10, None)  # 8 free, exact fit: (1 + 1) / 2 -> 10
    state.apply_allocation(allocation("h", 0))
    assert answer(state.placement, "h", 8) == (0, short(7, 8))  # kept current after warming


def test_a_node_short_only_because_gpus_are_in_mig_mode_fails_on_topology_not_capacity() -> None:
    """Issue 33: a refusal says what it is. MIG-mode GPUs are handed out as MIG devices, never
    as whole GPUs: a node whose whole free GPUs plus its MIG-mode ones would fit the pod is held
    by its layout (topology); one that would not fit even then, by capacity."""
    mig = h100("mig")
    mig = mig.model_copy(update={"gpus": [g.model_copy(update={"mig_enabled": g.index >= 4})
                                          for g in mig.gpus]})
    index = PlacementIndex()
    index.update_topology(mig)
    index.update_topology(h100("busy"))
    index.update_allocation(allocation("busy", 0, 1, 2, 3, 4, 5))
    # mig: 4 whole GPUs free (0..3), 4 in MIG mode; busy: 2 free of 8, none in MIG mode.
    assert answer(index, "mig", 8)[1] == (
        "gpumeter: topology: node has 4 free whole GPUs and 4 in MIG mode, pod needs 8")
    assert answer(index, "busy", 8)[1] == "gpumeter: capacity: node has 2 free GPUs, pod needs 8"
    assert answer(index, "mig", 4)[1] is None
    # Two whole GPUs taken: 2 + 4 < 8, so more free GPUs, not another layout, would help first.
    index.update_allocation(allocation("mig", 0, 1))
    assert answer(index, "mig", 8)[1] == short(2, 8)
    assert answer(index, "mig", 6)[1] == (
        "gpumeter: topology: node has 2 free whole GPUs and 4 in MIG mode, pod needs 6")
