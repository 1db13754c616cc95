"""The pipeline's tables: rated usage, dead letters and the hourly rollup, declared once.

The rating worker writes them; pricing, reconciliation and dashboards read them. They live
in infra because both a component (streams) and the domain (pricing) use them.

Idempotency by event_id is layered:
1. ``event_ids`` remembers the billing fields of the stored copy of every id, ordered by a
   64-bit hash of the id in small granules (256 rows). The sink looks a batch's ids up there:
   one granule of 8-byte hashes per id and part, whatever the month-to-date row count, and
   it finds the id in any tenant and any month. Same fields: a duplicate, skipped; other
   fields: a ``duplicate_conflict`` dead letter (contract 1: the first stored copy wins).
   The layouts measured against it: docs/decisions/0003-idempotency-in-layers.md.
2. rated_usage is ordered by (tenant, window_start, event_id): time-local, so the sink's
   retry check (rows of this batch already inserted before an ambiguous failure, whose ids
   had not reached event_ids yet) touches only the granules of the batch's own windows.
3. rated_usage is a ReplacingMergeTree and invoice queries read it with FINAL: an exact
   duplicate that slipped past (1) and (2), e.g. two sink instances racing during a
   rebalance, shares its sort key (copies share window_start) and is billed once.
"""

from __future__ import annotations

from dataclasses import replace

from gpumeter.infra.tables import (
    Column,
    CopyByPartition,
    Drop,
    Migration,
    ModifySettings,
    SchemaOwner,
    Table,
    View,
)

INSERT_DEDUP_WINDOW = 10_000
_DEDUP_WINDOW = f"non_replicated_deduplication_window = {INSERT_DEDUP_WINDOW}"
# Sharding keys on a sharded cluster (contract 9): usage by tenant, so a tenant's copies of one
# event_id meet on one shard where FINAL folds them; id tables by the id's hash.
BY_TENANT = "cityHash64(tenant)"
BY_ID_HASH = "sipHash64(event_id)"

# rated_usage as migrations 1 and 4 created it (frozen: they have shipped), by month.
RATED_USAGE_V4 = Table(
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
        Column("source_partition", "Int32", default="-1", backfill=True),
        Column("source_offset", "Int64", default="-1", backfill=True),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="ReplacingMergeTree",
    partition_by="period",
    order_by="(tenant, window_start, event_id)",
    shard_by=BY_TENANT,
    # Migration 5 sets non_replicated_deduplication_window: the sink names each insert
    # (insert_deduplication_token) and the engine drops a repeated insert of the same rows
    # among the last INSERT_DEDUP_WINDOW inserts; a non-replicated table keeps no such log
    # otherwise. Not set here, so that the copy in migration 4, if re-run after a failure
    # part-way, is never taken for a repeat of its first attempt.
)

# Partitioned by the day of window_start since migration 11 (issue 29, point 7): the partition
# key is a function of the sort key, so copies of a sort key (which share window_start) share a
# partition, and FINAL merges each day's parts on their own and reads a day already merged into
# one part as it is (the engine decides that by itself:
# enable_automatic_decision_for_merging_across_partitions_for_final). Measured by
# benchmarks/capacity_curve.py: the month's FINAL aggregate cost 2.2 x the plain aggregate of
# the same rows when the month was one partition of several overlapping parts.
# A day stops receiving rows once it is over (late samples aside); an hour after its last
# insert, min_age_to_force_merge merges it into one part, so a closed month is read without
# merging. Merges stay within a day's rows, never the month's. A query by period keeps its
# pruning through period_minmax (a day holds one period). Retention drops days:
# docs/capacity.md.
RATED_USAGE = replace(
    RATED_USAGE_V4,
    partition_by="toYYYYMMDD(window_start)",
    settings="min_age_to_force_merge_seconds = 3600, min_age_to_force_merge_on_partition_only = 1",
    indexes=("INDEX period_minmax period TYPE minmax GRANULARITY 1",),
)

# The fields two copies of one event_id must agree on (the rating stage's fingerprint).
FINGERPRINT_COLUMNS = ("tenant", "kind", "window_start", "window_end", "quantity", "unit_seconds",
                       "gpu_model", "mig_profile", "capacity_type")

# As pipeline migration 4 created it (frozen: that migration has shipped). Its point lookups
# cost ~120 us per id at 30 million ids here; migration 5 replaces it with EVENT_IDS.
_EVENT_IDS_BY_KEY = Table(
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

ID_HASH = Column("id_hash", "UInt64", default="sipHash64(event_id)", codec="NONE")

# event_ids as migrations 5 to 7 left it (they are replayed on a fresh database as written).
EVENT_IDS_V5 = Table(
    name="event_ids",
    columns=(
        *_EVENT_IDS_BY_KEY.columns,
        # The sort key, filled by the server: 8 bytes to read per candidate row, not a 36-byte id.
        # Uncompressed: hashes do not compress, and a lookup decompresses a block per id and
        # part. A server may compress merged parts with ZSTD by default (chdb does), which made
        # a 15,000-id lookup in 30 million ids in 5 merged parts 1.8x as costly (460 against
        # 250 ms of server CPU); benchmarks/month_end.py shows its effect on ingest.
        ID_HASH,
        # Several copies of one id can be recorded (two sinks racing): the earliest is the first.
        Column("recorded_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="MergeTree",
    order_by="id_hash",
    # Small granules and compressed blocks: a lookup reads one granule per id and part, so
    # its cost follows the batch's ids, not the rows stored.
    settings="index_granularity = 256, min_compress_block_size = 4096, max_compress_block_size = 16384",
)

# The claims on every event_id (streams/sink.py): a copy's billing fields and where it was read,
# recorded before its row is stored; the first claim the server made visible wins. That order
# is the part's block number, assigned as the insert commits and kept through merges by
# enable_block_number_column (migration 8, which gave older claims the position -1, -1).
# The sink probes both id tables with a batch's ids, and a probe costs per part it reads (each
# part's granules holding a batch's ids). Grown by 20,000 sink-sized inserts to 300 million ids,
# event_id_hashes was left by ClickHouse's default merge selector (base 5) in 6 and 16 parts
# (two runs), a 15,000-id probe 325 and 454 ms; by base 1.5 in 5 and 3 parts, 270 and 183 ms
# (0.83 and 0.40 x), for about twice the merge writes (12 x the ids written against 6 x), a few
# KB/s at the fleet's 1,500 ids/s. One part would be 139 ms. `python -m benchmarks.id_lookup
# --merges`; docs/capacity.md (pipeline migration 12).
ID_MERGES = "merge_selector_base = 1.5"

EVENT_IDS = Table(
    name="event_ids",
    columns=(
        *_EVENT_IDS_BY_KEY.columns,
        Column("source_partition", "Int32", default="-1", backfill=True),
        Column("source_offset", "Int64", default="-1", backfill=True),
        *EVENT_IDS_V5.columns[len(_EVENT_IDS_BY_KEY.columns):],
    ),
    engine="MergeTree",
    order_by="id_hash",
    settings=f"{EVENT_IDS_V5.settings}, enable_block_number_column = 1, {ID_MERGES}",
    shard_by=BY_ID_HASH,
)

# Which id hashes event_ids holds, and nothing else: probed first, so that the wide event_ids
# is read only for the hashes found here (almost never: a batch's ids are new). Its 8-byte rows
# merge cheaply into fewer, larger parts than event_ids' (2-3 against 4-7 at 30-300 M rows),
# and a probe's cost is per granule and part (docs/decisions/0003-idempotency-in-layers.md).
# Written by the sink itself, before the claims (since migration 13; by a view from every
# insert into event_ids before): so a claim visible in event_ids has its hash visible here,
# and the sink's contest after claiming probes this table too (streams/sink.py). A hash whose
# claim event_ids lacks (the claim's insert failed) costs one wasted read of event_ids, never
# a wrong answer: claims are read from event_ids alone.
EVENT_ID_HASHES = Table(
    name="event_id_hashes",
    columns=(Column("id_hash", "UInt64", codec="NONE"),),
    engine="MergeTree",
    order_by="id_hash",
    settings=f"{EVENT_IDS_V5.settings}, {ID_MERGES}",
    shard_by="id_hash",  # = sipHash64(event_id): a hash lands on the shard of its event_ids row
)
# As pipeline migration 7 created it (frozen: that migration has shipped).
EVENT_ID_HASHES_V7 = replace(EVENT_ID_HASHES, settings=EVENT_IDS_V5.settings)

# The view that filled event_id_hashes from migration 7 to 12 (dropped by 13).
EVENT_ID_HASHES_VIEW = View("event_id_hashes_mv", EVENT_ID_HASHES, EVENT_IDS, "SELECT id_hash FROM {source}")
EVENT_ID_HASHES_MV = EVENT_ID_HASHES_VIEW.create_sql()

DEAD_LETTERS = Table(
    name="dead_letters",
    columns=(
        Column("reason_code", "LowCardinality(String)"),
        Column("reason", "String"),
        Column("raw", "String"),
        Column("source_topic", "LowCardinality(String)"),
        Column("source_partition", "Int32", default="-1", backfill=True),
        Column("source_offset", "Int64", default="-1", backfill=True),
        Column("source_index", "UInt32"),
        Column("event_id", "Nullable(String)"),
        Column("tenant", "Nullable(String)"),
        Column("rejected_at", "DateTime64(3, 'UTC')"),
    ),
    engine="ReplacingMergeTree",
    order_by="(source_topic, source_partition, source_offset, source_index)",
    # A redelivered record meets its first copy on one shard, where the engine folds them.
    shard_by="cityHash64(source_topic, source_partition)",
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
    shard_by=BY_TENANT,
    # Migration 5 gives it a deduplication window too: a view's target drops the block of a
    # deduplicated insert only with a window of its own (else a dropped repeat still counts).
)

USAGE_HOURLY_VIEW = View("usage_hourly_mv", USAGE_HOURLY, RATED_USAGE, """
SELECT period, toStartOfHour(window_start) AS hour, tenant, rate_card, kind,
       ifNull(gpu_model, '') AS gpu_model, ifNull(mig_profile, '') AS mig_profile,
       capacity_type, sum(unit_seconds) AS unit_seconds, sum(list_cost) AS list_cost,
       count() AS samples
FROM {source}
GROUP BY period, hour, tenant, rate_card, kind, gpu_model, mig_profile, capacity_type
""")
USAGE_HOURLY_MV = USAGE_HOURLY_VIEW.create_sql()

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
        # Amendment "per-model limits": the model key; NULL for tenant-wide metrics.
        Column("gpu_model", "LowCardinality(Nullable(String))"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    # A replay republishes the same deterministic event_id: folded here.
    engine="ReplacingMergeTree",
    order_by="(tenant, event_id)",
    shard_by=BY_TENANT,
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
    shard_by=BY_TENANT,
)

# Budget grants (contract 4, amendment "grants"), numbered by claims: gpumeter/infra/grants.py.
GRANTS_DEDUP_WINDOW = 1000

GRANTS = Table(
    name="quota_grants",
    columns=(
        Column("number", "UInt64", comment="1, 2, 3, ... one row each"),
        Column("tenant", "LowCardinality(String)"),
        Column("metric", "LowCardinality(String)", comment="gpu_hours | spend"),
        Column("amount", "Decimal(38, 6)", comment="hours or money; negative for a correction"),
        Column("effective_at", "DateTime64(6, 'UTC')"),
        Column("expires_at", "Nullable(DateTime64(6, 'UTC'))"),
        Column("rollover", "Bool"),
        Column("corrects", "Nullable(UInt64)", comment="the grant a correction takes from"),
        Column("note", "String"),
        Column("granted_at", "DateTime64(6, 'UTC')"),
        Column("claim", "String", comment="the writer that took the number"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="MergeTree",
    order_by="number",
    # Never sharded: one replica set on a cluster, so a claim is decided cluster-wide.
    dedup_window=GRANTS_DEDUP_WINDOW,
)

_EVENT_ID_COLUMNS = ", ".join(EVENT_IDS_V5.insert_columns)

PIPELINE = SchemaOwner(
    owner="pipeline",
    migrations=(
        Migration(1, "rated usage, dead letters, hourly rollup", (
            RATED_USAGE_V4.create_sql(), DEAD_LETTERS.create_sql(), USAGE_HOURLY.create_sql(),
            USAGE_HOURLY_MV,
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
            # Dropped, not emptied (as shipped first): after a failure past the exchange the
            # twin holds the old layout, and emptying it copied the rows back into that layout.
            "DROP TABLE IF EXISTS rated_usage_rekeyed",
            RATED_USAGE_V4.create_sql("rated_usage_rekeyed"),
            "INSERT INTO rated_usage_rekeyed SELECT * FROM rated_usage",
            "EXCHANGE TABLES rated_usage AND rated_usage_rekeyed",
            "DROP TABLE IF EXISTS rated_usage_rekeyed",
            USAGE_HOURLY_MV,
            _EVENT_IDS_BY_KEY.create_sql(),
            f"INSERT INTO event_ids SELECT event_id, {', '.join(FINGERPRINT_COLUMNS)}, period "
            "FROM rated_usage FINAL",
        )),
        # Copy-and-exchange again (workers stopped), re-runnable: event_ids from key-value to a
        # MergeTree ordered by a hash of the id; the tables a sink insert reaches keep a log of
        # recent insert tokens.
        Migration(5, "event_ids ordered by sipHash64(event_id); insert deduplication windows", (
            "DROP TABLE IF EXISTS event_ids_rebuilt",
            EVENT_IDS_V5.create_sql("event_ids_rebuilt"),
            f"INSERT INTO event_ids_rebuilt ({_EVENT_ID_COLUMNS}) SELECT {_EVENT_ID_COLUMNS} FROM event_ids",
            "EXCHANGE TABLES event_ids AND event_ids_rebuilt",
            "DROP TABLE IF EXISTS event_ids_rebuilt",
            f"ALTER TABLE rated_usage MODIFY SETTING {_DEDUP_WINDOW}",
            f"ALTER TABLE usage_hourly MODIFY SETTING {_DEDUP_WINDOW}",
        )),
        # Re-runnable, metadata only: new parts are written uncompressed and existing ones as
        # merges rewrite them. The engine refuses to MATERIALIZE a sort-key column; an operator
        # who wants every part converted at once runs OPTIMIZE TABLE event_ids FINAL.
        Migration(6, "event_ids.id_hash uncompressed", (
            f"ALTER TABLE event_ids MODIFY COLUMN {ID_HASH.ddl}",
        )),
        # Re-runnable (the view is dropped before the table is emptied and exists before the
        # copy starts, so an id recorded meanwhile is in the copy or comes through the view).
        Migration(7, "event_id_hashes: the ids' hashes alone, probed before event_ids", (
            EVENT_ID_HASHES_V7.create_sql(),
            "DROP VIEW IF EXISTS event_id_hashes_mv",
            f"TRUNCATE TABLE {EVENT_ID_HASHES.name}",
            EVENT_ID_HASHES_MV,
            f"INSERT INTO {EVENT_ID_HASHES.name} SELECT id_hash FROM {EVENT_IDS.name}",
        )),
        # Metadata only, re-runnable. Ids recorded before it were recorded after their rows
        # were stored, so their unknown position (-1) never makes a replay look like their own.
        Migration(8, "event_ids are claims: their source position, ordered by block number", (
            "ALTER TABLE event_ids ADD COLUMN IF NOT EXISTS source_partition Int32 DEFAULT -1 AFTER period",
            "ALTER TABLE event_ids ADD COLUMN IF NOT EXISTS source_offset Int64 DEFAULT -1 "
            "AFTER source_partition",
            "ALTER TABLE event_ids MODIFY SETTING enable_block_number_column = 1",
        )),
        Migration(9, "quota_grants: numbered, append-only budget grants", (GRANTS.create_sql(),)),
        # A no-op where migration 3 created the current declaration.
        Migration(10, "quota_events.gpu_model: the model key of a per-model limit", (
            "ALTER TABLE quota_events ADD COLUMN IF NOT EXISTS gpu_model LowCardinality(Nullable(String)) "
            "AFTER at",
        )),
        # Copy-and-exchange (workers stopped: `gpumeter migrate`), one day at a time
        # (CopyByPartition). Re-runnable: the twin is dropped, not emptied, before it is made,
        # so a run that failed after the exchange copies the new table again instead of turning
        # the old layout back; the rollup's view is detached during the copy, as in migration 4.
        Migration(11, "rated_usage partitioned by day of window_start: FINAL merges within a day", (
            "DROP VIEW IF EXISTS usage_hourly_mv",
            "DROP TABLE IF EXISTS rated_usage_by_day",
            RATED_USAGE.create_sql("rated_usage_by_day"),
            CopyByPartition("rated_usage", "rated_usage_by_day", by="toYYYYMMDD(window_start)",
                            where="period"),
            "EXCHANGE TABLES rated_usage AND rated_usage_by_day",
            "DROP TABLE IF EXISTS rated_usage_by_day",
            f"ALTER TABLE rated_usage MODIFY SETTING {_DEDUP_WINDOW}",
            USAGE_HOURLY_MV,
        )),
        # Metadata only: merges from now on keep the id tables in fewer, larger parts. Written
        # for every topology (on a cluster: the _local tables, ON CLUSTER).
        Migration(12, "id tables merge into fewer parts: the sink's probe reads fewer", (
            ModifySettings(EVENT_IDS, ID_MERGES), ModifySettings(EVENT_ID_HASHES, ID_MERGES),
        )),
        # The sink writes a batch's hashes itself, before its claims (streams/sink.py), so the
        # view that copied each claim's hash goes. Workers stopped (`gpumeter migrate`): a sink
        # of before it would claim without hashes. Written for every topology, re-runnable.
        Migration(13, "event_id_hashes written by the sink before its claims, not by a view", (
            Drop(EVENT_ID_HASHES_VIEW),
        )),
    ),
    # What migrations 1 to 13 leave, for a fresh cluster database (the insert deduplication
    # windows were set by migration 5). tests/integration/test_cluster_schema.py compares it
    # with a database the migrations built.
    current=(
        replace(RATED_USAGE, dedup_window=INSERT_DEDUP_WINDOW), DEAD_LETTERS,
        replace(USAGE_HOURLY, dedup_window=INSERT_DEDUP_WINDOW), USAGE_HOURLY_VIEW,
        QUOTA_EVENTS, PREEMPTIONS, EVENT_IDS, EVENT_ID_HASHES, GRANTS,
    ),
)
