"""The insights job: reads usage from ClickHouse, runs the pure rules of insights/ (idle GPUs,
forecasts) and publishes what they say: advice events on ``gpumeter.advice.v1`` and rows in the
``advice``, ``forecasts``, ``budget_lines`` and ``insight_runs`` tables that the dashboards show.

``budget_lines`` holds every tenant's budget lines (quota.budget) as the report states them
(dashboards.budget_report.budgets: used from the hourly rollup, grants from ``quota_grants`` and
the tenants file, runway from this run's forecasts), so the Tenant dashboard, which cannot read
the tenants file, shows base limit, grants with rollover carries, per-model limits and runway.

Advice only: nothing here evicts, blocks or changes a pod.

The evaluation time defaults to the end of the latest gpu window in ClickHouse, so a replayed or
simulated history (the demo's fleet clock is not the wall clock) is judged at its own "now".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from dashboards.budget_report import budgets
from dashboards.finance_report import InsightsView
from gpumeter.core import jsonio, topics
from gpumeter.core.grants import Grant
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantsFile, load_tenants
from gpumeter.infra import grants as grants_store
from gpumeter.infra import kafka
from gpumeter.infra.clickhouse import to_decimal
from insights.forecast import (
    HOUR,
    Backtest,
    Forecast,
    History,
    Metric,
    QuotaLimit,
    Wanted,
    floor_hour,
    forecast_many,
)
from insights.idle import GpuWindow, IdleAdvice, IdleRule, find_idle
from insights.tables import ADVICE, BUDGET_LINES, FORECASTS, INSIGHT_RUNS
from quota.budget import BudgetLine
from quota.grants import fold, limit_at, of_file, previous_period
from quota.periods import period_end, period_key, period_start

# How far back the idle rule looks: a pod idle for longer is reported as idle "for at least" this.
IDLE_LOOKBACK = timedelta(hours=24)
# Enough for eight weekly backtest folds, each with two weeks of history and its whole month.
FORECAST_LOOKBACK = timedelta(days=120)
METRICS: tuple[Metric, ...] = ("spend", "gpu_hours")
# budget_lines' Decimal(38, 12) scale: stored rounded half-up (the client would truncate).
_STORED = Decimal("1e-12")


def utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def latest_gpu_window_end(client: Client) -> datetime | None:
    rows = client.query("SELECT max(window_end), count() FROM rated_usage WHERE kind = 'gpu'").result_rows
    if not rows or not rows[0][1]:
        return None
    return utc(rows[0][0])


# ------------------------------------------------------------------------------------ idle GPUs


def load_gpu_windows(client: Client, since: datetime, until: datetime) -> list[GpuWindow]:
    """Rated gpu samples (each event once: FINAL) whose window overlaps [since, until]."""
    result = client.query(
        "SELECT tenant, cluster, node, namespace, pod, pod_uid, ifNull(gpu_model, ''), mig_profile, "
        "capacity_type, window_start, window_end, quantity, utilization, unit_price, capacity_multiplier, "
        "list_cost, currency FROM rated_usage FINAL "
        "WHERE kind = 'gpu' AND window_end > %(since)s AND window_start < %(until)s "
        "ORDER BY cluster, pod_uid, window_start",
        parameters={"since": since, "until": until},
    )
    return [
        GpuWindow(tenant=str(r[0]), cluster=str(r[1]), node=str(r[2]), namespace=str(r[3]), pod=str(r[4]),
                  pod_uid=str(r[5]), gpu_model=str(r[6]), mig_profile=r[7], capacity_type=str(r[8]),
                  window_start=utc(r[9]), window_end=utc(r[10]), quantity=to_decimal(r[11]),
                  utilization=None if r[12] is None else to_decimal(r[12]), unit_price=to_decimal(r[13]),
                  capacity_multiplier=to_decimal(r[14]), list_cost=to_decimal(r[15]), currency=str(r[16]))
        for r in result.result_rows
    ]


def detect_idle(client: Client, at: datetime, rule: IdleRule) -> list[IdleAdvice]:
    return find_idle(load_gpu_windows(client, at - IDLE_LOOKBACK, at), at, rule)


def advice_rows(advice: Sequence[IdleAdvice]) -> list[tuple[Any, ...]]:
    rows = []
    for item in advice:
        document: dict[str, Any] = {name: getattr(item, name) for name in item.__dataclass_fields__}
        document["message"] = item.message
        rows.append(ADVICE.row_from(document))
    return rows


# ------------------------------------------------------------------------------------ forecasts


def load_histories(client: Client, origin: datetime, lookback: timedelta = FORECAST_LOOKBACK,
                   tenants: Sequence[str] | None = None) -> list[History]:
    """Per tenant and metric, hourly spend (every kind) and GPU-hours from the hourly rollup.

    A tenant's history starts at its first hour with usage in the lookback and runs, hours
    without usage as zeros, up to ``origin`` (exclusive).
    """
    where = "hour >= %(since)s AND hour < %(origin)s"
    if tenants is not None:
        where += " AND tenant IN %(tenants)s"
    rows = client.query(
        "SELECT tenant, hour, sum(list_cost), sumIf(unit_seconds, kind = 'gpu') / 3600 "
        f"FROM usage_hourly WHERE {where} GROUP BY tenant, hour ORDER BY tenant, hour",
        parameters={"since": origin - lookback, "origin": origin, "tenants": list(tenants or [])},
    ).result_rows
    by_tenant: dict[str, dict[datetime, tuple[Decimal, Decimal]]] = defaultdict(dict)
    for tenant, hour, spend, gpu_hours in rows:
        by_tenant[str(tenant)][utc(hour)] = (to_decimal(spend), to_decimal(gpu_hours))
    histories = []
    for tenant, hours in sorted(by_tenant.items()):
        start = min(hours)
        count = max(0, (origin - start) // HOUR)
        zero = (Decimal(0), Decimal(0))
        series = [hours.get(start + i * HOUR, zero) for i in range(count)]
        for position, metric in enumerate(METRICS):
            histories.append(History(tenant, metric, start, tuple(values[position] for values in series)))
    return histories


def quota_for(policies: TenantsFile, history: History, origin: datetime,
              grants: Mapping[str, Sequence[Grant]] | None = None) -> QuotaLimit | None:
    """The limit the forecast runs against: the effective one at ``origin`` (base + the grants
    counted then, quota.grants), as the quota worker decides on it. The carry of a rollover
    grant needs the period before's use, which the history holds (it reaches back 120 days)."""
    policy = policies.policy(history.tenant)
    if policy is None:
        return None
    base = policy.spend if history.metric == "spend" else policy.gpu_hours
    if base is None:
        return None
    previous = previous_period(period_key(origin, policy.period))
    before = history.total(period_start(previous), period_end(previous))
    every = [*of_file(policy.grants), *(grants or {}).get(history.tenant, ())]
    limit = limit_at(base, every, history.metric, policy.period, origin, before)
    return None if limit is None else QuotaLimit(policy.period, limit)


def forecast_all(histories: Sequence[History], origin: datetime, policies: TenantsFile,
                 grants: Mapping[str, Sequence[Grant]] | None = None) -> list[Forecast]:
    """Every history's forecast; histories of one length (all that end at ``origin`` and start
    alike) are backtested and fitted together (insights.forecast.forecast_many). ``grants``:
    ``quota_grants`` folded per tenant (the tenants file's are added from the policy)."""
    wanted = []
    for history in histories:
        policy = policies.policy(history.tenant)
        commitment = policy.commitment if policy is not None and history.metric == "spend" else None
        wanted.append(Wanted(history, quota_for(policies, history, origin, grants), commitment))
    return forecast_many(wanted, origin)


def read_grants(client: Client) -> dict[str, list[Grant]]:
    """``quota_grants`` folded per tenant (quota.grants.fold); a database from before the grants
    migration has none."""
    if not client.query("EXISTS TABLE quota_grants").result_rows[0][0]:
        return {}
    return fold(grants_store.read(client))


def forecast_rows(forecasts: Sequence[Forecast]) -> list[tuple[Any, ...]]:
    rows = []
    for item in forecasts:
        test: Backtest | None = item.backtest
        rows.append(FORECASTS.row_from({
            **{name: getattr(item, name) for name in item.__dataclass_fields__},
            "interval_level": item.level,
            "backtest_folds": test.folds if test else 0,
            "backtest_wape_model": test.wape_model if test else None,
            "backtest_wape_baseline": test.wape_run_rate if test else None,
        }))
    return rows


def budget_line_rows(lines: Sequence[BudgetLine]) -> list[tuple[Any, ...]]:
    """One ``budget_lines`` row per line; model_key '' for a tenant-wide line."""

    def stored(value: Decimal) -> Decimal:
        return value.quantize(_STORED, rounding=ROUND_HALF_UP)

    return [BUDGET_LINES.row_from({
        "tenant": line.tenant, "period": line.period, "metric": line.metric,
        "model_key": line.gpu_model or "", "base_limit": stored(line.base_limit),
        "granted": stored(line.granted), "limit": stored(line.limit), "used": stored(line.used),
        "remaining": stored(line.remaining), "runway_hours": line.runway.hours,
        "runway_until": line.runway.until, "runway_source": line.runway.source, "computed_at": line.at,
    }) for line in lines]


def store_budgets(client: Client, lines: Sequence[BudgetLine]) -> None:
    if lines:
        client.insert(BUDGET_LINES.name, budget_line_rows(lines),
                      column_names=list(BUDGET_LINES.insert_columns))


# ------------------------------------------------------------------------------------ the job


@dataclass
class InsightsResult:
    at: datetime | None
    idle: list[IdleAdvice] = field(default_factory=list)
    forecasts: list[Forecast] = field(default_factory=list)
    budgets: list[BudgetLine] = field(default_factory=list)
    advice_published: int = 0
    stored: bool = False


def evaluate(client: Client, policies: TenantsFile, at: datetime | None = None, rule: IdleRule | None = None,
             forecasts: bool = True, grants: Mapping[str, Sequence[Grant]] | None = None,
             budget_lines: bool = True) -> InsightsResult:
    """Idle advice and forecasts as of ``at`` (default: the end of the latest gpu window), the
    forecasts against the limits with grants (``grants``: ``quota_grants`` folded, read here
    when not given), and with the forecasts every tenant's budget lines at ``at`` (unless
    ``budget_lines`` is False: the report states them at its own moment)."""
    at = utc(at) if at is not None else latest_gpu_window_end(client)
    if at is None:
        return InsightsResult(at=None)
    result = InsightsResult(at=at, idle=detect_idle(client, at, rule or IdleRule()))
    if forecasts:
        origin = floor_hour(at)
        every = read_grants(client) if grants is None else grants
        result.forecasts = forecast_all(load_histories(client, origin), origin, policies, every)
        if budget_lines:
            result.budgets = budgets(client, policies, every, at, result.forecasts)
    return result


def store(client: Client, result: InsightsResult) -> None:
    """Advice, forecast and budget line rows, then the run marker (last: a run shows once it is
    complete)."""
    if result.at is None:
        return
    if result.idle:
        client.insert(ADVICE.name, advice_rows(result.idle), column_names=list(ADVICE.insert_columns))
    if result.forecasts:
        client.insert(FORECASTS.name, forecast_rows(result.forecasts),
                      column_names=list(FORECASTS.insert_columns))
    store_budgets(client, result.budgets)
    tenants = len({f.tenant for f in result.forecasts})
    client.insert(INSIGHT_RUNS.name, [(result.at, len(result.idle), tenants)],
                  column_names=list(INSIGHT_RUNS.insert_columns))
    result.stored = True


def publish_advice(settings: Settings, advice: Sequence[IdleAdvice]) -> int:
    """One event per idle pod on gpumeter.advice.v1 (key = tenant); returns how many were sent."""
    if not advice:
        return 0
    kafka.ensure_topics(settings.kafka, [spec for spec in topics.ALL if spec.name == topics.ADVICE])
    producer = kafka.make_producer(settings.kafka)
    try:
        topic = settings.kafka.topic(topics.ADVICE)
        futures = [producer.send(topic, key=item.tenant.encode(), value=jsonio.dumpb(item.to_document()))
                   for item in advice]
        producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)  # raises if the broker refused one
    finally:
        producer.close(timeout=10)
    return len(advice)


def run_for_report(settings: Settings, client: Client) -> InsightsView | None:
    """Evaluate, publish and store (as `gpumeter insights` does), and hand the result to the report."""
    result = evaluate(client, load_tenants(settings.tenants))
    if result.at is None:
        return None
    result.advice_published = publish_advice(settings, result.idle)
    store(client, result)
    return InsightsView(at=result.at, forecasts=result.forecasts, idle=result.idle)
