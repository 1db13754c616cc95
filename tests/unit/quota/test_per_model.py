"""Per-model limits (contract 4, amendment "per-model limits"): longest key match, one quota per
(metric, key), events carrying the key. Expected values by hand in the comments."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from gpumeter.core.tenants import TenantPolicy, model_key
from quota.accounting import TenantLedger, Usage, apply, blocked, blocked_models, reevaluate, status
from quota.trust import distrust
from tests.unit.quota.builders import policy, ts, usage

D = Decimal


def gpu(event_id: str, start: str, model: str, quantity: str = "1", pod_uid: str = "uid-1") -> Usage:
    return replace(usage(event_id, start, quantity=quantity, pod_uid=pod_uid), gpu_model=model)


@pytest.mark.parametrize(("model", "owner"), [
    ("H100-SXM-80GB", "H100-SXM-80GB"),  # exact key
    ("A100-SXM-80GB", "A100-SXM-"),  # the longer prefix wins over A100-
    ("A100-PCIE-40GB", "A100-"),
    ("L40S-48GB", None),  # no key: only tenant-wide limits count it
    ("H100-SXM-80GB-X", None),  # a key without a trailing '-' is a model, never a prefix
    (None, None),
])
def test_longest_key_wins(model: str | None, owner: str | None) -> None:
    keys = ("A100-", "A100-SXM-", "H100-SXM-80GB")
    assert model_key(keys, model) == owner


def test_a_model_budget_crosses_alone_and_its_event_names_the_key() -> None:
    rules = policy(gpu_hours="100", gpu_hours_by_model={"H100-": "3", "A100-": "10"})
    ledger = TenantLedger(tenant="team-a")
    # 2 H100-hours (pods 1, 2) and 5 A100-hours (pod 3): 2 < 3, 5 < 10, 7 < 100.
    ledger, events = apply(ledger, gpu("u1", "2026-11-05T00:00:00Z", "H100-SXM-80GB", "2", "p1"), rules,
                           ts("2026-11-05T01:00:00Z"))
    ledger, events = apply(ledger, gpu("u2", "2026-11-05T00:00:00Z", "A100-SXM-40GB", "5", "p3"), rules,
                           ts("2026-11-05T01:00:00Z"))
    assert events == []
    # 1 more H100-hour: 3 of 3, exceeded for H100- only.
    ledger, events = apply(ledger, gpu("u3", "2026-11-05T01:00:00Z", "H100-SXM-80GB", "1", "p1"), rules,
                           ts("2026-11-05T02:00:00Z"))
    assert [(e.metric, e.level, e.gpu_model, e.used, e.limit) for e in events] == [
        ("gpu_hours", "exceeded", "H100-", D("3.000000"), D("3.000000"))]
    assert blocked(ledger, rules) == [] and blocked_models(ledger, rules) == [("gpu_hours", "H100-")]
    # The status lists the key's use: H100 3 of 3, A100 5 of 10; tenant-wide 8 of 100.
    shown = {(m.metric, m.gpu_model): (m.used, m.limit, m.state)
             for m in status(ledger, rules, ts("2026-11-05T02:00:00Z"))}
    assert shown[("gpu_hours", None)] == (D(8), D(100), "ok")
    assert shown[("gpu_hours", "H100-")] == (D(3), D(3), "exceeded")
    assert shown[("gpu_hours", "A100-")] == (D(5), D(10), "ok")
    # A raised key recovers, under the key.
    raised = policy(gpu_hours="100", gpu_hours_by_model={"H100-": "4", "A100-": "10"})
    _, events = reevaluate(ledger, raised, ts("2026-11-05T02:00:00Z"))
    assert [(e.level, e.gpu_model, e.limit) for e in events] == [("recovered", "H100-", D("4.000000"))]


def test_per_model_ids_differ_from_tenant_wide_ones() -> None:
    rules = policy(gpu_hours="1", gpu_hours_by_model={"H100-": "1"})
    _, events = apply(TenantLedger(tenant="team-a"), gpu("u1", "2026-11-05T00:00:00Z", "H100-SXM-80GB"),
                      rules, ts("2026-11-05T01:00:00Z"))
    assert sorted((e.gpu_model or "", e.level) for e in events) == [("", "exceeded"), ("H100-", "exceeded")]
    assert len({e.event_id for e in events}) == 2


def test_max_gpus_by_model_counts_the_pods_held_on_that_model() -> None:
    rules = policy(max_gpus_by_model={"A100-": "4"})
    ledger = TenantLedger(tenant="team-a")
    # Pod 1: 3 A100 for one minute; pod 2: 2 H100 -> A100 held 3 of 4.
    ledger, events = apply(ledger, gpu("u1", "2026-11-05T00:00:00Z", "A100-SXM-40GB", "3", "p1"), rules,
                           ts("2026-11-05T01:00:00Z"))
    ledger, events = apply(ledger, gpu("u2", "2026-11-05T00:00:00Z", "H100-SXM-80GB", "2", "p2"), rules,
                           ts("2026-11-05T01:00:00Z"))
    assert events == []
    # Pod 3: 1 more A100 -> 4 of 4: exceeded.
    ledger, events = apply(ledger, gpu("u3", "2026-11-05T00:00:00Z", "A100-SXM-40GB", "1", "p3"), rules,
                           ts("2026-11-05T01:00:00Z"))
    assert [(e.metric, e.level, e.gpu_model, e.used) for e in events] == [
        ("max_gpus", "exceeded", "A100-", D(4))]


def test_a_new_period_recovers_a_model_budget() -> None:
    rules = policy(gpu_hours_by_model={"H100-": "1"})
    # 1 H100-hour on Nov 30 22:00-23:00: 1 of 1, exceeded; December starts from zero.
    ledger, events = apply(TenantLedger(tenant="team-a"), gpu("u1", "2026-11-30T22:00:00Z", "H100-SXM-80GB"),
                           rules, ts("2026-11-30T23:30:00Z"))
    assert [(e.level, e.period) for e in events] == [("exceeded", "2026-11")]
    _, events = reevaluate(ledger, rules, ts("2026-12-01T00:00:01Z"))
    assert [(e.level, e.period, e.gpu_model, e.used) for e in events] == [
        ("recovered", "2026-11", "H100-", D("1.000000"))]


def test_trust_checks_a_model_event_against_the_key_limit() -> None:
    rules: TenantPolicy = policy(gpu_hours="100", gpu_hours_by_model={"H100-": "3"})
    now = ts("2026-11-05T02:00:00Z")
    _, events = apply(TenantLedger(tenant="team-a"), gpu("u1", "2026-11-05T00:00:00Z", "H100-SXM-80GB", "3"),
                      rules, now)
    [event] = events
    assert distrust(event, rules, now) is None
    assert distrust(event.model_copy(update={"gpu_model": "A100-"}), rules, now) == "no_limit"
    assert distrust(event.model_copy(update={"limit": D(100)}), rules, now) == "limit_mismatch"


def test_bad_model_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="model key"):
        policy(gpu_hours_by_model={"H100 SXM": "1"})
    with pytest.raises(ValueError, match="max_gpus_by_model"):
        policy(max_gpus_by_model={"A100-": "-1"})
