"""The report's enforcement section: per tenant and quota, use against the limit over time,
with every crossing, refusal and eviction marked (issue 33, point 5).

Read from the stores: use from ``rated_usage`` (GPU rows: GPU-hours summed in each period of
the tenant, GPUs held per window), crossings from ``quota_events`` (``exceeded``), evictions
from ``preemptions`` (``evicted``). Refusals are the extender's answers and are not stored: the
demo passes the ones its scheduler got (``gpumeter report`` shows crossings and evictions).

The stated overshoot of a quota (its bound): the most GPUs the tenant held from the crossing
on x (window + grace + pipeline lag); the demo states its lag (gpumeter/app/demo.py).
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from gpumeter.core.tenants import TenantsFile

METRICS = ("gpu_hours", "max_gpus")
HOUR = Decimal(3600)


@dataclass(frozen=True)
class Mark:
    at: datetime
    kind: str  # crossing | refusal | eviction
    detail: str


@dataclass
class QuotaSeries:
    tenant: str
    metric: str
    limit: Decimal
    on_exceed: str
    period: str  # month | day
    points: list[tuple[datetime, Decimal]] = field(default_factory=list)  # (window end, used / held)
    marks: list[Mark] = field(default_factory=list)
    bound: Decimal | None = None  # stated overshoot past the limit (gpu_hours)
    worst_over: Decimal = Decimal(0)  # the most a period ended (or the run ended) over the limit


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _period_key(at: datetime, kind: str) -> str:
    return at.strftime("%Y-%m-%d" if kind == "day" else "%Y-%m")


def enforcement_series(client: Any, tenants: TenantsFile, refusals: Sequence[tuple[str, Mark]] = (),
                       window: timedelta | None = None, lag: timedelta | None = None) -> list[QuotaSeries]:
    """One series per tenant and metric with a limit whose tenant blocks or preempts."""
    rows = client.query(
        "SELECT tenant, window_start, window_end, sum(quantity) FROM rated_usage FINAL WHERE kind = 'gpu' "
        "GROUP BY tenant, window_start, window_end ORDER BY window_start").result_rows
    crossings = client.query(
        "SELECT tenant, metric, at, used, limit FROM quota_events FINAL WHERE level = 'exceeded'").result_rows
    evictions = client.query(
        "SELECT tenant, metric, at, pod FROM preemptions FINAL WHERE action = 'evicted'").result_rows
    series: list[QuotaSeries] = []
    for policy in tenants.tenants:
        if policy.on_exceed not in ("block", "preempt"):
            continue
        for metric in METRICS:
            limit = getattr(policy, metric, None)
            if limit is None:
                continue
            one = QuotaSeries(policy.tenant, metric, Decimal(limit), policy.on_exceed, policy.period)
            used: dict[str, Decimal] = defaultdict(Decimal)
            held_after: dict[str, Decimal] = {}
            crossed: set[str] = set()
            for tenant, start, end, quantity in rows:
                if tenant != policy.tenant:
                    continue
                start, end, quantity = _utc(start), _utc(end), Decimal(quantity)
                key = _period_key(start, policy.period)
                if metric == "gpu_hours":
                    used[key] += quantity * Decimal((end - start).total_seconds()) / HOUR
                    value = used[key]
                    if value >= one.limit:
                        crossed.add(key)
                    if key in crossed:
                        held_after[key] = max(held_after.get(key, Decimal(0)), quantity)
                else:
                    value = quantity
                one.points.append((end, value))
            if metric == "gpu_hours":
                one.worst_over = max((u - one.limit for u in used.values()), default=Decimal(0))
                # Stated for preempt only: a blocked tenant's running pods run on to their end.
                if window is not None and lag is not None and held_after and policy.on_exceed == "preempt":
                    grace = timedelta(seconds=policy.grace_seconds)
                    span = Decimal((window + grace + lag).total_seconds()) / HOUR
                    one.bound = max(held_after.values()) * span
            else:
                one.worst_over = max((v - one.limit for _, v in one.points), default=Decimal(0))
            mine = policy.tenant
            one.marks += [Mark(_utc(at), "crossing", f"exceeded: {used_} of {lim}")
                          for tenant, m, at, used_, lim in crossings if tenant == mine and m == metric]
            one.marks += [Mark(_utc(at), "eviction", f"evicted {pod}")
                          for tenant, m, at, pod in evictions if tenant == mine and m == metric]
            # A refusal names the quota that refused (scheduler_hooks/extender/policy.py).
            one.marks += [mark for tenant, mark in refusals if tenant == mine and metric in mark.detail]
            series.append(one)
    return series


COLOURS = {"crossing": "#e15759", "refusal": "#f28e2b", "eviction": "#222222"}


def series_svg(one: QuotaSeries, width: int = 900, height: int = 200) -> str:
    if not one.points:
        return ""
    left, right, top, bottom = 60, 20, 20, 30
    times = [at for at, _ in one.points] + [m.at for m in one.marks]
    t0, t1 = min(times), max(times)
    span = max((t1 - t0).total_seconds(), 1.0)
    top_value = max([v for _, v in one.points] + [one.limit * Decimal("1.2")])

    def x(at: datetime) -> float:
        return left + (width - left - right) * (at - t0).total_seconds() / span

    def y(value: Decimal) -> float:
        if not top_value:
            return height - bottom
        return top + (height - top - bottom) * (1 - float(value / top_value))

    path = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in one.points)
    label = f"{one.tenant} {one.metric}: use against the limit {one.limit.normalize():f}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(label)}">',
             f'<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="{path}"/>',
             f'<line x1="{left}" x2="{width - right}" y1="{y(one.limit):.1f}" y2="{y(one.limit):.1f}" '
             'stroke="#e15759" stroke-dasharray="5,4"/>',
             f'<text x="4" y="{y(one.limit) + 4:.1f}" font-size="11">limit</text>',
             f'<text x="{left}" y="{height - 8}" font-size="11">{t0:%Y-%m-%d %H:%M}</text>',
             f'<text x="{width - right}" y="{height - 8}" font-size="11" text-anchor="end">'
             f'{t1:%Y-%m-%d %H:%M}</text>']
    for mark in sorted(one.marks, key=lambda m: m.at):
        colour = COLOURS.get(mark.kind, "#888")
        parts.append(f'<line x1="{x(mark.at):.1f}" x2="{x(mark.at):.1f}" y1="{top}" y2="{height - bottom}" '
                     f'stroke="{colour}" stroke-opacity="0.6"><title>{html.escape(mark.kind)} '
                     f'{mark.at:%Y-%m-%d %H:%M}: {html.escape(mark.detail)}</title></line>')
    parts.append("</svg>")
    return "\n".join(parts)


def enforcement_rows(series: Sequence[QuotaSeries]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for one in series:
        counts = {kind: sum(1 for m in one.marks if m.kind == kind) for kind in COLOURS}
        rows.append((one.tenant, one.metric, one.on_exceed, f"{one.limit.normalize():f}",
                     f"{max(one.worst_over, Decimal(0)):.2f}",
                     "" if one.bound is None else f"{one.bound:.2f}",
                     str(counts["crossing"]), str(counts["refusal"]), str(counts["eviction"])))
    return rows


ENFORCEMENT_HEADER = ("tenant", "metric", "on_exceed", "limit", "most over the limit", "stated overshoot",
                      "crossings", "refusals", "evictions")


def enforcement_html(series: Sequence[QuotaSeries]) -> str:
    legend = " ".join(f'<span style="color:{c}">&#9646; {k}</span>' for k, c in COLOURS.items())
    parts = ["<p>Per tenant and quota: use (GPU-hours in the period, or GPUs held) against the limit "
             f"(dashed), with each {legend} marked.</p>"]
    for one in series:
        title = f"{one.tenant}: {one.metric} ({one.on_exceed})"
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(series_svg(one))
    return "\n".join(parts)
