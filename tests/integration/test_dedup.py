"""The same event_id is billed once, whatever differs between its copies (contract 1, amended).

On the real broker and the real ClickHouse engine, through the worker. Each copy below
arrives after a worker restart, so the rating stage's in-memory window has forgotten the
id: only the store can tell. Before event_ids (and with rated_usage keyed by tenant and
event_id) the sink's anti-join looked for the id in the new copy's own tenant and month
only, so a copy with another month or tenant was billed a second time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, migrations
from gpumeter.infra.schema import EVENT_IDS_V5, PIPELINE, RATED_USAGE, RATED_USAGE_V4
from gpumeter.infra.tables import SINGLE_NODE, Topology
from testkit.builders import sample
from tests.integration.invoice_checks import count_rows, publish_lines
from tests.services import run_cli
from tests.support.migrations import pipeline_since

pytestmark = pytest.mark.integration

FIRST = sample("gpu-hour-1", tenant="team-a", start="2026-11-30T23:00:00Z", seconds=3600, quantity="1")
COPIES: dict[str, dict[str, Any]] = {
    # The case: re-sent after a restart with a December window and quantity 3.
    "december-and-quantity-3": sample("gpu-hour-1", tenant="team-a", start="2026-12-01T00:00:00Z",
                                      seconds=3600, quantity="3"),
    "another-tenant": sample("gpu-hour-1", tenant="team-b", start="2026-11-30T23:00:00Z", seconds=3600,
                             quantity="1"),
    "another-quantity": sample("gpu-hour-1", tenant="team-a", start="2026-11-30T23:00:00Z", seconds=3600,
                               quantity="2"),
}


def run_through_worker(settings: Settings, worker_factory: Callable[..., WorkerProcess],
                       lines: list[dict[str, Any]]) -> None:
    worker = worker_factory(settings)
    publish_lines(settings, [json.dumps(line).encode() for line in lines])
    drained = run_cli(settings, "drain", "--timeout", "120")
    assert drained.returncode == 0, drained.stderr
    worker.stop()


def billed(settings: Settings) -> list[tuple[str, str, Decimal]]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        rows = client.query(
            "SELECT tenant, period, sum(unit_seconds) FROM rated_usage FINAL "
            "WHERE event_id = 'gpu-hour-1' GROUP BY tenant, period ORDER BY tenant, period").result_rows
    finally:
        client.close()
    return [(tenant, period, Decimal(seconds)) for tenant, period, seconds in rows]


@pytest.mark.parametrize("copy", COPIES.values(), ids=COPIES.keys())
def test_a_differing_copy_after_a_restart_is_a_conflict_and_the_first_stays_billed(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], copy: dict[str, Any]
) -> None:
    run_through_worker(settings, worker_factory, [FIRST])
    run_through_worker(settings, worker_factory, [copy])  # a new worker: nothing in memory

    # One GPU for one hour in November, as first sent; nothing anywhere else.
    assert billed(settings) == [("team-a", "2026-11", Decimal(3600))]
    assert count_rows(settings, "SELECT count() FROM dead_letters FINAL WHERE event_id = 'gpu-hour-1' "
                                "AND reason_code = 'duplicate_conflict'") == 1
    # The rollup finance reads agrees with the base table.
    assert count_rows(settings, "SELECT sum(samples) FROM usage_hourly") == 1


def test_an_identical_copy_after_a_restart_is_billed_once_and_is_no_dead_letter(
    settings: Settings, worker_factory: Callable[..., WorkerProcess]
) -> None:
    run_through_worker(settings, worker_factory, [FIRST])
    run_through_worker(settings, worker_factory, [dict(FIRST)])

    assert billed(settings) == [("team-a", "2026-11", Decimal(3600))]
    assert count_rows(settings, "SELECT count() FROM dead_letters FINAL") == 0
    assert count_rows(settings, "SELECT count() FROM rated_usage") == 1  # not even an unmerged copy
    assert count_rows(settings, "SELECT sum(samples) FROM usage_hourly") == 1


def test_two_differing_copies_in_one_batch_first_wins(
    settings: Settings, worker_factory: Callable[..., WorkerProcess]
) -> None:
    run_through_worker(settings, worker_factory, [FIRST, COPIES["december-and-quantity-3"]])

    assert billed(settings) == [("team-a", "2026-11", Decimal(3600))]
    assert count_rows(settings, "SELECT count() FROM dead_letters FINAL WHERE event_id = 'gpu-hour-1' "
                                "AND reason_code = 'duplicate_conflict'") == 1


TOTALS = ("SELECT tenant, period, count(), sum(unit_seconds) FROM rated_usage "
          "GROUP BY tenant, period ORDER BY tenant, period")
ROLLUP_TOTALS = ("SELECT tenant, period, sum(samples), sum(unit_seconds) FROM usage_hourly "
                 "GROUP BY tenant, period ORDER BY tenant, period")
CREATE_QUERY = ("SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
                "AND name = 'rated_usage'")
def test_ids_with_tabs_newlines_and_backslashes_are_found_again(settings: Settings) -> None:
    """The sink sends a batch's ids as a TabSeparated external table: escaping must round-trip."""
    from streams.sink import ClickHouseSink, connector
    from tests.integration.test_poison import rated_row_values

    awkward = ["tab\there", "new\nline", "back\\slash\\t", "cr\rret", "plain"]
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    try:
        first = sink.store_rated([tuple(rated_row_values(event_id)) for event_id in awkward])
        again = sink.store_rated([tuple(rated_row_values(event_id)) for event_id in awkward])
        changed = sink.store_rated([tuple(rated_row_values(name, tenant="team-b")) for name in awkward])
    finally:
        sink.close()
    assert (first.stored, again.stored, changed.stored) == (5, 0, 0)
    assert (again.conflicts, len(changed.conflicts)) == ([], 5)
    assert count_rows(settings, "SELECT count() FROM rated_usage") == 5


OLD_KEY_RATED_USAGE = RATED_USAGE_V4.create_sql().replace(
    "ORDER BY (tenant, window_start, event_id)", "ORDER BY (tenant, event_id)")
# What later pipeline migrations added beside event_ids, dropped to rewind a database.
LATER_THAN_6 = ("DROP VIEW IF EXISTS event_id_hashes_mv", "DROP TABLE IF EXISTS event_id_hashes")


def rewind_to_pipeline_3(settings: Settings) -> None:
    """The database as pipeline migration 3 left it (rated_usage keyed by tenant, event_id),
    holding 3,000 rows over 3 tenants and 2 months, the rollup filled by its view."""
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        for statement in (*LATER_THAN_6, *(f"DROP TABLE IF EXISTS {table}" for table in (
                "usage_hourly_mv", "event_ids", "rated_usage", "usage_hourly"))):
            client.command(statement)
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 4")
        client.command(OLD_KEY_RATED_USAGE)
        migration_1 = next(m for m in PIPELINE.migrations if m.version == 1)
        for step in migration_1.statements[1:]:  # dead letters, rollup and its view as shipped
            migrations.run_statement(client, step)
        assert "ORDER BY (tenant, event_id)" in clickhouse.scalar(client, CREATE_QUERY)
        # 3 tenants x 2 months x 500 rows, inserted the way the sink does (the view fills the rollup).
        client.command(
            f"INSERT INTO rated_usage ({', '.join(RATED_USAGE.insert_columns)}) "
            "SELECT concat('e', toString(number)), concat('t', toString(number % 3)), "
            "if(number % 2 = 0, '2026-11', '2026-12'), 'gpu', 'c', 'n', 'ns', 'p', 'u', "
            "if(number % 2 = 0, toDateTime64('2026-11-05 00:00:00', 6, 'UTC'), "
            "toDateTime64('2026-12-05 00:00:00', 6, 'UTC')) + toIntervalSecond(number * 60), "
            "if(number % 2 = 0, toDateTime64('2026-11-05 00:01:00', 6, 'UTC'), "
            "toDateTime64('2026-12-05 00:01:00', 6, 'UTC')) + toIntervalSecond(number * 60), "
            "1, 60, 'H100-SXM-80GB', NULL, 'on-demand', 0, '2026-11', 'USD', 2.5, 1, 0.041666666666666667, "
            "NULL, NULL, map(), 0, number FROM numbers(3000)")
    finally:
        client.close()


def test_the_rekeying_migration_keeps_every_row_once(settings: Settings) -> None:
    """A database at pipeline migration 3 (rated_usage keyed by tenant, event_id) with rows."""
    rewind_to_pipeline_3(settings)
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        before = client.query(TOTALS).result_rows
        rollup_before = client.query(ROLLUP_TOTALS).result_rows

        applied = migrations.migrate(client, [PIPELINE])
        assert applied == pipeline_since(4)

        after = client.query(TOTALS).result_rows
        rollup_after = client.query(ROLLUP_TOTALS).result_rows
        assert len(before) == 6 and sum(row[2] for row in before) == 3000
        assert after == before
        assert rollup_after == rollup_before  # the copy did not pass through the rollup's view
        assert clickhouse.scalar(client, "SELECT count() FROM event_ids") == 3000
        assert clickhouse.scalar(client, "SELECT uniqExact(event_id) FROM event_ids") == 3000
        assert "ORDER BY (tenant, window_start, event_id)" in clickhouse.scalar(client, CREATE_QUERY)
        # The view is attached again: a new row reaches the rollup once.
        client.command("INSERT INTO rated_usage SELECT * REPLACE ('new' AS event_id) "
                       "FROM (SELECT * FROM rated_usage WHERE event_id = 'e0')")
        assert clickhouse.scalar(client, "SELECT sum(samples) FROM usage_hourly") == 3001
    finally:
        client.close()


def test_the_rekeying_migration_rerun_after_its_exchange_keeps_the_new_key(settings: Settings) -> None:
    """Migration 4 failed after EXCHANGE TABLES and before it dropped the twin (which now holds
    the old layout): run again, it must not copy the rows back into that old layout."""
    rewind_to_pipeline_3(settings)
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        before = client.query(TOTALS).result_rows
        steps = next(m for m in PIPELINE.migrations if m.version == 4).statements
        exchange = next(i for i, step in enumerate(steps) if str(step).startswith("EXCHANGE TABLES"))
        for step in steps[:exchange + 1]:
            migrations.run_statement(client, step)
        assert "ORDER BY (tenant, event_id)" in clickhouse.scalar(
            client, CREATE_QUERY.replace("'rated_usage'", "'rated_usage_rekeyed'"))

        rerun(client, 4)

        assert "ORDER BY (tenant, window_start, event_id)" in clickhouse.scalar(client, CREATE_QUERY)
        assert client.query(TOTALS).result_rows == before
    finally:
        client.close()


EVENT_IDS_QUERY = ("SELECT engine, create_table_query FROM system.tables WHERE database = currentDatabase() "
                   "AND name = %(name)s")
EVENT_ID_ROWS = ("SELECT event_id, tenant, kind, window_start, window_end, quantity, unit_seconds, "
                 "gpu_model, mig_profile, capacity_type, period FROM event_ids ORDER BY event_id")
# Ids as an earlier sink recorded them: id-N billed to t(N % 3) at 00:N minutes on 2026-11-05 for
# 1 + N % 4 GPU-minutes.
RECORDED_IDS = (
    f"INSERT INTO event_ids ({', '.join(EVENT_IDS_V5.insert_columns)}) "
    "SELECT concat('id-', toString(number)), concat('t', toString(number % 3)), 'gpu', "
    "toDateTime64('2026-11-05 00:00:00', 6, 'UTC') + toIntervalSecond(number * 60), "
    "toDateTime64('2026-11-05 00:01:00', 6, 'UTC') + toIntervalSecond(number * 60), 1 + number % 4, "
    "60 * (1 + number % 4), 'H100-SXM-80GB', NULL, 'on-demand', '2026-11' FROM numbers({count})")


def rerun(client: Any, version: int) -> None:
    """Run a migration's statements again, as after a failure part-way."""
    for step in next(m for m in PIPELINE.migrations if m.version == version).statements:
        migrations.run_statement(client, step)


def assert_id_7_is_found(settings: Settings) -> None:
    """id-7 of RECORDED_IDS (t1, 00:07, 4 GPU-minutes): the same copy is a duplicate, a copy
    for another tenant a conflict; neither is stored."""
    from streams.sink import ClickHouseSink, connector
    from tests.integration.test_poison import rated_row_values

    start = datetime(2026, 11, 5, 0, 7, tzinfo=UTC)
    copy = {"tenant": "t1", "window_start": start, "window_end": start + timedelta(minutes=1),
            "quantity": Decimal(4), "unit_seconds": Decimal(240)}
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    try:
        same = sink.store_rated([tuple(rated_row_values("id-7", **copy))])
        other = sink.store_rated([tuple(rated_row_values("id-7", **{**copy, "tenant": "t2"}))])
    finally:
        sink.close()
    assert (same.stored, same.conflicts) == (0, [])
    assert other.stored == 0 and [row[0] for row, _ in other.conflicts] == ["id-7"]


@pytest.mark.single_node
def test_event_ids_move_from_key_value_to_a_hash_ordered_table_with_every_id_once(settings: Settings) -> None:
    """A database at pipeline migration 4 (event_ids in EmbeddedRocksDB) with ids: migration 5."""
    migration_4 = next(m for m in PIPELINE.migrations if m.version == 4)
    key_value = next(s for s in migration_4.statements if isinstance(s, str) and "EmbeddedRocksDB" in s)
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        for statement in (*LATER_THAN_6, "DROP TABLE event_ids", key_value):
            client.command(statement)
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 5")
        client.command(RECORDED_IDS.format(count=2000))
        before = client.query(EVENT_ID_ROWS).result_rows

        assert migrations.migrate(client, [PIPELINE]) == pipeline_since(5)
        for version in (5, 6, 7, 8):  # migration 5 again, as after a failure part-way, and on
            rerun(client, version)  # still each id once

        engine, ddl = client.query(EVENT_IDS_QUERY, parameters={"name": "event_ids"}).result_rows[0]
        assert engine == "MergeTree" and "ORDER BY id_hash" in ddl and "index_granularity = 256" in ddl
        assert client.query(EVENT_ID_ROWS).result_rows == before
        assert len(before) == 2000
        for table in ("rated_usage", "usage_hourly"):
            ddl = client.query(EVENT_IDS_QUERY, parameters={"name": table}).result_rows[0][1]
            assert "non_replicated_deduplication_window = 10000" in ddl, table
    finally:
        client.close()
    assert_id_7_is_found(settings)


@pytest.mark.single_node
def test_migration_6_leaves_event_ids_hashes_uncompressed_and_every_id_found(settings: Settings) -> None:
    """A database at pipeline migration 5 as shipped (id_hash in the server's default codec)."""
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        shipped = EVENT_IDS_V5.create_sql().replace(" CODEC(NONE)", "")
        assert shipped != EVENT_IDS_V5.create_sql()
        for statement in (*LATER_THAN_6, "DROP TABLE event_ids", shipped):
            client.command(statement)
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 6")
        client.command(RECORDED_IDS.format(count=500))
        before = client.query(EVENT_ID_ROWS).result_rows

        assert migrations.migrate(client, [PIPELINE]) == pipeline_since(6)
        rerun(client, 6)

        assert clickhouse.scalar(client, CODEC_QUERY) == "CODEC(NONE)"
        assert client.query(EVENT_ID_ROWS).result_rows == before and len(before) == 500
    finally:
        client.close()
    assert_id_7_is_found(settings)


CODEC_QUERY = ("SELECT compression_codec FROM system.columns WHERE database = currentDatabase() "
               "AND table = 'event_ids' AND name = 'id_hash'")
HASHES = "SELECT groupArray(id_hash) FROM (SELECT id_hash FROM {table} ORDER BY id_hash)"


@pytest.mark.single_node
def test_migrations_7_to_13_give_every_recorded_id_its_hash_and_later_ids_come_from_the_sink(
        settings: Settings) -> None:
    """A database at pipeline migration 6 with recorded ids: migration 7 builds event_id_hashes
    and its view (run twice: each hash once), 8 makes the ids claims, 13 drops the view (run
    twice): the sink writes the hashes of its claims itself."""
    from streams.sink import ClickHouseSink, connector
    from tests.integration.test_poison import rated_row_values

    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        for statement in LATER_THAN_6:
            client.command(statement)
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 7")
        client.command(RECORDED_IDS.format(count=500))

        assert migrations.migrate(client, [PIPELINE]) == pipeline_since(7)
        rerun(client, 7)  # as after a failure part-way: the hashes are made again, each once
        hashes = clickhouse.scalar(client, HASHES.format(table="event_id_hashes"))
        assert hashes == clickhouse.scalar(client, HASHES.format(table="event_ids"))
        assert len(set(hashes)) == 500
        rerun(client, 8)
        # Ids recorded before migration 8 have no known position: never a replay's own claim.
        assert clickhouse.scalar(
            client, "SELECT groupUniqArray((source_partition, source_offset)) FROM event_ids") == [(-1, -1)]
        rerun(client, 13)
        rerun(client, 13)
        assert clickhouse.scalar(
            client, "SELECT groupArray(name) FROM system.tables WHERE database = currentDatabase() "
                    "AND name IN ('event_id_hashes', 'event_id_hashes_mv')") == ["event_id_hashes"]
    finally:
        client.close()
    assert_id_7_is_found(settings)
    # Ids claimed by the sink from now on reach event_id_hashes from the sink, once each, and
    # are found again.
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    try:
        assert sink.store_rated([tuple(rated_row_values(f"new-{i}")) for i in range(3)]).stored == 3
        assert sink.store_rated([tuple(rated_row_values(f"new-{i}")) for i in range(3)]).stored == 0
    finally:
        sink.close()
    assert count_rows(settings, "SELECT count() FROM event_ids") == 503
    assert count_rows(settings, "SELECT count() FROM event_id_hashes") == 503


def test_a_hash_without_its_recorded_row_does_not_make_an_id_billed(settings: Settings) -> None:
    """event_id_hashes may hold more than event_ids (the sink stores a batch's hashes before its
    claims, and the claims' insert can fail): only a row in event_ids itself makes an id billed."""
    from streams.sink import ClickHouseSink, connector
    from tests.integration.test_poison import rated_row_values

    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("INSERT INTO event_id_hashes SELECT sipHash64('ghost')")
    finally:
        client.close()
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    try:
        stored = sink.store_rated([tuple(rated_row_values("ghost"))])
    finally:
        sink.close()
    assert (stored.stored, stored.conflicts) == (1, [])
    assert count_rows(settings, "SELECT count() FROM rated_usage WHERE event_id = 'ghost'") == 1


def test_a_repeated_insert_of_the_same_rows_is_dropped_by_the_engine(settings: Settings) -> None:
    """What the sink's insert tokens rely on, on the real engine and the migrated tables.

    The sink's lookups catch a repeat they can see. The engine catches one they cannot: the
    same rows sent again before they are visible (a second sink racing after a rebalance, an
    ambiguous failure on a cluster). A non-replicated table honours insert_deduplication_token
    only with non_replicated_deduplication_window set, and a view's target only with its own.
    """
    from streams.sink import ClickHouseSink, connector, insert_token
    from tests.integration.test_poison import rated_row_values

    rows = [tuple(rated_row_values(f"named-{i}", source_offset=100 + i)) for i in range(20)]
    columns = list(RATED_USAGE.insert_columns)
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    try:
        assert sink.store_rated(rows).stored == 20
    finally:
        sink.close()
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        # The same rows again under the name the sink gave them, past its lookups: dropped.
        client.insert("rated_usage", rows, column_names=columns,
                      settings={"insert_deduplication_token": insert_token(rows)})
        assert clickhouse.scalar(client, "SELECT count() FROM rated_usage") == 20
        assert clickhouse.scalar(client, "SELECT sum(samples) FROM usage_hourly") == 20
        # Other rows (a part of the same range) under their own name: stored.
        client.insert("rated_usage", rows[:5], column_names=columns,
                      settings={"insert_deduplication_token": insert_token(rows[:5])})
        assert clickhouse.scalar(client, "SELECT count() FROM rated_usage") == 25
        # Without the window (as rated_usage was before pipeline migration 5) both inserts land.
        client.command(RATED_USAGE.create_sql("rated_usage_without_window"))
        for _ in range(2):
            client.insert("rated_usage_without_window", rows, column_names=columns,
                          settings={"insert_deduplication_token": insert_token(rows)})
        assert clickhouse.scalar(client, "SELECT count() FROM rated_usage_without_window") == 40
    finally:
        client.close()


class RivalAtStep:
    """A clickhouse-connect client for the sink under test that lets a rival sink act just
    before a chosen step of the sink's: before the first statement holding ``step``, each of
    ``actions`` runs once, committed, through a client of its own. The sink's steps are its
    statements: the horizon (``max(max_block_number)``), the lookup's probe of the hashes, its
    hashes (``INSERT INTO event_id_hashes``), its claims (an insert into event_ids), the
    contest (``HAVING claims > 1``)."""

    def __init__(self, client: Any, rival: Any, steps: dict[str, list[Callable[[Any], None]]]) -> None:
        self._client = client
        self._rival = rival
        self._steps = {step: list(actions) for step, actions in steps.items()}

    def _before(self, statement: str) -> None:
        for step, actions in self._steps.items():
            if step in statement and actions:
                for action in actions:
                    action(self._rival)
                actions.clear()
                return

    def query(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._before(sql)
        return self._client.query(sql, *args, **kwargs)

    def command(self, cmd: str, *args: Any, **kwargs: Any) -> Any:
        self._before(cmd)
        return self._client.command(cmd, *args, **kwargs)

    def raw_insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        self._before(f"INSERT INTO {table}")
        return self._client.raw_insert(table, *args, **kwargs)

    def insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        self._before(f"INSERT INTO {table}")
        return self._client.insert(table, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def rival_hash(rival: Any) -> None:
    rival.command("INSERT INTO event_id_hashes SELECT sipHash64('raced')")


def rival_claim(rival: Any) -> None:
    """The rival's claim on 'raced' for team-b (another copy: another tenant, another position)."""
    from gpumeter.infra.insert import insert_rows
    from gpumeter.infra.schema import EVENT_IDS
    from tests.integration.test_poison import rated_row_values

    copy = rated_row_values("raced", tenant="team-b", source_partition=3, source_offset=8)
    claim = tuple(copy[RATED_USAGE.insert_columns.index(name)] for name in EVENT_IDS.insert_columns)
    insert_rows(rival, EVENT_IDS, [claim], None)


def merge_hashes(rival: Any) -> None:
    """A merge of every part of event_id_hashes: the rival's part is gone, its rows in a part
    whose highest block is still above the horizon."""
    rival.command("SYSTEM START MERGES event_id_hashes")
    rival.command("OPTIMIZE TABLE event_id_hashes FINAL")


HORIZON, LOOKUP, OUR_HASHES, OUR_CLAIMS, CONTEST = (
    "max(max_block_number)", "FROM batch_ids WHERE sipHash64(event_id) IN", "INSERT INTO event_id_hashes",
    "INSERT INTO event_ids", "HAVING claims > 1")
# Where the rival's hash and claim commit around our steps. The first claim to commit wins
# (contract 1): ours unless the rival's claim commits before our claims' insert.
RACES: dict[str, tuple[dict[str, list[Callable[[Any], None]]], bool]] = {
    # The test stops merges on one node (below): a background merge of the rival's part with
    # ours would make some of these pass by luck.
    "its-hash-and-claim-after-our-lookup-before-our-claim": (
        {OUR_HASHES: [rival_hash, rival_claim]}, False),
    "its-hash-before-our-horizon-its-claim-before-ours": (
        {HORIZON: [rival_hash], OUR_HASHES: [rival_claim]}, False),
    "its-hash-between-horizon-and-lookup-its-claim-before-ours": (
        {LOOKUP: [rival_hash], OUR_CLAIMS: [rival_claim]}, False),
    "its-hash-and-claim-before-ours-then-a-merge-before-our-contest": (
        {OUR_HASHES: [rival_hash, rival_claim], CONTEST: [merge_hashes]}, False),
    "its-hash-and-claim-after-our-claim": (
        {CONTEST: [rival_hash, rival_claim]}, True),
    "its-hash-before-our-horizon-its-claim-after-ours": (
        {HORIZON: [rival_hash], CONTEST: [rival_claim]}, True),
}


def merges(steps: dict[str, list[Callable[[Any], None]]]) -> bool:
    return any(merge_hashes in actions for actions in steps.values())


@pytest.mark.parametrize(("steps", "ours_wins"), [
    pytest.param(*race, id=name, marks=[pytest.mark.single_node] if merges(race[0]) else [])
    for name, race in RACES.items()])
def test_two_sinks_claiming_one_id_at_once_bill_the_claim_committed_first(
        settings: Settings, steps: dict[str, list[Callable[[Any], None]]], ours_wins: bool) -> None:
    """On the real engine, a rival sink claims the same id as ours at each point of our batch
    (with rows claimed earlier in the table, in several parts, so that the contest on one node
    reads only the parts committed since its lookup began): the claim that committed first is
    the one billed, ours is a conflict exactly when the rival's came first."""
    from streams.sink import ClickHouseSink, connector
    from tests.integration.test_poison import rated_row_values

    topology = Topology.of(settings.clickhouse)
    earlier = ClickHouseSink(connector(settings.clickhouse.dsn), topology)
    try:
        for batch in range(3):  # three earlier batches: hashes in three parts below the horizon
            rows = [tuple(rated_row_values(f"earlier-{batch}-{i}", source_offset=10 * batch + i))
                    for i in range(5)]
            assert earlier.store_rated(rows).stored == 5
    finally:
        earlier.close()
    rival = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    if topology == SINGLE_NODE:
        rival.command("SYSTEM STOP MERGES event_id_hashes")
    sink = ClickHouseSink(
        lambda: RivalAtStep(clickhouse.connect(settings.clickhouse.dsn, create_database=False), rival, steps),  # type: ignore[arg-type, return-value]
        topology)
    try:
        result = sink.store_rated([tuple(rated_row_values("raced", source_offset=100)),
                                   tuple(rated_row_values("alone", source_offset=101))])
    finally:
        sink.close()
        rival.close()
    assert result.stored == (2 if ours_wins else 1)
    assert [reason for _, reason in result.conflicts] == (
        [] if ours_wins else ["event_id raced was already billed with different tenant"])
    assert count_rows(settings, "SELECT count() FROM rated_usage WHERE event_id = 'raced'") == int(ours_wins)
