"""The explanation rule of `gpumeter explain pod` (gpumeter.app.explanation): facts in, document
and text out. Expected amounts are worked out by hand in each test from the numbers it sets."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.app.explanation import ExtenderAnswer, Facts, QuotaLine, explain, kind_of, render

URL = "http://127.0.0.1:8790"
END = datetime(2026, 12, 1, tzinfo=UTC)
QUOTA = "gpumeter: tenant team-a over gpu_hours quota"


def facts(**changes: Any) -> Facts:
    base: dict[str, Any] = dict(
        namespace="ml", name="trainer", gpus=4, phase="Pending", node=None, tenant="team-a",
        on_exceed="block", blocked=[], quotas=[], period_end=END, max_gpus=None, held=Decimal(0),
        extender=ExtenderAnswer(URL, passed=["n1"]),
    )
    base.update(changes)
    return Facts(**base)


@pytest.mark.parametrize(("reason", "kind"), [
    (QUOTA, "quota"),
    ("gpumeter: tenant team-a over max_gpus quota: for H100- GPUs (node h has H100-SXM-80GB)", "quota"),
    ("gpumeter: namespace ml has no valid tenant: its label ...", "quota"),
    ("gpumeter: capacity: node has 2 free GPUs, pod needs 4", "capacity"),
    ("gpumeter: topology: node has 2 whole free GPUs (4 in MIG mode), pod needs 4", "topology"),
    ("Insufficient cpu", "other"),
])
def test_each_extender_reason_names_its_kind(reason: str, kind: str) -> None:
    assert kind_of(reason) == kind


def test_a_tenant_over_its_gpu_hours_needs_more_than_the_overshoot_or_the_next_period() -> None:
    # limit 1000 = base 900 + grant 100; used 1012.5: over by 12.5 GPU-hours.
    line = QuotaLine("gpu_hours", "2026-11", Decimal("1012.5"), Decimal(1000), "exceeded",
                     grants=[("7", Decimal(100))])
    answer = ExtenderAnswer(URL, unresolvable={"n1": QUOTA, "n2": QUOTA})
    document = explain(facts(blocked=["gpu_hours"], quotas=[line], extender=answer))
    assert document["held_by"] == ["quota"]
    assert document["would_change"] == [
        "team-a is 12.500000 GPU-hours over its gpu_hours limit: a grant of more than that, "
        "or the period ending 2026-12-01T00:00:00Z"]
    assert document["quotas"] == [{"metric": "gpu_hours", "gpu_model": None, "period": "2026-11",
                                   "used": "1012.500000", "limit": "1000.000000",
                                   "grants": [{"grant": "7", "amount": "100.000000"}], "state": "exceeded"}]
    text = render(document)
    assert "gpu_hours 2026-11: used 1012.500000 / limit 1000.000000 (grants + 7 100.000000)  exceeded" in text
    assert "held by: quota" in text and f"  2 node(s): {QUOTA}" in text


def test_max_gpus_says_how_many_gpus_must_be_freed() -> None:
    # Holds 6, asks 4, limit 8: 6 + 4 - 8 = 2 must be freed.
    reason = "gpumeter: tenant team-a over max_gpus quota: holds 6 GPUs, pod needs 4, limit 8"
    document = explain(facts(max_gpus=Decimal(8), held=Decimal(6),
                             extender=ExtenderAnswer(URL, unresolvable={"n1": reason})))
    assert document["held_by"] == ["quota"]
    assert document["would_change"] == ["2 GPUs of team-a must be freed (holds 6, pod needs 4, max_gpus 8)"]
    # Reaching the limit exactly is allowed: holds 4, asks 4, limit 8 changes nothing.
    assert explain(facts(max_gpus=Decimal(8), held=Decimal(4)))["would_change"] == []


def test_capacity_names_the_nodes_that_came_closest() -> None:
    failed = {f"n{free}": f"gpumeter: capacity: node has {free} free GPUs, pod needs 4"
              for free in (0, 2, 3, 1)}
    document = explain(facts(extender=ExtenderAnswer(URL, failed=failed)))
    assert document["held_by"] == ["capacity"]
    assert document["would_change"] == [
        "capacity: 4 free GPUs on one node; closest: n3 (3 free), n2 (2 free), n1 (1 free)"]


def test_a_per_model_quota_on_some_nodes_and_capacity_on_the_others() -> None:
    # H100- key: holds 3, asks 4, limit 4: 3 + 4 - 4 = 3 GPUs on H100 nodes must be freed.
    h100 = "gpumeter: tenant team-a over max_gpus quota: for H100- GPUs (node h1 has H100-SXM-80GB): ..."
    short = "gpumeter: capacity: node has 1 free GPUs, pod needs 4"
    answer = ExtenderAnswer(URL, failed={"h1": h100, "a1": short})
    document = explain(facts(max_gpus_by_model={"H100-": Decimal(4)}, held_by_key={"H100-": Decimal(3)},
                             held=Decimal(3), extender=answer))
    assert document["held_by"] == ["quota", "capacity"]
    assert document["would_change"] == [
        "3 GPUs of team-a on H100- nodes must be freed (holds 3, pod needs 4, limit 4), or the pod placed on "
        "another model",
        "capacity: 4 free GPUs on one node; closest: a1 (1 free)"]


def test_a_pod_the_extender_passes_is_held_by_nothing_of_ours() -> None:
    document = explain(facts(extender=ExtenderAnswer(URL, passed=["n1", "n2"])))
    assert document["held_by"] == [] and document["would_change"] == []
    assert ("held by: nothing of gpumeter's: the extender passes it on 2 node(s) (if it is pending, "
            "kube-scheduler's own filters hold it)") in render(document)


def test_no_extender_answer_is_one_line_and_the_quota_part_still_stands() -> None:
    down = ExtenderAnswer(URL, error="connection refused")
    quiet = explain(facts(extender=down))
    assert quiet["held_by"] is None and quiet["extender"]["answered"] is False
    text = render(quiet)
    assert f"extender: no answer from {URL}: connection refused" in text.splitlines()
    # The quota state alone still says the quota refuses it (spend: 250.00 - 200.00 = 50.00 over).
    line = QuotaLine("spend", "2026-11", Decimal("250"), Decimal("200"), "exceeded")
    blocked = explain(facts(extender=down, blocked=["spend"], quotas=[line]))
    assert blocked["held_by"] == ["quota"]
    assert blocked["would_change"] == ["team-a is 50.00 over its spend limit: a grant of more than that, "
                                       "or the period ending 2026-12-01T00:00:00Z"]


def test_notify_never_holds_and_a_per_model_gpu_hours_key_is_not_lifted_by_grants() -> None:
    over = QuotaLine("gpu_hours", "2026-11", Decimal(11), Decimal(10), "exceeded")
    assert explain(facts(on_exceed="notify", quotas=[over], blocked=[]))["would_change"] == []
    key = QuotaLine("gpu_hours", "2026-11", Decimal(11), Decimal(10), "exceeded", gpu_model="H100-")
    reason = "gpumeter: tenant team-a over gpu_hours quota: for H100- GPUs (node h1 has H100-SXM-80GB)"
    document = explain(facts(quotas=[key], extender=ExtenderAnswer(URL, unresolvable={"h1": reason})))
    assert document["would_change"] == [
        "team-a is 1.000000 GPU-hours over its gpu_hours limit for H100- GPUs (grants raise "
        "tenant-wide limits only): that key's limit raised in the tenants file, the period ending "
        "2026-12-01T00:00:00Z, or the pod placed on another model"]


def test_a_namespace_without_a_valid_tenant_says_to_fix_its_label() -> None:
    reason = "gpumeter: namespace ml has no valid tenant: ..."
    answer = ExtenderAnswer(URL, unresolvable={"n": reason})
    document = explain(facts(tenant=None, on_exceed=None, extender=answer))
    assert document["held_by"] == ["quota"] and document["tenant"] is None
    assert document["would_change"][0].startswith("namespace ml: its label gpumeter.io/tenant must be")
