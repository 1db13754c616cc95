"""The offline finance report: one self-contained HTML file with charts, from ClickHouse.

No plotting library: the charts are plain SVG, so the file opens anywhere and diffs as text.
Figures are list spend (the streaming price, before tiers, commitments and credits) per
day and tenant from the hourly rollup, next to the invoice totals, which are the amounts
billed.
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")


@dataclass(frozen=True)
class DailySpend:
    day: date
    tenant: str
    list_cost: Decimal


def daily_spend(client: Any) -> list[DailySpend]:
    rows = client.query(
        "SELECT toDate(hour) AS day, tenant, sum(list_cost) FROM usage_hourly "
        "GROUP BY day, tenant ORDER BY day, tenant"
    ).result_rows
    return [DailySpend(day, str(tenant), Decimal(str(cost))) for day, tenant, cost in rows]


def stacked_bars_svg(spend: list[DailySpend], width: int = 900, height: int = 320) -> str:
    """Daily list spend, one bar per day stacked by tenant, with a legend and a y axis."""
    tenants = sorted({s.tenant for s in spend})
    days = sorted({s.day for s in spend})
    by_day: dict[date, dict[str, Decimal]] = defaultdict(dict)
    for item in spend:
        by_day[item.day][item.tenant] = item.list_cost
    peak = max((sum(v.values(), Decimal(0)) for v in by_day.values()), default=Decimal(1)) or Decimal(1)
    left, bottom, top = 70, 40, 20
    plot_w, plot_h = width - left - 150, height - bottom - top
    step = plot_w / max(len(days), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="daily list spend by tenant">',
             f'<text x="{left}" y="12" font-size="11" fill="#555">list spend per day (USD)</text>']
    for tick in range(5):
        value = peak * tick / 4
        y = top + plot_h - plot_h * tick / 4
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
                     f'{value:,.0f}</text>')
    for index, day in enumerate(days):
        x = left + index * step
        y = top + plot_h
        for position, tenant in enumerate(tenants):
            cost = by_day[day].get(tenant, Decimal(0))
            bar = float(cost / peak) * plot_h
            y -= bar
            colour = PALETTE[position % len(PALETTE)]
            parts.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(step - 2, 1):.1f}" '
                         f'height="{bar:.1f}" fill="{colour}"><title>{html.escape(tenant)} {day}: '
                         f'{cost:,.2f}</title></rect>')
        if len(days) <= 31 or index % max(1, len(days) // 15) == 0:
            parts.append(f'<text x="{x + step / 2:.1f}" y="{top + plot_h + 16}" font-size="10" '
                         f'text-anchor="middle">{day:%m-%d}</text>')
    for position, tenant in enumerate(tenants):
        y = top + 16 * position
        colour = PALETTE[position % len(PALETTE)]
        parts.append(f'<rect x="{left + plot_w + 16}" y="{y}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{left + plot_w + 34}" y="{y + 10}" font-size="12">'
                     f'{html.escape(tenant)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render(spend: list[DailySpend], invoices: list[dict[str, Any]], generated: str) -> str:
    """The report as HTML: the spend chart, list spend per tenant, and the invoices."""
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for item in spend:
        totals[item.tenant] += item.list_cost
    tenant_rows = "".join(
        f"<tr><td>{html.escape(t)}</td><td class=n>{totals[t]:,.2f}</td></tr>" for t in sorted(totals)
    )
    invoice_rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(doc[k]))}</td>" for k in ("tenant", "period", "status"))
        + "".join(f"<td class=n>{html.escape(str(doc[k]))}</td>"
                  for k in ("subtotal", "commitment_true_up", "credits", "total"))
        + "</tr>"
        for doc in sorted(invoices, key=lambda d: (d["period"], d["tenant"]))
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpumeter finance report</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 10px}}
td.n{{text-align:right;font-variant-numeric:tabular-nums}}</style>
</head><body>
<h1>gpumeter finance report</h1>
<p>Generated {html.escape(generated)}. List spend is the streaming price before tiers,
commitments and credits; invoice totals are what is billed.</p>
<h2>Daily list spend by tenant</h2>
{stacked_bars_svg(spend)}
<h2>List spend per tenant</h2>
<table><tr><th>tenant</th><th>list spend</th></tr>{tenant_rows}</table>
<h2>Invoices</h2>
<table><tr><th>tenant</th><th>period</th><th>status</th><th>subtotal</th><th>true-up</th><th>credits</th>
<th>total</th></tr>{invoice_rows}</table>
</body></html>
"""
