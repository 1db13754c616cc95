"""The extender over real HTTP (contract 6): every verb's wire answer, errors, TLS, metrics.

The server is the production aiohttp app and state on a free loopback port (testkit.live_hooks);
requests are JSON written by hand from the upstream Go types (kube-scheduler extender/v1 and
Volcano's extender plugin); expected answers are worked out by hand from the rules in
scheduler_hooks.cluster.placement / policy, not read back from the code.
"""

from __future__ import annotations

import functools
import http.client
import json
import ssl
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumeter.core.models import GpuAssignment, GpuDevice, NodeAllocation, NodeTopology, QuotaEvent
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from quota.periods import period_key
from scheduler_hooks.cluster.state import WatchedNode, WatchedPod, watched_namespace
from scheduler_hooks.extender.server import MAX_BODY_BYTES, server_ssl_context
from testkit.live_hooks import LiveHooks

pytestmark = pytest.mark.integration

AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
TENANTS = TenantsFile(
    tenants=[
        TenantPolicy(tenant="team-x", gpu_hours=Decimal(100), on_exceed="block"),
        TenantPolicy(tenant="team-p", spend=Decimal("10.00"), on_exceed="notify"),
        TenantPolicy(tenant="team-m", max_gpus=Decimal(4), on_exceed="preempt"),
    ]
)
BLOCKED_MESSAGE = "gpumeter: tenant team-x over gpu_hours quota"


def topology(node: str, count: int, link: Any) -> NodeTopology:
    gpus = [GpuDevice(index=i, uuid=f"GPU-{node}-{i}", model="M", numa_node=0) for i in range(count)]
    links = {f"{a}-{b}": link(a, b) for a in range(count) for b in range(a + 1, count)}
    return NodeTopology(cluster="c", node=node, gpus=gpus, links=links, at=AT)


def allocation(node: str, *indices: int) -> NodeAllocation:
    assignment = GpuAssignment(
        namespace="other", pod="holder", pod_uid=f"holder-{node}", gpu_indices=list(indices)
    )
    return NodeAllocation(cluster="c", node=node, assignments=[assignment], at=AT)


# This month: the hooks trust only a quota event of the current period (contract 4, "trust").
THIS_MONTH = period_key(datetime.now(UTC), "month")


def quota_event(tenant: str, metric: str, level: str, period: str = THIS_MONTH) -> QuotaEvent:
    return QuotaEvent(
        event_id=f"{tenant}-{metric}-{level}-{period}",
        tenant=tenant,
        metric=metric,
        level=level,
        threshold="1",
        used="101",
        limit="100",
        period=period,
        at=AT,
    )


def load(state: Any) -> None:
    """The cluster every test talks to (docstring of each test says what matters there)."""
    nv18 = lambda a, b: "NV18"  # noqa: E731
    l40s = lambda a, b: "PIX" if a // 2 == b // 2 else "SYS"  # noqa: E731
    state.apply_topology(topology("h100-a", 8, nv18))
    state.apply_allocation(allocation("h100-a", 0, 1, 2, 3, 4, 5))  # free: 6, 7 (NV18)
    state.apply_topology(topology("h100-b", 8, nv18))  # 8 free
    state.apply_topology(topology("l40s-a", 4, l40s))
    state.apply_allocation(allocation("l40s-a", 1, 3))  # free: 0, 2 (SYS)
    state.apply_topology(topology("l40s-b", 4, l40s))
    state.apply_allocation(allocation("l40s-b", 0, 1, 2))  # free: 3
    state.upsert_namespace("research", "team-x")
    state.upsert_namespace("finance", "team-p")
    state.apply_quota_event(quota_event("team-x", "gpu_hours", "exceeded"))
    state.apply_quota_event(quota_event("team-p", "spend", "exceeded"))
    state.upsert_node(WatchedNode("spot-1", "spot", 8))
    state.upsert_node(WatchedNode("od-1", None, 8))
    state.upsert_node(WatchedNode("od-2", None, 8))
    state.upsert_pod(WatchedPod("v-spot", "team-a", "w-spot", "spot-1", 1, priority=10))
    state.upsert_pod(WatchedPod("v-od", "team-a", "w-od", "od-1", 1, priority=5))
    # Protection counts in team-a: it is labelled gpumeter.io/protection-allowed: "true".
    state.upsert_namespace("team-a", "team-a", protection_allowed=True)
    state.upsert_pod(WatchedPod("v-prot", "team-a", "w-prot", "od-2", 1, asks_protection=True))
    state.upsert_pod(WatchedPod("m-held", "team-m", "held", "od-1", 3))  # team-m holds 3 of 4


@pytest.fixture
def hooks() -> Iterator[LiveHooks]:
    live = LiveHooks(TENANTS).start()
    live.call(lambda: load(live.state))
    yield live
    live.stop()


def pod(namespace: str = "team-a", gpus: int = 2, **meta: Any) -> dict[str, Any]:
    """A v1.Pod as kube-scheduler serialises it (json tags: lower-case keys)."""
    return {
        "metadata": {"name": "trainer", "namespace": namespace, "uid": "uid-trainer", **meta},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}},
                }
            ],
            "priority": 0,
        },
        "status": {"phase": "Pending"},
    }


def task(uid: str, namespace: str = "team-a", milli_gpus: int = 2000, **extra: Any) -> dict[str, Any]:
    """A Volcano TaskInfo as encoding/json writes it (no json tags: Go field names)."""
    return {
        "UID": uid,
        "Job": "job-1",
        "Name": f"{uid}-0",
        "Namespace": namespace,
        "Resreq": {"MilliCPU": 1000, "Memory": 0, "ScalarResources": {GPU: milli_gpus}},
        "NodeName": "",
        "Status": 1,
        "Priority": 0,
        **extra,
    }


NODES = ["h100-a", "l40s-a", "h100-b", "l40s-b", "mystery"]


# -- kube-scheduler --------------------------------------------------------------------------


def test_filter_node_names_mode(hooks: LiveHooks) -> None:
    status, answer = hooks.post_json("/kube/filter", {"Pod": pod(), "Nodes": None, "NodeNames": NODES})
    assert status == 200
    assert answer == {
        "Nodes": None,
        "NodeNames": ["h100-a", "l40s-a", "h100-b", "mystery"],
        "FailedNodes": {"l40s-b": "gpumeter: capacity: node has 1 free GPUs, pod needs 2"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_filter_full_nodes_mode_returns_the_passing_node_objects(hooks: LiveHooks) -> None:
    items = [
        {"metadata": {"name": name, "labels": {"x": name}}, "status": {}} for name in ("h100-b", "l40s-b")
    ]
    status, answer = hooks.post_json(
        "/kube/filter",
        {"Pod": pod(), "Nodes": {"metadata": {"resourceVersion": "7"}, "items": items}, "NodeNames": None},
    )
    assert status == 200
    assert answer["NodeNames"] is None
    assert answer["Nodes"] == {"metadata": {"resourceVersion": "7"}, "items": [items[0]]}
    assert answer["FailedNodes"] == {"l40s-b": "gpumeter: capacity: node has 1 free GPUs, pod needs 2"}


def test_filter_refuses_a_blocked_tenant_everywhere_unresolvably(hooks: LiveHooks) -> None:
    # "research" is labelled tenant team-x, exceeded on gpu_hours with on_exceed: block.
    status, answer = hooks.post_json("/kube/filter", {"Pod": pod("research"), "NodeNames": NODES})
    assert status == 200
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {}
    assert answer["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, BLOCKED_MESSAGE)


def test_filter_lets_a_notify_tenant_over_quota_through(hooks: LiveHooks) -> None:
    status, answer = hooks.post_json("/kube/filter", {"Pod": pod("finance"), "NodeNames": ["h100-b"]})
    assert (status, answer["NodeNames"], answer["FailedAndUnresolvableNodes"]) == (200, ["h100-b"], {})


def test_filter_refuses_a_pod_that_would_exceed_max_gpus(hooks: LiveHooks) -> None:
    # team-m holds 3 GPUs (a pod bound to od-1), limit 4: 3 + 2 > 4, while 3 + 1 fits.
    status, answer = hooks.post_json("/kube/filter", {"Pod": pod("team-m", gpus=2), "NodeNames": ["h100-b"]})
    assert status == 200
    message = answer["FailedAndUnresolvableNodes"]["h100-b"]
    assert message.startswith("gpumeter: tenant team-m over max_gpus quota") and "limit 4" in message
    status, answer = hooks.post_json("/kube/filter", {"Pod": pod("team-m", gpus=1), "NodeNames": ["h100-b"]})
    assert answer["NodeNames"] == ["h100-b"]


@pytest.mark.security
def test_a_namespace_whose_tenant_label_is_no_tenant_id_is_refused_never_folded(hooks: LiveHooks) -> None:
    """Issue 31, point 7: ``TEAM_B`` and ``Team.B`` were folded into ``team-b``: a namespace labelled
    either way got team-b's quota, and team-b's block or max_gpus did not stop it in the same way.
    Now each is no tenant: its GPU pods are refused naming the label, its CPU pods pass."""

    def labelled(name: str, value: str) -> None:
        watched = watched_namespace({"metadata": {"name": name, "labels": {"gpumeter.io/tenant": value}}})
        assert watched is not None
        hooks.state.upsert_watched_namespace(watched)

    for name, value in (("shouting", "TEAM_B"), ("dotted", "Team.B"), ("proper", "team-b")):
        hooks.call(functools.partial(labelled, name, value))
    for namespace in ("shouting", "dotted"):
        status, answer = hooks.post_json("/kube/filter", {"Pod": pod(namespace), "NodeNames": ["h100-b"]})
        assert status == 200 and answer["NodeNames"] == []
        message = answer["FailedAndUnresolvableNodes"]["h100-b"]
        assert message.startswith(f"gpumeter: namespace {namespace} has no valid tenant") and \
            "gpumeter.io/tenant" in message
        cpu_only = {"Pod": pod(namespace, gpus=0), "NodeNames": ["h100-b"]}
        assert hooks.post_json("/kube/filter", cpu_only)[1]["NodeNames"] == ["h100-b"]  # nothing to refuse
        job = {"UID": "j", "Namespace": namespace, "TotalRequest": {"ScalarResources": {GPU: 1000}}}
        assert hooks.post_json("/volcano/jobEnqueueable", {"job": job}) == (200, {"status": -1})
    status, answer = hooks.post_json("/kube/filter", {"Pod": pod("proper"), "NodeNames": ["h100-b"]})
    assert answer["NodeNames"] == ["h100-b"]


def test_filter_counts_a_pod_bound_since_the_agents_last_record(hooks: LiveHooks) -> None:
    # h100-b's record says 8 free; a 6-GPU pod bound there since leaves 2 for a 4-GPU pod.
    hooks.call(lambda: hooks.state.upsert_pod(WatchedPod("big", "team-a", "big", "h100-b", 6)))
    _, answer = hooks.post_json("/kube/filter", {"Pod": pod(gpus=4), "NodeNames": ["h100-b"]})
    assert answer["FailedNodes"] == {"h100-b": "gpumeter: capacity: node has 2 free GPUs, pod needs 4"}
    hooks.call(lambda: hooks.state.delete_pod("big"))
    _status, answer = hooks.post_json("/kube/filter", {"Pod": pod(gpus=4), "NodeNames": ["h100-b"]})
    assert answer["NodeNames"] == ["h100-b"]


def test_prioritize_prefers_a_free_nvlink_pair(hooks: LiveHooks) -> None:
    # Band rule (placement docstring), 2-GPU pod: h100-a's free pair is NV18 and fills the
    # node: 6 + round(4 x (1 + 2/2) / 2) = 10; h100-b, NV18 with 8 free:
    # 6 + round(4 x (1 + 2/8) / 2) = 9; l40s-a's free pair crosses sockets (SYS): 0; an unknown
    # node is neutral: 5. l40s-b (1 free) is not sent: the filter removed it.
    sent = ["h100-a", "l40s-a", "h100-b", "mystery"]
    status, answer = hooks.post_json("/kube/prioritize", {"Pod": pod(), "Nodes": None, "NodeNames": sent})
    assert status == 200
    assert answer == [
        {"Host": "h100-a", "Score": 10},
        {"Host": "l40s-a", "Score": 0},
        {"Host": "h100-b", "Score": 9},
        {"Host": "mystery", "Score": 5},
    ]


@pytest.mark.security
def test_preempt_keeps_only_spot_victims_and_never_a_protected_pod(hooks: LiveHooks) -> None:
    status, answer = hooks.post_json(
        "/kube/preempt",
        {
            "Pod": pod(),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "spot-1": {"Pods": [{"UID": "v-spot"}], "NumPDBViolations": 0},
                "od-1": {"Pods": [{"UID": "v-od"}], "NumPDBViolations": 1},
                "od-2": {"Pods": [{"UID": "v-prot"}], "NumPDBViolations": 0},
            },
        },
    )
    assert status == 200
    assert answer == {
        "NodeNameToMetaVictims": {"spot-1": {"Pods": [{"UID": "v-spot"}], "NumPDBViolations": 0}}
    }


def test_preempt_offers_every_unprotected_node_when_none_is_cheap(hooks: LiveHooks) -> None:
    _status, answer = hooks.post_json(
        "/kube/preempt",
        {
            "Pod": pod(),
            "NodeNameToMetaVictims": {
                "od-1": {"Pods": [{"UID": "v-od"}], "NumPDBViolations": 1},
                "od-2": {"Pods": [{"UID": "v-prot"}], "NumPDBViolations": 0},
            },
        },
    )
    assert answer == {"NodeNameToMetaVictims": {"od-1": {"Pods": [{"UID": "v-od"}], "NumPDBViolations": 1}}}


# -- Volcano ---------------------------------------------------------------------------------


def test_volcano_predicate(hooks: LiveHooks) -> None:
    assert hooks.post_json(
        "/volcano/predicate", {"task": task("t1", "research"), "node": {"Name": "h100-a"}}
    ) == (200, {"status": BLOCKED_MESSAGE, "code": 3})
    assert hooks.post_json("/volcano/predicate", {"task": task("t2"), "node": {"Name": "h100-a"}}) == (
        200,
        {"status": "", "code": 0},
    )
    assert hooks.post_json("/volcano/predicate", {"task": task("t3"), "node": {"Name": "l40s-b"}}) == (
        200,
        {"status": "gpumeter: capacity: node has 1 free GPUs, pod needs 2", "code": 2},
    )


def test_volcano_prioritize_scores_in_volcano_range(hooks: LiveHooks) -> None:
    status, answer = hooks.post_json(
        "/volcano/prioritize",
        {"task": task("t1"), "nodes": [{"Name": "h100-a"}, {"Name": "l40s-a"}, {"Name": "h100-b"}]},
    )
    assert (status, answer) == (
        200,
        {"nodeScore": {"h100-a": 100, "l40s-a": 0, "h100-b": 90}, "errorMessage": ""},
    )


def test_volcano_queue_and_job_verbs(hooks: LiveHooks) -> None:
    blocked_queue = {"UID": "q1", "Name": "gpumeter-team-x", "Weight": 1}
    assert hooks.post_json("/volcano/queueOverused", {"queue": blocked_queue}) == (200, {"overused": True})
    assert hooks.post_json("/volcano/queueOverused", {"queue": {"UID": "q2", "Name": "gpumeter-team-a"}}) == (
        200,
        {"overused": False},
    )
    job = {
        "UID": "j1",
        "Name": "train",
        "Namespace": "research",
        "Queue": "gpumeter-team-x",
        "MinAvailable": 1,
        "TotalRequest": {"MilliCPU": 0, "Memory": 0, "ScalarResources": {GPU: 4000}},
    }
    assert hooks.post_json("/volcano/jobEnqueueable", {"job": job}) == (200, {"status": -1})
    assert hooks.post_json("/volcano/jobEnqueueable", {"job": {**job, "Namespace": "team-a"}}) == (
        200,
        {"status": 0},
    )
    assert hooks.post_json("/volcano/jobReady", {"job": job}) == (200, {"status": True})


@pytest.mark.parametrize("verb", ["preemptable", "reclaimable"])
def test_volcano_victims_spot_first_protected_never_echoed_unchanged(hooks: LiveHooks, verb: str) -> None:
    # v-od (priority 5) is sent first, v-spot (priority 10, on a spot node) second: spot goes
    # first anyway; v-prot is protected. Victims come back as sent, floats included.
    od = task(
        "v-od", Priority=5, Resreq={"MilliCPU": 1500.5, "Memory": 2.5e9, "ScalarResources": {GPU: 1000}}
    )
    spot = task("v-spot", Priority=10)
    protected = task("v-prot")
    status, answer = hooks.post_json(
        f"/volcano/{verb}", {"evictor": task("t1"), "evictees": [od, spot, protected]}
    )
    assert status == 200
    assert answer == {"status": 1, "victims": [spot, od]}


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{", "not JSON"),
        (b"", "not JSON"),
        (b'{"Pod": NaN, "NodeNames": []}', "not JSON"),
        (b"\xff\xfe{}", "not UTF-8 JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b"[1, 2]", "ExtenderArgs must be a JSON object, got array"),
        (b'{"NodeNames": []}', "ExtenderArgs.Pod is missing"),
        (b'{"Pod": {}, "NodeNames": "h100-a"}', "NodeNames must be a JSON array, got string"),
        (
            b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}}',
            "is not a resource quantity",
        ),
    ],
    ids=["truncated", "empty", "nan", "not-utf8", "deep", "array", "no-pod", "names-string", "quantity"],
)
def test_malformed_requests_get_400_with_a_reason(hooks: LiveHooks, body: bytes, reason: str) -> None:
    status, answer = hooks.request("POST", "/kube/filter", body, {"Content-Type": "application/json"})
    assert status == 400
    assert reason in json.loads(answer)["error"]


def test_body_over_16_mib_is_413_and_16_mib_exactly_is_served(hooks: LiveHooks) -> None:
    head = json.dumps({"Pod": pod(), "NodeNames": ["h100-b"], "pad": ""}).encode()
    exact = head[:-2] + b"x" * (MAX_BODY_BYTES - len(head)) + head[-2:]
    assert len(exact) == MAX_BODY_BYTES
    status, answer = hooks.request("POST", "/kube/filter", exact)
    assert status == 200 and json.loads(answer)["NodeNames"] == ["h100-b"]
    status, answer = hooks.request("POST", "/kube/filter", exact + b" ")
    assert status == 413
    assert "exceeds 16 MiB" in json.loads(answer)["error"]


def test_chunked_body_over_16_mib_is_413(hooks: LiveHooks) -> None:
    # No Content-Length: the limit is enforced while reading.
    connection = http.client.HTTPConnection("127.0.0.1", hooks.port, timeout=30)
    chunks = (b"x" * (1 << 20) for _ in range(17))
    try:
        connection.request("POST", "/volcano/predicate", body=chunks, encode_chunked=True)
        response = connection.getresponse()
        status, answer = response.status, response.read()
    finally:
        connection.close()
    assert status == 413
    assert "exceeds 16 MiB" in json.loads(answer)["error"]


def test_unknown_route_404_and_wrong_method_405_are_json(hooks: LiveHooks) -> None:
    status, answer = hooks.request("POST", "/kube/bind", b"{}")
    assert (status, json.loads(answer)) == (404, {"error": "Not Found"})
    status, answer = hooks.request("GET", "/kube/filter")
    assert (status, json.loads(answer)) == (405, {"error": "Method Not Allowed"})


def test_verbs_answer_503_until_the_state_is_loaded() -> None:
    live = LiveHooks(TENANTS).start()
    try:
        live.call(lambda: live.state.expect("quota_events", "topology"))
        status, answer = live.request("GET", "/readyz")
        assert (status, json.loads(answer)) == (
            503,
            {"ready": False, "waiting_for": ["quota_events", "topology"]},
        )
        status, document = live.post_json("/kube/filter", {"Pod": pod(), "NodeNames": ["n"]})
        assert status == 503 and document["waiting_for"] == ["quota_events", "topology"]
        assert live.request("GET", "/healthz")[0] == 200  # alive all along

        def load_both() -> None:
            live.state.loaded("quota_events")
            live.state.loaded("topology")

        live.call(load_both)
        assert live.request("GET", "/readyz") == (200, b'{"ready":true}')
        assert live.post_json("/kube/filter", {"Pod": pod(), "NodeNames": ["n"]})[0] == 200
    finally:
        live.stop()


def test_metrics_count_requests_and_latency_per_verb(hooks: LiveHooks) -> None:
    for _ in range(2):
        hooks.post_json("/kube/filter", {"Pod": pod(), "NodeNames": ["h100-b"]})
    hooks.request("POST", "/kube/filter", b"{")
    hooks.post_json("/volcano/jobReady", {"job": {"UID": "j"}})
    status, body = hooks.request("GET", "/metrics")
    assert status == 200
    lines = set(body.decode().splitlines())
    assert 'gpumeter_hooks_requests_total{code="200",verb="kube.filter"} 2.0' in lines
    assert 'gpumeter_hooks_requests_total{code="400",verb="kube.filter"} 1.0' in lines
    assert 'gpumeter_hooks_requests_total{code="200",verb="volcano.jobReady"} 1.0' in lines
    assert 'gpumeter_hooks_request_seconds_count{verb="kube.filter"} 3.0' in lines
    assert "gpumeter_hooks_ready 1.0" in lines
    assert "gpumeter_hooks_blocked_tenants 1.0" in lines  # team-x; team-p is notify


# -- never a 500 -----------------------------------------------------------------------------

VALID: dict[str, Any] = {
    "/kube/filter": {"Pod": pod(), "Nodes": None, "NodeNames": NODES},
    "/kube/prioritize": {
        "Pod": pod(),
        "Nodes": {"items": [{"metadata": {"name": "h100-a"}}]},
        "NodeNames": None,
    },
    "/kube/preempt": {
        "Pod": pod(),
        "NodeNameToMetaVictims": {"spot-1": {"Pods": [{"UID": "v-spot"}]}},
        "NodeNameToVictims": {"od-1": {"Pods": [pod(uid="x")], "NumPDBViolations": 0}},
    },
    "/volcano/predicate": {"task": task("t", Pod=pod()), "node": {"Name": "h100-a"}},
    "/volcano/prioritize": {
        "task": task("t"),
        "nodes": [{"Name": "h100-a"}, {"Node": {"metadata": {"name": "x"}}}],
    },
    "/volcano/preemptable": {"evictor": task("t"), "evictees": [task("v-od"), task("v-spot")]},
    "/volcano/reclaimable": {"evictor": task("t"), "evictees": [task("v-od")]},
    "/volcano/queueOverused": {"queue": {"Name": "gpumeter-team-x", "Queue": {"name": "q"}}},
    "/volcano/jobEnqueueable": {
        "job": {
            "Namespace": "research",
            "Tasks": {"a": task("a")},
            "PodGroup": {"Spec": {"MinResources": {GPU: "2"}}},
        }
    },
    "/volcano/jobReady": {"job": {"UID": "j"}},
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


@pytest.fixture(scope="module")
def fuzz_hooks() -> Iterator[LiveHooks]:
    live = LiveHooks(TENANTS).start()
    live.call(lambda: load(live.state))
    yield live
    live.stop()


@pytest.mark.security
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(sorted(VALID)), choice=st.integers(0, 10_000), value=json_values)
def test_any_json_in_any_field_is_answered_200_or_400(
    fuzz_hooks: LiveHooks, route: str, choice: int, value: Any
) -> None:
    paths = _paths(VALID[route])
    document = _replaced(VALID[route], paths[choice % len(paths)], value)
    status, body = fuzz_hooks.request("POST", route, json.dumps(document).encode())
    assert status in (200, 400), (route, document, body)
    answer = json.loads(body)
    if status == 400:
        assert isinstance(answer["error"], str) and answer["error"]


# Numbers and shapes a JSON parser takes but the wire's Go types cannot hold: integers past 64
# bits (and past Python's 4,300-digit conversion limit), exponents past float64, deep nesting.
# And the same as strings, where a field is a resource quantity ("2", "2000m"): a quantity of a
# million digits once took minutes to round up to whole GPUs, or overflowed into a 500.
HUGE_QUANTITIES = ['"' + "9" * 100_000 + '"', '"' + "9" * 1_000_001 + '"', '"9' + "9" * 30 + 'Gi"',
                   '"' + "9" * 19 + '"', '"0.' + "1" * 5_000 + '"']
RAW_NUMBERS = st.sampled_from([
    "9" * 20, "-" + "9" * 20, "9" * 400, "9" * 4_301, "9" * 6_000, "1e400", "-1e400", "1e-400",
    "1.5E+999999", "0." + "1" * 2_000, "12345678901234567890123456789.5", "[" * 3_000 + "]" * 3_000,
    "1e300", *HUGE_QUANTITIES,
])
_RAW = "__raw_json__"


@pytest.mark.security
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(sorted(VALID)), choice=st.integers(0, 10_000), raw=RAW_NUMBERS)
def test_huge_numbers_and_deep_nesting_in_any_field_are_answered_200_or_400(
    fuzz_hooks: LiveHooks, route: str, choice: int, raw: str
) -> None:
    """Issue 31, point 6: such values in a pod spec answered 500 (contract 6: never for input)."""
    paths = _paths(VALID[route])
    document = _replaced(VALID[route], paths[choice % len(paths)], _RAW)
    body = json.dumps(document).replace(json.dumps(_RAW), raw).encode()
    status, answer = fuzz_hooks.request("POST", route, body)
    assert status in (200, 400), (route, paths[choice % len(paths)], raw[:40], answer[:300])
    if status == 400:
        assert isinstance(json.loads(answer)["error"], str)


# Every place a GPU quantity is read from a request, with each huge quantity: always answered,
# a quantity beyond 64 bits (or past 64 characters) is a 400 naming the field.
QUANTITY_PATHS = [
    ("/kube/filter", ("Pod", "spec", "containers", 0, "resources", "limits", GPU)),
    ("/kube/filter", ("Pod", "spec", "containers", 0, "resources", "requests", GPU)),
    ("/kube/preempt", ("NodeNameToVictims", "od-1", "Pods", 0, "spec", "containers", 0, "resources",
                       "limits", GPU)),
    ("/volcano/predicate", ("task", "Pod", "spec", "containers", 0, "resources", "limits", GPU)),
    ("/volcano/jobEnqueueable", ("job", "PodGroup", "Spec", "MinResources", GPU)),
]
HUGE = ["9" * 100_000, "9" * 1_000_001, "9" * 30 + "Gi", "1" + "0" * 19]
# Quantity strings where the wire has v1 quantities; JSON numbers in a Volcano Resource.
QUANTITY_CASES = [(route, path, json.dumps(raw)) for route, path in QUANTITY_PATHS for raw in HUGE] + [
    ("/volcano/prioritize", ("task", "Resreq", "ScalarResources", GPU), raw)
    for raw in ("1" + "0" * 19, "1e300")
]


@pytest.mark.parametrize(("route", "path", "value"), QUANTITY_CASES,
                         ids=[f"{route}-{path[-2]}-{len(value)}" for route, path, value in QUANTITY_CASES])
def test_a_gpu_quantity_beyond_64_bits_is_400_naming_the_field(
    fuzz_hooks: LiveHooks, route: str, path: tuple[Any, ...], value: str
) -> None:
    """Issue 31, point 6: "9" * 1,000,001 answered 500 (decimal.Overflow) and "9" * 100,000
    held the loop for a second (rounding it up to whole GPUs); "9" * 999,990 for minutes."""
    document = _replaced(VALID[route], path, _RAW)
    body = json.dumps(document).replace(json.dumps(_RAW), value).encode()
    status, answer = fuzz_hooks.request("POST", route, body)
    assert status == 400, answer[:300]
    reason = json.loads(answer)["error"]
    assert GPU in reason and str(path[-2]) in reason, reason


# -- TLS -------------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# A fresh unencrypted P-256 key, for the CA and every leaf.
NEW_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req",
        "-x509",
        *NEW_EC_KEY,
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions + "\n")
    _openssl(
        "req",
        *NEW_EC_KEY,
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        f"/CN={name}",
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("pki")
    server_ca, client_ca, other_ca = (
        _ca(directory, "server-ca"),
        _ca(directory, "client-ca"),
        _ca(directory, "other"),
    )
    return {
        "server_ca": server_ca,
        "client_ca": client_ca,
        "server": _leaf(
            directory, "server", server_ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"
        ),
        "scheduler": _leaf(directory, "scheduler", client_ca, "extendedKeyUsage=clientAuth"),
        "stranger": _leaf(directory, "stranger", other_ca, "extendedKeyUsage=clientAuth"),
    }


def _client_context(pki: dict[str, tuple[Path, Path]], identity: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["server_ca"][0]))  # verifies the server
    if identity is not None:
        context.load_cert_chain(*pki[identity])
    return context


def _tls_hooks(pki: dict[str, tuple[Path, Path]], require_client: bool) -> LiveHooks:
    context = server_ssl_context(*pki["server"], pki["client_ca"][0] if require_client else None)
    live = LiveHooks(TENANTS, ssl_context=context).start()
    live.call(lambda: load(live.state))
    return live


@pytest.mark.security
def test_tls_without_client_ca_serves_any_client(pki: dict[str, tuple[Path, Path]]) -> None:
    live = _tls_hooks(pki, require_client=False)
    try:
        assert live.url.startswith("https://")
        status, _ = live.request("GET", "/healthz", context=_client_context(pki, None))
        assert status == 200
        with pytest.raises(ssl.SSLError):  # plain HTTPS verification of the server still applies
            live.request("GET", "/healthz", context=ssl.create_default_context())
    finally:
        live.stop()


@pytest.mark.security
def test_tls_with_client_ca_requires_a_client_certificate_from_it(pki: dict[str, tuple[Path, Path]]) -> None:
    live = _tls_hooks(pki, require_client=True)
    try:
        body = json.dumps({"Pod": pod("research"), "NodeNames": ["h100-a"]}).encode()
        status, answer = live.request("POST", "/kube/filter", body, context=_client_context(pki, "scheduler"))
        assert status == 200
        assert json.loads(answer)["FailedAndUnresolvableNodes"] == {"h100-a": BLOCKED_MESSAGE}
        for identity in (None, "stranger"):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                live.request("POST", "/kube/filter", body, context=_client_context(pki, identity))
    finally:
        live.stop()


def test_tls_settings_are_checked() -> None:
    from gpumeter.core.config_files import ConfigError

    with pytest.raises(ConfigError, match="must be set together"):
        server_ssl_context(Path("cert.pem"), None, None)
    with pytest.raises(ConfigError, match=r"needs hooks\.tls_cert"):
        server_ssl_context(None, None, Path("ca.pem"))
    with pytest.raises(ConfigError, match="cannot load certificate"):
        server_ssl_context(Path("/nonexistent/cert.pem"), Path("/nonexistent/key.pem"), None)
