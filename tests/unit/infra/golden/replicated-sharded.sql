CREATE TABLE IF NOT EXISTS schema_migrations ON CLUSTER gpumeter_cluster (
    owner LowCardinality(String),
    version UInt32,
    name String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/global/{database}/schema_migrations', '{shard}-{replica}')
ORDER BY (owner, version);

CREATE TABLE IF NOT EXISTS schema_lock ON CLUSTER gpumeter_cluster (
    seq UInt64,
    holder String,
    state LowCardinality(String) COMMENT 'held | released',
    expires_at DateTime64(3, 'UTC'),
    at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/global/{database}/schema_lock', '{shard}-{replica}')
ORDER BY seq
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS rated_usage_local ON CLUSTER gpumeter_cluster (
    event_id String,
    tenant LowCardinality(String),
    period LowCardinality(String),
    kind LowCardinality(String),
    cluster LowCardinality(String),
    node LowCardinality(String),
    namespace LowCardinality(String),
    pod String,
    pod_uid String,
    window_start DateTime64(6, 'UTC'),
    window_end DateTime64(6, 'UTC'),
    quantity Decimal(38, 12),
    unit_seconds Decimal(38, 21),
    gpu_model LowCardinality(Nullable(String)),
    mig_profile LowCardinality(Nullable(String)),
    capacity_type LowCardinality(String),
    priority Int32,
    rate_card LowCardinality(String),
    currency LowCardinality(String),
    unit_price Decimal(38, 12),
    capacity_multiplier Decimal(38, 12),
    list_cost Decimal(38, 18),
    utilization Nullable(Decimal(18, 6)),
    energy_joules Nullable(Decimal(38, 6)),
    labels Map(String, String),
    source_partition Int32 DEFAULT -1,
    source_offset Int64 DEFAULT -1,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3),
    INDEX period_minmax period TYPE minmax GRANULARITY 1
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rated_usage_local', '{replica}')
PARTITION BY toYYYYMMDD(window_start)
ORDER BY (tenant, window_start, event_id)
SETTINGS min_age_to_force_merge_seconds = 3600, min_age_to_force_merge_on_partition_only = 1, replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS rated_usage ON CLUSTER gpumeter_cluster AS rated_usage_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), rated_usage_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS dead_letters_local ON CLUSTER gpumeter_cluster (
    reason_code LowCardinality(String),
    reason String,
    raw String,
    source_topic LowCardinality(String),
    source_partition Int32 DEFAULT -1,
    source_offset Int64 DEFAULT -1,
    source_index UInt32,
    event_id Nullable(String),
    tenant Nullable(String),
    rejected_at DateTime64(3, 'UTC')
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/dead_letters_local', '{replica}')
ORDER BY (source_topic, source_partition, source_offset, source_index);

CREATE TABLE IF NOT EXISTS dead_letters ON CLUSTER gpumeter_cluster AS dead_letters_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), dead_letters_local, cityHash64(source_topic, source_partition));

CREATE TABLE IF NOT EXISTS usage_hourly_local ON CLUSTER gpumeter_cluster (
    period LowCardinality(String),
    hour DateTime('UTC'),
    tenant LowCardinality(String),
    rate_card LowCardinality(String),
    kind LowCardinality(String),
    gpu_model LowCardinality(String),
    mig_profile LowCardinality(String),
    capacity_type LowCardinality(String),
    unit_seconds Decimal(38, 21),
    list_cost Decimal(38, 18),
    samples UInt64
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/usage_hourly_local', '{replica}')
PARTITION BY period
ORDER BY (tenant, hour, rate_card, kind, gpu_model, mig_profile, capacity_type)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS usage_hourly ON CLUSTER gpumeter_cluster AS usage_hourly_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), usage_hourly_local, cityHash64(tenant));

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_hourly_mv ON CLUSTER gpumeter_cluster TO usage_hourly_local AS SELECT period, toStartOfHour(window_start) AS hour, tenant, rate_card, kind,
       ifNull(gpu_model, '') AS gpu_model, ifNull(mig_profile, '') AS mig_profile,
       capacity_type, sum(unit_seconds) AS unit_seconds, sum(list_cost) AS list_cost,
       count() AS samples
FROM rated_usage_local
GROUP BY period, hour, tenant, rate_card, kind, gpu_model, mig_profile, capacity_type;

CREATE TABLE IF NOT EXISTS quota_events_local ON CLUSTER gpumeter_cluster (
    event_id String,
    tenant LowCardinality(String),
    metric LowCardinality(String),
    level LowCardinality(String),
    threshold Decimal(18, 6),
    used Decimal(38, 12),
    limit Decimal(38, 12),
    period LowCardinality(String),
    at DateTime64(6, 'UTC'),
    gpu_model LowCardinality(Nullable(String)),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/quota_events_local', '{replica}')
ORDER BY (tenant, event_id);

CREATE TABLE IF NOT EXISTS quota_events ON CLUSTER gpumeter_cluster AS quota_events_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), quota_events_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS preemptions_local ON CLUSTER gpumeter_cluster (
    record_id String,
    tenant LowCardinality(String),
    namespace LowCardinality(String),
    pod String,
    pod_uid String,
    node LowCardinality(String),
    gpus Decimal(38, 12),
    capacity_type LowCardinality(String),
    priority Int32,
    cause String,
    metric LowCardinality(String),
    action LowCardinality(String),
    detail String,
    at DateTime64(6, 'UTC'),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/preemptions_local', '{replica}')
ORDER BY (tenant, record_id);

CREATE TABLE IF NOT EXISTS preemptions ON CLUSTER gpumeter_cluster AS preemptions_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), preemptions_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS event_ids_local ON CLUSTER gpumeter_cluster (
    event_id String,
    tenant LowCardinality(String),
    kind LowCardinality(String),
    window_start DateTime64(6, 'UTC'),
    window_end DateTime64(6, 'UTC'),
    quantity Decimal(38, 12),
    unit_seconds Decimal(38, 21),
    gpu_model LowCardinality(Nullable(String)),
    mig_profile LowCardinality(Nullable(String)),
    capacity_type LowCardinality(String),
    period String,
    source_partition Int32 DEFAULT -1,
    source_offset Int64 DEFAULT -1,
    id_hash UInt64 DEFAULT sipHash64(event_id) CODEC(NONE),
    recorded_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/event_ids_local', '{replica}')
ORDER BY id_hash
SETTINGS index_granularity = 256, min_compress_block_size = 4096, max_compress_block_size = 16384, enable_block_number_column = 1, merge_selector_base = 1.5;

CREATE TABLE IF NOT EXISTS event_ids ON CLUSTER gpumeter_cluster AS event_ids_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), event_ids_local, sipHash64(event_id));

CREATE TABLE IF NOT EXISTS event_id_hashes_local ON CLUSTER gpumeter_cluster (
    id_hash UInt64 CODEC(NONE)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/event_id_hashes_local', '{replica}')
ORDER BY id_hash
SETTINGS index_granularity = 256, min_compress_block_size = 4096, max_compress_block_size = 16384, merge_selector_base = 1.5;

CREATE TABLE IF NOT EXISTS event_id_hashes ON CLUSTER gpumeter_cluster AS event_id_hashes_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), event_id_hashes_local, id_hash);

CREATE TABLE IF NOT EXISTS quota_grants ON CLUSTER gpumeter_cluster (
    number UInt64 COMMENT '1, 2, 3, ... one row each',
    tenant LowCardinality(String),
    metric LowCardinality(String) COMMENT 'gpu_hours | spend',
    amount Decimal(38, 6) COMMENT 'hours or money; negative for a correction',
    effective_at DateTime64(6, 'UTC'),
    expires_at Nullable(DateTime64(6, 'UTC')),
    rollover Bool,
    corrects Nullable(UInt64) COMMENT 'the grant a correction takes from',
    note String,
    granted_at DateTime64(6, 'UTC'),
    claim String COMMENT 'the writer that took the number',
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/global/{database}/quota_grants', '{shard}-{replica}')
ORDER BY number
SETTINGS replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS invoices ON CLUSTER gpumeter_cluster (
    tenant LowCardinality(String),
    period LowCardinality(String),
    seq UInt32,
    status LowCardinality(String),
    document String,
    exact_quantities String,
    finalized_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/global/{database}/invoices', '{shard}-{replica}')
ORDER BY (tenant, period, seq);

CREATE TABLE IF NOT EXISTS invoice_ledger ON CLUSTER gpumeter_cluster (
    seq UInt64 COMMENT 'global position, 1, 2, 3, ... without gaps',
    year UInt16,
    year_seq UInt32 COMMENT 'number within the year: GM-<year>-<year_seq>',
    number String,
    tenant LowCardinality(String),
    period LowCardinality(String),
    status LowCardinality(String) COMMENT 'final | adjustment',
    adjusts String COMMENT 'an adjustment''s final; empty for a final',
    document String COMMENT 'canonical JSON of the issued invoice',
    content_sha256 String,
    chain_sha256 String COMMENT 'sha256(previous chain_sha256 '':'' content_sha256)',
    exact_quantities String COMMENT 'unrounded line quantities, JSON list',
    credit_draws String COMMENT 'credits applied per source, JSON object',
    claim String COMMENT 'the close run that wrote the row',
    issued_at DateTime64(3, 'UTC'),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/global/{database}/invoice_ledger', '{shard}-{replica}')
ORDER BY seq
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS advice_local ON CLUSTER gpumeter_cluster (
    advice_id String,
    kind LowCardinality(String),
    tenant LowCardinality(String),
    cluster LowCardinality(String),
    node LowCardinality(String),
    namespace LowCardinality(String),
    pod String,
    pod_uid String,
    gpu_model LowCardinality(String),
    mig_profile LowCardinality(Nullable(String)),
    capacity_type LowCardinality(String),
    gpus Decimal(38, 12),
    idle_since DateTime64(6, 'UTC'),
    last_seen DateTime64(6, 'UTC'),
    idle_hours Decimal(38, 6),
    mean_utilization Decimal(18, 6),
    max_utilization Decimal(18, 6),
    threshold Decimal(18, 6),
    price_per_gpu_hour Decimal(38, 12),
    cost_per_day Decimal(38, 12),
    wasted_so_far Decimal(38, 18),
    currency LowCardinality(String),
    message String,
    detected_at DateTime64(6, 'UTC'),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/advice_local', '{replica}', detected_at)
ORDER BY (tenant, advice_id);

CREATE TABLE IF NOT EXISTS advice ON CLUSTER gpumeter_cluster AS advice_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), advice_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS forecasts_local ON CLUSTER gpumeter_cluster (
    tenant LowCardinality(String),
    period LowCardinality(String),
    metric LowCardinality(String),
    computed_at DateTime64(6, 'UTC'),
    model LowCardinality(String),
    reason String,
    month_to_date Decimal(38, 12),
    month_end Decimal(38, 12),
    month_end_low Decimal(38, 12),
    month_end_high Decimal(38, 12),
    interval_level Decimal(9, 4),
    quota_period LowCardinality(String),
    quota_limit Nullable(Decimal(38, 12)),
    quota_used Nullable(Decimal(38, 12)),
    exhaust_at Nullable(DateTime64(6, 'UTC')),
    exhaust_early Nullable(DateTime64(6, 'UTC')),
    exhaust_late Nullable(DateTime64(6, 'UTC')),
    exhaust_probability Decimal(9, 4),
    commitment Nullable(Decimal(38, 12)),
    backtest_folds UInt16,
    backtest_wape_model Nullable(Float64),
    backtest_wape_baseline Nullable(Float64),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/forecasts_local', '{replica}', computed_at)
ORDER BY (tenant, period, metric);

CREATE TABLE IF NOT EXISTS forecasts ON CLUSTER gpumeter_cluster AS forecasts_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), forecasts_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS budget_lines_local ON CLUSTER gpumeter_cluster (
    tenant LowCardinality(String),
    period LowCardinality(String),
    metric LowCardinality(String),
    model_key LowCardinality(String),
    base_limit Decimal(38, 12),
    granted Decimal(38, 12),
    limit Decimal(38, 12),
    used Decimal(38, 12),
    remaining Decimal(38, 12),
    runway_hours Nullable(Decimal(18, 1)),
    runway_until Nullable(DateTime64(6, 'UTC')),
    runway_source LowCardinality(String),
    computed_at DateTime64(6, 'UTC'),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/budget_lines_local', '{replica}', computed_at)
ORDER BY (tenant, period, metric, model_key);

CREATE TABLE IF NOT EXISTS budget_lines ON CLUSTER gpumeter_cluster AS budget_lines_local
ENGINE = Distributed(gpumeter_cluster, currentDatabase(), budget_lines_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS insight_runs ON CLUSTER gpumeter_cluster (
    run_at DateTime64(6, 'UTC'),
    idle_pods UInt32,
    forecast_tenants UInt32,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/global/{database}/insight_runs', '{shard}-{replica}')
ORDER BY run_at;

