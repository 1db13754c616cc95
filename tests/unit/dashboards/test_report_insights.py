"""The finance report's forecast, quota and idle-GPU sections: well-formed charts that carry the
inputs' figures, and one CSV per table holding exactly the rows shown."""

from __future__ import annotations

import csv
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from dashboards.finance_report import (
    DailySpend,
    InsightsView,
    forecast_svg,
    idle_svg,
    render,
    write_report,
)
from insights.forecast import Forecast
from insights.idle import IdleAdvice

AT = datetime(2026, 11, 20, 12, tzinfo=UTC)


def forecast(tenant: str, mtd: str, end: str, low: str, high: str, metric: str = "spend",
             limit: str | None = None) -> Forecast:
    return Forecast(tenant=tenant, metric=metric, period="2026-11", computed_at=AT,  # type: ignore[arg-type]
                    model="run-rate", reason="5.0 days of history", month_to_date=Decimal(mtd),
                    month_end=Decimal(end), month_end_low=Decimal(low), month_end_high=Decimal(high),
                    level=Decimal("0.8"), quota_period="month" if limit else "",
                    quota_limit=Decimal(limit) if limit else None, quota_used=Decimal(mtd) if limit else None,
                    exhaust_at=AT + timedelta(days=3) if limit else None, exhaust_probability=Decimal("0.9"))


def idle(tenant: str, pod: str, gpus: str, per_day: str) -> IdleAdvice:
    return IdleAdvice(advice_id=pod, tenant=tenant, cluster="c", node="n1", namespace=tenant, pod=pod,
                      pod_uid=pod, gpu_model="H100-SXM-80GB", mig_profile=None, capacity_type="on-demand",
                      gpus=Decimal(gpus), idle_since=AT - timedelta(hours=3), last_seen=AT,
                      idle_hours=Decimal("3.000000"), mean_utilization=Decimal("0.010000"),
                      max_utilization=Decimal("0.02"), threshold=Decimal("0.05"),
                      price_per_gpu_hour=Decimal("2.5"), cost_per_day=Decimal(per_day),
                      wasted_so_far=Decimal("15"), currency="USD", detected_at=AT)


VIEW = InsightsView(
    at=AT,
    forecasts=[forecast("team-a", "600.00", "1500.00", "1400.00", "1650.00", limit="20000.00"),
               forecast("<b>", "100.00", "250.00", "200.00", "300.00"),
               forecast("team-a", "240.000000", "600.000000", "560.000000", "640.000000",
                        metric="gpu_hours")],
    idle=[idle("team-a", "big", "2", "120.00"), idle("team-a", "small", "1", "60.00"),
          idle("team-b", "other", "1", "43.20")],
)
SPEND = [DailySpend(AT.date(), "team-a", Decimal("10.00"))]


def titles(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [el.text or "" for el in root.iter() if el.tag.endswith("title")]


def test_forecast_chart_has_a_bar_pair_and_a_whisker_per_tenant_spend_forecast() -> None:
    svg = forecast_svg(VIEW.forecasts)
    assert titles(svg) == ["<b> month to date: 100.00", "<b> forecast month end: 250.00 (run-rate)",
                           "team-a month to date: 600.00", "team-a forecast month end: 1,500.00 (run-rate)"]
    # The widest interval end (1650) spans the plot: 900 - 110 - 90 = 700 px from x=110.
    root = ET.fromstring(svg)
    whiskers = [el for el in root if el.tag.endswith("line") and el.get("stroke-width")]
    whisker_ends = [float(el.get("x2", "0")) for el in whiskers]
    assert max(whisker_ends) == 810.0


def test_idle_chart_sums_cost_per_day_per_tenant() -> None:
    assert titles(idle_svg(VIEW.idle)) == ["team-a: 2 pod(s), 3 GPU(s), 180.00 USD/day",
                                           "team-b: 1 pod(s), 1 GPU(s), 43.20 USD/day"]
    assert "no idle GPUs found" in idle_svg([])
    assert "no spend forecasts" in forecast_svg([])


def test_report_shows_the_sections_only_with_insights() -> None:
    plain = render(SPEND, [], "now")
    assert "Idle GPUs" not in plain and "Quota status" not in plain
    full = render(SPEND, [], "now", VIEW)
    for text in ("Forecast to month end", "Quota status", "Idle GPUs", "&lt;b&gt;", "180.00",
                 "quota_status.csv"):
        assert text in full
    assert "<b>" not in full.split("<body>")[1].replace("<b>gpumeter", "")  # tenant names are escaped


def test_every_table_is_written_as_csv_with_the_rows_shown(tmp_path: Path) -> None:
    report = write_report(tmp_path, SPEND, [], "now", VIEW)
    assert report.name == "finance-report.html" and report.exists()
    names = sorted(path.name for path in tmp_path.glob("*.csv"))
    assert names == ["daily_spend.csv", "forecasts.csv", "idle_by_tenant.csv", "idle_gpus.csv",
                     "invoices.csv", "quota_status.csv", "tenant_spend.csv"]
    with (tmp_path / "idle_by_tenant.csv").open() as handle:
        assert list(csv.reader(handle)) == [["tenant", "idle_pods", "idle_gpus", "cost_per_day", "currency"],
                                            ["team-a", "2", "3", "180.00", "USD"],
                                            ["team-b", "1", "1", "43.20", "USD"]]
    with (tmp_path / "quota_status.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[1][:6] == ["team-a", "spend", "month", "600.00", "20000.00", "3.0%"]
    assert rows[1][6] == "2026-11-23 12:00" and rows[1][9] == "90%"
