"""Pod metadata rules: tenant, capacity type, priority, effective requests, PVC sizes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from collectors.agent.podmeta import (
    StaticPodMetadata,
    claim_info,
    effective_requests,
    pod_info,
)
from testkit.cluster_state import pod, pvc

pytestmark = pytest.mark.agent


def test_tenant_from_namespace_label_else_namespace() -> None:
    p = pod("ml-research", "a", "u1")
    assert pod_info(p, {"gpumeter.io/tenant": "team-a"}).tenant == "team-a"
    assert pod_info(p, {}).tenant == "ml-research"
    assert pod_info(p, {"gpumeter.io/tenant": "Team_A"}).tenant is None  # no tenant id: never folded


def test_capacity_type_node_label_wins_over_pod() -> None:
    spot_pod = pod("t", "a", "u", labels={"gpumeter.io/capacity-type": "spot"})
    assert pod_info(spot_pod, {}, {"gpumeter.io/capacity-type": "reserved"}).capacity_type == "reserved"
    assert pod_info(spot_pod, {}, {}).capacity_type == "spot"
    annotated = pod("t", "a", "u", annotations={"gpumeter.io/capacity-type": "reserved"})
    assert pod_info(annotated, {}, None).capacity_type == "reserved"
    assert pod_info(pod("t", "a", "u"), {}, {"karpenter.sh/capacity-type": "spot"}).capacity_type == "spot"
    assert pod_info(pod("t", "a", "u"), {}, {"cloud.google.com/gke-spot": "true"}).capacity_type == "spot"
    bogus = pod("t", "a", "u", labels={"gpumeter.io/capacity-type": "free"})
    assert pod_info(bogus, {}, {}).capacity_type == "on-demand"


def test_priority_start_time_phase_and_claims() -> None:
    info = pod_info(pod("t", "a", "u", priority=1000, claims=("data", "ckpt"), phase="Pending"))
    assert info.priority == 1000 and info.phase == "Pending"
    assert info.start_time == datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
    assert info.pvc_claims == ("data", "ckpt")
    assert pod_info(pod("t", "a", "u")).priority == 0


def test_effective_requests_follow_the_scheduler() -> None:
    spec = pod("t", "a", "u", cpu="2", memory="4Gi")["spec"]
    spec["containers"].append({"name": "b", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}})
    spec["initContainers"] = [
        {"name": "setup", "resources": {"requests": {"cpu": "8", "memory": "1Gi"}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
    ]
    spec["overhead"] = {"cpu": "100m"}
    requests = effective_requests(spec)
    assert requests.cpu_cores == Decimal("8.1")  # the big init container dominates, plus overhead
    assert requests.memory_bytes == 5 * 1024**3  # 4Gi + 1Gi (limit defaults request)


def test_claim_size_prefers_status_capacity() -> None:
    assert claim_info(pvc("t", "c", "uid-1", "100Gi", request="50Gi")).capacity_bytes == 100 * 1024**3  # type: ignore[union-attr]
    assert claim_info(pvc("t", "c", "uid-1", None, request="50Gi")).capacity_bytes == 50 * 1024**3  # type: ignore[union-attr]
    static = StaticPodMetadata([pod("t", "a", "u")], claims=[pvc("t", "c", "uid-1", "1Ti")])
    assert static.claim("t", "c") is not None and static.claim("t", "missing") is None
