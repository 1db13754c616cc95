"""The insights tables, declared once: idle-GPU advice, per-tenant forecasts and budget lines.

Written by the insights job (dashboards/insights_job.py), read by the Grafana dashboards and
`gpumeter insights`. Both are ReplacingMergeTree with the evaluation time as version: a
re-evaluation of the same idle run (same ``advice_id``) or of the same tenant, month and
metric replaces the earlier row, so readers use FINAL and see the latest word.

Only declarations here (gpumeter.infra.tables imports nothing external), so insights/
stays a pure package under the import-linter forbidden contract.
"""

from __future__ import annotations

from gpumeter.infra.tables import Column, Migration, SchemaOwner, Table

ADVICE = Table(
    name="advice",
    columns=(
        Column("advice_id", "String"),
        Column("kind", "LowCardinality(String)"),
        Column("tenant", "LowCardinality(String)"),
        Column("cluster", "LowCardinality(String)"),
        Column("node", "LowCardinality(String)"),
        Column("namespace", "LowCardinality(String)"),
        Column("pod", "String"),
        Column("pod_uid", "String"),
        Column("gpu_model", "LowCardinality(String)"),
        Column("mig_profile", "LowCardinality(Nullable(String))"),
        Column("capacity_type", "LowCardinality(String)"),
        Column("gpus", "Decimal(38, 12)"),
        Column("idle_since", "DateTime64(6, 'UTC')"),
        Column("last_seen", "DateTime64(6, 'UTC')"),
        Column("idle_hours", "Decimal(38, 6)"),
        Column("mean_utilization", "Decimal(18, 6)"),
        Column("max_utilization", "Decimal(18, 6)"),
        Column("threshold", "Decimal(18, 6)"),
        Column("price_per_gpu_hour", "Decimal(38, 12)"),
        Column("cost_per_day", "Decimal(38, 12)"),
        Column("wasted_so_far", "Decimal(38, 18)"),
        Column("currency", "LowCardinality(String)"),
        Column("message", "String"),
        Column("detected_at", "DateTime64(6, 'UTC')"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree(detected_at)",
    order_by="(tenant, advice_id)",
    shard_by="cityHash64(tenant)",
)

FORECASTS = Table(
    name="forecasts",
    columns=(
        Column("tenant", "LowCardinality(String)"),
        Column("period", "LowCardinality(String)"),
        Column("metric", "LowCardinality(String)"),
        Column("computed_at", "DateTime64(6, 'UTC')"),
        Column("model", "LowCardinality(String)"),
        Column("reason", "String"),
        Column("month_to_date", "Decimal(38, 12)"),
        Column("month_end", "Decimal(38, 12)"),
        Column("month_end_low", "Decimal(38, 12)"),
        Column("month_end_high", "Decimal(38, 12)"),
        Column("interval_level", "Decimal(9, 4)"),
        Column("quota_period", "LowCardinality(String)"),
        Column("quota_limit", "Nullable(Decimal(38, 12))"),
        Column("quota_used", "Nullable(Decimal(38, 12))"),
        Column("exhaust_at", "Nullable(DateTime64(6, 'UTC'))"),
        Column("exhaust_early", "Nullable(DateTime64(6, 'UTC'))"),
        Column("exhaust_late", "Nullable(DateTime64(6, 'UTC'))"),
        Column("exhaust_probability", "Decimal(9, 4)"),
        Column("commitment", "Nullable(Decimal(38, 12))"),
        Column("backtest_folds", "UInt16"),
        Column("backtest_wape_model", "Nullable(Float64)"),
        Column("backtest_wape_baseline", "Nullable(Float64)"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree(computed_at)",
    order_by="(tenant, period, metric)",
    shard_by="cityHash64(tenant)",
)

# One row per budget line (quota.budget) of every tenant with a limit, at each insights run: what
# `gpumeter budget show` and the report state, for the Tenant dashboard (it cannot read the
# tenants file). model_key '' is the tenant-wide line; a gpu_hours_by_model key otherwise. The
# lines of one run share computed_at (the run's time): readers take the tenant's latest run, so a
# line dropped from the tenants file stops showing.
BUDGET_LINES = Table(
    name="budget_lines",
    columns=(
        Column("tenant", "LowCardinality(String)"),
        Column("period", "LowCardinality(String)"),
        Column("metric", "LowCardinality(String)"),
        Column("model_key", "LowCardinality(String)"),
        Column("base_limit", "Decimal(38, 12)"),
        Column("granted", "Decimal(38, 12)"),
        Column("limit", "Decimal(38, 12)"),
        Column("used", "Decimal(38, 12)"),
        Column("remaining", "Decimal(38, 12)"),
        Column("runway_hours", "Nullable(Decimal(18, 1))"),
        Column("runway_until", "Nullable(DateTime64(6, 'UTC'))"),
        Column("runway_source", "LowCardinality(String)"),
        Column("computed_at", "DateTime64(6, 'UTC')"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree(computed_at)",
    order_by="(tenant, period, metric, model_key)",
    shard_by="cityHash64(tenant)",
)

# One row per evaluation, even one that found nothing: "the idle GPUs now" are the advice rows of
# the latest run, and a run with no advice must be able to say so.
INSIGHT_RUNS = Table(
    name="insight_runs",
    columns=(
        Column("run_at", "DateTime64(6, 'UTC')"),
        Column("idle_pods", "UInt32"),
        Column("forecast_tenants", "UInt32"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree",
    order_by="run_at",
)

INSIGHTS = SchemaOwner(
    owner="insights",
    migrations=(
        Migration(1, "idle-GPU advice, per-tenant forecasts, evaluation runs", (
            ADVICE.create_sql(), FORECASTS.create_sql(), INSIGHT_RUNS.create_sql(),
        )),
        Migration(2, "budget lines per tenant, metric and GPU model key", (BUDGET_LINES.create_sql(),)),
    ),
    # insight_runs (one row per evaluation) is never sharded.
    current=(ADVICE, FORECASTS, BUDGET_LINES, INSIGHT_RUNS),
)
