"""rated_usage partitioned by day (pipeline migration 11; issue 29, point 7), on the real engine.

The month's close reads ``rated_usage FINAL``. With the month as one partition of overlapping
parts, FINAL merged every part of the month; partitioned by the day of ``window_start`` (a
function of the sort key, so copies of one key share a day), it merges only a day that has
several parts, and a day merged into one part is read as it is. Checked here by what the
engine plans (EXPLAIN), never by timing; the gain is measured by benchmarks/capacity_curve.py.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, migrations
from gpumeter.infra.schema import (
    EVENT_ID_HASHES_VIEW,
    INSERT_DEDUP_WINDOW,
    PIPELINE,
    RATED_USAGE,
    RATED_USAGE_V4,
)
from tests.integration.test_dedup import CREATE_QUERY, rerun
from tests.support.migrations import pipeline_since

pytestmark = [pytest.mark.integration, pytest.mark.single_node]

ROWS = 2_000
START = datetime(2026, 11, 10, tzinfo=UTC)
STEP = timedelta(minutes=47)  # 2,000 x 47 min: 65 days, from November 10 into January
INSERT = (
    f"INSERT INTO rated_usage ({', '.join(RATED_USAGE.insert_columns)}) "
    "SELECT concat('e', toString(number)), concat('t', toString(number % 3)), "
    "toString(toYYYYMM(ws) DIV 100) || '-' || leftPad(toString(toYYYYMM(ws) % 100), 2, '0'), "
    "'gpu', 'c', 'n', 'ns', 'p', 'u', ws, ws + toIntervalSecond(60), "
    "1 + number % 4, 60 * (1 + number % 4), 'H100-SXM-80GB', NULL, 'on-demand', 0, '2026-11', 'USD', 2.5, 1, "
    "0, NULL, NULL, map(), 0, number "
    "FROM (SELECT number, "
    "toDateTime64('2026-11-10 00:00:00', 6, 'UTC') + toIntervalMinute(47 * number) AS ws "
    "FROM numbers({first}, {count}))")
FINAL_TOTALS = ("SELECT tenant, period, sum(unit_seconds) FROM rated_usage FINAL "
                "GROUP BY tenant, period ORDER BY tenant, period")
ROLLUP = ("SELECT tenant, period, sum(samples), sum(unit_seconds) FROM usage_hourly "
          "GROUP BY tenant, period ORDER BY tenant, period")
PARTITIONS = ("SELECT partition, min(min_time), max(max_time), count() FROM system.parts "
              "WHERE database = currentDatabase() AND table = 'rated_usage' AND active GROUP BY partition")


def expected_totals() -> list[tuple[str, str, Decimal]]:
    """Row n: tenant t(n % 3), window at START + 47 n minutes, (1 + n % 4) GPU-minutes; each once."""
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for n in range(ROWS):
        at = START + n * STEP
        totals[(f"t{n % 3}", f"{at.year}-{at.month:02d}")] += Decimal(60 * (1 + n % 4))
    return [(tenant, period, total) for (tenant, period), total in sorted(totals.items())]


def rewind_to_pipeline_10(client: Any) -> None:
    """rated_usage as migrations 1 to 10 left it (one partition a month), holding ROWS rows in
    several parts, and one exact copy of e5 (stored twice, as by two racing sinks); the view that
    fed the id hashes."""
    client.command("DROP VIEW IF EXISTS usage_hourly_mv")
    client.command("DROP TABLE IF EXISTS rated_usage")
    client.command("TRUNCATE TABLE usage_hourly")
    client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 11")
    client.command(replace(RATED_USAGE_V4, dedup_window=INSERT_DEDUP_WINDOW).create_sql())
    client.command(next(m for m in PIPELINE.migrations if m.version == 1).statements[-1])  # the rollup's view
    # The view that fed event_id_hashes until migration 13 dropped it (the table stays).
    client.command(EVENT_ID_HASHES_VIEW.create_sql())
    for first in range(0, ROWS, 500):
        client.command(INSERT.format(first=first, count=500))
    client.command(INSERT.format(first=5, count=1), settings={"insert_deduplicate": 0})


def totals(client: Any) -> list[tuple[str, str, Decimal]]:
    return [(str(t), str(p), Decimal(s)) for t, p, s in client.query(FINAL_TOTALS).result_rows]


def assert_partitioned_by_day(client: Any) -> None:
    key = clickhouse.scalar(client, "SELECT partition_key FROM system.tables "
                                    "WHERE database = currentDatabase() AND name = 'rated_usage'")
    assert key == "toYYYYMMDD(window_start)"
    for partition, first, last, _ in client.query(PARTITIONS).result_rows:
        assert first.date() == last.date() and first.strftime("%Y%m%d") == partition


def test_migration_11_keeps_every_row_and_partitions_by_day(settings: Settings) -> None:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        rewind_to_pipeline_10(client)
        rollup_before = client.query(ROLLUP).result_rows
        assert clickhouse.scalar(client, "SELECT count() FROM rated_usage FINAL") == ROWS
        assert migrations.migrate(client, [PIPELINE]) == pipeline_since(11)

        # Every row once: the exact copy of e5, if no merge had folded it yet, is folded by the
        # copy's own insert (optimize_on_insert), as FINAL folded it before.
        assert clickhouse.scalar(client, "SELECT count() FROM rated_usage") == ROWS
        assert clickhouse.scalar(client, "SELECT uniqExact(event_id) FROM rated_usage") == ROWS
        assert totals(client) == expected_totals()  # FINAL still folds the copy of e5
        assert_partitioned_by_day(client)
        # 65 days from November 10: every day one partition.
        assert len(client.query(PARTITIONS).result_rows) == len(
            {(START + n * STEP).date() for n in range(ROWS)})
        assert client.query(ROLLUP).result_rows == rollup_before
        create = clickhouse.scalar(client, CREATE_QUERY)
        assert f"non_replicated_deduplication_window = {INSERT_DEDUP_WINDOW}" in create
        assert "period_minmax" in create

        # Re-run as after a failure past the exchange: the new layout is copied again, not the old.
        rerun(client, 11)
        assert totals(client) == expected_totals()
        assert_partitioned_by_day(client)
        # The rollup's view is attached once: a new row reaches it once.
        client.command(INSERT.format(first=ROWS, count=1))
        assert clickhouse.scalar(client, "SELECT sum(samples) FROM usage_hourly") == sum(
            row[2] for row in rollup_before) + 1
    finally:
        client.close()


def replacing_merges(client: Any, sql: str) -> list[int]:
    """The number of streams each FINAL merge of ``sql``'s plan takes (``ReplacingSorted n → 1``)."""
    plan = "\n".join(str(row[0]) for row in client.query(f"EXPLAIN PIPELINE {sql}").result_rows)
    return [int(n) for n in re.findall(r"ReplacingSorted (\d+) →", plan)]


def test_final_merges_only_the_days_that_have_several_parts(settings: Settings) -> None:
    """Two past days merged into one part each, and today in three parts: the close's FINAL
    aggregate merges today's three parts and nothing else (with one partition a month it merged
    every part of the month)."""
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    close_sql = ("SELECT tenant, rate_card, kind, gpu_model, mig_profile, capacity_type, sum(unit_seconds) "
                 "FROM rated_usage FINAL WHERE period = '2026-11' "
                 "GROUP BY tenant, rate_card, kind, gpu_model, mig_profile, capacity_type")
    try:
        client.command("TRUNCATE TABLE rated_usage")
        # Rows 0-30 fall on Nov 10, 31-61 on Nov 11, 62-91 on Nov 12 (47 minutes apart).
        for first, count in ((0, 15), (15, 16), (31, 15), (46, 16), (62, 10), (72, 10), (82, 10)):
            client.command(INSERT.format(first=first, count=count))
        client.command("OPTIMIZE TABLE rated_usage PARTITION 20261110 FINAL")
        client.command("OPTIMIZE TABLE rated_usage PARTITION 20261111 FINAL")
        parts = {str(p): n for p, _, _, n in client.query(PARTITIONS).result_rows}
        assert parts == {"20261110": 1, "20261111": 1, "20261112": 3}
        assert replacing_merges(client, close_sql) == [3]
    finally:
        client.close()


def test_a_query_by_period_reads_only_that_months_parts(settings: Settings) -> None:
    """A day holds one period; period_minmax lets a query by period skip the other months' parts
    (the partition key no longer names the period)."""
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("TRUNCATE TABLE rated_usage")
        client.command(INSERT.format(first=0, count=ROWS))
        november = {str(p) for p, *_ in client.query(PARTITIONS).result_rows if str(p).startswith("202611")}
        everything = len(client.query(PARTITIONS).result_rows)
        sql = "EXPLAIN indexes = 1 SELECT sum(unit_seconds) FROM rated_usage WHERE period = '2026-11'"
        plan = "\n".join(str(row[0]) for row in client.query(sql).result_rows)
        skip = plan[plan.index("period_minmax"):]
        selected, total = map(int, re.search(r"Parts: (\d+)/(\d+)", skip).groups())  # type: ignore[union-attr]
        assert (selected, total) == (len(november), everything)
        assert selected < total
    finally:
        client.close()
