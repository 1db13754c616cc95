"""HooksState: the quota fold, tenants of namespaces, GPUs held, pods and effective allocation.

Expected values are written from contract 4 and the module docstring, case by case.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core.grants import Grant
from gpumeter.core.models import QuotaEvent
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from scheduler_hooks.cluster.state import (
    HooksState,
    WatchedNamespace,
    WatchedNode,
    WatchedPod,
    watched_namespace,
    watched_node,
    watched_pod,
)
from tests.unit.scheduler_hooks.builders import allocation, h100, l40s, time_sliced_l4

AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)


def quota(tenant: str, metric: str, level: str, period: str = "2026-11", tag: str = "", limit: str = "1",
          used: str | None = None) -> QuotaEvent:
    return QuotaEvent(
        event_id=f"{tenant}|{metric}|{level}|{period}|{tag}",
        tenant=tenant,
        metric=metric,
        level=level,
        threshold="1",
        used=used if used is not None else ("0.5" if level == "recovered" else "1"),
        limit=limit,
        period=period,
        at=AT,
    )


TENANTS = TenantsFile(
    tenants=[
        TenantPolicy(
            tenant="blocker", gpu_hours=Decimal(1), spend=Decimal(1), max_gpus=Decimal(1), on_exceed="block"
        ),
        TenantPolicy(tenant="preempter", gpu_hours=Decimal(1), on_exceed="preempt"),
        TenantPolicy(tenant="notifier", gpu_hours=Decimal(1), max_gpus=Decimal(2), on_exceed="notify"),
    ]
)

FOLD_CASES: dict[str, tuple[list[QuotaEvent], dict[str, str]]] = {
    "exceeded blocks": ([quota("blocker", "gpu_hours", "exceeded")], {"blocker": "gpu_hours"}),
    "preempt blocks too": ([quota("preempter", "gpu_hours", "exceeded")], {"preempter": "gpu_hours"}),
    "notify never blocks": ([quota("notifier", "gpu_hours", "exceeded")], {}),
    "tenant without a policy never blocks": ([quota("stranger", "gpu_hours", "exceeded")], {}),
    "warning alone does not block": ([quota("blocker", "gpu_hours", "warning")], {}),
    "recovered unblocks": (
        [quota("blocker", "gpu_hours", "exceeded"), quota("blocker", "gpu_hours", "recovered")],
        {},
    ),
    "a replayed old exceeded does not undo recovered": (
        [
            quota("blocker", "gpu_hours", "exceeded"),
            quota("blocker", "gpu_hours", "recovered"),
            quota("blocker", "gpu_hours", "exceeded"),
        ],
        {},
    ),
    "recovered of another period leaves this one exceeded": (
        [
            quota("blocker", "gpu_hours", "exceeded", "2026-11"),
            quota("blocker", "gpu_hours", "recovered", "2026-10"),
        ],
        {"blocker": "gpu_hours"},
    ),
    "max_gpus has one scope across periods": (
        [
            quota("blocker", "max_gpus", "exceeded", "2026-11", tag="nov"),
            quota("blocker", "max_gpus", "recovered", "2026-11-01"),
        ],
        {},
    ),
    "the first metric in contract order is named": (
        [quota("blocker", "max_gpus", "exceeded"), quota("blocker", "spend", "exceeded")],
        {"blocker": "spend"},
    ),
    "a metric without a limit in the file does not block": ([quota("preempter", "spend", "exceeded")], {}),
    "a new crossing after recovery blocks again": (
        [
            quota("blocker", "spend", "exceeded", tag="g0"),
            quota("blocker", "spend", "recovered", tag="g0"),
            quota("blocker", "spend", "exceeded", tag="g1"),
        ],
        {"blocker": "spend"},
    ),
    # Contract 4, amendment "trust": the tenants file decides, not the event.
    "an exceeded with a limit not the policy's does not block": (
        [quota("blocker", "gpu_hours", "exceeded", limit="0.5")],
        {},
    ),
    "an exceeded of max_gpus with a limit not the policy's does not block": (
        [quota("blocker", "max_gpus", "exceeded", limit="0")],
        {},
    ),
    "an exceeded of a past period does not block": (
        [quota("blocker", "gpu_hours", "exceeded", "2026-10")],
        {},
    ),
    "a recovered with a limit not the policy's does not unblock": (
        [quota("blocker", "gpu_hours", "exceeded"), quota("blocker", "gpu_hours", "recovered", limit="100")],
        {"blocker": "gpu_hours"},
    ),
    "a recovered whose own usage is still at the limit does not unblock": (
        [quota("blocker", "gpu_hours", "exceeded"), quota("blocker", "gpu_hours", "recovered", used="1")],
        {"blocker": "gpu_hours"},
    ),
    "a recovered of a period not begun does not unblock max_gpus": (
        [quota("blocker", "max_gpus", "exceeded"), quota("blocker", "max_gpus", "recovered", "2026-12")],
        {"blocker": "max_gpus"},
    ),
    "a later trusted recovered unblocks after an untrusted one": (
        [
            quota("blocker", "spend", "exceeded"),
            quota("blocker", "spend", "recovered", limit="100", tag="forged"),
            quota("blocker", "spend", "recovered", tag="real"),
        ],
        {},
    ),
}


@pytest.mark.parametrize(("events", "blocked"), FOLD_CASES.values(), ids=FOLD_CASES.keys())
def test_quota_fold(events: list[QuotaEvent], blocked: dict[str, str]) -> None:
    state = HooksState(TENANTS, clock=lambda: AT)
    for item in events:
        state.apply_quota_event(item)
    assert state.blocked == blocked


def test_reloaded_tenants_file_reevaluates_blocking_and_max_gpus() -> None:
    state = HooksState(TENANTS, clock=lambda: AT)
    state.apply_quota_event(quota("blocker", "gpu_hours", "exceeded"))
    # Contract 6: max_gpus refuses new pods whatever on_exceed says (notify included).
    assert state.max_gpus == {"blocker": Decimal(1), "notifier": Decimal(2)}
    state.set_tenants(
        TenantsFile(tenants=[TenantPolicy(tenant="blocker", gpu_hours=Decimal(1), on_exceed="notify")])
    )
    assert (state.blocked, state.max_gpus) == ({}, {})
    state.set_tenants(TENANTS)
    assert state.blocked == {"blocker": "gpu_hours"}


def test_a_recovered_from_a_raised_limit_unblocks_once_the_hooks_read_the_raised_limit() -> None:
    state = HooksState(TENANTS, clock=lambda: AT)
    state.apply_quota_event(quota("blocker", "gpu_hours", "exceeded"))
    # The quota worker read the raised limit (2) first: its recovered carries it.
    state.apply_quota_event(quota("blocker", "gpu_hours", "recovered", limit="2", used="1"))
    assert state.blocked == {"blocker": "gpu_hours"}  # the hooks' file still says 1
    raised = TenantPolicy(tenant="blocker", gpu_hours=Decimal(2), on_exceed="block")
    state.set_tenants(TenantsFile(tenants=[raised]))
    assert state.blocked == {}


def test_a_recovered_from_a_grant_unblocks_once_the_hooks_read_the_grant() -> None:
    state = HooksState(TENANTS, clock=lambda: AT)
    state.apply_quota_event(quota("blocker", "gpu_hours", "exceeded"))
    # The worker read grant #1 (+0.5 GPU-hours from Nov 1) first: 1 < 1 + 0.5, recovered.
    state.apply_quota_event(quota("blocker", "gpu_hours", "recovered", limit="1.5", used="1"))
    assert state.blocked == {"blocker": "gpu_hours"}  # no grant read yet: the limit disagrees
    top_up = Grant(key="#1", metric="gpu_hours", amount=Decimal("0.5"),
                   effective_at=datetime(2026, 11, 1, tzinfo=UTC))
    state.set_grants({"blocker": [top_up]})
    assert state.blocked == {}
    # A grant of another tenant proves nothing for this one.
    other = HooksState(TENANTS, clock=lambda: AT)
    other.apply_quota_event(quota("blocker", "gpu_hours", "exceeded"))
    other.apply_quota_event(quota("blocker", "gpu_hours", "recovered", limit="1.5", used="1"))
    other.set_grants({"preempter": [top_up]})
    assert other.blocked == {"blocker": "gpu_hours"}


def pod(uid: str, namespace: str = "ns-a", node: str = "", gpus: int = 1, **extra: Any) -> WatchedPod:
    return WatchedPod(uid=uid, namespace=namespace, name=uid, node=node, gpus=gpus, **extra)


def test_gpus_held_follow_binding_termination_and_namespace_relabel() -> None:
    state = HooksState()
    state.upsert_pod(pod("p1", gpus=2))  # pending: holds nothing yet
    assert state.gpus_held == {}
    state.upsert_pod(pod("p1", node="n1", gpus=2))
    state.upsert_pod(pod("p2", node="n1", gpus=3, namespace="ns-b"))
    assert state.gpus_held == {"ns-a": 2, "ns-b": 3}
    state.upsert_namespace("ns-b", "team")
    state.upsert_namespace("ns-a", "team")
    assert state.gpus_held == {"team": 5}
    assert state.pods["p1"].tenant == "team"
    state.upsert_pod(pod("p2", node="n1", gpus=3, namespace="ns-b", terminal=True))
    assert state.gpus_held == {"team": 2} and "p2" not in state.pods
    state.delete_namespace("ns-a")  # the label goes with it: the name is the tenant again
    assert state.gpus_held == {"ns-a": 2}
    state.delete_pod("p1")
    assert state.gpus_held == {}


def test_replace_pods_drops_what_the_new_list_lacks() -> None:
    state = HooksState()
    state.replace_pods([pod("a", node="n1"), pod("b", node="n1")])
    state.replace_pods([pod("b", node="n1")])
    assert set(state.pods) == {"b"} and state.gpus_held == {"ns-a": 1}


@pytest.mark.parametrize(
    ("node_labels", "hint", "expected"),
    [
        pytest.param({"gpumeter.io/capacity-type": "spot"}, None, "spot", id="gpumeter label"),
        pytest.param({"karpenter.sh/capacity-type": "spot"}, None, "spot", id="karpenter label"),
        # the node wins
        pytest.param(
            {"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "spot", "on-demand",
            id="eks on-demand beats pod hint",
        ),
        pytest.param({"cloud.google.com/gke-spot": "true"}, None, "spot", id="gke spot"),
        pytest.param({}, "reserved", "reserved", id="pod hint only"),
        pytest.param({}, None, "on-demand", id="nothing: on-demand"),
    ],
)
def test_capacity_type_node_first_then_pod(
    node_labels: dict[str, str], hint: str | None, expected: str
) -> None:
    state = HooksState()
    node = watched_node({"metadata": {"name": "n1", "labels": node_labels}, "status": {}})
    assert node is not None
    state.upsert_node(node)
    state.upsert_pod(pod("p", node="n1", capacity_hint=hint))
    assert state.pods["p"].capacity_type == expected


def test_watched_pod_reads_the_api_object() -> None:
    obj = {
        "metadata": {
            "uid": "u1",
            "namespace": "ns",
            "name": "w",
            "annotations": {"gpumeter.io/protected": "True"},
            "labels": {"gpumeter.io/capacity-type": "spot"},
        },
        "spec": {
            "nodeName": "n1",
            "priority": 7,
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
            ],
        },
        "status": {"phase": "Running", "startTime": "2026-11-05T10:00:00Z"},
    }
    assert watched_pod(obj) == WatchedPod(
        uid="u1",
        namespace="ns",
        name="w",
        node="n1",
        gpus=3,
        priority=7,
        asks_protection=True,
        capacity_hint="spot",
        started_at=datetime(2026, 11, 5, 10, tzinfo=UTC),
        terminal=False,
    )
    assert watched_pod({"metadata": {"name": "no-uid"}}) is None
    bad_quantity = {
        "metadata": {"uid": "u2"},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "many"}}}]},
    }
    assert watched_pod(bad_quantity) is not None and watched_pod(bad_quantity).gpus == 0  # type: ignore[union-attr]


def test_watched_node_and_namespace_tenant() -> None:
    assert watched_node(
        {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    ) == WatchedNode("n", None, 8)
    assert watched_node({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "8"}}}) == WatchedNode("n")
    assert watched_namespace({"metadata": {"name": "ns", "labels": {"gpumeter.io/tenant": "team-a"}}}) == (
        WatchedNamespace("ns", "team-a")
    )
    # Not a tenant id: no tenant (NO_TENANT, ""), never folded into team-a.
    assert watched_namespace({"metadata": {"name": "ns", "labels": {"gpumeter.io/tenant": "Team_A"}}}) == (
        WatchedNamespace("ns", "")
    )
    assert watched_namespace({"metadata": {"name": "ns"}}) == WatchedNamespace("ns", "ns")
    allowed = {"metadata": {"name": "ns", "labels": {"gpumeter.io/protection-allowed": "true"}}}
    assert watched_namespace(allowed) == WatchedNamespace("ns", "ns", protection_allowed=True)


@pytest.mark.security
def test_protection_follows_the_namespace_label() -> None:
    state = HooksState()
    state.upsert_pod(pod("p", node="n1", asks_protection=True))
    state.upsert_pod(pod("q", node="n1"))
    assert not state.pods["p"].protected  # the namespace is not known to allow it
    state.upsert_namespace("ns-a", "team", protection_allowed=True)
    assert state.pods["p"].protected and not state.pods["q"].protected
    state.upsert_namespace("ns-a", "team")  # the label removed
    assert not state.pods["p"].protected
    state.upsert_namespace("ns-a", "team", protection_allowed=True)
    state.replace_namespaces([])  # a relist without the namespace
    assert not state.pods["p"].protected


def test_a_pod_bound_since_the_record_takes_the_best_set_left() -> None:
    # L40S: pairs (0,1) and (2,3) on one PCIe switch each (PIX), SYS across. The record holds
    # GPU 0; a 2-GPU pod bound since gets the intact PIX pair (2,3), the device plugin's pick,
    # so a further 1-GPU pod is left GPU 1: one free.
    state = HooksState()
    state.apply_topology(l40s("l40s-0"))
    state.apply_allocation(allocation("l40s-0", 0))
    state.upsert_pod(pod("new", node="l40s-0", gpus=2))
    effective = state.effective_allocation("l40s-0")
    assert effective is not None
    assert {a.pod_uid: a.gpu_indices for a in effective.assignments} == {"uid-holder": [0], "new": [2, 3]}
    assert state.placement.free("l40s-0") == 1


def test_a_pod_watched_gone_frees_its_gpus_before_the_next_record() -> None:
    state = HooksState()
    state.apply_topology(h100("h100-0"))
    state.apply_allocation(allocation("h100-0", 0, 1, 2, 3, 4, 5, pod="holder"))
    assert state.placement.free("h100-0") == 2
    state.upsert_pod(pod("uid-holder", node="h100-0", gpus=6))
    state.delete_pod("uid-holder")
    assert state.placement.free("h100-0") == 8


def test_without_topology_the_count_comes_from_the_node() -> None:
    state = HooksState()
    state.upsert_node(WatchedNode("plain", None, 4))
    state.upsert_pod(pod("p", node="plain", gpus=3))
    assert state.placement.free("plain") == 1
    state.delete_pod("p")
    assert state.placement.free("plain") == 4


def test_topology_tombstone_forgets_the_layout_keeps_the_count() -> None:
    state = HooksState()
    state.upsert_node(WatchedNode("h100-0", None, 8))
    state.apply_topology(h100("h100-0"))
    state.apply_allocation(allocation("h100-0", 0, 1))
    state.remove_topology("h100-0")
    entry = state.placement.entry("h100-0")
    assert entry is not None and entry.gpus is None and entry.free == 6


def test_readiness_waits_for_every_expected_source() -> None:
    state = HooksState()
    assert state.ready
    state.expect("pods", "topology")
    state.loaded("pods")
    assert (state.ready, state.waiting_for) == (False, ["topology"])
    state.loaded("topology")
    assert state.ready


def test_cached_scores_and_free_counts_follow_every_update() -> None:
    # The request path reads PlacementIndex.scores (cached per k) and free_counts: each update
    # of a node must show in the next answer. 2-GPU pod on 8x H100 (NV18): 8 free scores
    # 6 + round(4 x (1 + 2/8) / 2) = 9; 2 free scores 10; an unknown node 5; too few free None.
    state = HooksState()
    index = state.placement
    assert index.scores(["h100-0"], 2) == [5] and "h100-0" not in index.free_counts
    state.apply_topology(h100("h100-0"))
    assert index.scores(["h100-0"], 2) == [9] and index.free_counts["h100-0"] == 8
    state.apply_allocation(allocation("h100-0", 0, 1, 2, 3, 4, 5))
    assert index.scores(["h100-0"], 2) == [10] and index.free_counts["h100-0"] == 2
    state.apply_allocation(allocation("h100-0", 0, 1, 2, 3, 4, 5, 6))
    assert index.scores(["h100-0"], 2) == [None] and index.free_counts["h100-0"] == 1
    index.remove("h100-0")
    assert index.scores(["h100-0"], 2) == [5] and "h100-0" not in index.free_counts


def test_pods_bound_to_a_time_sliced_node_take_replicas_until_none_is_left() -> None:
    # One L4 time-sliced 4 ways, nothing in the agent's record yet: a 3-GPU pod bound since
    # takes three replicas of GPU 0 (the only GPU), leaving one.
    state = HooksState()
    state.apply_topology(time_sliced_l4("l4-ts", replicas=4))
    state.upsert_pod(pod("three", node="l4-ts", gpus=3))
    assert state.placement.free("l4-ts") == 1
    effective = state.effective_allocation("l4-ts")
    assert effective is not None
    assert {a.pod_uid: a.gpu_indices for a in effective.assignments} == {"three": [0, 0, 0]}
    state.delete_pod("three")
    assert state.placement.free("l4-ts") == 4


def test_a_crossing_of_an_ended_period_blocks_no_more_once_refreshed() -> None:
    now = {"at": AT}
    state = HooksState(TENANTS, clock=lambda: now["at"])
    state.apply_quota_event(quota("blocker", "gpu_hours", "exceeded", period=f"{AT:%Y-%m}"))
    state.refresh_blocked()
    assert state.blocked == {"blocker": "gpu_hours"}  # the period runs on: still blocked
    # The next month, and no recovered from the quota stage (the tenant sent no usage since).
    now["at"] = datetime(AT.year + (AT.month == 12), AT.month % 12 + 1, 1, tzinfo=UTC)
    assert state.blocked == {"blocker": "gpu_hours"}  # nothing asked the state yet
    state.refresh_blocked()
    assert state.blocked == {}


def test_a_model_budget_refuses_only_nodes_of_that_model() -> None:
    models = TenantsFile(tenants=[TenantPolicy(
        tenant="blocker", gpu_hours=Decimal(100), on_exceed="block",
        gpu_hours_by_model={"H100-": Decimal(3), "H100-PCIE-": Decimal(5)})])
    state = HooksState(models, clock=lambda: AT)
    nodes = (("h1", "H100-SXM-80GB"), ("h2", "H100-PCIE-80GB"), ("a1", "A100-SXM-40GB"), ("x", None))
    for name, model in nodes:
        labels = {} if model is None else {"nvidia.com/gpu.product": model}
        node = watched_node({"metadata": {"name": name, "labels": labels}})
        assert node is not None
        state.upsert_node(node)
    over = quota("blocker", "gpu_hours", "exceeded", limit="3", used="3").model_copy(
        update={"gpu_model": "H100-", "event_id": "h100"})
    state.apply_quota_event(over)
    assert state.blocked == {}  # the tenant as a whole is not blocked
    view = state.view
    # H100-SXM belongs to H100- (exhausted); H100-PCIE to the longer H100-PCIE- (not); A100 to none.
    assert view.model_refusal("blocker", "h1") == (
        "gpumeter: tenant blocker over gpu_hours quota: for H100- GPUs (node h1 has H100-SXM-80GB)")
    assert [view.model_refusal("blocker", n) for n in ("h2", "a1", "x")] == [None, None, None]
    assert view.model_refusal("notifier", "h1") is None
    # A trusted recovered of that key lifts it; a tenant-wide recovered would not.
    state.apply_quota_event(over.model_copy(update={"event_id": "h100-r", "level": "recovered",
                                                    "used": Decimal(3), "limit": Decimal(3)}))
    assert view.model_refusal("blocker", "h1") is not None  # used 3 is not under 3: distrusted
    state.apply_quota_event(over.model_copy(update={"event_id": "h100-r2", "level": "recovered",
                                                    "used": Decimal("2.5"), "limit": Decimal(3)}))
    assert view.model_refusal("blocker", "h1") is None and state.blocked_models == {}


def test_a_pod_that_would_take_a_model_key_above_its_max_gpus_is_refused_on_that_models_nodes() -> None:
    """Contract 6 refuses a pod that *would* take its tenant above max_gpus; the per-model amendment
    the same for a key of max_gpus_by_model, on the nodes of the models that key owns only
    (FailedNodes), and everywhere (unresolvable) only when every node sent is of such a model."""
    from scheduler_hooks.extender.policy import PodRequest, Policy
    from scheduler_hooks.extender.wire_kube import handle_filter

    capped = TenantsFile(tenants=[TenantPolicy(tenant="capped", on_exceed="notify",
                                               max_gpus_by_model={"H100-": Decimal(4)})])
    state = HooksState(capped, clock=lambda: AT)
    for name, model in (("h1", "H100-SXM-80GB"), ("h2", "H100-PCIE-80GB"), ("a1", "A100-SXM-40GB")):
        node = watched_node({"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model}},
                             "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
        assert node is not None
        state.upsert_node(node)
    state.upsert_namespace("ml", "capped")
    state.upsert_pod(pod("running", "ml", "h1", 3))  # 3 H100 GPUs held; the A100 key has no limit
    policy = Policy(state.view)
    two, one = PodRequest("ml", "next", "u2", gpus=2), PodRequest("ml", "small", "u1", gpus=1)
    why = ("gpumeter: tenant capped over max_gpus quota: for H100- GPUs (node {} has {}): "
           "holds 3 GPUs, pod needs 2, limit 4")
    result = policy.filter(two, ["h1", "a1", "h2"])
    # 3 + 2 = 5 > 4 on both H100 models; the A100 node takes it.
    assert result.passed == ["a1"] and result.unresolvable == {}
    assert result.failed == {"h1": why.format("h1", "H100-SXM-80GB"),
                             "h2": why.format("h2", "H100-PCIE-80GB")}
    # 3 + 1 = 4: reaching the limit exactly is allowed, as for max_gpus.
    assert policy.filter(one, ["h1", "a1"]).passed == ["h1", "a1"]
    # Only H100 nodes sent: refused everywhere, preemption cannot help.
    only = policy.filter(two, ["h1", "h2"])
    assert only.passed == [] and only.failed == {} and sorted(only.unresolvable) == ["h1", "h2"]
    # The wire's encoded NodeNames path answers the same.
    document = {"Pod": {"metadata": {"name": "next", "namespace": "ml", "uid": "u2"},
                        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]}},
                "NodeNames": ["h1", "a1"]}
    answer = json.loads(handle_filter(document, policy))
    assert answer["NodeNames"] == ["a1"]
    assert answer["FailedNodes"] == {"h1": why.format("h1", "H100-SXM-80GB")}
    # Volcano: code 2 (another node may do) on an H100 node.
    assert policy.predicate(two, "h1") == (2, why.format("h1", "H100-SXM-80GB"))
    # The running pod finishing frees the key.
    state.delete_pod("running")
    assert policy.filter(two, ["h1"]).passed == ["h1"]


def test_a_tenant_under_its_per_model_max_gpus_keeps_the_fit_table_path() -> None:
    """The encoded NodeNames answer (the fit table alone) still serves a tenant with
    max_gpus_by_model while this pod would take no key above its limit."""
    from scheduler_hooks.extender.policy import PodRequest, Policy

    capped = TenantsFile(tenants=[TenantPolicy(tenant="capped", max_gpus_by_model={"H100-": Decimal(4)})])
    state = HooksState(capped, clock=lambda: AT)
    node = watched_node({"metadata": {"name": "h1", "labels": {"nvidia.com/gpu.product": "H100-SXM-80GB"}},
                         "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert node is not None
    state.upsert_node(node)
    state.upsert_namespace("ml", "capped")
    policy = Policy(state.view)
    assert policy.filter_table(PodRequest("ml", "p", "u", gpus=4)) is not None  # 0 + 4 = 4: allowed
    assert policy.filter_table(PodRequest("ml", "p", "u", gpus=5)) is None  # 0 + 5 > 4
