"""Every panel's SQL, in one place, with the columns its panel reads.

The SQL is written for the Grafana ClickHouse plugin: its macros (``$__timeFilter(col)``,
``$__timeInterval(col)``, ``$__interval_s``, ``$__toTime``, ``$__conditionalAll(...)``) and
Grafana's template variables (``${tenant:singlequote}``) are expanded before ClickHouse sees it.
tests/integration/test_dashboard_sql.py expands them as the plugin does and runs every query
here against the real schema; ``columns`` is what the panel reads, checked there.

Conventions that keep the numbers exact and the queries cheap:
- spend and GPU-hours come from ``usage_hourly`` (the rollup: one row per tenant-hour-line),
  filtered on its ``hour``; money stays Decimal end to end (``sum(list_cost)``);
- anything needing a sample's price or telemetry reads ``rated_usage FINAL`` (each event once);
- telemetry ratios (utilization, lag) are floats: they are not billed;
- the "current" forecast of a tenant is its row for the month of the range's end
  (``formatDateTime($__toTime, '%Y-%m', 'UTC')``), the "current" idle GPUs the advice of
  the latest insights run in the range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dashboards.chquery import Format

PanelKind = Literal["timeseries", "table", "stat", "bargauge"]

# Finance: a multi-valued tenant filter; "All" (or nothing) drops the condition.
TENANTS = "$__conditionalAll(tenant IN (${tenant:singlequote}), $tenant)"
# Tenant dashboard: exactly one tenant.
TENANT = "tenant = ${tenant:singlequote}"
MONTH_OF_RANGE_END = "formatDateTime($__toTime, '%Y-%m', 'UTC')"
LATEST_RUN = "(SELECT max(run_at) FROM insight_runs WHERE $__timeFilter(run_at))"


# The budget view (issue 33 point 6): the budget lines the insights job stored at the tenant's
# latest run (quota.budget, as `gpumeter budget show` and the report state them): the current
# budget, not the range's. One run's lines share computed_at, so a line the tenants file dropped
# since (or one of an earlier period) is not shown; FINAL keeps each line's latest row (a later run
# replaces it, so no earlier run can be shown whole). The tenant's rows live on one shard.
BUDGET_SQL = (
    "SELECT metric, if(model_key = '', 'all', model_key) AS gpu_model, period, base_limit,\n"
    "       granted AS grants, `limit` AS quota_limit, used, remaining,\n"
    "       if(`limit` > 0, toFloat64(used) / toFloat64(`limit`), NULL) AS used_share,\n"
    "       runway_hours, runway_until, runway_source AS runway_from, computed_at\n"
    "FROM budget_lines FINAL\n"
    f"WHERE {TENANT}\n"
    f"  AND computed_at = (SELECT max(computed_at) FROM budget_lines WHERE {TENANT})\n"
    "ORDER BY metric, model_key"
)
# quota_grants rows are numbered; a number held twice is read once (gpumeter/infra/grants.py).
GRANTS_SQL = (
    "SELECT concat('#', toString(g.number)) AS grant, g.metric AS metric,\n"
    "       g.amount + ifNull(c.corrected, 0) AS amount, g.effective_at AS effective_at,\n"
    "       g.expires_at AS expires_at, g.rollover AS rollover,\n"
    "       formatDateTime(g.effective_at, '%Y-%m', 'UTC') AS home_month, g.note AS note\n"
    "FROM (SELECT number, metric, amount, effective_at, expires_at, rollover, note FROM quota_grants\n"
    f"      WHERE {TENANT} AND corrects IS NULL ORDER BY number, inserted_at LIMIT 1 BY number) AS g\n"
    "LEFT JOIN (\n"
    "  SELECT corrects, sum(amount) AS corrected\n"
    "  FROM (SELECT number, corrects, amount FROM quota_grants\n"
    f"        WHERE {TENANT} AND corrects IS NOT NULL ORDER BY number, inserted_at LIMIT 1 BY number)\n"
    "  GROUP BY corrects) AS c ON c.corrects = g.number\n"
    "WHERE g.effective_at <= $__toTime AND (g.expires_at IS NULL OR g.expires_at > $__toTime)\n"
    "  AND g.effective_at >= toDateTime(toStartOfMonth($__toTime, 'UTC'), 'UTC') - INTERVAL 1 MONTH\n"
    "ORDER BY g.number"
)


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: PanelKind
    sql: str
    columns: tuple[str, ...]
    fmt: Format = Format.TABLE
    unit: str | None = None
    width: int = 12
    height: int = 8
    description: str = ""
    # Grafana's lower bound on $__interval for this panel (hourly rollups: never finer than 1h).
    min_interval: str | None = None
    # Per-column units for tables and multi-value stats.
    column_units: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VariableSpec:
    name: str
    label: str
    sql: str
    multi: bool
    include_all: bool


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    time_from: str
    variables: tuple[VariableSpec, ...]
    rows: tuple[tuple[str, tuple[PanelSpec, ...]], ...]

    def panels(self) -> list[PanelSpec]:
        return [panel for _, panels in self.rows for panel in panels]


TENANT_VARIABLE_SQL = "SELECT DISTINCT tenant FROM usage_hourly ORDER BY tenant"

FINANCE = DashboardSpec(
    uid="gpumeter-finance",
    title="gpumeter / Finance",
    description="List spend (streaming price before tiers, commitments and credits) by tenant, "
                "GPU model and capacity type; savings; commitments and month-end forecasts.",
    tags=("gpumeter", "finance"),
    time_from="now-30d",
    variables=(VariableSpec("tenant", "Tenant", TENANT_VARIABLE_SQL, multi=True, include_all=True),),
    rows=(
        ("Spend", (
            PanelSpec(
                "Spend by tenant and day", "timeseries",
                "SELECT toStartOfDay(hour) AS time, tenant, sum(list_cost) AS spend\n"
                "FROM usage_hourly\n"
                f"WHERE $__timeFilter(hour) AND {TENANTS}\n"
                "GROUP BY time, tenant\nORDER BY time, tenant",
                ("time", "tenant", "spend"), Format.TIME_SERIES, unit="currencyUSD", width=16,
                description="Daily list spend per tenant (UTC days) from the hourly rollup.",
                min_interval="1h"),
            PanelSpec(
                "Spend by tenant", "bargauge",
                "SELECT tenant, sum(list_cost) AS spend,\n"
                "       sumIf(unit_seconds, kind = 'gpu') / 3600 AS gpu_hours\n"
                "FROM usage_hourly\n"
                f"WHERE $__timeFilter(hour) AND {TENANTS}\n"
                "GROUP BY tenant\nORDER BY spend DESC, tenant",
                ("tenant", "spend", "gpu_hours"), unit="currencyUSD", width=8,
                column_units={"gpu_hours": "h"}),
            PanelSpec(
                "Month-to-date list spend", "stat",
                "SELECT sum(list_cost) AS spend\nFROM usage_hourly\n"
                f"WHERE period = {MONTH_OF_RANGE_END} AND hour <= $__toTime AND {TENANTS}",
                ("spend",), unit="currencyUSD", width=6, height=5,
                description="List spend of the month the time range ends in, up to its end."),
            PanelSpec(
                "Spend by GPU model and capacity type", "table",
                "SELECT gpu_model, mig_profile, capacity_type, sum(unit_seconds) / 3600 AS gpu_hours,\n"
                "       sum(list_cost) AS spend\n"
                "FROM usage_hourly\n"
                f"WHERE kind = 'gpu' AND $__timeFilter(hour) AND {TENANTS}\n"
                "GROUP BY gpu_model, mig_profile, capacity_type\n"
                "ORDER BY gpu_model, mig_profile, capacity_type",
                ("gpu_model", "mig_profile", "capacity_type", "gpu_hours", "spend"), width=18, height=8,
                column_units={"gpu_hours": "h", "spend": "currencyUSD"}),
        )),
        ("Savings and commitments", (
            PanelSpec(
                "Spot and reserved savings against on-demand list price", "table",
                "SELECT capacity_type, sum(list_cost) AS spend,\n"
                "       sum(toDecimal128(unit_seconds, 12) * toDecimal128(unit_price, 12)) / 3600 "
                "AS on_demand_list,\n"
                "       on_demand_list - spend AS savings\n"
                "FROM rated_usage FINAL\n"
                f"WHERE $__timeFilter(window_start) AND {TENANTS}\n"
                "GROUP BY capacity_type\nORDER BY capacity_type",
                ("capacity_type", "spend", "on_demand_list", "savings"), unit="currencyUSD",
                description="What the same usage would cost at the on-demand list price (unit price "
                            "without the capacity multiplier), and the difference.",
                ),
            PanelSpec(
                "Commitments against actual", "table",
                "SELECT tenant, commitment, month_to_date AS spend_to_date,\n"
                "       month_end AS forecast_month_end,\n"
                "       greatest(commitment - month_end, 0) AS expected_true_up, model, computed_at\n"
                "FROM forecasts FINAL\n"
                f"WHERE metric = 'spend' AND commitment IS NOT NULL AND period = {MONTH_OF_RANGE_END}\n"
                f"  AND {TENANTS}\n"
                "ORDER BY tenant",
                ("tenant", "commitment", "spend_to_date", "forecast_month_end", "expected_true_up", "model",
                 "computed_at"),
                column_units={"commitment": "currencyUSD", "spend_to_date": "currencyUSD",
                              "forecast_month_end": "currencyUSD", "expected_true_up": "currencyUSD"},
                description="Minimum monthly spend against spend so far and the month-end forecast; "
                            "a forecast below the commitment means a true-up line on the invoice."),
            PanelSpec(
                "Month to date and forecast to month end", "table",
                "SELECT tenant, month_to_date, month_end AS forecast, month_end_low AS forecast_low,\n"
                "       month_end_high AS forecast_high, interval_level, model, computed_at\n"
                "FROM forecasts FINAL\n"
                f"WHERE metric = 'spend' AND period = {MONTH_OF_RANGE_END} AND {TENANTS}\n"
                "ORDER BY tenant",
                ("tenant", "month_to_date", "forecast", "forecast_low", "forecast_high", "interval_level",
                 "model", "computed_at"), width=24,
                column_units={"month_to_date": "currencyUSD", "forecast": "currencyUSD",
                              "forecast_low": "currencyUSD", "forecast_high": "currencyUSD",
                              "interval_level": "percentunit"},
                description="From `gpumeter insights`: Holt-Winters where it beat the run-rate "
                            "baseline on backtests, the run rate elsewhere."),
        )),
    ),
)

TENANT_DASHBOARD = DashboardSpec(
    uid="gpumeter-tenant",
    title="gpumeter / Tenant",
    description="One tenant: GPU-hours, allocated against used GPUs, quota burn-down, quota events, "
                "preemptions and idle GPUs.",
    tags=("gpumeter", "tenant"),
    time_from="now-7d",
    variables=(VariableSpec("tenant", "Tenant", TENANT_VARIABLE_SQL, multi=False, include_all=False),),
    rows=(
        ("Usage", (
            PanelSpec(
                "GPU-hours in range", "stat",
                "SELECT sum(unit_seconds) / 3600 AS gpu_hours\nFROM usage_hourly\n"
                f"WHERE kind = 'gpu' AND {TENANT} AND $__timeFilter(hour)",
                ("gpu_hours",), unit="h", width=6, height=5),
            PanelSpec(
                "GPU efficiency in range", "stat",
                "SELECT sumIf(toFloat64(unit_seconds) * toFloat64(utilization), utilization IS NOT NULL)\n"
                "       / sumIf(toFloat64(unit_seconds), utilization IS NOT NULL) AS efficiency\n"
                "FROM rated_usage FINAL\n"
                f"WHERE kind = 'gpu' AND {TENANT} AND $__timeFilter(window_start)",
                ("efficiency",), unit="percentunit", width=6, height=5,
                description="Busy GPU-time over allocated GPU-time (samples with utilization telemetry)."),
            PanelSpec(
                "GPU-hours", "timeseries",
                "SELECT $__timeInterval(hour) AS time, sum(unit_seconds) / 3600 AS gpu_hours\n"
                "FROM usage_hourly\n"
                f"WHERE kind = 'gpu' AND {TENANT} AND $__timeFilter(hour)\n"
                "GROUP BY time\nORDER BY time",
                ("time", "gpu_hours"), Format.TIME_SERIES, unit="h", width=12, min_interval="1h"),
            PanelSpec(
                "Allocated vs used GPUs", "timeseries",
                "SELECT $__timeInterval(window_start) AS time,\n"
                "       sum(toFloat64(unit_seconds)) / $__interval_s AS gpus_allocated,\n"
                "       sumIf(toFloat64(unit_seconds) * toFloat64(utilization), utilization IS NOT NULL)\n"
                "           / $__interval_s AS gpus_busy\n"
                "FROM rated_usage FINAL\n"
                f"WHERE kind = 'gpu' AND {TENANT} AND $__timeFilter(window_start)\n"
                "GROUP BY time\nORDER BY time",
                ("time", "gpus_allocated", "gpus_busy"), Format.TIME_SERIES, unit="short", width=24,
                description="Average GPUs held per interval, and how many of them were busy "
                            "(held x utilization).", min_interval="10m"),
        )),
        ("Quota", (
            PanelSpec(
                "Quota burn-down", "table",
                "SELECT metric, quota_period, quota_used AS used, quota_limit,\n"
                "       if(quota_limit > 0, toFloat64(quota_used) / toFloat64(quota_limit), NULL)\n"
                "           AS used_share,\n"
                "       month_end AS forecast_month_end, exhaust_at, exhaust_early, exhaust_late,\n"
                "       exhaust_probability, model\n"
                "FROM forecasts FINAL\n"
                f"WHERE {TENANT} AND period = {MONTH_OF_RANGE_END} AND quota_limit IS NOT NULL\n"
                "ORDER BY metric",
                ("metric", "quota_period", "used", "quota_limit", "used_share", "forecast_month_end",
                 "exhaust_at", "exhaust_early", "exhaust_late", "exhaust_probability", "model"), width=24,
                column_units={"used_share": "percentunit", "exhaust_probability": "percentunit"},
                description="Used against each limit in the quota period, and when the forecast "
                            "reaches it (with its interval)."),
            PanelSpec(
                "Month to date, cumulative", "timeseries",
                "SELECT hour AS time,\n"
                "       sum(sum(list_cost)) OVER (ORDER BY hour) AS spend_to_date,\n"
                "       sum(sumIf(unit_seconds, kind = 'gpu')) OVER (ORDER BY hour) / 3600\n"
                "           AS gpu_hours_to_date\n"
                "FROM usage_hourly\n"
                f"WHERE {TENANT} AND period = {MONTH_OF_RANGE_END} AND hour <= $__toTime\n"
                "GROUP BY hour\nORDER BY hour",
                ("time", "spend_to_date", "gpu_hours_to_date"), Format.TIME_SERIES, width=12,
                column_units={"spend_to_date": "currencyUSD", "gpu_hours_to_date": "h"}),
            PanelSpec(
                "Quota events", "table",
                "SELECT at, metric, level, threshold, used, `limit` AS quota_limit, period\n"
                "FROM quota_events FINAL\n"
                f"WHERE {TENANT} AND $__timeFilter(at)\n"
                "ORDER BY at DESC\nLIMIT 500",
                ("at", "metric", "level", "threshold", "used", "quota_limit", "period"), width=12),
        )),
        ("Budget", (
            PanelSpec(
                "Budget: limit, grants, used and runway", "table", BUDGET_SQL,
                ("metric", "gpu_model", "period", "base_limit", "grants", "quota_limit", "used", "remaining",
                 "used_share", "runway_hours", "runway_until", "runway_from", "computed_at"), width=24,
                column_units={"used_share": "percentunit", "runway_hours": "h"},
                description="The tenant's budget lines as the latest insights run (`gpumeter insights`) "
                            "stated them (computed_at; not the range's), as `gpumeter budget show` and "
                            "`gpumeter report` do: per gpu_hours/spend limit (gpu_model all) "
                            "and per gpu_hours_by_model key, the tenants file's base limit, the grants "
                            "counted then (the tenants file's and `quota_grants`, a rollover grant of "
                            "the period before as its carry; per-model keys take none), the limit, used "
                            "from the hourly rollup, remaining, and how long it lasts: by the forecast "
                            "where its model beat the run rate, else at the period's run rate "
                            "(runway_from; empty: beyond the period, 0: exhausted). A grant made since "
                            "shows at the next run."),
            PanelSpec(
                "Budget grants", "table", GRANTS_SQL,
                ("grant", "metric", "amount", "effective_at", "expires_at", "rollover", "home_month", "note"),
                width=12,
                description="Grants of `quota_grants` in force at the range's end and effective since the "
                            "start of the month before (each number once, corrections folded in). One of "
                            "the current quota period counts in full, a rollover grant of the period "
                            "before as its unused part; grants in the tenants file are not in this table "
                            "(the Budget table counts them, with each carry)."),
            PanelSpec(
                "GPU-hours by GPU model this month", "table",
                "SELECT gpu_model, sum(unit_seconds) / 3600 AS gpu_hours\n"
                "FROM usage_hourly\n"
                f"WHERE kind = 'gpu' AND {TENANT} AND period = {MONTH_OF_RANGE_END} AND hour <= $__toTime\n"
                "GROUP BY gpu_model\nORDER BY gpu_model",
                ("gpu_model", "gpu_hours"), width=12, column_units={"gpu_hours": "h"},
                description="Use by the samples' own GPU model, limited or not (the Budget table has "
                            "each gpu_hours_by_model key with its limit)."),
        )),
        ("Preemptions and idle GPUs", (
            PanelSpec(
                "Preemptions suffered", "table",
                "SELECT at, namespace, pod, node, gpus, capacity_type, priority, metric, action, cause\n"
                "FROM preemptions FINAL\n"
                f"WHERE {TENANT} AND $__timeFilter(at)\n"
                "ORDER BY at DESC\nLIMIT 500",
                ("at", "namespace", "pod", "node", "gpus", "capacity_type", "priority", "metric", "action",
                 "cause"), width=12),
            PanelSpec(
                "Idle GPUs", "table",
                "SELECT namespace, pod, node, gpu_model, gpus, idle_since, idle_hours, mean_utilization,\n"
                "       cost_per_day\n"
                "FROM advice FINAL\n"
                f"WHERE kind = 'idle_gpu' AND {TENANT} AND detected_at = {LATEST_RUN}\n"
                "ORDER BY cost_per_day DESC, pod",
                ("namespace", "pod", "node", "gpu_model", "gpus", "idle_since", "idle_hours",
                 "mean_utilization", "cost_per_day"), width=12,
                column_units={"cost_per_day": "currencyUSD", "idle_hours": "h",
                              "mean_utilization": "percentunit"}),
        )),
    ),
)

OPERATIONS = DashboardSpec(
    uid="gpumeter-operations",
    title="gpumeter / Operations",
    description="Pipeline lag and throughput, dead letters, samples per node, idle GPUs, quota events "
                "and evictions.",
    tags=("gpumeter", "operations"),
    time_from="now-6h",
    variables=(),
    rows=(
        ("Pipeline", (
            PanelSpec(
                "Pipeline lag (window end to stored)", "timeseries",
                "SELECT $__timeInterval(inserted_at) AS time,\n"
                "       quantile(0.5)(dateDiff('millisecond', window_end, inserted_at)) / 1000\n"
                "           AS lag_p50_s,\n"
                "       quantile(0.99)(dateDiff('millisecond', window_end, inserted_at)) / 1000\n"
                "           AS lag_p99_s\n"
                "FROM rated_usage\n"
                "WHERE $__timeFilter(inserted_at)\n"
                "GROUP BY time\nORDER BY time",
                ("time", "lag_p50_s", "lag_p99_s"), Format.TIME_SERIES, unit="s", width=12,
                description="From the end of a usage window to its row in ClickHouse."),
            PanelSpec(
                "Samples stored per second", "timeseries",
                "SELECT $__timeInterval(inserted_at) AS time, count() / $__interval_s AS samples_per_s\n"
                "FROM rated_usage\n"
                "WHERE $__timeFilter(inserted_at)\n"
                "GROUP BY time\nORDER BY time",
                ("time", "samples_per_s"), Format.TIME_SERIES, unit="short", width=12),
            PanelSpec(
                "Dead letters by reason", "timeseries",
                "SELECT $__timeInterval(rejected_at) AS time, reason_code, count() AS dead_letters\n"
                "FROM dead_letters FINAL\n"
                "WHERE $__timeFilter(rejected_at)\n"
                "GROUP BY time, reason_code\nORDER BY time, reason_code",
                ("time", "reason_code", "dead_letters"), Format.TIME_SERIES, unit="short", width=12),
            PanelSpec(
                "Dead letters, totals", "table",
                "SELECT reason_code, count() AS dead_letters, max(rejected_at) AS last_seen,\n"
                "       any(reason) AS example\n"
                "FROM dead_letters FINAL\n"
                "WHERE $__timeFilter(rejected_at)\n"
                "GROUP BY reason_code\nORDER BY dead_letters DESC, reason_code",
                ("reason_code", "dead_letters", "last_seen", "example"), width=12),
            PanelSpec(
                "Samples per node", "table",
                "SELECT cluster, node, count() AS samples, uniqExact(pod_uid) AS pods,\n"
                "       max(window_end) AS last_window_end\n"
                "FROM rated_usage FINAL\n"
                "WHERE $__timeFilter(window_start)\n"
                "GROUP BY cluster, node\nORDER BY cluster, node",
                ("cluster", "node", "samples", "pods", "last_window_end"), width=24),
        )),
        ("Idle GPUs", (
            PanelSpec(
                "Idle GPUs now", "stat",
                "SELECT sum(gpus) AS idle_gpus, sum(cost_per_day) AS idle_cost_per_day\n"
                "FROM advice FINAL\n"
                f"WHERE kind = 'idle_gpu' AND detected_at = {LATEST_RUN}",
                ("idle_gpus", "idle_cost_per_day"), width=6, height=8,
                column_units={"idle_gpus": "short", "idle_cost_per_day": "currencyUSD"}),
            PanelSpec(
                "Idle GPUs", "table",
                "SELECT tenant, namespace, pod, node, gpu_model, capacity_type, gpus, idle_since,\n"
                "       idle_hours,\n"
                "       mean_utilization, cost_per_day, wasted_so_far\n"
                "FROM advice FINAL\n"
                f"WHERE kind = 'idle_gpu' AND detected_at = {LATEST_RUN}\n"
                "ORDER BY cost_per_day DESC, tenant, pod",
                ("tenant", "namespace", "pod", "node", "gpu_model", "capacity_type", "gpus", "idle_since",
                 "idle_hours", "mean_utilization", "cost_per_day", "wasted_so_far"), width=18,
                column_units={"cost_per_day": "currencyUSD", "wasted_so_far": "currencyUSD",
                              "idle_hours": "h", "mean_utilization": "percentunit"},
                description="Allocated GPUs under the utilization threshold for a sustained time "
                            "(advice only: nothing is evicted by it)."),
        )),
        ("Quotas and evictions", (
            PanelSpec(
                "Quota events", "timeseries",
                "SELECT $__timeInterval(at) AS time, level, count() AS events\n"
                "FROM quota_events FINAL\n"
                "WHERE $__timeFilter(at)\n"
                "GROUP BY time, level\nORDER BY time, level",
                ("time", "level", "events"), Format.TIME_SERIES, unit="short", width=12),
            PanelSpec(
                "Evictions", "table",
                "SELECT at, tenant, namespace, pod, node, gpus, action, metric, cause\n"
                "FROM preemptions FINAL\n"
                "WHERE $__timeFilter(at)\n"
                "ORDER BY at DESC\nLIMIT 500",
                ("at", "tenant", "namespace", "pod", "node", "gpus", "action", "metric", "cause"), width=12),
        )),
    ),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (FINANCE, TENANT_DASHBOARD, OPERATIONS)
