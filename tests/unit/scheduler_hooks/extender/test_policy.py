"""The one placement and quota policy: filter reasons, scores, victim choice, Volcano answers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from scheduler_hooks.cluster.kube_objects import quota_message
from scheduler_hooks.cluster.placement import PlacementIndex
from scheduler_hooks.cluster.state import ClusterView, KnownPod, ModelBlock
from scheduler_hooks.extender.policy import (
    ABSTAIN,
    CODE_SUCCESS,
    CODE_UNSCHEDULABLE,
    CODE_UNSCHEDULABLE_AND_UNRESOLVABLE,
    REJECT,
    PodRequest,
    Policy,
    Victim,
)
from scheduler_hooks.extender.wire_kube import handle_filter
from tests.unit.scheduler_hooks.builders import SAMPLE_NODES, sample_placement

NODES = SAMPLE_NODES
UNRESOLVABLE = CODE_UNSCHEDULABLE_AND_UNRESOLVABLE


def placement() -> PlacementIndex:
    return sample_placement()


T0 = datetime(2026, 11, 5, 8, tzinfo=UTC)
T1 = datetime(2026, 11, 5, 9, tzinfo=UTC)

KNOWN = {
    pod.uid: pod
    for pod in [
        KnownPod("spot-1", "team-a", Decimal(1), capacity_type="spot", started_at=T0),
        KnownPod("od-1", "team-a", Decimal(1), started_at=T0),
        KnownPod("od-2", "team-a", Decimal(1), started_at=T0),
        KnownPod("od-new", "team-a", Decimal(1), started_at=T1),
        KnownPod("od-high", "team-a", Decimal(1), priority=100, started_at=T0),
        KnownPod("prot-1", "team-a", Decimal(1), capacity_type="spot", protected=True),
        KnownPod("blocked-1", "team-b", Decimal(2)),
        KnownPod("over-max-1", "team-d", Decimal(2)),
    ]
}


def view() -> ClusterView:
    return ClusterView(
        placement=placement(),
        blocked={"team-b": "spend"},
        max_gpus={"team-a": Decimal(16), "team-c": Decimal(8), "team-d": Decimal(4)},
        gpus_held={"team-a": Decimal(10), "team-c": Decimal(7), "team-d": Decimal(6)},
        namespace_tenants={"research": "team-c", "ml-b": "team-b"},
        pods=KNOWN,
        protection_namespaces={"ops"},  # labelled gpumeter.io/protection-allowed: "true"
    )


POLICY = Policy(view())


def pod(namespace: str = "team-a", gpus: int = 2, **extra: object) -> PodRequest:
    return PodRequest(namespace=namespace, name="p", uid="uid-p", gpus=gpus, **extra)  # type: ignore[arg-type]


# -- filter ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterCase:
    id: str
    pod: PodRequest
    nodes: Sequence[str]
    passed: Sequence[str]
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable_prefix: str | None = None


FILTER_CASES = [
    FilterCase("cpu-pod-of-blocked-tenant-passes", pod("ml-b", gpus=0), NODES, NODES),
    FilterCase(
        "blocked-tenant-refused-everywhere",
        pod("ml-b", gpus=1),
        NODES,
        [],
        unresolvable_prefix="gpumeter: tenant team-b over spend quota",
    ),
    FilterCase(
        "would-exceed-max-gpus",  # team-c holds 7 of 8; 7 + 2 > 8
        pod("research", gpus=2),
        ["h100-b", "l40s-a"],
        [],
        unresolvable_prefix="gpumeter: tenant team-c over max_gpus quota",
    ),
    FilterCase("reaching-max-gpus-exactly-is-allowed", pod("research", gpus=1), ["h100-b"], ["h100-b"]),
    FilterCase(
        "two-gpus-by-free-count",
        pod(gpus=2),
        NODES,
        ["h100-a", "h100-b", "l40s-a", "mystery"],
        {"l40s-b": "gpumeter: capacity: node has 1 free GPUs, pod needs 2"},
    ),
    FilterCase(
        "four-gpus-by-free-count",
        pod(gpus=4),
        NODES,
        ["h100-b", "l40s-a", "mystery"],
        {
            "h100-a": "gpumeter: capacity: node has 2 free GPUs, pod needs 4",
            "l40s-b": "gpumeter: capacity: node has 1 free GPUs, pod needs 4",
        },
    ),
    FilterCase("only-nodes-asked-about", pod("team-e", gpus=8), ["h100-b"], ["h100-b"]),
    FilterCase("unknown-node-passes", pod("team-e", gpus=16), ["mystery"], ["mystery"]),
    FilterCase(  # team-a holds 10 of 16: 10 + 8 > 16
        "max-gpus-checked-before-node-fit",
        pod(gpus=8),
        ["h100-b"],
        [],
        unresolvable_prefix="gpumeter: tenant team-a over max_gpus quota",
    ),
    FilterCase("no-candidates", pod(gpus=1), [], []),
    # A MIG device (nvidia.com/mig-<profile>) or a renamed time-sliced replica is a GPU pod too:
    # its hours count against the tenant's gpu_hours and spend, so a blocked tenant is refused it.
    FilterCase(
        "mig-pod-of-blocked-tenant-refused-everywhere",
        pod("ml-b", gpus=0, other_gpu_devices=1),
        NODES,
        [],
        unresolvable_prefix="gpumeter: tenant team-b over spend quota",
    ),
    FilterCase("mig-pod-of-unblocked-tenant-passes", pod(gpus=0, other_gpu_devices=1), NODES, NODES),
]


@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda case: case.id)
def test_filter(case: FilterCase) -> None:
    result = POLICY.filter(case.pod, case.nodes)
    assert result.passed == list(case.passed)
    assert result.failed == dict(case.failed)
    if case.unresolvable_prefix is None:
        assert result.unresolvable == {}
    else:
        assert sorted(result.unresolvable) == sorted(case.nodes)
        assert all(m.startswith(case.unresolvable_prefix) for m in result.unresolvable.values())
    assert set(result.passed) | set(result.failed) | set(result.unresolvable) == set(case.nodes)


def test_quota_messages_are_exact() -> None:
    result = POLICY.filter(pod("ml-b", gpus=1), ["h100-b"])
    assert result.unresolvable == {"h100-b": "gpumeter: tenant team-b over spend quota"}
    detail = POLICY.filter(pod("research", gpus=2), ["h100-b"]).unresolvable["h100-b"]
    assert detail == "gpumeter: tenant team-c over max_gpus quota: holds 7 GPUs, pod needs 2, limit 8"
    assert quota_message("t", "gpu_hours") == "gpumeter: tenant t over gpu_hours quota"


def test_tenant_without_label_is_its_namespace() -> None:
    view_ = ClusterView(placement=placement(), blocked={"research": "gpu_hours"})
    assert Policy(view_).refusal(pod("research", gpus=1)) == "gpumeter: tenant research over gpu_hours quota"


# -- prioritize ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # h100-a: NVLink pair exactly filled 10; h100-b: pair of 8 free 9; l40s-a: PIX pair of 4 free 5;
        # l40s-b: too few free 0; mystery: no record, neutral 5.
        (pod(gpus=2), [("h100-a", 10), ("h100-b", 9), ("l40s-a", 5), ("l40s-b", 0), ("mystery", 5)]),
        # one GPU: packing only, int(10 / free + .5)
        (pod(gpus=1), [("h100-a", 5), ("h100-b", 1), ("l40s-a", 3), ("l40s-b", 10), ("mystery", 5)]),
        (pod(gpus=0), [(name, 0) for name in NODES]),
        (pod("ml-b", gpus=2), [(name, 0) for name in NODES]),
    ],
    ids=["two-gpus", "one-gpu", "no-gpus", "refused-pod"],
)
def test_prioritize(request_: PodRequest, expected: list[tuple[str, int]]) -> None:
    assert POLICY.prioritize(request_, NODES) == expected


# -- preempt ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreemptCase:
    id: str
    victims: Mapping[str, Sequence[str]]
    expected: Mapping[str, Sequence[str]]
    observed: Mapping[str, PodRequest] = field(default_factory=dict)
    preemptor: PodRequest = field(default_factory=lambda: pod(gpus=1))


SPOT, OD, OD2, PROT = ["spot-1"], ["od-1"], ["od-2"], ["prot-1"]
PROTECT = {"gpumeter.io/protected": "true"}
PREEMPT_CASES = [
    PreemptCase("spot-node-preferred", {"n1": SPOT, "n2": OD}, {"n1": SPOT}),
    PreemptCase("no-preferred-node-keeps-all", {"n1": OD, "n2": OD2}, {"n1": OD, "n2": OD2}),
    PreemptCase("protected-victim-drops-its-node", {"n1": SPOT + PROT, "n2": OD}, {"n2": OD}),
    PreemptCase("only-protected-offers-nothing", {"n1": PROT}, {}),
    PreemptCase("blocked-tenant-victims-preferred", {"n1": ["blocked-1"], "n2": OD}, {"n1": ["blocked-1"]}),
    PreemptCase("over-max-gpus-victims-preferred", {"n1": ["over-max-1"], "n2": OD}, {"n1": ["over-max-1"]}),
    PreemptCase(
        "partly-preferred-node-is-not-preferred",
        {"n1": SPOT + OD, "n2": OD2},
        {"n1": SPOT + OD, "n2": OD2},
    ),
    PreemptCase("node-without-victims-dropped", {"n1": [], "n2": OD}, {"n2": OD}),
    PreemptCase("unknown-victim-is-ordinary", {"n1": ["ghost"], "n2": OD}, {"n1": ["ghost"], "n2": OD}),
    PreemptCase(
        "annotation-seen-on-the-wire-protects",
        {"n1": ["ghost"], "n2": OD},
        {"n2": OD},
        observed={"ghost": PodRequest("ops", "ghost", "ghost", annotations=PROTECT)},
    ),
    PreemptCase(
        "annotation-on-the-wire-without-namespace-label-protects-nothing",
        {"n1": ["ghost"], "n2": OD},
        {"n1": ["ghost"], "n2": OD},
        observed={"ghost": PodRequest("x", "ghost", "ghost", annotations=PROTECT)},
    ),
    PreemptCase(
        "unknown-victim-of-blocked-namespace-preferred",
        {"n1": ["ghost"], "n2": OD},
        {"n1": ["ghost"]},
        observed={"ghost": PodRequest("ml-b", "ghost", "ghost", gpus=1)},
    ),
    PreemptCase("refused-preemptor-gets-nothing", {"n1": SPOT}, {}, preemptor=pod("ml-b", gpus=1)),
]


@pytest.mark.parametrize("case", PREEMPT_CASES, ids=lambda case: case.id)
def test_preempt(case: PreemptCase) -> None:
    kept = POLICY.preempt(case.preemptor, case.victims, case.observed)
    assert kept == {node: list(uids) for node, uids in case.expected.items()}


# -- Volcano ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "node", "expected"),
    [
        (pod("ml-b", gpus=1), "h100-b", (UNRESOLVABLE, "gpumeter: tenant team-b over spend quota")),
        (pod(gpus=2), "l40s-b",
         (CODE_UNSCHEDULABLE, "gpumeter: capacity: node has 1 free GPUs, pod needs 2")),
        (pod(gpus=2), "h100-b", (CODE_SUCCESS, "")),
        (pod(gpus=2), "mystery", (CODE_SUCCESS, "")),
        (pod("ml-b", gpus=0), "l40s-b", (CODE_SUCCESS, "")),
        (pod("ml-b", gpus=0, other_gpu_devices=1), "a100-a",
         (UNRESOLVABLE, "gpumeter: tenant team-b over spend quota")),
        (pod(gpus=0, other_gpu_devices=1), "a100-a", (CODE_SUCCESS, "")),
    ],
    ids=["blocked", "too-few-gpus", "fits", "unknown-node", "cpu-pod", "blocked-mig-pod", "mig-pod"],
)
def test_predicate(request_: PodRequest, node: str, expected: tuple[int, str]) -> None:
    assert POLICY.predicate(request_, node) == expected


@pytest.mark.parametrize(
    ("queue", "expected"),
    [("gpumeter-team-b", True), ("gpumeter-team-a", False), ("team-b", False), ("gpumeter-", False)],
    ids=["blocked-tenant", "ok-tenant", "not-a-gpumeter-queue", "empty-tenant"],
)
def test_queue_overused(queue: str, expected: bool) -> None:
    assert POLICY.queue_overused(queue) is expected


@pytest.mark.parametrize(
    ("namespace", "gpus", "expected"),
    [("ml-b", 4, REJECT), ("ml-b", 0, ABSTAIN), ("team-a", 4, ABSTAIN)],
    ids=["blocked-gpu-job", "blocked-cpu-job", "ok-tenant"],
)
def test_job_enqueueable(namespace: str, gpus: int, expected: int) -> None:
    assert POLICY.job_enqueueable(namespace, gpus) == expected


def test_node_scores_scale_to_volcano_range() -> None:
    assert POLICY.node_scores(pod(gpus=2), ["h100-a", "l40s-b"]) == {"h100-a": 100, "l40s-b": 0}


def test_volcano_victims_drop_protected_and_follow_contract_order() -> None:
    evictees = [Victim(uid) for uid in ["od-1", "prot-1", "od-high", "spot-1", "od-new", "blocked-1"]]
    ordered = [v.uid for v in POLICY.volcano_victims(pod(gpus=1), evictees)]
    # preferred (spot, over-quota tenant) first; then lowest priority; then most recently started
    # (a pod with no start time known sorts as the oldest)
    assert ordered == ["spot-1", "blocked-1", "od-new", "od-1", "od-high"]
    assert POLICY.volcano_victims(pod("ml-b", gpus=1), evictees) == []


# -- per-model budgets (contract 4, amendment "per-model limits") ----------------------------------

def model_view(*blocks: ModelBlock) -> Policy:
    base = view()
    return Policy(ClusterView(
        placement=base.placement, blocked=base.blocked, max_gpus={}, gpus_held={},
        namespace_tenants=base.namespace_tenants, pods=KNOWN,
        protection_namespaces=base.protection_namespaces,
        blocked_models={"team-a": blocks},
        node_models={"h100-a": "H100-SXM-80GB", "h100-b": "H100-SXM-80GB", "l40s-a": "L40S-48GB",
                     "l40s-b": "L40S-48GB"},  # mystery: no model label
    ))


def test_an_exhausted_model_fails_its_nodes_only_so_the_pod_may_land_elsewhere() -> None:
    policy = model_view(ModelBlock("gpu_hours", "H100-", ("H100-",)))
    result = policy.filter(pod(gpus=2), NODES)
    why = "gpumeter: tenant team-a over gpu_hours quota: for H100- GPUs (node {} has H100-SXM-80GB)"
    # H100 nodes fail with the budget's reason (FailedNodes); l40s-b fails on capacity (1 free);
    # l40s-a (4 free) and mystery (unknown model and placement) pass.
    assert result.passed == ["l40s-a", "mystery"]
    assert result.failed["h100-a"] == why.format("h100-a") and result.failed["h100-b"] == why.format("h100-b")
    assert set(result.failed) == {"h100-a", "h100-b", "l40s-b"} and result.unresolvable == {}
    assert policy.predicate(pod(gpus=2), "h100-b") == (CODE_UNSCHEDULABLE, why.format("h100-b"))
    assert policy.predicate(pod(gpus=2), "l40s-a") == (CODE_SUCCESS, "")
    # Another tenant's pods and GPU-less pods are untouched.
    assert policy.filter(pod("research", gpus=2), ["h100-b"]).passed == ["h100-b"]
    assert policy.filter(pod(gpus=0), ["h100-b"]).passed == ["h100-b"]


def test_a_mig_pod_keeps_off_the_nodes_of_an_exhausted_model_too() -> None:
    # A MIG device of an H100 is H100 hours: the budget's reason fails the H100 nodes; whole-GPU
    # capacity is not its fit (l40s-b, 1 whole GPU free, passes: the scheduler checks the device).
    policy = model_view(ModelBlock("gpu_hours", "H100-", ("H100-",)))
    mig = pod(gpus=0, other_gpu_devices=1)
    result = policy.filter(mig, NODES)
    assert result.passed == ["l40s-a", "l40s-b", "mystery"]
    assert set(result.failed) == {"h100-a", "h100-b"} and result.unresolvable == {}
    assert policy.predicate(mig, "h100-a")[0] == CODE_UNSCHEDULABLE
    assert policy.predicate(mig, "l40s-b") == (CODE_SUCCESS, "")


def test_every_node_sent_of_an_exhausted_model_refuses_the_pod_everywhere() -> None:
    policy = model_view(ModelBlock("gpu_hours", "H100-", ("H100-",)),
                        ModelBlock("max_gpus", "L40S-", ("L40S-",)))
    result = policy.filter(pod(gpus=1), ["h100-a", "l40s-a", "h100-b"])
    assert result.passed == [] and result.failed == {}
    assert sorted(result.unresolvable) == ["h100-a", "h100-b", "l40s-a"]
    assert result.unresolvable["l40s-a"] == (
        "gpumeter: tenant team-a over max_gpus quota: for L40S- GPUs (node l40s-a has L40S-48GB)")


def test_the_wire_answer_of_a_model_budget_is_the_policys_whatever_path_encodes_it() -> None:
    """The server's filter (NodeNames alone: the encoded fast path for a pod its tenant's quota
    lets through) must still fail the nodes of an exhausted model, as ``filter`` does."""
    policy = model_view(ModelBlock("gpu_hours", "H100-", ("H100-",)))
    document = {"Pod": {"metadata": {"name": "p", "namespace": "team-a", "uid": "u"},
                        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]}},
                "NodeNames": NODES}
    answer = json.loads(handle_filter(document, policy))
    expected = policy.filter(pod(gpus=2), NODES, distinct=False)
    assert answer["NodeNames"] == expected.passed == ["l40s-a", "mystery"]
    assert answer["FailedNodes"] == expected.failed
    assert set(answer["FailedNodes"]) == {"h100-a", "h100-b", "l40s-b"}
