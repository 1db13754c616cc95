"""The quota actuator's decisions, pure and table-driven: pods read from API JSON, preemption
plans, replays, eviction answers, back-off, spot reclaim, Volcano queue desired state.

Pods are written as the API server sends them (camelCase JSON) and read with ``pod_view``,
so parsing is exercised with every case. Expected victims are worked out by hand from
contract 4's order (spot first, then lowest priority, then most recently started).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core.kube import EVICTION_NOTICE_ANNOTATION, NO_TENANT
from gpumeter.core.models import QuotaEvent
from gpumeter.core.tenants import TenantPolicy
from scheduler_hooks.actuator.backoff import backoff_seconds
from scheduler_hooks.actuator.kube_gateway import (
    classify_eviction,
    eviction_body,
    notice_patch,
    status_message,
    withdraw_patch,
)
from scheduler_hooks.actuator.offsets import OffsetTracker
from scheduler_hooks.actuator.plan import Recoveries, blocked_after, crossing_event, plan_preemption
from scheduler_hooks.actuator.reclaim import excludes_spot, node_allows, plan_spot_reclaim
from scheduler_hooks.actuator.records import pod_record, queue_record, record_id
from scheduler_hooks.actuator.tenants_source import TenantsSource
from scheduler_hooks.actuator.volcano_queues import blocked_on, gpu_capability, queue_manifest, spec_patch
from scheduler_hooks.cluster.kube_objects import (
    NodeView,
    Notice,
    PodView,
    Taint,
    namespace_labels,
    node_view,
    parse_notice,
    pod_view,
    tenants_of,
)

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
TENANT = "team-a"
EVENT_ID = "e" * 64


# -- builders ---------------------------------------------------------------------------------


def pod_json(
    name: str,
    gpus: int | str = 1,
    *,
    namespace: str = "ml",
    node: str | None = "gpu-0",
    phase: str = "Running",
    priority: int | None = None,
    started: str | None = "2026-11-20T08:00:00Z",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    deleting: bool = False,
    node_selector: dict[str, str] | None = None,
    affinity: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
    created: str = "2026-11-20T07:00:00Z",
) -> dict[str, Any]:
    resources = {
        "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
        "limits": {"nvidia.com/gpu": str(gpus)},
    }
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": resources}]}
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity}
            }
        }
    if tolerations:
        spec["tolerations"] = tolerations
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "creationTimestamp": created,
    }
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-20T11:59:00Z"
    status: dict[str, Any] = {"phase": phase}
    if started:
        status["startTime"] = started
    if unschedulable:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            }
        ]
    return {"metadata": metadata, "spec": spec, "status": status}


# A namespace where gpumeter.io/protected counts (contract 4, amendment "trust").
PROTECTION_ALLOWED = {"gpumeter.io/protection-allowed": "true"}
PROTECT = {"gpumeter.io/protected": "true"}


def pod(
    name: str,
    gpus: int | str = 1,
    *,
    tenant: str = TENANT,
    node_labels: dict[str, str] | None = None,
    namespace_labels: dict[str, str] | None = None,
    **kwargs: Any,
) -> PodView:
    return pod_view(pod_json(name, gpus, **kwargs), tenant, node_labels, namespace_labels)


def guarded(name: str, gpus: int | str = 1, **kwargs: Any) -> PodView:
    """Annotated protected in a namespace that allows it."""
    return pod(name, gpus, annotations=PROTECT, namespace_labels=PROTECTION_ALLOWED, **kwargs)


def noticed(
    cause: str, deadline: datetime = NOW + timedelta(seconds=10), metric: str = "gpu_hours"
) -> dict[str, str]:
    return {EVICTION_NOTICE_ANNOTATION: Notice(cause, "over quota", deadline, metric).to_annotation()}


def event(
    metric: str = "gpu_hours",
    level: str = "exceeded",
    limit: str = "100",
    used: str = "100",
    tenant: str = TENANT,
    event_id: str = EVENT_ID,
) -> QuotaEvent:
    return QuotaEvent(
        event_id=event_id,
        tenant=tenant,
        metric=metric,
        level=level,
        threshold="1",
        used=used,
        limit=limit,
        period="2026-11",
        at=NOW,
    )


def policy(on_exceed: str = "preempt", grace: int = 30, tenant: str = TENANT, **limits: str) -> TenantPolicy:
    return TenantPolicy.model_validate({"tenant": tenant, "on_exceed": on_exceed, "grace_seconds": grace,
                                        **limits})


def names(pods: Any) -> list[str]:
    return [p.name for p in pods]


# -- reading API objects ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "expected"),
    [
        pytest.param({"metadata": {"name": "team-b"}}, "team-b", id="name"),
        pytest.param(
            {"metadata": {"name": "ns-1", "labels": {"gpumeter.io/tenant": "team-a"}}}, "team-a", id="label"
        ),
        pytest.param(
            {"metadata": {"name": "ns-1", "labels": {"gpumeter.io/tenant": "Team_A.Prod"}}},
            NO_TENANT,
            id="label-no-tenant-id-is-no-tenant",
        ),
        pytest.param(
            {"metadata": {"name": "ns-1", "labels": {"gpumeter.io/tenant": "  "}}},
            NO_TENANT,
            id="blank-label-is-no-tenant",
        ),
    ],
)
def test_namespace_tenant(namespace: dict[str, Any], expected: str) -> None:
    assert tenants_of(namespace_labels([namespace])) == {namespace["metadata"]["name"]: expected}


@pytest.mark.parametrize(
    ("node_labels", "pod_labels", "pod_annotations", "expected"),
    [
        pytest.param({"gpumeter.io/capacity-type": "spot"}, {}, {}, "spot", id="spot-node"),
        pytest.param({"karpenter.sh/capacity-type": "spot"}, {}, {}, "spot", id="cloud-spot-node"),
        pytest.param(
            {"gpumeter.io/capacity-type": "on-demand"},
            {"gpumeter.io/capacity-type": "spot"},
            {},
            "spot",
            id="pod-volunteers-spot-on-on-demand-node",
        ),
        pytest.param(
            {"gpumeter.io/capacity-type": "reserved"},
            {},
            {"gpumeter.io/capacity-type": "spot"},
            "spot",
            id="annotation-volunteers-spot",
        ),
        pytest.param(
            {"gpumeter.io/capacity-type": "reserved"},
            {"gpumeter.io/capacity-type": "on-demand"},
            {},
            "reserved",
            id="node-type-wins-otherwise",
        ),
        pytest.param(
            {}, {"gpumeter.io/capacity-type": "reserved"}, {}, "reserved", id="declared-when-node-silent"
        ),
        pytest.param(None, {}, {}, "on-demand", id="nothing-known"),
    ],
)
def test_eviction_class(
    node_labels: dict[str, str] | None,
    pod_labels: dict[str, str],
    pod_annotations: dict[str, str],
    expected: str,
) -> None:
    view = pod("p", labels=pod_labels, annotations=pod_annotations, node_labels=node_labels)
    assert view.capacity_type == expected


def test_pod_view_reads_the_fields_decisions_use() -> None:
    raw = pod_json(
        "trainer",
        4,
        priority=7,
        started="2026-11-20T09:30:00Z",
        annotations={"gpumeter.io/protected": "True", **noticed("cause-1")},
        deleting=True,
    )
    view = pod_view(raw, TENANT, None, PROTECTION_ALLOWED)
    assert (view.namespace, view.name, view.uid, view.node, view.phase) == (
        "ml",
        "trainer",
        "uid-trainer",
        "gpu-0",
        "Running",
    )
    assert view.gpus == Decimal(4) and view.priority == 7
    assert view.started_at == datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
    assert view.protected and view.deleting and view.holds_gpus and not view.evictable
    assert view.notice is not None and view.notice.cause == "cause-1"
    assert view.notice_text == raw["metadata"]["annotations"][EVICTION_NOTICE_ANNOTATION]


@pytest.mark.parametrize(
    ("phase", "node", "gpus", "holds"),
    [
        pytest.param("Running", "gpu-0", 1, True, id="running"),
        # Bound, starting: the scheduler already counts its GPUs.
        pytest.param("Pending", "gpu-0", 1, True, id="pending-bound"),
        pytest.param("Pending", None, 1, False, id="pending-unbound"),  # unbound holds nothing
        pytest.param("Succeeded", "gpu-0", 1, False, id="succeeded"),
        pytest.param("Failed", "gpu-0", 1, False, id="failed"),
        pytest.param("Running", "gpu-0", 0, False, id="running-without-gpus"),
    ],
)
def test_which_pods_hold_gpus(phase: str, node: str | None, gpus: int, holds: bool) -> None:
    assert pod("p", gpus, phase=phase, node=node).holds_gpus is holds


def test_notice_round_trip_and_refusals() -> None:
    notice = Notice(
        "cause", "gpumeter: tenant team-a over spend quota", NOW, "spend", beneficiary="ml/waiting"
    )
    text = notice.to_annotation()
    assert parse_notice(text) == notice
    assert json.loads(text)["deadline"] == "2026-11-20T12:00:00.000Z"
    for bad in (
        "",
        "not json",
        "[]",
        '{"reason": "x", "deadline": "2026-11-20T12:00:00Z"}',
        '{"cause": "c", "reason": "x", "deadline": "yesterday"}',
        None,
    ):
        assert parse_notice(bad) is None, bad


# -- preemption plans ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quota_event", "tenant_policy"),
    [
        pytest.param(event(level="warning"), policy(), id="warning"),
        pytest.param(event(level="recovered"), policy(), id="recovered"),
        pytest.param(event(), policy("block"), id="block-only"),
        pytest.param(event(), policy("notify"), id="notify-only"),
        pytest.param(event(), None, id="tenant-without-policy"),
    ],
)
def test_no_plan_unless_exceeded_and_preempt(
    quota_event: QuotaEvent, tenant_policy: TenantPolicy | None
) -> None:
    assert plan_preemption(quota_event, tenant_policy, [pod("a")], NOW) is None


# gpu_hours and spend: every unprotected GPU pod of the tenant, in order.
EVERYONE = [
    pod("od-old", priority=0, started="2026-11-19T00:00:00Z"),
    pod("od-new", priority=0, started="2026-11-20T09:00:00Z"),
    pod("spot-high", priority=100, node_labels={"gpumeter.io/capacity-type": "spot"}),
    pod("low", priority=-5),
    guarded("guarded", priority=-100),
    # Annotated, but its namespace does not allow protection: the tenant's own say-so.
    pod("self-declared", priority=-50, annotations=PROTECT),
    pod("cpu-only", 0),
    pod("unbound", node=None, phase="Pending"),
    pod("done", phase="Succeeded"),
    pod("neighbour", tenant="team-b"),
]


@pytest.mark.parametrize("metric", ["gpu_hours", "spend"])
def test_period_budgets_evict_every_unprotected_gpu_pod_in_order(metric: str) -> None:
    plan = plan_preemption(event(metric), policy(grace=45), EVERYONE, NOW)
    assert plan is not None
    assert names(v.pod for v in plan.victims) == ["spot-high", "self-declared", "low", "od-new", "od-old"]
    assert names(plan.protected) == ["guarded"]
    for victim in plan.victims:
        assert not victim.resumed
        assert victim.notice.cause == EVENT_ID and victim.notice.metric == metric
        assert victim.notice.deadline == NOW + timedelta(seconds=45)
        assert victim.notice.reason.startswith(f"gpumeter: tenant {TENANT} over {metric} quota")


MAX_GPUS_CASES = [
    pytest.param(
        # held 2+2+4+1 = 9 > 8: the spot pod (1) alone brings it to 8.
        [
            pod("a", 2),
            pod("b", 2, priority=5),
            pod("c", 4, priority=9),
            pod("s", 1, labels={"gpumeter.io/capacity-type": "spot"}),
        ],
        "8",
        ["s"],
        [],
        id="one-pod-enough",
    ),
    pytest.param(
        # held 9, limit 4: s(1) -> 8, a(2, prio 0) -> 6, b(2, prio 5) -> 4.
        [
            pod("a", 2),
            pod("b", 2, priority=5),
            pod("c", 4, priority=9),
            pod("s", 1, labels={"gpumeter.io/capacity-type": "spot"}),
        ],
        "4",
        ["s", "a", "b"],
        [],
        id="stops-as-soon-as-within",
    ),
    pytest.param(
        # held 6, limit 3: the protected low-priority pod is skipped, then b(2) -> 4, c(1) -> 3.
        [
            guarded("p", 3, priority=-1),
            pod("b", 2),
            pod("c", 1, priority=1),
        ],
        "3",
        ["b", "c"],
        ["p"],
        id="protected-passed-over",
    ),
    pytest.param(
        # held 5, limit 1: everything unprotected goes and it is still not enough.
        [guarded("p", 4), pod("b", 1)],
        "1",
        ["b"],
        ["p"],
        id="protected-hold-the-rest",
    ),
    pytest.param(
        # The same pods, the annotation in a namespace that does not allow it: p goes first.
        [pod("p", 3, priority=-1, annotations=PROTECT), pod("b", 2), pod("c", 1, priority=1)],
        "3",
        ["p"],
        [],
        id="annotation-without-namespace-label-protects-nothing",
    ),
    pytest.param(
        # held 4 (the leaving pod's 2 count as gone already): 2 <= 2, nobody new.
        [pod("x", 2, annotations=noticed("other-cause")), pod("y", 2)],
        "2",
        [],
        [],
        id="pods-already-leaving-count-as-gone",
    ),
    pytest.param(
        [pod("x", 2, deleting=True), pod("y", 2), pod("z", 1, priority=3)],
        "1",
        ["y"],
        [],
        id="terminating-pods-not-chosen-again",
    ),
    pytest.param([pod("a", 2)], "2", [], [], id="at-the-limit-is-within"),
]


@pytest.mark.parametrize(("pods", "limit", "victims", "protected"), MAX_GPUS_CASES)
def test_max_gpus_evicts_until_within_limit(
    pods: list[PodView], limit: str, victims: list[str], protected: list[str]
) -> None:
    plan = plan_preemption(event("max_gpus", limit=limit), policy(max_gpus=limit), pods, NOW)
    assert plan is not None
    assert names(v.pod for v in plan.victims) == victims
    assert names(plan.protected) == protected


@pytest.mark.parametrize(
    ("claimed", "victims"),
    [
        # held 2+2+1 = 5, the policy's limit 4: the lowest-priority 1-GPU pod alone is enough.
        pytest.param("0", ["c"], id="event-claims-a-lower-limit"),
        pytest.param("100", ["c"], id="event-claims-a-higher-limit"),
    ],
)
def test_max_gpus_counts_against_the_policys_limit_not_the_events(claimed: str, victims: list[str]) -> None:
    pods = [pod("a", 2, priority=5), pod("b", 2, priority=3), pod("c", 1, priority=1)]
    plan = plan_preemption(event("max_gpus", limit=claimed), policy(max_gpus="4"), pods, NOW)
    assert plan is not None
    assert names(v.pod for v in plan.victims) == victims


def test_max_gpus_without_a_limit_in_the_file_evicts_nobody() -> None:
    assert plan_preemption(event("max_gpus", limit="0"), policy(), [pod("a", 2)], NOW) is None


def test_a_replay_resumes_its_own_notices_with_the_original_deadline() -> None:
    original = NOW - timedelta(seconds=5)
    pods = [
        pod("a", 2, annotations=noticed(EVENT_ID, deadline=original, metric="max_gpus")),
        pod("b", 2),
        pod("c", 2, priority=1),
    ]
    # held 6, limit 2: the first run chose a and b (a noticed, then a crash before b?): a resumes,
    # held without it is 4 > 2, so b (lower priority than c) is chosen fresh.
    plan = plan_preemption(event("max_gpus", limit="2"), policy(grace=60, max_gpus="2"), pods, NOW)
    assert plan is not None
    assert [(v.pod.name, v.resumed, v.notice.deadline) for v in plan.victims] == [
        ("a", True, original),
        ("b", False, NOW + timedelta(seconds=60)),
    ]


def test_a_replay_after_all_noticed_adds_nobody() -> None:
    pods = [pod("a", 2, annotations=noticed(EVENT_ID)), pod("b", 2, annotations=noticed(EVENT_ID))]
    plan = plan_preemption(event("gpu_hours"), policy(), pods, NOW)
    assert plan is not None
    assert [(v.pod.name, v.resumed) for v in plan.victims] == [("a", True), ("b", True)]


# -- events in a backlog, blocked state ---------------------------------------------------------


def test_a_recovered_cancels_its_exceeded_however_far_apart() -> None:
    recoveries = Recoveries()
    exceeded = event("gpu_hours", "exceeded", event_id="g-ex")
    other_metric = event("max_gpus", "exceeded", event_id="m-ex")
    other_tenant = event("gpu_hours", "exceeded", tenant="team-b", event_id="b-ex")
    last_month = event("gpu_hours", "exceeded", event_id="old-ex").model_copy(update={"period": "2026-10"})
    stream = [(exceeded, 0), (other_metric, 1), (other_tenant, 2), (last_month, 3)]
    # Far more unrelated events than one fetch (service.BATCH) between the crossing and its recovery.
    stream += [(event("spend", "warning", tenant=f"t-{i}", event_id=f"w-{i}"), 4 + i) for i in range(5000)]
    recovered = event("gpu_hours", "recovered", event_id="g-rec")
    stream.append((recovered, 6000))
    again = event("gpu_hours", "exceeded", event_id="g-ex-2")  # after the recovery: stands
    stream.append((again, 6001))
    for item, offset in stream:
        recoveries.observe(item, (0, offset))
    assert recoveries.read_to(0) == 6001 and recoveries.read_to(1) == -1
    assert recoveries.cancelled(exceeded, (0, 0))
    assert not recoveries.cancelled(again, (0, 6001))
    assert not recoveries.cancelled(other_metric, (0, 1))
    assert not recoveries.cancelled(other_tenant, (0, 2))
    assert not recoveries.cancelled(last_month, (0, 3))  # another period: not its recovery
    assert not recoveries.cancelled(exceeded, (1, 0))  # another partition: no order to compare
    assert not recoveries.cancelled(recovered, (0, 6000))


def test_recoveries_keep_the_latest_recovered_whatever_order_they_are_read_in() -> None:
    recoveries = Recoveries()
    exceeded = event("spend", "exceeded")
    # The read-ahead saw the recovery first; the consumer then reads the earlier events again.
    recoveries.observe(event("spend", "recovered", event_id="r"), (0, 900))
    recoveries.observe(exceeded, (0, 10))
    recoveries.observe(event("spend", "recovered", event_id="r-old"), (0, 5))
    assert recoveries.cancelled(exceeded, (0, 10))
    assert recoveries.read_to(0) == 900



BLOCKS_ON_SPEND = policy("block", spend="100")
PREEMPTS_ON_SPEND = policy("preempt", spend="100")

BLOCKED_CASES = [
    pytest.param({}, event("spend"), BLOCKS_ON_SPEND, {TENANT: {"spend"}}, id="block-blocks"),
    pytest.param({}, event("spend"), PREEMPTS_ON_SPEND, {TENANT: {"spend"}}, id="preempt-blocks"),
    pytest.param({}, event("spend"), policy("notify", spend="100"), {}, id="notify-does-not"),
    pytest.param({}, event("spend", "warning"), BLOCKS_ON_SPEND, {}, id="warning-does-not"),
    pytest.param(
        {TENANT: {"spend", "max_gpus"}},
        event("spend", "recovered", used="90"),
        BLOCKS_ON_SPEND,
        {TENANT: {"max_gpus"}},
        id="recovered-one-of-two",
    ),
    pytest.param({TENANT: {"spend"}}, event("spend", "recovered", used="90"), BLOCKS_ON_SPEND, {},
                 id="recovered-last"),
    pytest.param(
        {"team-b": {"gpu_hours"}},
        event("spend"),
        BLOCKS_ON_SPEND,
        {"team-b": {"gpu_hours"}, TENANT: {"spend"}},
        id="others-kept",
    ),
    pytest.param({}, event("spend", limit="50"), BLOCKS_ON_SPEND, {}, id="forged-exceeded-limit"),
    pytest.param({}, event("spend"), policy("block"), {}, id="exceeded-of-a-metric-without-limit"),
    pytest.param({}, event("spend"), None, {}, id="exceeded-of-a-tenant-not-in-file"),
    pytest.param(
        {TENANT: {"spend"}}, event("spend", "recovered", limit="500", used="90"), BLOCKS_ON_SPEND,
        {TENANT: {"spend"}}, id="forged-recovered-limit",
    ),
    pytest.param(
        {TENANT: {"spend"}}, event("spend", "recovered", used="120"), BLOCKS_ON_SPEND,
        {TENANT: {"spend"}}, id="recovered-still-over",
    ),
]


@pytest.mark.parametrize(("before", "quota_event", "tenant_policy", "after"), BLOCKED_CASES)
def test_blocked_after(
    before: dict[str, set[str]],
    quota_event: QuotaEvent,
    tenant_policy: TenantPolicy | None,
    after: dict[str, set[str]],
) -> None:
    start = {tenant: frozenset(metrics) for tenant, metrics in before.items()}
    result = blocked_after(start, quota_event, tenant_policy, NOW)
    assert {tenant: set(metrics) for tenant, metrics in result.items()} == after


# -- the Eviction API's answers -------------------------------------------------------------------

# As kube-apiserver words them (pkg/registry/core/pod/storage/eviction.go, apimachinery errors).
PDB_BODY = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget guard needs 2 healthy pods and has 2 currently",
                }
            ]
        },
        "code": 429,
    }
)
THROTTLED_BODY = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "Too many requests, please try again later.",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 1},
        "code": 429,
    }
)


@pytest.mark.parametrize(
    ("status", "body", "outcome"),
    [
        pytest.param(201, '{"kind":"Status","status":"Success","code":201}', "evicted", id="201-created"),
        pytest.param(200, "", "evicted", id="200-empty-body"),
        pytest.param(429, PDB_BODY, "pdb", id="429-disruption-budget"),
        pytest.param(429, PDB_BODY.encode(), "pdb", id="429-disruption-budget-as-bytes"),
        pytest.param(429, THROTTLED_BODY, "throttled", id="429-too-many-requests"),
        pytest.param(429, "not json", "throttled", id="429-body-not-json"),
        pytest.param(429, None, "throttled", id="429-without-body"),
        pytest.param(404, '{"reason":"NotFound"}', "gone", id="404-pod-gone"),
        pytest.param(
            409,
            '{"reason":"Conflict","message":"the UID in the precondition (a) does not match"}',
            "gone",
            id="409-uid-precondition-failed",
        ),
        pytest.param(
            500,
            '{"message":"This pod has more than one PodDisruptionBudget"}',
            "error",
            id="500-more-than-one-disruption-budget",
        ),
        pytest.param(0, "connection refused", "error", id="no-response"),
        pytest.param(403, '{"reason":"Forbidden"}', "error", id="403-forbidden"),
    ],
)
def test_classify_eviction(status: int, body: str | bytes | None, outcome: str) -> None:
    assert classify_eviction(status, body) == outcome


def test_status_message() -> None:
    assert status_message(PDB_BODY) == "Cannot evict pod as it would violate the pod's disruption budget."
    assert status_message("plain text\n") == "plain text"
    assert status_message(None) == ""


@pytest.mark.parametrize(
    ("attempt", "cap", "expected"),
    [
        pytest.param(0, 60, 1.0, id="first-attempt-waits-1s"),
        pytest.param(1, 60, 2.0, id="second-attempt-doubles"),
        pytest.param(2, 60, 4.0, id="third-attempt-doubles-again"),
        pytest.param(5, 60, 32.0, id="last-attempt-below-the-cap"),
        pytest.param(6, 60, 60.0, id="first-attempt-at-the-cap"),
        pytest.param(50, 60, 60.0, id="attempt-50-stays-at-the-cap"),
        pytest.param(5000, 60, 60.0, id="attempt-5000-stays-at-the-cap"),
        pytest.param(3, 2.5, 2.5, id="fractional-cap"),
    ],
)
def test_backoff_seconds(attempt: int, cap: float, expected: float) -> None:
    assert backoff_seconds(attempt, cap) == expected


def test_backoff_refuses_negative_attempts() -> None:
    with pytest.raises(ValueError, match="from 0"):
        backoff_seconds(-1, 10)


# -- API bodies and records -----------------------------------------------------------------------


def test_bodies() -> None:
    notice = Notice(EVENT_ID, "why", NOW, "spend")
    assert notice_patch("uid-1", notice) == {
        "metadata": {"uid": "uid-1", "annotations": {EVICTION_NOTICE_ANNOTATION: notice.to_annotation()}}
    }
    assert withdraw_patch("TEXT") == [
        {"op": "test", "path": "/metadata/annotations/gpumeter.io~1eviction-notice", "value": "TEXT"},
        {"op": "remove", "path": "/metadata/annotations/gpumeter.io~1eviction-notice"},
    ]
    assert eviction_body("ml", "p", "uid-1") == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p", "namespace": "ml"},
        "deleteOptions": {"preconditions": {"uid": "uid-1"}},
    }


def test_record_ids_are_deterministic_and_distinct() -> None:
    view = pod("a", 2)
    first = pod_record(EVENT_ID, "spend", view, "noticed", "one", NOW)
    again = pod_record(EVENT_ID, "spend", view, "noticed", "other detail", NOW + timedelta(hours=1))
    assert first.record_id == again.record_id == record_id(EVENT_ID, "uid-a", "noticed")
    distinct = {
        first.record_id,
        pod_record(EVENT_ID, "spend", view, "evicted", "", NOW).record_id,
        pod_record("other-event", "spend", view, "noticed", "", NOW).record_id,
        pod_record(EVENT_ID, "spend", pod("b"), "noticed", "", NOW).record_id,
        queue_record(EVENT_ID, "spend", TENANT, "gpumeter-team-a", "queue_closed", "", NOW).record_id,
    }
    assert len(distinct) == 5
    assert (first.tenant, first.namespace, first.pod, first.gpus, first.node) == (
        TENANT,
        "ml",
        "a",
        Decimal(2),
        "gpu-0",
    )


# -- spot reclaim -----------------------------------------------------------------------------------

ON_DEMAND_ONLY = {"gpumeter.io/capacity-type": "on-demand"}
SPOT_LABEL = {"gpumeter.io/capacity-type": "spot"}


def node(
    name: str,
    gpus: int = 4,
    labels: dict[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    unschedulable: bool = False,
) -> NodeView:
    return NodeView(
        name,
        Decimal(gpus),
        labels if labels is not None else {"gpumeter.io/capacity-type": "on-demand"},
        taints,
        unschedulable,
    )


def waiting(name: str, gpus: int = 2, **kwargs: Any) -> PodView:
    kwargs.setdefault("node_selector", ON_DEMAND_ONLY)
    return pod(name, gpus, node=None, phase="Pending", started=None, unschedulable=True, **kwargs)


def spot_pod(name: str, gpus: int = 1, node_name: str = "gpu-0", **kwargs: Any) -> PodView:
    return pod(name, gpus, node=node_name, labels=SPOT_LABEL, **kwargs)


def with_affinity(*terms: dict[str, Any]) -> PodView:
    """A waiting pod without node selector whose required node affinity is ``terms`` (ORed)."""
    return waiting("p", node_selector={}, affinity=list(terms))


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    """A node selector term of one match expression."""
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return {"matchExpressions": [requirement]}


@pytest.mark.parametrize(
    ("candidate", "target", "allowed"),
    [
        pytest.param(waiting("p"), node("n"), True, id="selector-matches"),
        pytest.param(waiting("p"), node("n", labels=SPOT_LABEL), False, id="selector-rejects"),
        pytest.param(waiting("p"), node("n", unschedulable=True), False, id="cordoned"),
        pytest.param(
            with_affinity(expression("zone", "In", "a", "b")),
            node("n", labels={"zone": "b"}),
            True,
            id="affinity-in",
        ),
        pytest.param(
            with_affinity(expression("zone", "NotIn", "b")),
            node("n", labels={"zone": "b"}),
            False,
            id="affinity-notin",
        ),
        pytest.param(
            with_affinity(
                expression("zone", "Exists"),
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
            ),
            node("n", labels={}),
            True,
            id="terms-are-ored",
        ),
        pytest.param(
            with_affinity(expression("gpus", "Gt", "4")),
            node("n", labels={"gpus": "8"}),
            True,
            id="affinity-gt",
        ),
        pytest.param(
            waiting("p", node_selector={}),
            node("n", taints=(Taint("dedicated", "ml", "NoSchedule"),)),
            False,
            id="untolerated-taint",
        ),
        pytest.param(
            waiting(
                "p",
                node_selector={},
                tolerations=[
                    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
                ],
            ),
            node("n", taints=(Taint("dedicated", "ml", "NoSchedule"),)),
            True,
            id="tolerated-taint",
        ),
        pytest.param(
            waiting("p", node_selector={}, tolerations=[{"operator": "Exists"}]),
            node("n", taints=(Taint("dedicated", "ml", "NoExecute"),)),
            True,
            id="tolerate-everything",
        ),
        pytest.param(
            waiting("p", node_selector={}),
            node("n", taints=(Taint("soft", "", "PreferNoSchedule"),)),
            True,
            id="prefer-no-schedule-does-not-block",
        ),
    ],
)
def test_node_allows(candidate: PodView, target: NodeView, allowed: bool) -> None:
    assert node_allows(candidate, target) is allowed


@pytest.mark.parametrize(
    ("candidate", "excludes"),
    [
        pytest.param(waiting("p"), True, id="selector-on-demand"),
        pytest.param(
            waiting("p", node_selector={"karpenter.sh/capacity-type": "on-demand"}), True, id="cloud-label"
        ),
        pytest.param(
            waiting("p", node_selector={"gpumeter.io/capacity-type": "spot"}), False, id="wants-spot"
        ),
        pytest.param(waiting("p", node_selector={}), False, id="no-constraint"),
        pytest.param(
            with_affinity(expression("gpumeter.io/capacity-type", "NotIn", "spot")), True, id="affinity-notin"
        ),
        pytest.param(
            with_affinity(expression("cloud.google.com/gke-spot", "DoesNotExist")),
            True,
            id="affinity-doesnotexist",
        ),
        pytest.param(
            with_affinity(
                expression("gpumeter.io/capacity-type", "In", "on-demand"), expression("zone", "In", "a")
            ),
            False,
            id="one-term-admits-spot",
        ),
    ],
)
def test_excludes_spot(candidate: PodView, excludes: bool) -> None:
    assert excludes_spot(candidate) is excludes


def plan_names(
    nodes: list[NodeView], pods: list[PodView], blocked: set[str] | None = None
) -> list[tuple[str, str, list[str]]]:
    return [
        (r.pending.name, r.node, names(r.victims)) for r in plan_spot_reclaim(nodes, pods, blocked or set())
    ]


def test_reclaim_frees_room_with_the_fewest_spot_pods() -> None:
    pods = [
        pod("busy-1", 1),
        pod("busy-2", 1),
        spot_pod("spot-old", 1, started="2026-11-19T00:00:00Z"),
        spot_pod("spot-new", 1, started="2026-11-20T10:00:00Z"),
        waiting("trainer", 1),
    ]
    # gpu-0: 4 GPUs all taken; one GPU missing; the most recently started spot pod goes.
    assert plan_names([node("gpu-0")], pods) == [("trainer", "gpu-0", ["spot-new"])]


@pytest.mark.security
def test_reclaim_takes_a_spot_pod_whose_namespace_does_not_allow_its_protection() -> None:
    pods = [spot_pod("s", 4, annotations=PROTECT), waiting("trainer", 2)]
    assert plan_names([node("gpu-0")], pods) == [("trainer", "gpu-0", ["s"])]


def test_reclaim_prefers_the_node_needing_fewest_victims() -> None:
    pods = [
        spot_pod("a1", 1, "gpu-a"),
        spot_pod("a2", 1, "gpu-a"),
        pod("a-busy", 2, node="gpu-a"),
        spot_pod("b1", 2, "gpu-b"),
        pod("b-busy", 2, node="gpu-b"),
        waiting("trainer", 2),
    ]
    assert plan_names([node("gpu-a"), node("gpu-b")], pods) == [("trainer", "gpu-b", ["b1"])]


@pytest.mark.parametrize(
    ("pods", "nodes", "blocked"),
    [
        pytest.param([pod("busy", 2), waiting("trainer", 2)], [node("gpu-0")], set(), id="room-already-free"),
        pytest.param(
            [pod("busy", 4), waiting("trainer", 2)], [node("gpu-0")], set(), id="no-spot-pods-to-take"
        ),
        pytest.param(
            [spot_pod("s", 4), waiting("trainer", 2, node_selector={})],
            [node("gpu-0")],
            set(),
            id="pending-pod-may-run-on-spot",
        ),
        pytest.param(
            [spot_pod("s", 4), waiting("trainer", 2)], [node("gpu-0")], {TENANT}, id="tenant-blocked"
        ),
        pytest.param(
            [
                spot_pod("s", 4),
                pod("trainer", 2, node=None, phase="Pending", started=None, node_selector=ON_DEMAND_ONLY),
            ],
            [node("gpu-0")],
            set(),
            id="scheduler-has-not-given-up",
        ),
        pytest.param(
            [spot_pod("s", 4, annotations=PROTECT, namespace_labels=PROTECTION_ALLOWED),
             waiting("trainer", 2)],
            [node("gpu-0")],
            set(),
            id="protected-spot-pod",
        ),
        pytest.param(
            [
                spot_pod("s", 4, annotations=noticed("spot-reclaim:uid-trainer", metric="")),
                waiting("trainer", 2),
            ],
            [node("gpu-0")],
            set(),
            id="room-already-being-freed",
        ),
        pytest.param(
            [spot_pod("s", 1), pod("busy", 3), waiting("trainer", 2)],
            [node("gpu-0")],
            set(),
            id="all-spot-pods-not-enough",
        ),
        pytest.param(
            [spot_pod("s", 4, node_name="spot-0"), waiting("trainer", 2)],
            [node("gpu-0", 0), node("spot-0", 4, labels=SPOT_LABEL)],
            set(),
            id="spot-node-not-eligible",
        ),
    ],
)
def test_no_reclaim(pods: list[PodView], nodes: list[NodeView], blocked: set[str]) -> None:
    assert plan_names(nodes, pods, blocked) == []


def test_two_pending_pods_never_count_the_same_room() -> None:
    pods = [
        spot_pod("s1", 2, priority=1),
        spot_pod("s2", 2, priority=2),
        waiting("first", 2, priority=10),
        waiting("second", 2, priority=5),
        waiting("third", 2, priority=1),
    ]
    # 4 GPUs, all spot: "first" takes s1 (lower priority), "second" takes s2, "third" finds nothing left.
    assert plan_names([node("gpu-0")], pods) == [("first", "gpu-0", ["s1"]), ("second", "gpu-0", ["s2"])]


def test_node_view_reads_allocatable_and_taints() -> None:
    view = node_view(
        {
            "metadata": {"name": "n", "labels": SPOT_LABEL},
            "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}], "unschedulable": True},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96"}},
        }
    )
    assert (view.name, view.gpus, view.capacity_type, view.taints, view.unschedulable) == (
        "n",
        Decimal(8),
        "spot",
        (Taint("k", "v", "NoSchedule"),),
        True,
    )


# -- Volcano queues ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_gpus", "expected"),
    [
        pytest.param(None, None, id="no-limit"),
        pytest.param("64", "64", id="whole-gpus"),
        pytest.param("100", "100", id="100-written-out-not-as-1E+2"),
        pytest.param("2.50", "2.5", id="trailing-fraction-zero-dropped"),
        pytest.param("0", "0", id="zero"),
    ],
)
def test_gpu_capability(max_gpus: str | None, expected: str | None) -> None:
    tenant_policy = TenantPolicy(tenant=TENANT, max_gpus=max_gpus)
    assert gpu_capability(tenant_policy) == expected


def test_queue_manifest_and_spec_patch() -> None:
    limited = TenantPolicy(tenant=TENANT, max_gpus="8")
    manifest = queue_manifest(TENANT, limited)
    assert manifest["metadata"] == {
        "name": "gpumeter-team-a",
        "labels": {"app.kubernetes.io/managed-by": "gpumeter", "gpumeter.io/tenant": TENANT},
    }
    assert manifest["spec"] == {"weight": 1, "reclaimable": True, "capability": {"nvidia.com/gpu": "8"}}
    assert spec_patch(manifest, limited) is None
    assert spec_patch({"spec": {"capability": {"nvidia.com/gpu": "8000m"}}}, limited) is None  # same quantity
    raised = TenantPolicy(tenant=TENANT, max_gpus="16")
    assert spec_patch(manifest, raised) == {"spec": {"capability": {"nvidia.com/gpu": "16"}}}
    assert spec_patch(manifest, TenantPolicy(tenant=TENANT)) == {
        "spec": {"capability": {"nvidia.com/gpu": None}}
    }
    assert spec_patch({"spec": {}}, TenantPolicy(tenant=TENANT)) is None


def test_blocked_on_reads_the_annotation() -> None:
    assert blocked_on({"metadata": {"annotations": {"gpumeter.io/blocked-on": "spend,gpu_hours"}}}) == {
        "spend",
        "gpu_hours",
    }
    assert blocked_on({"metadata": {}}) == frozenset()


# -- committing offsets of events handled out of order ----------------------------------------------


def test_offsets_commit_only_the_handled_prefix() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    done = {(p, o): tracker.add(p, o) for p, o in [("p0", 10), ("p0", 11), ("p0", 12), ("p1", 5)]}
    assert tracker.in_flight == 4
    assert tracker.committable() == {}
    done["p0", 11]()  # handled before 10: nothing can be committed on p0 yet
    done["p1", 5]()
    assert tracker.committable() == {"p1": 6}
    done["p0", 10]()
    assert tracker.committable() == {"p0": 12}  # 10 and 11 handled: next to read is 12
    assert tracker.committable() == {}  # once per advance
    done["p0", 12]()
    assert tracker.committable() == {"p0": 13}
    assert tracker.in_flight == 0


def test_handled_events_stop_counting_in_flight_before_they_are_committed() -> None:
    # The consumer waits while in_flight is at its limit and commits only between fetches: an
    # event handled but not yet committed must not hold that wait up, or a backlog of the
    # limit's size wedges the actuator for good.
    tracker: OffsetTracker[str] = OffsetTracker()
    marks = [tracker.add("p0", offset) for offset in range(3)]
    marks[0]()
    marks[1]()
    marks[1]()  # a second call changes nothing
    assert tracker.in_flight == 1
    tracker.add("p1", 0)
    tracker.forget({"p0"})
    assert tracker.in_flight == 1  # p1's event; p0's unhandled one went with its partition


def test_offsets_of_revoked_partitions_are_forgotten() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    tracker.add("p0", 1)
    mark = tracker.add("p1", 7)
    tracker.forget({"p0"})
    mark()
    assert tracker.committable() == {"p1": 8}
    assert tracker.in_flight == 0


# -- the tenants file, re-read when it changes -------------------------------------------------------


def test_a_tenants_file_that_does_not_parse_is_refused_and_the_last_good_one_stays(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  - {tenant: team-a, max_gpus: 8, on_exceed: preempt}\n")
    source = TenantsSource(path)
    assert source.current().policy("team-a") is not None
    path.write_text("tenants:\n  - {tenant: team-a, max_gpus: eight}\n")
    assert source.poll() is False
    assert source.current().policy("team-a").max_gpus == Decimal(8)  # type: ignore[union-attr]
    [message] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert str(path) in message and "max_gpus" in message
    path.write_text("tenants:\n  - {tenant: team-a, max_gpus: 16}\n  - {tenant: team-b}\n")
    assert source.poll() is True
    assert source.current().policy("team-a").max_gpus == Decimal(16)  # type: ignore[union-attr]
    assert source.poll() is False  # unchanged since


def on(model: str) -> dict[str, str]:
    return {"nvidia.com/gpu.product": model}


def test_a_model_budget_preempts_only_pods_on_that_model() -> None:
    rules = TenantPolicy.model_validate({
        "tenant": TENANT, "on_exceed": "preempt", "grace_seconds": 30,
        "gpu_hours_by_model": {"H100-": "10", "H100-PCIE-": "10"}, "max_gpus_by_model": {"A100-": "3"}})
    pods = [pod("h-sxm", 2, node="n1", node_labels=on("H100-SXM-80GB")),
            pod("h-pcie", 2, node="n2", node_labels=on("H100-PCIE-80GB")),  # the longer key owns it
            pod("a-1", 2, node="n3", node_labels=on("A100-SXM-40GB")),
            pod("a-2", 2, node="n3", node_labels=on("A100-SXM-40GB")),
            pod("unlabelled", 2, node="n4")]
    over = event("gpu_hours").model_copy(update={"gpu_model": "H100-"})
    plan = plan_preemption(over, rules, pods, NOW)
    assert plan is not None and names(v.pod for v in plan.victims) == ["h-sxm"]
    assert plan.victims[0].notice.metric == "gpu_hours:H100-"
    # A100-: 4 GPUs held, limit 3 -> one 2-GPU pod goes (4 - 2 = 2 <= 3).
    held = event("max_gpus", limit="3", used="4").model_copy(update={"gpu_model": "A100-"})
    plan = plan_preemption(held, rules, pods, NOW)
    assert plan is not None and len(plan.victims) == 1 and plan.victims[0].pod.name in ("a-1", "a-2")
    # A key the file does not have evicts nobody.
    assert plan_preemption(over.model_copy(update={"gpu_model": "L40S-"}), rules, pods, NOW) is None


def test_a_model_event_neither_blocks_the_tenant_nor_cancels_a_tenant_wide_one() -> None:
    rules = TenantPolicy.model_validate({"tenant": TENANT, "on_exceed": "preempt", "gpu_hours": "100",
                                         "gpu_hours_by_model": {"H100-": "10"}})
    model_over = event("gpu_hours", limit="10", used="10").model_copy(update={"gpu_model": "H100-"})
    assert blocked_after({}, model_over, rules, NOW) == {}
    recoveries = Recoveries()
    recoveries.observe(model_over.model_copy(update={"level": "recovered", "used": Decimal(9)}), (0, 5))
    assert not recoveries.cancelled(event("gpu_hours"), (0, 1))
    assert recoveries.cancelled(model_over, (0, 1))


@pytest.mark.parametrize(("level", "threshold", "model", "expected"), [
    ("warning", "0.8", None, ("QuotaWarning", "gpumeter: tenant team-a reached 80% of its gpu_hours quota: "
                                              "used 80 of 100 (period 2026-11)", True)),
    ("exceeded", "1", "H100-", ("QuotaExceeded", "gpumeter: tenant team-a over its gpu_hours quota for H100- "
                                                 "GPUs: used 80 of 100 (period 2026-11)", True)),
    ("recovered", "1", None, ("QuotaRecovered", "gpumeter: tenant team-a back under its gpu_hours quota: "
                                                "used 80 of 100 (period 2026-11)", False)),
])
def test_crossing_events_read_as_sentences(level: str, threshold: str, model: str | None,
                                           expected: tuple[str, str, bool]) -> None:
    crossing = event("gpu_hours", level=level, used="80").model_copy(
        update={"threshold": Decimal(threshold), "gpu_model": model})
    assert crossing_event(crossing) == expected


def device_pod(name: str, resource: str, count: str = "1", *,
               namespace_labels: dict[str, str] | None = None, **kwargs: Any) -> PodView:
    """A pod asking GPU devices by another name than nvidia.com/gpu (a MIG slice, a renamed
    time-sliced replica), as the device plugin's mixed strategy and renaming advertise them."""
    raw = pod_json(name, 0, **kwargs)
    raw["spec"]["containers"][0]["resources"] = {"requests": {resource: count}, "limits": {resource: count}}
    return pod_view(raw, TENANT, None, namespace_labels)


def test_a_pod_view_counts_mig_and_shared_devices_apart_from_whole_gpus() -> None:
    mig = device_pod("mig", "nvidia.com/mig-1g.10gb", "2")
    assert (mig.gpus, mig.other_gpu_devices) == (Decimal(0), Decimal(2))
    assert mig.holds_gpu_devices and not mig.holds_gpus  # no whole GPU taken on its node
    whole = pod("whole", 2)
    assert (whole.gpus, whole.other_gpu_devices) == (Decimal(2), Decimal(0))
    assert whole.holds_gpu_devices


@pytest.mark.parametrize("metric", ["gpu_hours", "spend"])
def test_period_budgets_evict_mig_and_shared_pods_too(metric: str) -> None:
    """The quota counts a MIG slice's and a shared replica's hours (contract 4), so a preempted
    tenant's such pods go as well, in the same order; a protected one is passed over."""
    pods = [
        pod("whole", 1, priority=5),
        device_pod("mig", "nvidia.com/mig-3g.40gb", priority=1),
        device_pod("shared", "nvidia.com/gpu.shared", priority=3),
        device_pod("mig-guarded", "nvidia.com/mig-1g.10gb", annotations=PROTECT,
                   namespace_labels=PROTECTION_ALLOWED),
        pod("cpu-only", 0),
    ]
    plan = plan_preemption(event(metric), policy(), pods, NOW)
    assert plan is not None
    assert names(v.pod for v in plan.victims) == ["mig", "shared", "whole"]  # lowest priority first
    assert names(plan.protected) == ["mig-guarded"]


def test_max_gpus_never_evicts_a_pod_that_frees_no_whole_gpu() -> None:
    # max_gpus counts nvidia.com/gpu (contract 6): held 2 + 2 = 4 > 3; the MIG pod, lowest in
    # priority, would free none of it, so the 2-GPU pod of lower priority goes.
    pods = [pod("a", 2, priority=5), pod("b", 2, priority=3),
            device_pod("mig", "nvidia.com/mig-1g.10gb", priority=0)]
    plan = plan_preemption(event("max_gpus", limit="3"), policy(max_gpus="3"), pods, NOW)
    assert plan is not None
    assert names(v.pod for v in plan.victims) == ["b"]
