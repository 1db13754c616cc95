"""The report's Budgets section: well-formed SVG whose bars are the lines' figures, and the table
rows as finance reads them (values worked out by hand)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from decimal import Decimal

from dashboards.budget_report import budget_rows, budget_svg, report_moment
from dashboards.finance_report import render
from gpumeter.core.grants import Grant
from gpumeter.core.tenants import TenantPolicy
from quota.budget import budget_view

AT = datetime(2026, 11, 16, tzinfo=UTC)
POLICY = TenantPolicy.model_validate({"tenant": "team-a", "gpu_hours": "100",
                                      "gpu_hours_by_model": {"H100-SXM-80GB": "40"}})
GRANT = Grant.model_validate({"key": "#1", "metric": "gpu_hours", "amount": "50",
                              "effective_at": "2026-11-10T00:00:00Z"})
LINES = budget_view(POLICY, [GRANT], AT, {"gpu_hours": Decimal(90)}, {}, {"H100-SXM-80GB": Decimal(12)})


def test_bars_are_base_grants_and_used_on_one_scale() -> None:
    root = ET.fromstring(budget_svg(LINES, "gpu_hours"))
    bars = {el.find("{*}title").text: float(el.get("width", "nan"))  # type: ignore[union-attr]
            for el in root if el.tag.endswith("rect")}
    # The longest bar is team-a's limit 150 (100 base + 50 granted): widths in proportion.
    base, granted = bars["team-a base limit: 100.000000"], bars["team-a grants: 50.000000"]
    assert abs(granted / base - 0.5) < 0.01
    assert abs(bars["team-a used: 90.000000 of 150.000000"] / (base + granted) - 90 / 150) < 0.01
    assert abs(bars["team-a · H100-SXM-80GB used: 12.000000 of 40.000000"] / (base + granted)
               - 12 / 150) < 0.01
    assert "no list spend (USD) budgets" in budget_svg(LINES, "spend")


def test_rows_carry_limit_grants_used_and_runway() -> None:
    [tenant_wide, h100] = budget_rows(LINES)
    # 90 h in 360 h, 60 left: 240 h -> Nov 26 00:00
    assert tenant_wide[:13] == ("team-a", "gpu_hours", "all", "2026-11", "100.000000", "50.000000",
                                "150.000000", "90.000000", "60.000000", "60.0%", "240.0",
                                "2026-11-26 00:00", "run-rate: 240.0 h (at the current rate)")
    assert tenant_wide[13] == "#1 50.000000"
    # 12 h in 360 h, 28 left: 840 h, past the month
    assert h100[2] == "H100-SXM-80GB" and h100[10] == "" and h100[12].endswith("beyond the period "
                                                                              "(at the current rate)")
    page = render([], [], "now", budgets=LINES)
    assert '<table id="budgets">' in page and "team-a · H100-SXM-80GB" in page


def test_the_report_moment_is_within_the_month() -> None:
    latest = datetime(2026, 11, 1, 10, tzinfo=UTC)
    assert report_moment("2026-11", latest) == latest
    assert report_moment("2026-10", latest) == datetime(2026, 10, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert report_moment("2026-12", latest) == datetime(2026, 12, 1, tzinfo=UTC)
