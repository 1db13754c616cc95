"""Budgets for finance (issue 33 point 6): every tenant's budget lines (quota.budget) from
ClickHouse, as a table and a chart of the finance report, and the forecasts' word on runway.

Used comes from the hourly rollup (``usage_hourly``, the figures of the report's spend); the
grants from ``quota_grants`` and the tenants file; the runway from the insights forecasts where
their model beat the run rate (quota.budget). ``gpumeter budget show`` builds the same lines
from the quota worker's ledger instead of the rollup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from dashboards.svg import empty_svg
from gpumeter.core.grants import GRANT_METRICS, Grant, GrantMetric
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from gpumeter.infra.clickhouse import to_decimal
from insights.forecast import Forecast
from quota.accounting import format_value
from quota.budget import BudgetLine, ExhaustionForecast, budget_view, hours_by_key
from quota.grants import previous_period
from quota.periods import period_end, period_key, period_start

_ZERO = Decimal(0)
_INSTANT = timedelta(microseconds=1)
SECONDS_PER_HOUR = Decimal(3600)
# Chart colours, the report's palette: base limit, grants on top of it, used over both.
BASE, GRANTED, USED = "#c9d6e3", "#f28e2b", "#4e79a7"

BUDGET_HEADER = ("tenant", "metric", "gpu_model", "period", "base_limit", "grants", "limit", "used",
                 "remaining", "used_share", "runway_hours", "runway_until", "runway_from", "grant_detail")


def exhaustion(forecast: Forecast) -> ExhaustionForecast | None:
    """The forecast's word on its quota limit (None: it was made against none)."""
    if forecast.quota_limit is None:
        return None
    return ExhaustionForecast(
        beats_run_rate=forecast.model == "holt-winters", model=forecast.model,
        period=period_key(forecast.computed_at, "day" if forecast.quota_period == "day" else "month"),
        limit=forecast.quota_limit,
        exhaust_at=forecast.exhaust_at)


def exhaustions(forecasts: Iterable[Forecast]) -> dict[tuple[str, GrantMetric], ExhaustionForecast]:
    found: dict[tuple[str, GrantMetric], ExhaustionForecast] = {}
    for forecast in forecasts:
        said = exhaustion(forecast)
        if said is not None:
            found[(forecast.tenant, forecast.metric)] = said
    return found


def report_moment(period: str, latest: datetime | None) -> datetime:
    """The instant a month's report states budgets at: the latest usage in it, its last instant
    once it is over, its first before it began."""
    start, end = period_start(period), period_end(period)
    moment = latest if latest is not None else end
    return min(max(moment, start), end - _INSTANT)


def rollup_use(client: Any, policy: TenantPolicy, at: datetime
               ) -> tuple[dict[GrantMetric, Decimal], dict[GrantMetric, Decimal], dict[str, Decimal]]:
    """The tenant's use of the quota period holding ``at`` (up to ``at``'s hour) and of the
    period before (for carries), and GPU-hours per gpu_model of the current one."""
    current = period_key(at, policy.period)
    start = period_start(current)
    rows = client.query(
        "SELECT gpu_model, hour >= %(start)s AS current, sumIf(unit_seconds, kind = 'gpu'), sum(list_cost) "
        "FROM usage_hourly WHERE tenant = %(tenant)s AND hour >= %(before)s AND hour <= %(at)s "
        "GROUP BY gpu_model, current",
        parameters={"tenant": policy.tenant, "start": start, "at": at,
                    "before": period_start(previous_period(current))}).result_rows
    used: dict[GrantMetric, Decimal] = {"gpu_hours": _ZERO, "spend": _ZERO}
    before: dict[GrantMetric, Decimal] = {"gpu_hours": _ZERO, "spend": _ZERO}
    by_model: dict[str, Decimal] = {}
    with exact():
        for model, is_now, seconds, cost in rows:
            hours = to_decimal(seconds) / SECONDS_PER_HOUR
            into = used if is_now else before
            into["gpu_hours"] += hours
            into["spend"] += to_decimal(cost)
            if is_now and model:
                by_model[str(model)] = by_model.get(str(model), _ZERO) + hours
    return used, before, by_model


def budgets(client: Any, policies: TenantsFile, grants: Mapping[str, Sequence[Grant]], at: datetime,
            forecasts: Iterable[Forecast] = ()) -> list[BudgetLine]:
    """Every tenant's budget lines at ``at``; tenants without a gpu_hours or spend limit have none."""
    said = exhaustions(forecasts)
    lines: list[BudgetLine] = []
    for policy in sorted(policies.tenants, key=lambda p: p.tenant):
        if policy.gpu_hours is None and policy.spend is None and not policy.gpu_hours_by_model:
            continue
        used, before, by_model = rollup_use(client, policy, at)
        tenant_said = {metric: said[(policy.tenant, metric)] for metric in GRANT_METRICS
                       if (policy.tenant, metric) in said}
        lines += budget_view(policy, grants.get(policy.tenant, ()), at, used, before,
                             hours_by_key(policy, by_model), tenant_said)
    return lines


def budget_rows(lines: Sequence[BudgetLine]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for line in lines:
        share = f"{line.used / line.limit:.1%}" if line.limit > 0 else ""
        runway = line.runway
        rows.append((
            line.tenant, line.metric, line.gpu_model or "all", line.period,
            format_value(line.metric, line.base_limit), format_value(line.metric, line.granted),
            format_value(line.metric, line.limit), format_value(line.metric, line.used),
            format_value(line.metric, line.remaining), share,
            "0" if runway.exhausted else ("" if runway.hours is None else str(runway.hours)),
            "" if runway.until is None else f"{runway.until:%Y-%m-%d %H:%M}",
            f"{runway.source}: {runway.text()}",
            "; ".join(f"{g.key} {format_value(line.metric, g.amount)}"
                      + (f" (carried of {format_value(line.metric, g.granted)})" if g.carried else "")
                      for g in line.grants)))
    return rows


def budget_svg(lines: Sequence[BudgetLine], metric: GrantMetric, width: int = 900) -> str:
    """One row per budget line of ``metric``: the base limit, the grants stacked on it (together
    the effective limit), and the used amount as a bar over both."""
    chosen = [line for line in lines if line.metric == metric]
    unit = "GPU-hours" if metric == "gpu_hours" else "list spend (USD)"
    if not chosen:
        return empty_svg(f"no {unit} budgets", width)
    row, left, right = 30, 200, 170
    height = 34 + row * len(chosen)
    peak = max(max(line.limit, line.used) for line in chosen) or Decimal(1)
    plot = width - left - right

    def x(value: Decimal) -> float:
        return left + float(max(value, _ZERO) / peak) * plot

    def show(value: Decimal) -> str:
        return format_value(metric, value)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{unit} budgets: used against base limit and grants">',
             f'<text x="{left}" y="14" font-size="11" fill="#555">{unit}: base limit, grants on top '
             f'(together the limit), used as the dark bar</text>']
    for index, line in enumerate(chosen):
        y = 24 + index * row
        name = line.tenant if line.gpu_model is None else f"{line.tenant} · {line.gpu_model}"
        label = html.escape(name)
        parts.append(f'<text x="{left - 6}" y="{y + 15}" font-size="12" text-anchor="end">{label}</text>')
        parts.append(f'<rect x="{left}" y="{y + 2}" width="{x(line.base_limit) - left:.1f}" height="20" '
                     f'fill="{BASE}"><title>{label} base limit: {show(line.base_limit)}</title></rect>')
        parts.append(f'<rect x="{x(line.base_limit):.1f}" y="{y + 2}" '
                     f'width="{max(x(line.limit) - x(line.base_limit), 0):.1f}" height="20" fill="{GRANTED}">'
                     f'<title>{label} grants: {show(line.granted)}</title></rect>')
        parts.append(f'<rect x="{left}" y="{y + 8}" width="{x(line.used) - left:.1f}" height="8" '
                     f'fill="{USED}"><title>{label} used: {show(line.used)} of {show(line.limit)}'
                     '</title></rect>')
        parts.append(f'<text x="{x(max(line.limit, line.used)) + 6:.1f}" y="{y + 16}" font-size="11">'
                     f'{show(line.used)} / {show(line.limit)} · {html.escape(line.runway.text())}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def stored_exhaustions(client: Any, tenant: str) -> dict[GrantMetric, ExhaustionForecast]:
    """The latest stored forecast of each metric of ``tenant`` made against a limit (the
    insights job's ``forecasts`` rows), as quota.budget reads it."""
    rows = client.query(
        "SELECT metric, model, quota_period, quota_limit, exhaust_at, computed_at FROM forecasts FINAL "
        "WHERE tenant = %(tenant)s AND quota_limit IS NOT NULL AND metric IN ('gpu_hours', 'spend') "
        "ORDER BY computed_at", parameters={"tenant": tenant}).result_rows
    found: dict[GrantMetric, ExhaustionForecast] = {}
    for metric, model, kind, limit, exhaust_at, computed_at in rows:
        found["spend" if metric == "spend" else "gpu_hours"] = ExhaustionForecast(
            beats_run_rate=model == "holt-winters", model=str(model),
            period=period_key(_utc(computed_at), "day" if kind == "day" else "month"),
            limit=to_decimal(limit),
            exhaust_at=None if exhaust_at is None else _utc(exhaust_at))
    return found


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
