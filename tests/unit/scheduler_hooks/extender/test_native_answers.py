"""NodeNames requests answered from their raw bodies (native/src/extender.rs) against the plain
answers, on the same bodies and the same cluster.

Reference: ``filter_answer`` and ``handle_prioritize`` (dicts built by the policy, encoded by
orjson as the server encodes a JSON value): the native answers must be those bytes. Bodies are
written by orjson (UTF-8 as it is) and by the standard library (non-ASCII as ``\\u`` escapes),
with names a JSON writer must escape, names sent twice and names no node has, while the
cluster's allocations change between requests (the native mirror of each fit table follows).
A body that is not plainly a NodeNames request is left to the Python path, which answers as it
always did.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler_hooks.extender.wire_kube as wire_kube
from scheduler_hooks.cluster.json_pieces import json_value
from scheduler_hooks.cluster.state import ClusterView, HooksState
from scheduler_hooks.extender.policy import Policy
from scheduler_hooks.extender.server import KUBE_VERBS, decode
from scheduler_hooks.extender.wire_kube import (
    NamesArgs,
    decide_filter,
    decide_prioritize_encoded,
    filter_answer,
    handle_prioritize,
    read_extender_args,
)
from tests.unit.scheduler_hooks.builders import allocation, h100, l40s, pod_json, sample_placement


@pytest.fixture(autouse=True)
def native() -> None:
    assert wire_kube.read_node_names is not None, "gpumeter_native is not built: `make install` builds it"


def plain_filter(body: bytes, policy: Policy) -> bytes:
    return json_value(filter_answer(orjson.loads(body), policy))


def plain_prioritize(body: bytes, policy: Policy) -> bytes:
    return json_value(handle_prioritize(orjson.loads(body), policy))


def read(body: bytes) -> NamesArgs:
    args = read_extender_args(body)
    assert args is not None, body[:200]
    return args


def assert_native_answers_alike(body: bytes, policy: Policy) -> None:
    args = read(body)
    assert decide_filter(args, policy) == plain_filter(body, policy)
    assert decide_prioritize_encoded(args, policy) == plain_prioritize(body, policy)


# -- by hand ----------------------------------------------------------------------------------

POLICY = Policy(ClusterView(placement=sample_placement(), blocked={"team-b": "gpu_hours"}))


def body(names: list[str], namespace: str = "team-a", gpus: int = 2, ascii_only: bool = False) -> bytes:
    document = {"Pod": pod_json(namespace=namespace, gpus=gpus), "Nodes": None, "NodeNames": names}
    return json.dumps(document).encode() if ascii_only else orjson.dumps(document)


def test_a_node_names_request_is_answered_natively_byte_for_byte() -> None:
    # sample_placement: h100-a 2 free, h100-b 8, l40s-a 4, l40s-b 1, mystery unknown (passes).
    sent = ["l40s-b", "h100-a", 'quo"te', "mystery", "l40s-b", "h100-a", "\u00fc-node", "back\\slash\n"]
    for ascii_only in (False, True):
        args = read(body(sent, ascii_only=ascii_only))
        assert decide_filter(args, POLICY) == (
            b'{"Nodes":null,"NodeNames":["h100-a","quo\\"te","mystery","h100-a","\xc3\xbc-node",'
            b'"back\\\\slash\\n"],'
            b'"FailedNodes":{"l40s-b":"gpumeter: capacity: node has 1 free GPUs, pod needs 2"},'
            b'"FailedAndUnresolvableNodes":{},"Error":""}')
        assert decide_prioritize_encoded(args, POLICY) == (
            b'[{"Host":"l40s-b","Score":0},{"Host":"h100-a","Score":10},{"Host":"quo\\"te","Score":5},'
            b'{"Host":"mystery","Score":5},{"Host":"\xc3\xbc-node","Score":5},'
            b'{"Host":"back\\\\slash\\n","Score":5}]')


@pytest.mark.parametrize(("namespace", "gpus"), [("team-b", 2), ("team-a", 0), ("team-a", 4)],
                         ids=["refused tenant", "pod without GPUs", "some fail"])
def test_pods_no_table_alone_answers_are_answered_alike(namespace: str, gpus: int) -> None:
    assert_native_answers_alike(body(["l40s-b", "h100-a", "mystery", "h100-a"], namespace, gpus), POLICY)


# Bodies the Python path reads (or refuses) its own way: not plainly a NodeNames request.
UNUSUAL = {
    "lower-case keys": b'{"pod":%(pod)s,"nodenames":["h100-a"]}',
    "Nodes given": b'{"Pod":%(pod)s,"Nodes":{"items":[{"metadata":{"name":"h100-a"}}]},'
                   b'"NodeNames":["h100-a"]}',
    "an extra key": b'{"Pod":%(pod)s,"NodeNames":["h100-a"],"Extra":1}',
    "a repeated key": b'{"Pod":%(pod)s,"NodeNames":["l40s-b"],"NodeNames":["h100-a"]}',
    "NodeNames null": b'{"Pod":%(pod)s,"NodeNames":null}',
    "a number among the names": b'{"Pod":%(pod)s,"NodeNames":["h100-a",7]}',
    "Pod null": b'{"Pod":null,"NodeNames":["h100-a"]}',
    "Pod a string": b'{"Pod":"p","NodeNames":["h100-a"]}',
    "a bad GPU count": b'{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"x"}}}]}},'
                       b'"NodeNames":["h100-a"]}',
    "a lone surrogate": b'{"Pod":%(pod)s,"NodeNames":["\\ud800"]}',
    "not UTF-8": b'{"Pod":%(pod)s,"NodeNames":["\xff"]}',
    "no Pod": b'{"NodeNames":["h100-a"]}',
    "not JSON": b'{"Pod":%(pod)s,"NodeNames":["h100-a"]',
    "an array": b'[1]',
}


@pytest.mark.parametrize("template", list(UNUSUAL.values()), ids=list(UNUSUAL))
def test_an_unusual_body_is_left_to_the_python_path(template: bytes) -> None:
    raw = template % {b"pod": orjson.dumps(pod_json(gpus=2))} if b"%(pod)s" in template else template
    assert read_extender_args(raw) is None


def test_a_large_pod_is_left_to_the_python_path() -> None:
    """Checking a Pod of thousands of containers takes long: the server does it on a worker
    thread, so the native reader (on the loop) leaves such a Pod alone."""
    containers = [{"name": f"c-{i}", "image": "x"} for i in range(3_000)]
    large = orjson.dumps({"Pod": pod_json(gpus=2, containers=containers), "NodeNames": ["h100-a"]})
    assert len(large) > wire_kube.MAX_READ_POD_BYTES
    assert read_extender_args(large) is None
    assert read_extender_args(body(["h100-a"])) is not None


def test_the_server_reads_natively_what_it_can_and_decodes_the_rest() -> None:
    """The verbs' ``read`` is the native reader; a body it leaves is decoded and parsed."""
    for verb in ("filter", "prioritize"):
        assert KUBE_VERBS[verb].read is read_extender_args
    left = UNUSUAL["lower-case keys"] % {b"pod": orjson.dumps(pod_json(gpus=2))}
    assert read_extender_args(left) is None
    args = KUBE_VERBS["filter"].parse(decode(left))
    assert decide_filter(args, POLICY) == plain_filter(left, POLICY)


def test_without_the_extension_every_body_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_kube, "read_node_names", None)
    assert read_extender_args(body(["h100-a"])) is None


def test_a_names_request_decodes_to_what_parsing_gives() -> None:
    raw = body(["h100-a", 'q"', "h100-a", "\u00e9"], ascii_only=True)
    expected = wire_kube.parse_extender_args(orjson.loads(raw))
    assert read(raw).expanded() == expected


# -- random clusters, random requests ---------------------------------------------------------

# Node names with what a JSON writer escapes (quote, backslash, control characters), non-ASCII
# and astral characters; the cluster's own nodes are a few of them.
NAME = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc")),
               min_size=1, max_size=12).filter(lambda name: not name.isspace())


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, str, list[int]]], list[list[str]], list[int], bool]:
    """(nodes as (name, board, first allocation), requests' names, GPU counts, ASCII bodies)."""
    nodes = draw(st.lists(NAME, min_size=1, max_size=8, unique=True))
    cluster = [(name, draw(st.sampled_from(["h100", "l40s"])),
                draw(st.lists(st.integers(0, 3), max_size=4, unique=True))) for name in nodes]
    known_or_not = st.one_of(st.sampled_from(nodes), NAME)
    requests = draw(st.lists(st.lists(known_or_not, max_size=12), min_size=1, max_size=4))
    gpus = draw(st.lists(st.sampled_from([0, 1, 2, 4, 8]), min_size=len(requests), max_size=len(requests)))
    return cluster, requests, gpus, draw(st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_requests_on_a_changing_cluster_are_answered_alike(scenario: Any) -> None:
    cluster, requests, gpus, ascii_only = scenario
    state = HooksState()
    for name, board, taken in cluster:
        state.apply_topology(h100(name) if board == "h100" else l40s(name))
        state.apply_allocation(allocation(name, *taken))
    policy = Policy(state.view)
    for number, (names, count) in enumerate(zip(requests, gpus, strict=True)):
        assert_native_answers_alike(body(names, gpus=count, ascii_only=ascii_only), policy)
        # Between requests a node fills up, frees, or goes (the tables, and their mirrors, follow).
        name, board, _ = cluster[number % len(cluster)]
        if number % 3 == 0:
            state.apply_allocation(allocation(name, *range(8 if board == "h100" else 4)))
        elif number % 3 == 1:
            state.apply_allocation(allocation(name))
        else:
            state.placement.remove(name)
    # The blocked tenant's requests too (refused everywhere: no table answers them).
    state.blocked["team-b"] = "gpu_hours"
    assert_native_answers_alike(body(requests[0], namespace="team-b", gpus=2, ascii_only=ascii_only), policy)


# Churn: the native mirror grows past its first index, rewrites pieces in place or appends them
# (a score or reason of another width), forgets nodes (deleting from probe runs), compacts its
# arena and reuses slots; the answers must stay the Python path's through all of it.
CHURN_STEP = st.tuples(st.sampled_from(["allocate", "remove", "re-add"]), st.integers(0, 10**6),
                       st.lists(st.integers(0, 7), max_size=8, unique=True), st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(NAME, min_size=20, max_size=70, unique=True),
       steps=st.lists(CHURN_STEP, min_size=1, max_size=60),
       strangers=st.lists(NAME, max_size=5), ascii_only=st.booleans())
def test_answers_stay_alike_while_nodes_are_set_reset_forgotten_and_readded(
        nodes: list[str], steps: list[tuple[str, int, list[int], bool]], strangers: list[str],
        ascii_only: bool) -> None:
    state = HooksState()
    for number, name in enumerate(nodes):
        state.apply_topology(h100(name) if number % 2 else l40s(name))
        state.apply_allocation(allocation(name, *range(number % 5)))
    policy = Policy(state.view)
    sent = nodes + strangers + nodes[::3]
    counts = (1, 2, 4, 8)
    for count in counts:  # the fit tables (and their mirrors) of each count exist from here on
        assert_native_answers_alike(body(sent, gpus=count, ascii_only=ascii_only), policy)
    for number, (kind, pick, taken, h100_board) in enumerate(steps):
        name = nodes[pick % len(nodes)]
        if kind == "allocate":
            state.apply_allocation(allocation(name, *taken))
        elif kind == "remove":  # gone for good (with its allocation the node stays known)
            state.remove_allocation(name)
            state.remove_topology(name)
        else:
            state.apply_topology(h100(name) if h100_board else l40s(name))
            state.apply_allocation(allocation(name, *(index for index in taken if index < 4)))
        if number % 7 == 6:
            assert_native_answers_alike(body(sent, gpus=counts[number % 4], ascii_only=ascii_only), policy)
    for count in counts:
        assert_native_answers_alike(body(sent[::-1], gpus=count, ascii_only=ascii_only), policy)
