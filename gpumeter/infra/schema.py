"""The pipeline's tables: rated usage, dead letters and the hourly rollup, declared once.

The rating worker writes them; pricing, reconciliation and dashboards read them. They live
in infra because both a component (streams) and the domain (pricing) use them.

Idempotency by event_id is layered:
1. ``event_ids`` (EmbeddedRocksDB, a key-value table keyed by event_id) remembers the billing
   fields of the first stored copy of every id. The sink looks a batch's ids up there by key:
   the cost is one point lookup per id, whatever the month-to-date row count, and it finds
   the id in any tenant and any month. Same fields: a duplicate, skipped; other fields: a
   ``duplicate_conflict`` dead letter (contract 1: the first stored copy wins).
2. rated_usage is ordered by (tenant, window_start, event_id): time-local, so the sink's
   retry check (rows of this batch already inserted before an ambiguous failure, whose ids
   had not reached event_ids yet) touches only the granules of the batch's own windows.
3. rated_usage is a ReplacingMergeTree and invoice queries read it with FINAL: an exact
   duplicate that slipped past (1) and (2), e.g. two sink instances racing during a
   rebalance, shares its sort key (copies share window_start) and is billed once.
"""

from __future__ import annotations

from gpumeter.infra.tables import Column, Migration, SchemaOwner, Table

RATED_USAGE = Table(
    name="rated_usage",
    columns=(
        Column("event_id", "String"),
        Column("tenant", "LowCardinality(String)"),
        Column("period", "LowCardinality(String)"),
        Column("kind", "LowCardinality(String)"),
        Column("cluster", "LowCardinality(String)"),
        Column("node", "LowCardinality(String)"),
        Column("namespace", "LowCardinality(String)"),
        Column("pod", "String"),
        Column("pod_uid", "String"),
        Column("window_start", "DateTime64(6, 'UTC')"),
        Column("window_end", "DateTime64(6, 'UTC')"),
        Column("quantity", "Decimal(38, 12)"),
        # 21 places: a 12-place quantity times a nanosecond (RFC3339Nano) window stays exact.
        Column("unit_seconds", "Decimal(38, 21)"),
        Column("gpu_model", "LowCardinality(Nullable(String))"),
        Column("mig_profile", "LowCardinality(Nullable(String))"),
        Column("capacity_type", "LowCardinality(String)"),
        Column("priority", "Int32"),
        Column("rate_card", "LowCardinality(String)"),
        Column("currency", "LowCardinality(String)"),
        Column("unit_price", "Decimal(38, 12)"),
        Column("capacity_multiplier", "Decimal(38, 12)"),
        Column("list_cost", "Decimal(38, 18)"),
        Column("utilization", "Nullable(Decimal(18, 6))"),
        Column("energy_joules", "Nullable(Decimal(38, 6))"),
        Column("labels", "Map(String, String)"),
        Column("source_partition", "Int32"),
        Column("source_offset", "Int64"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree",
    partition_by="period",
    order_by="(tenant, window_start, event_id)",
)

# The fields two copies of one event_id must agree on (the rating stage's fingerprint).
FINGERPRINT_COLUMNS = ("tenant", "kind", "window_start", "window_end", "quantity", "unit_seconds",
                       "gpu_model", "mig_profile", "capacity_type")

EVENT_IDS = Table(
    name="event_ids",
    columns=(
        Column("event_id", "String"),
        *(RATED_USAGE.column(name) for name in FINGERPRINT_COLUMNS),
        Column("period", "String"),
    ),
    engine="EmbeddedRocksDB",
    order_by=None,
    primary_key="event_id",
)

DEAD_LETTERS = Table(
    name="dead_letters",
    columns=(
        Column("reason_code", "LowCardinality(String)"),
        Column("reason", "String"),
        Column("raw", "String"),
        Column("source_topic", "LowCardinality(String)"),
        Column("source_partition", "Int32"),
        Column("source_offset", "Int64"),
        Column("source_index", "UInt32"),
        Column("event_id", "Nullable(String)"),
        Column("tenant", "Nullable(String)"),
        Column("rejected_at", "DateTime64(3, 'UTC')"),
    ),
    engine="ReplacingMergeTree",
    order_by="(source_topic, source_partition, source_offset, source_index)",
)

USAGE_HOURLY = Table(
    name="usage_hourly",
    columns=(
        Column("period", "LowCardinality(String)"),
        Column("hour", "DateTime('UTC')"),
        Column("tenant", "LowCardinality(String)"),
        Column("rate_card", "LowCardinality(String)"),
        Column("kind", "LowCardinality(String)"),
        Column("gpu_model", "LowCardinality(String)"),
        Column("mig_profile", "LowCardinality(String)"),
        Column("capacity_type", "LowCardinality(String)"),
        Column("unit_seconds", "Decimal(38, 21)"),
        Column("list_cost", "Decimal(38, 18)"),
        Column("samples", "UInt64"),
    ),
    engine="SummingMergeTree",
    partition_by="period",
    order_by="(tenant, hour, rate_card, kind, gpu_model, mig_profile, capacity_type)",
)

USAGE_HOURLY_MV = """
CREATE MATERIALIZED VIEW IF NOT EXISTS usage_hourly_mv TO usage_hourly AS
SELECT period, toStartOfHour(window_start) AS hour, tenant, rate_card, kind,
       ifNull(gpu_model, '') AS gpu_model, ifNull(mig_profile, '') AS mig_profile,
       capacity_type, sum(unit_seconds) AS unit_seconds, sum(list_cost) AS list_cost,
       count() AS samples
FROM rated_usage
GROUP BY period, hour, tenant, rate_card, kind, gpu_model, mig_profile, capacity_type
"""

QUOTA_EVENTS = Table(
    name="quota_events",
    columns=(
        Column("event_id", "String"),
        Column("tenant", "LowCardinality(String)"),
        Column("metric", "LowCardinality(String)"),
        Column("level", "LowCardinality(String)"),
        Column("threshold", "Decimal(18, 6)"),
        Column("used", "Decimal(38, 12)"),
        Column("limit", "Decimal(38, 12)"),
        Column("period", "LowCardinality(String)"),
        Column("at", "DateTime64(6, 'UTC')"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    # A replay republishes the same deterministic event_id: folded here.
    engine="ReplacingMergeTree",
    order_by="(tenant, event_id)",
)

PREEMPTIONS = Table(
    name="preemptions",
    columns=(
        Column("record_id", "String"),
        Column("tenant", "LowCardinality(String)"),
        Column("namespace", "LowCardinality(String)"),
        Column("pod", "String"),
        Column("pod_uid", "String"),
        Column("node", "LowCardinality(String)"),
        Column("gpus", "Decimal(38, 12)"),
        Column("capacity_type", "LowCardinality(String)"),
        Column("priority", "Int32"),
        Column("cause", "String"),
        Column("metric", "LowCardinality(String)"),
        Column("action", "LowCardinality(String)"),
        Column("detail", "String"),
        Column("at", "DateTime64(6, 'UTC')"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree",
    order_by="(tenant, record_id)",
)

PIPELINE = SchemaOwner(
    owner="pipeline",
    migrations=(
        Migration(1, "rated usage, dead letters, hourly rollup", (
            RATED_USAGE.create_sql(), DEAD_LETTERS.create_sql(), USAGE_HOURLY.create_sql(), USAGE_HOURLY_MV,
        )),
        # A no-op where migration 1 created the current declaration; widens older tables.
        Migration(2, "unit_seconds at 21 places: RFC3339Nano windows x 12-place quantities stay exact", (
            "ALTER TABLE rated_usage MODIFY COLUMN unit_seconds Decimal(38, 21)",
            "ALTER TABLE usage_hourly MODIFY COLUMN unit_seconds Decimal(38, 21)",
        )),
        Migration(3, "quota events and preemption decisions", (
            QUOTA_EVENTS.create_sql(), PREEMPTIONS.create_sql(),
        )),
        # Copy-and-exchange: ORDER BY cannot be altered in place. Run it with the workers
        # stopped (`gpumeter worker` migrates before it consumes). The hourly rollup keeps its
        # rows: the view is detached while the copy is made, so nothing is counted twice.
        # Every step can be re-run after a failure part-way.
        Migration(4, "rated usage ordered by (tenant, window_start, event_id); event_ids by key", (
            "DROP VIEW IF EXISTS usage_hourly_mv",
            RATED_USAGE.create_sql("rated_usage_rekeyed"),
            "TRUNCATE TABLE IF EXISTS rated_usage_rekeyed",
            "INSERT INTO rated_usage_rekeyed SELECT * FROM rated_usage",
            "EXCHANGE TABLES rated_usage AND rated_usage_rekeyed",
            "DROP TABLE IF EXISTS rated_usage_rekeyed",
            USAGE_HOURLY_MV,
            EVENT_IDS.create_sql(),
            f"INSERT INTO event_ids SELECT event_id, {', '.join(FINGERPRINT_COLUMNS)}, period "
            "FROM rated_usage FINAL",
        )),
    ),
)
