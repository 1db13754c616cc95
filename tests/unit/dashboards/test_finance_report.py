"""The offline finance report renders valid SVG inside HTML, and its figures are the inputs'."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import date
from decimal import Decimal

from dashboards.finance_report import DailySpend, render, stacked_bars_svg

SPEND = [
    DailySpend(date(2026, 11, 1), "team-a", Decimal("120.50")),
    DailySpend(date(2026, 11, 1), "team-b", Decimal("79.50")),
    DailySpend(date(2026, 11, 2), "team-a", Decimal("10.00")),
    DailySpend(date(2026, 11, 2), "<script>", Decimal("1.00")),
]


def test_chart_is_well_formed_svg_with_one_bar_segment_per_day_and_tenant() -> None:
    root = ET.fromstring(stacked_bars_svg(SPEND))
    bars = [el for el in root if el.tag.endswith("rect") and el.find("{*}title") is not None]
    assert len(bars) == 2 * 3  # two days x three tenants (absent ones drawn at zero height)
    heights = {}
    for el in bars:
        title = el.find("{*}title")
        assert title is not None and title.text is not None
        heights[title.text] = float(el.get("height", "nan"))
    # The tallest day (200.00) fills the plot; team-a on day 1 is 120.50 / 200 of it.
    day_one = heights["team-a 2026-11-01: 120.50"] + heights["team-b 2026-11-01: 79.50"]
    assert abs(heights["team-a 2026-11-01: 120.50"] / day_one - 120.5 / 200) < 0.01


def test_report_totals_per_tenant_and_escapes_names() -> None:
    invoice = {"tenant": "team-a", "period": "2026-11", "status": "draft", "subtotal": "130.50",
               "commitment_true_up": "0.00", "credits": "0.00", "total": "130.50"}
    page = render(SPEND, [invoice], "now")
    assert "<td>team-a</td><td class=n>130.50</td>" in page  # 120.50 + 10.00
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<td class=n>130.50</td></tr>" in page
