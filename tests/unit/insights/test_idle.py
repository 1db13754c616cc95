"""Idle-GPU detection on seeded idle and busy pods: the exact list, the exact cost."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from insights.idle import GpuWindow, IdleRule, advice_id, find_idle, per_tenant

AT = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
TEN_MINUTES = timedelta(minutes=10)


def pod(name: str, utilizations: Sequence[str | None], *, tenant: str = "team-a", gpus: str = "2",
        model: str = "H100-SXM-80GB", mig: str | None = None, capacity: str = "on-demand",
        price: str = "2.50", multiplier: str = "1", end: datetime = AT,
        gaps_after: tuple[int, ...] = ()) -> list[GpuWindow]:
    """Consecutive 10-minute windows ending at ``end`` (``gaps_after``: a 20-minute hole after index i)."""
    starts = []
    start = end - TEN_MINUTES
    for index in reversed(range(len(utilizations))):
        starts.append(start)
        start -= TEN_MINUTES
        if index - 1 in gaps_after:
            start -= timedelta(minutes=20)
    starts.reverse()
    # list cost as rated_usage stores it: gpus x 1/6 h x price x multiplier at 18 places
    cost = (Decimal(gpus) * Decimal(price) * Decimal(multiplier) / 6).quantize(Decimal("1e-18"))
    return [
        GpuWindow(tenant=tenant, cluster="c1", node="node-1", namespace=tenant, pod=name,
                  pod_uid=f"uid-{name}",
                  gpu_model=model, mig_profile=mig, capacity_type=capacity, window_start=s,
                  window_end=s + TEN_MINUTES, quantity=Decimal(gpus),
                  utilization=None if u is None else Decimal(u), unit_price=Decimal(price),
                  capacity_multiplier=Decimal(multiplier), list_cost=cost)
        for s, u in zip(starts, utilizations, strict=True)
    ]


def test_an_idle_pod_is_reported_with_its_cost_per_day_and_waste() -> None:
    windows = pod("idle", ["0.01", "0.02", "0.03", "0.04", "0.00", "0.01", "0.02"])
    [advice] = find_idle(windows, AT)
    assert advice.pod == "idle" and advice.tenant == "team-a" and advice.gpus == Decimal(2)
    assert advice.idle_since == AT - 7 * TEN_MINUTES and advice.last_seen == AT
    assert advice.idle_hours == Decimal("1.166667")  # 70 minutes
    assert advice.cost_per_day == Decimal("120")  # 2 GPUs x 2.50 x 24
    assert advice.wasted_so_far == 7 * Decimal("0.833333333333333333")  # 7 windows x 2 x 2.50 / 6
    assert advice.mean_utilization == Decimal("0.018571")  # 0.13 / 7
    assert advice.max_utilization == Decimal("0.04")
    assert "120.00 USD/day" in advice.message and "advice only" in advice.message


def test_busy_short_stale_unknown_and_at_threshold_pods_are_not_reported() -> None:
    windows = [
        *pod("busy", ["0.60"] * 12),
        *pod("short", ["0.01"] * 5),  # 50 minutes < 1 hour
        *pod("stale", ["0.01"] * 12, end=AT - timedelta(hours=1)),
        *pod("no-telemetry", ["0.01"] * 9 + [None] + ["0.01"] * 3),  # the last 30 minutes only
        *pod("at-threshold", ["0.05"] * 12),  # not under 5 %
        *pod("was-busy", ["0.90"] * 6 + ["0.01"] * 5),
    ]
    assert find_idle(windows, AT) == []


def test_a_gap_in_reporting_ends_the_run() -> None:
    # 6 idle windows, a 20-minute hole, 5 idle windows: only the last 50 minutes count.
    windows = pod("gappy", ["0.01"] * 11, gaps_after=(5,))
    assert find_idle(windows, AT) == []
    assert [a.pod for a in find_idle(windows, AT, IdleRule(max_gap=timedelta(minutes=20)))] == ["gappy"]


def test_windows_after_the_evaluation_time_are_ignored() -> None:
    windows = pod("later-busy", ["0.01"] * 7 + ["0.95"] * 3, end=AT + 3 * TEN_MINUTES)
    [advice] = find_idle(windows, AT)
    assert advice.last_seen == AT and advice.idle_hours == Decimal("1.166667")


def test_list_price_includes_the_capacity_multiplier_and_mig_fractions() -> None:
    windows = pod("mig", ["0.00"] * 8, gpus="0.142857142857", model="A100-SXM-40GB", mig="1g.5gb",
                  capacity="spot", price="0.40", multiplier="0.35", tenant="team-b")
    [advice] = find_idle(windows, AT)
    assert advice.price_per_gpu_hour == Decimal("0.14")
    # 0.142857142857 x 0.14 x 24 = 0.47999999999952, kept at 12 places (half-up): 0.480000000000
    assert str(advice.cost_per_day) == "0.480000000000"
    assert advice.mig_profile == "1g.5gb" and advice.capacity_type == "spot"


def test_list_is_most_expensive_first_and_summed_per_tenant() -> None:
    windows = [
        *pod("small", ["0.0"] * 7, gpus="1", tenant="team-b"),
        *pod("big", ["0.0"] * 7, gpus="8"),
        *pod("cheap", ["0.0"] * 7, gpus="1", price="1.80", capacity="spot", multiplier="0.35"),
    ]
    advice = find_idle(windows, AT)
    assert [(a.pod, a.cost_per_day) for a in advice] == [
        ("big", Decimal(480)), ("small", Decimal(60)), ("cheap", Decimal("15.12"))]
    summary = per_tenant(advice)
    assert [(t.tenant, t.pods, t.gpus, t.cost_per_day) for t in summary] == [
        ("team-a", 2, Decimal(9), Decimal("495.12")), ("team-b", 1, Decimal(1), Decimal(60))]


def test_advice_ids_are_one_per_pod_and_stable_across_evaluations() -> None:
    windows = pod("idle", ["0.01"] * 12)
    [first] = find_idle(windows, AT - 2 * TEN_MINUTES)
    [second] = find_idle(windows, AT)
    assert first.advice_id == second.advice_id == advice_id("c1", "uid-idle")
    assert advice_id("c1", "uid-other") != first.advice_id
    document = second.to_document()
    assert document["cost_per_day"] == "120.000000000000"
    assert document["idle_since"] == "2026-11-10T10:00:00+00:00"


@pytest.mark.parametrize("bad", [
    pytest.param({"threshold": Decimal(0)}, id="zero threshold"),
    pytest.param({"threshold": Decimal("1.5")}, id="threshold above 1"),
    pytest.param({"sustain": timedelta(0)}, id="zero sustain"),
    pytest.param({"stale": timedelta(seconds=-1)}, id="negative stale"),
])
def test_rule_refuses_meaningless_settings(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        IdleRule(**bad)  # type: ignore[arg-type]


def test_a_pod_reported_one_sample_per_gpu_counts_all_its_gpus() -> None:
    """The agent sends one gpu sample per (pod, device) and window (collectors/agent/samples.py):
    a 2-GPU pod is two windows of quantity 1 each. Its advice names 2 GPUs, and the cost per day
    and the waste agree with each other."""
    windows = [*pod("pair", ["0.01"] * 7, gpus="1"), *pod("pair", ["0.02"] * 7, gpus="1")]
    [advice] = find_idle(windows, AT)
    assert advice.gpus == Decimal(2)
    assert advice.cost_per_day == Decimal("120")  # 2 GPUs x 2.50 x 24
    assert advice.wasted_so_far == 14 * Decimal("0.416666666666666667")  # 14 windows x 1 x 2.50 / 6
    assert advice.idle_hours == Decimal("1.166667")  # 70 minutes, not twice that
    assert advice.mean_utilization == Decimal("0.015")  # both GPUs' windows alike
