"""The offline finance report: one self-contained HTML file with charts, from ClickHouse.

No plotting library: the charts are plain SVG, so the file opens anywhere and diffs as text.
Figures are list spend (the streaming price, before tiers, commitments and credits) per
day and tenant from the hourly rollup, next to the invoice totals, which are the amounts
billed. With insights (dashboards/insights_job.py) the report adds the month-end forecasts,
quota status and idle-GPU costs, each with a chart; with budgets (dashboards/budget_report.py)
each tenant's limit, grants, used and runway per metric and GPU model, as bars and a table;
:func:`write_report` also writes every
table of the report as a CSV file beside it.
"""

from __future__ import annotations

import csv
import html
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from dashboards.budget_report import BUDGET_HEADER, budget_rows, budget_svg
from dashboards.enforcement_report import (
    ENFORCEMENT_HEADER,
    QuotaSeries,
    enforcement_html,
    enforcement_rows,
)
from dashboards.svg import empty_svg
from gpumeter.core.money import format_money
from insights.forecast import Forecast
from insights.idle import IdleAdvice, per_tenant
from quota.budget import BudgetLine

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


@dataclass(frozen=True)
class ReportTable:
    """One table of the report: shown in the HTML and written as ``<name>.csv``."""

    name: str
    title: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    numeric: frozenset[int] = field(default_factory=frozenset)

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td class=n>{html.escape(v)}</td>" if i in self.numeric
                             else f"<td>{html.escape(v)}</td>" for i, v in enumerate(row)) + "</tr>"
            for row in self.rows)
        if not self.rows:
            body = f"<tr><td colspan={len(self.header)}>none</td></tr>"
        return (f"<table id=\"{self.name}\"><tr>{head}</tr>{body}</table>"
                f"<p class=csv><a href=\"{self.name}.csv\">{self.name}.csv</a></p>")


@dataclass(frozen=True)
class InsightsView:
    at: datetime
    forecasts: Sequence[Forecast] = ()
    idle: Sequence[IdleAdvice] = ()


def _when(moment: datetime | None) -> str:
    return "" if moment is None else f"{moment:%Y-%m-%d %H:%M}"


INVOICE_FIELDS = ("tenant", "period", "status", "subtotal", "commitment_true_up", "credits", "total")


def base_tables(spend: list[DailySpend], invoices: list[dict[str, Any]]) -> list[ReportTable]:
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for item in spend:
        totals[item.tenant] += item.list_cost
    return [
        ReportTable("daily_spend", "Daily list spend by tenant", ("day", "tenant", "list_spend"),
                    [(f"{s.day}", s.tenant, f"{s.list_cost:.2f}") for s in spend], frozenset({2})),
        ReportTable("tenant_spend", "List spend per tenant", ("tenant", "list_spend"),
                    [(t, f"{totals[t]:,.2f}") for t in sorted(totals)], frozenset({1})),
        ReportTable("invoices", "Invoices",
                    ("tenant", "period", "status", "subtotal", "true_up", "credits", "total"),
                    [tuple(str(doc[k]) for k in INVOICE_FIELDS)
                     for doc in sorted(invoices, key=lambda d: (d["period"], d["tenant"]))],
                    frozenset({3, 4, 5, 6})),
    ]


def insight_tables(view: InsightsView) -> list[ReportTable]:
    forecasts = sorted(view.forecasts, key=lambda f: (f.tenant, f.metric))
    quotas = [f for f in forecasts if f.quota_limit is not None]
    return [
        ReportTable("forecasts", f"Forecast to month end (as of {_when(view.at)} UTC)",
                    ("tenant", "metric", "period", "month_to_date", "month_end", "low", "high", "interval",
                     "model", "why"),
                    [(f.tenant, f.metric, f.period, str(f.month_to_date), str(f.month_end),
                      str(f.month_end_low), str(f.month_end_high), f"{f.level:.0%}", f.model, f.reason)
                     for f in forecasts],
                    frozenset({3, 4, 5, 6})),
        ReportTable("quota_status", "Quota status", ("tenant", "metric", "quota_period", "used", "limit",
                                                     "used_share", "limit_reached", "early", "late",
                                                     "probability"),
                    [(f.tenant, f.metric, f.quota_period, str(f.quota_used), str(f.quota_limit),
                      f"{(f.quota_used or 0) / f.quota_limit:.1%}" if f.quota_limit else "",
                      _when(f.exhaust_at), _when(f.exhaust_early), _when(f.exhaust_late),
                      f"{float(f.exhaust_probability):.0%}") for f in quotas],
                    frozenset({3, 4, 5, 9})),
        ReportTable("idle_gpus", "Idle GPUs (advice only)",
                    ("tenant", "pod", "node", "gpu_model", "gpus", "idle_since", "idle_hours",
                     "mean_utilization", "cost_per_day", "wasted_so_far"),
                    [(a.tenant, f"{a.namespace}/{a.pod}", a.node, a.gpu_model, f"{a.gpus.normalize():f}",
                      _when(a.idle_since), f"{a.idle_hours:.2f}", f"{a.mean_utilization:.4f}",
                      format_money(a.cost_per_day), format_money(a.wasted_so_far)) for a in view.idle],
                    frozenset({4, 6, 7, 8, 9})),
        ReportTable("idle_by_tenant", "Idle GPU cost per tenant", ("tenant", "idle_pods", "idle_gpus",
                                                                   "cost_per_day", "currency"),
                    [(t.tenant, str(t.pods), f"{t.gpus.normalize():f}", format_money(t.cost_per_day),
                      t.currency) for t in per_tenant(view.idle)], frozenset({1, 2, 3})),
    ]


def forecast_svg(forecasts: Sequence[Forecast], width: int = 900) -> str:
    """Spend per tenant: month to date (dark), forecast rest of month (light), interval whisker."""
    spend = sorted((f for f in forecasts if f.metric == "spend"), key=lambda f: f.tenant)
    if not spend:
        return empty_svg("no spend forecasts", width)
    row, left, right = 26, 110, 90
    height = 30 + row * len(spend)
    peak = max((max(f.month_end_high, f.month_end) for f in spend), default=Decimal(1)) or Decimal(1)
    plot = width - left - right

    def x(value: Decimal) -> float:
        return left + float(value / peak) * plot

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="spend forecast to month end by tenant">',
             f'<text x="{left}" y="14" font-size="11" fill="#555">list spend: month to date, forecast to '
             f'month end ({spend[0].level:.0%} interval)</text>']
    for index, item in enumerate(spend):
        y = 24 + index * row
        parts.append(f'<text x="{left - 6}" y="{y + 13}" font-size="12" text-anchor="end">'
                     f'{html.escape(item.tenant)}</text>')
        parts.append(f'<rect x="{left}" y="{y + 2}" width="{x(item.month_to_date) - left:.1f}" height="16" '
                     f'fill="{PALETTE[0]}"><title>{html.escape(item.tenant)} month to date: '
                     f'{item.month_to_date:,.2f}</title></rect>')
        parts.append(f'<rect x="{x(item.month_to_date):.1f}" y="{y + 2}" '
                     f'width="{max(x(item.month_end) - x(item.month_to_date), 0):.1f}" height="16" '
                     f'fill="{PALETTE[3]}"><title>{html.escape(item.tenant)} forecast month end: '
                     f'{item.month_end:,.2f} ({item.model})</title></rect>')
        parts.append(f'<line x1="{x(item.month_end_low):.1f}" x2="{x(item.month_end_high):.1f}" '
                     f'y1="{y + 10}" y2="{y + 10}" stroke="#222" stroke-width="1.5"/>')
        for edge in (item.month_end_low, item.month_end_high):
            parts.append(f'<line x1="{x(edge):.1f}" x2="{x(edge):.1f}" y1="{y + 5}" y2="{y + 15}" '
                         f'stroke="#222"/>')
        parts.append(f'<text x="{x(max(item.month_end_high, item.month_end)) + 6:.1f}" y="{y + 14}" '
                     f'font-size="11">{item.month_end:,.0f}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def idle_svg(idle: Sequence[IdleAdvice], width: int = 900) -> str:
    """Idle GPU cost per day per tenant (list price)."""
    totals = per_tenant(idle)
    if not totals:
        return empty_svg("no idle GPUs found", width)
    row, left, right = 26, 110, 120
    height = 30 + row * len(totals)
    peak = max(t.cost_per_day for t in totals) or Decimal(1)
    plot = width - left - right
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="idle GPU cost per day by tenant">',
             f'<text x="{left}" y="14" font-size="11" fill="#555">idle GPU cost per day at list price</text>']
    for index, total in enumerate(totals):
        y = 24 + index * row
        bar = float(total.cost_per_day / peak) * plot
        parts.append(f'<text x="{left - 6}" y="{y + 13}" font-size="12" text-anchor="end">'
                     f'{html.escape(total.tenant)}</text>')
        parts.append(f'<rect x="{left}" y="{y + 2}" width="{bar:.1f}" height="16" fill="{PALETTE[2]}">'
                     f'<title>{html.escape(total.tenant)}: {total.pods} pod(s), '
                     f'{total.gpus.normalize():f} GPU(s), '
                     f'{format_money(total.cost_per_day)} {total.currency}/day</title></rect>')
        parts.append(f'<text x="{left + bar + 6:.1f}" y="{y + 14}" font-size="11">'
                     f'{format_money(total.cost_per_day)} {html.escape(total.currency)}/day</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def enforcement_table(series: Sequence[QuotaSeries]) -> ReportTable:
    return ReportTable("enforcement", "Quota enforcement", ENFORCEMENT_HEADER, enforcement_rows(series),
                       frozenset({3, 4, 5, 6, 7, 8}))


def budget_table(lines: Sequence[BudgetLine]) -> ReportTable:
    at = f" (as of {_when(lines[0].at)} UTC)" if lines else ""
    return ReportTable("budgets", f"Budgets per tenant and GPU model{at}", BUDGET_HEADER, budget_rows(lines),
                       frozenset({4, 5, 6, 7, 8, 9, 10}))


def budget_section(lines: Sequence[BudgetLine]) -> list[str]:
    table = budget_table(lines)
    return [f"<h2>{html.escape(table.title)}</h2>",
            "<p>Per tenant and per GPU-model limit of the quota period: the tenants file's base limit, "
            "the grants counted now (a rollover grant of the period before as its carry), the limit they "
            "make, what is used and how long the rest lasts: by the insights forecast where its model beat "
            "the run rate on backtests, else at the period's run rate so far (runway_from says which).</p>",
            budget_svg(lines, "gpu_hours"), budget_svg(lines, "spend"), table.html()]


def render(spend: list[DailySpend], invoices: list[dict[str, Any]], generated: str,
           insights: InsightsView | None = None, enforcement: Sequence[QuotaSeries] | None = None,
           budgets: Sequence[BudgetLine] | None = None) -> str:
    """The report as HTML: the spend chart and tables; with insights, forecasts, quotas and idle GPUs;
    with budgets, the budget lines (dashboards/budget_report.py)."""
    tables = {table.name: table for table in base_tables(spend, invoices)}
    sections = [
        "<h2>Daily list spend by tenant</h2>", stacked_bars_svg(spend),
        "<h2>List spend per tenant</h2>", tables["tenant_spend"].html(),
        "<h2>Invoices</h2>", tables["invoices"].html(),
    ]
    if insights is not None:
        extra = {table.name: table for table in insight_tables(insights)}
        sections += [
            f"<h2>{html.escape(extra['forecasts'].title)}</h2>", forecast_svg(insights.forecasts),
            extra["forecasts"].html(),
            "<h2>Quota status</h2>", extra["quota_status"].html(),
            "<h2>Idle GPUs</h2>",
            "<p>Allocated GPUs under the utilization threshold for a sustained time, with what they cost "
            "per day at list price. Advice only: nothing is evicted by it.</p>",
            idle_svg(insights.idle), extra["idle_by_tenant"].html(), extra["idle_gpus"].html(),
        ]
    if budgets is not None:
        sections += budget_section(budgets)
    if enforcement is not None:
        sections += ["<h2>Quota enforcement</h2>",
                     "<p>What the extender refused and the actuator evicted, and how far past each limit "
                     "a tenant went: the stated overshoot is the most GPUs held after the crossing x "
                     "(window + grace + pipeline lag).</p>",
                     enforcement_table(enforcement).html(), enforcement_html(enforcement)]
    body = "\n".join(sections)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpumeter finance report</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 10px}}
td.n{{text-align:right;font-variant-numeric:tabular-nums}}
p.csv{{font-size:small;margin-top:-0.5em}}</style>
</head><body>
<h1>gpumeter finance report</h1>
<p>Generated {html.escape(generated)}. List spend is the streaming price before tiers,
commitments and credits; invoice totals are what is billed.</p>
{body}
</body></html>
"""


def write_csvs(out_dir: Path, tables: Sequence[ReportTable]) -> list[Path]:
    paths = []
    for table in tables:
        path = out_dir / f"{table.name}.csv"
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(table.header)
            writer.writerows(table.rows)
        paths.append(path)
    return paths


def write_report(out_dir: Path, spend: list[DailySpend], invoices: list[dict[str, Any]], generated: str,
                 insights: InsightsView | None = None,
                 enforcement: Sequence[QuotaSeries] | None = None,
                 budgets: Sequence[BudgetLine] | None = None) -> Path:
    """finance-report.html and one CSV per table of it, in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = base_tables(spend, invoices) + (insight_tables(insights) if insights is not None else [])
    if budgets is not None:
        tables.append(budget_table(budgets))
    if enforcement is not None:
        tables.append(enforcement_table(enforcement))
    write_csvs(out_dir, tables)
    report = out_dir / "finance-report.html"
    report.write_text(render(spend, invoices, generated, insights, enforcement, budgets), encoding="utf-8")
    return report
