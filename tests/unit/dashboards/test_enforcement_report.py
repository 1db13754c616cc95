"""The report's enforcement section from a given series: every mark drawn, the table's figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from dashboards.enforcement_report import Mark, QuotaSeries, enforcement_html, enforcement_rows, series_svg

T0 = datetime(2026, 10, 30, tzinfo=UTC)


def series() -> QuotaSeries:
    one = QuotaSeries("team-a", "gpu_hours", Decimal(100), "preempt", "month")
    one.points = [(T0 + timedelta(hours=h), Decimal(12) * h) for h in range(1, 11)]
    one.marks = [Mark(T0 + timedelta(hours=9), "crossing", "exceeded: 108 of 100"),
                 Mark(T0 + timedelta(hours=9, minutes=10), "refusal", "over gpu_hours quota"),
                 Mark(T0 + timedelta(hours=10), "eviction", "evicted train-1"),
                 Mark(T0 + timedelta(hours=10), "eviction", "evicted train-2")]
    one.worst_over, one.bound = Decimal(20), Decimal("45.5")
    return one


def test_every_crossing_refusal_and_eviction_is_drawn_with_its_detail() -> None:
    svg = series_svg(series())
    assert svg.startswith("<svg") and svg.count("<line") == 1 + 4  # the limit, then one per mark
    for detail in ("exceeded: 108 of 100", "over gpu_hours quota", "evicted train-1", "evicted train-2"):
        assert detail in svg
    assert "<h3>team-a: gpu_hours (preempt)</h3>" in enforcement_html([series()])


def test_the_table_counts_marks_and_states_the_overshoot() -> None:
    assert enforcement_rows([series()]) == [
        ("team-a", "gpu_hours", "preempt", "100", "20.00", "45.50", "1", "1", "2")]
    empty = QuotaSeries("team-b", "max_gpus", Decimal(12), "block", "day")
    assert series_svg(empty) == ""
    assert enforcement_rows([empty]) == [("team-b", "max_gpus", "block", "12", "0.00", "", "0", "0", "0")]
