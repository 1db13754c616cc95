"""The same published samples give the same figures on one node and on two shards (contract 9).

On the two-shard cluster of testkit/clickhouse_cluster.py (two chserver processes, Distributed
tables over ``_local`` ones): `gpumeter migrate`, the real worker and its sink, `invoice`,
`invoice close`, `reconcile`, `rerate` and every dashboard panel's SQL, beside the same on the
session's ClickHouse. Invoices equal the independent reference (tests/unit/reference_billing.py);
everything else equals what one node answers. One event_id arrives twice under two tenants whose
usage sits on different shards: the first copy is billed, the second is a duplicate_conflict
dead letter, wherever each landed.

Replicated tables are not exercised here (chdb cannot replicate; docs/contracts.md, Known gaps).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from dashboards.panels import DASHBOARDS
from gpumeter.app import schema
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, migrations
from gpumeter.infra import kafka as gkafka
from gpumeter.infra.schema import EVENT_ID_HASHES_VIEW, GRANTS
from insights.tables import BUDGET_LINES, FORECASTS
from streams.sink import ClickHouseSink, connector
from testkit.builders import random_samples, sample
from testkit.clickhouse_cluster import TwoShards, two_shards
from tests.integration.invoice_checks import assert_invoices_are_the_reference, expected_invoices
from tests.integration.test_dedup import run_through_worker
from tests.integration.test_poison import rated_row_values
from tests.services import Endpoints, Namespaces, free_port, isolated_settings, run_cli
from tests.support.grafana_macros import ALL, Request, Variable, expand

pytestmark = pytest.mark.integration

PERIOD = "2026-11"
SAMPLES = random_samples(seed=29, count=300)
# team-b's usage sits on shard 1 and team-a's on shard 2 (cityHash64(tenant) % 2; checked below).
FIRST = sample("cross-shard-1", tenant="team-b", namespace="team-b", start="2026-11-20T10:00:00Z",
               seconds=3600, quantity="2")
COPY = sample("cross-shard-1", tenant="team-a", namespace="team-a", start="2026-11-20T10:00:00Z",
              seconds=3600, quantity="2")
RANGE = (datetime(2026, 10, 28, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoShards]:
    ports = [(free_port(), free_port()) for _ in range(2)]
    with two_shards(tmp_path_factory.mktemp("two-shards"), ports) as running:
        yield running


def query(settings: Settings, sql: str, url: str | None = None) -> list[tuple[Any, ...]]:
    database = clickhouse.parse_dsn(settings.clickhouse.dsn).database
    dsn = settings.clickhouse.dsn if url is None else f"{url}/{database}"
    client = clickhouse.connect(dsn, create_database=False)
    try:
        return [tuple(row) for row in client.query(sql).result_rows]
    finally:
        client.close()


def panels(settings: Settings) -> dict[str, list[tuple[Any, ...]]]:
    """Every panel's rows over the samples' range, every tenant selected; panels on insertion time
    (pipeline lag, throughput) differ by when each run stored its rows, so only their columns."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        for spec in DASHBOARDS:
            tenants = [row[0] for row in client.query(
                "SELECT DISTINCT tenant FROM rated_usage ORDER BY tenant").result_rows]
            variables = {v.name: Variable(current=[ALL] if v.include_all else [tenants[0]], options=tenants,
                                          multi=v.multi) for v in spec.variables}
            for panel in spec.panels():
                # On insertion time: a filter on it (the Budget grants panel only orders by it).
                on_insertion = "$__timeFilter(inserted_at)" in panel.sql
                if on_insertion:
                    now = datetime.now(UTC)
                    request = Request(now - timedelta(hours=1), now + timedelta(hours=1), timedelta(hours=1),
                                      variables)
                else:
                    request = Request(*RANGE, timedelta(hours=1), variables)
                result = client.query(expand(panel.sql, request))
                if result.result_rows:  # an empty answer comes without its header (no insights here)
                    assert list(result.column_names) == list(panel.columns), panel.title
                rows = [] if on_insertion else sorted(map(tuple, result.result_rows), key=repr)
                found[f"{spec.uid}:{panel.title}"] = rows
    finally:
        client.close()
    return found


def seed_budget(settings: Settings) -> None:
    """A grant per tenant in ``quota_grants`` (never sharded), a forecast with a limit per
    tenant and two insights runs' budget lines per tenant (both sharded by tenant) for the Tenant
    dashboard's Quota and Budget panels; the range ends on December 1, so the forecasts are
    December's. The later run dropped the earlier one's per-model key: it shows on neither."""
    tenants = sorted({s["tenant"] for s in [*SAMPLES, FIRST]})
    grants = [GRANTS.row_from({
        "number": number, "tenant": tenant, "metric": "gpu_hours", "amount": Decimal(number),
        "effective_at": datetime(2026, 11, 1, tzinfo=UTC), "expires_at": None, "rollover": True,
        "corrects": None, "note": "", "granted_at": datetime(2026, 11, 1, tzinfo=UTC), "claim": "test"})
        for number, tenant in enumerate(tenants, start=1)]
    forecasts = [FORECASTS.row_from({
        "tenant": tenant, "period": "2026-12", "metric": "gpu_hours", "computed_at": RANGE[1],
        "model": "run-rate", "reason": "test", "month_to_date": Decimal(0), "month_end": Decimal(0),
        "month_end_low": Decimal(0), "month_end_high": Decimal(0), "interval_level": Decimal("0.8"),
        "quota_period": "month", "quota_limit": Decimal(100), "quota_used": Decimal(0),
        "exhaust_probability": Decimal(0), "backtest_folds": 0}) for tenant in tenants]
    line = {"period": PERIOD, "metric": "gpu_hours", "base_limit": Decimal(100), "limit": Decimal(100),
            "runway_hours": None, "runway_until": None, "runway_source": "run-rate"}
    lines = [BUDGET_LINES.row_from({
        **line, "tenant": tenant, "model_key": key, "granted": Decimal(number), "used": Decimal(number),
        "remaining": Decimal(100 - number), "computed_at": at})
        for number, tenant in enumerate(tenants, start=1)
        for key, at in (("", RANGE[0]), ("H100-", RANGE[0]), ("", RANGE[1]))]
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.insert(GRANTS.name, grants, column_names=list(GRANTS.insert_columns))
        client.insert(FORECASTS.name, forecasts, column_names=list(FORECASTS.insert_columns))
        client.insert(BUDGET_LINES.name, lines, column_names=list(BUDGET_LINES.insert_columns))
    finally:
        client.close()


def run_everything(settings: Settings, worker_factory: Callable[..., WorkerProcess], out: Path
                   ) -> dict[str, Any]:
    """The month from `gpumeter migrate` to `rerate`, through the CLI and the real worker."""
    gkafka.ensure_topics(settings.kafka)
    migrated = run_cli(settings, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    seed_budget(settings)
    run_through_worker(settings, worker_factory, [*SAMPLES, FIRST])
    run_through_worker(settings, worker_factory, [COPY])  # a new worker: only the store knows the id

    assert_invoices_are_the_reference(settings, [*SAMPLES, FIRST], out / "drafts")
    closed = run_cli(settings, "invoice", "close", "--period", PERIOD, "--format", "json",
                     "--out", str(out / "final"))
    assert closed.returncode == 0, closed.stderr
    reconciled = run_cli(settings, "reconcile", "--period", PERIOD)
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    rerated = run_cli(settings, "rerate", "--period", PERIOD, "--dry-run")
    assert rerated.returncode == 0, rerated.stderr
    finals = {}
    for path in (out / "final").glob("*.json"):
        document = json.loads(path.read_text())
        finals[document["tenant"]] = (document["status"], document["currency"], document["total"])
    return {
        "billed": query(settings, "SELECT tenant, period, sum(unit_seconds) FROM rated_usage FINAL "
                                  "WHERE event_id = 'cross-shard-1' GROUP BY tenant, period"),
        "conflicts": query(settings, "SELECT event_id, reason_code FROM dead_letters FINAL "
                                     "WHERE reason_code = 'duplicate_conflict'"),
        "rows": query(settings, "SELECT count(), uniqExact(event_id) FROM rated_usage"),
        "rollup": query(settings, "SELECT sum(unit_seconds) = (SELECT sum(unit_seconds) FROM rated_usage) "
                                  "FROM usage_hourly"),
        "finals": finals,
        "rerate": rerated.stdout,
        "panels": panels(settings),
    }


def test_two_shards_give_one_nodes_figures_and_bill_a_cross_shard_duplicate_once(
    endpoints: Endpoints, cluster: TwoShards, worker_factory: Callable[..., WorkerProcess],
    namespaces: Namespaces, tmp_path: Path
) -> None:
    one = isolated_settings(endpoints, tmp_path / "one")
    sharded = isolated_settings(endpoints, tmp_path / "two", clickhouse_url=cluster.url)
    sharded.clickhouse.cluster, sharded.clickhouse.sharded = cluster.topology.cluster, True
    for configured in (one, sharded):
        namespaces.add(configured)

    on_shards = run_everything(sharded, worker_factory, tmp_path / "out-two")
    on_one = run_everything(one, worker_factory, tmp_path / "out-one")

    # The first copy is billed (2 GPUs x 1 h under team-b), the other tenant's copy dead-lettered.
    assert on_shards["billed"] == [("team-b", PERIOD, 7200)]
    assert on_shards["conflicts"] == [("cross-shard-1", "duplicate_conflict")]
    assert on_shards["rows"] == [(len(SAMPLES) + 1, len(SAMPLES) + 1)]
    assert on_shards["rollup"] == [(1,)]
    # The month's final invoices are the reference's totals, and the same on both.
    expected = {tenant: document["total"] for (tenant, period), document
                in expected_invoices([*SAMPLES, FIRST]).items() if period == PERIOD}
    finals = on_shards["finals"]
    assert {tenant: total for tenant, (_, _, total) in finals.items() if tenant in expected} == expected
    for key in ("billed", "conflicts", "rows", "rollup", "finals", "rerate"):
        assert on_shards[key] == on_one[key], key
    assert on_shards["panels"].keys() == on_one["panels"].keys()
    for title, rows in on_one["panels"].items():
        assert on_shards["panels"][title] == rows, title
    assert any(on_one["panels"].values()), "the samples should show in the panels"
    for budget in ("Budget grants", "Budget: limit, grants, used and runway"):
        assert on_one["panels"][f"gpumeter-tenant:{budget}"], budget
    # The later run's one line (the dropped key is not shown), on shards as on one node.
    shown = on_shards["panels"]["gpumeter-tenant:Budget: limit, grants, used and runway"]
    assert [row[:2] for row in shown] == [("gpu_hours", "all")]

    # The rows are spread: each shard holds usage, the two copies' tenants on different shards,
    # and the id's claims on exactly one (its hash's).
    database = clickhouse.parse_dsn(sharded.clickhouse.dsn).database
    per_shard = [query(sharded, "SELECT groupUniqArray(tenant), count() FROM rated_usage_local", url)[0]
                 for url in cluster.node_urls()]
    assert all(count > 0 for _, count in per_shard), per_shard
    assert ["team-b" in tenants for tenants, _ in per_shard] == [True, False], per_shard
    assert ["team-a" in tenants for tenants, _ in per_shard] == [False, True], per_shard
    claims = [query(sharded, "SELECT count() FROM event_ids_local WHERE event_id = 'cross-shard-1'",
                    url)[0][0] for url in cluster.node_urls()]
    assert sorted(claims) == [0, 1], (database, claims)


def test_a_refused_rows_claim_is_withdrawn_on_shards_so_a_later_good_copy_is_billed(
    endpoints: Endpoints, cluster: TwoShards, namespaces: Namespaces, tmp_path: Path
) -> None:
    """The sink claims an id before the row is stored; a row the engine refuses gives its claim
    back (on shards: in its shard's own table, a Distributed table takes no DELETE)."""
    sharded = isolated_settings(endpoints, tmp_path, clickhouse_url=cluster.url)
    sharded.clickhouse.cluster, sharded.clickhouse.sharded = cluster.topology.cluster, True
    namespaces.add(sharded, topics=False)
    client = clickhouse.connect(sharded.clickhouse.dsn)
    try:
        schema.migrate(client, cluster.topology)
    finally:
        client.close()
    sink = ClickHouseSink(connector(sharded.clickhouse.dsn), cluster.topology)
    try:
        refused = sink.store_rated([tuple(rated_row_values("poisoned-1", priority=3_000_000_000))])
        assert [row[0] for row, _ in refused.rejected] == ["poisoned-1"]
        later = sink.store_rated([tuple(rated_row_values("poisoned-1", source_offset=1))])
    finally:
        sink.close()
    assert later.stored == 1 and later.conflicts == []
    assert query(sharded, "SELECT count() FROM rated_usage WHERE event_id = 'poisoned-1'") == [(1,)]
    assert query(sharded, "SELECT count() FROM event_ids WHERE event_id = 'poisoned-1'") == [(1,)]


def test_settings_and_drop_migrations_are_applied_on_every_shard_and_a_one_node_migration_still_refused(
    endpoints: Endpoints, cluster: TwoShards, namespaces: Namespaces, tmp_path: Path
) -> None:
    """Pipeline migrations 12 (the id tables' merge setting) and 13 (event_id_hashes' view
    dropped: the sink writes the hashes) are written for every topology: a cluster database
    made before them gets them on each shard through ON CLUSTER. A missing migration written for
    one node is refused as before, with nothing applied."""
    sharded = isolated_settings(endpoints, tmp_path, clickhouse_url=cluster.url)
    sharded.clickhouse.cluster, sharded.clickhouse.sharded = cluster.topology.cluster, True
    namespaces.add(sharded, topics=False)
    database = clickhouse.parse_dsn(sharded.clickhouse.dsn).database
    client = clickhouse.connect(sharded.clickhouse.dsn)

    def engines() -> list[list[str]]:
        """Each node's id tables' engine settings, in node order."""
        return [[str(row[0]) for row in query(
            sharded, "SELECT engine_full FROM system.tables WHERE database = currentDatabase() "
                     "AND name IN ('event_ids_local', 'event_id_hashes_local') ORDER BY name", url)]
            for url in cluster.node_urls()]

    def hash_tables() -> list[int]:
        """How many of event_id_hashes, its _local table and its view each node has."""
        names = "'event_id_hashes', 'event_id_hashes_local', 'event_id_hashes_mv'"
        return [query(sharded, "SELECT count() FROM system.tables WHERE database = currentDatabase() "
                               f"AND name IN ({names})", url)[0][0] for url in cluster.node_urls()]

    try:
        schema.migrate(client, cluster.topology)
        assert all("merge_selector_base = 1.5" in engine for node in engines() for engine in node)
        assert hash_tables() == [2, 2]  # the Distributed table and its _local table, no view
        # The database as it stood at version 11, on every node: event_id_hashes fed by its view,
        # and the id tables without the merge setting.
        client.command(EVENT_ID_HASHES_VIEW.create_sql(cluster.topology))
        for url in cluster.node_urls():
            node = clickhouse.connect(f"{url}/{database}", create_database=False)
            try:
                for table in ("event_ids_local", "event_id_hashes_local"):
                    node.command(f"ALTER TABLE {table} RESET SETTING merge_selector_base")
            finally:
                node.close()
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 12")
        assert hash_tables() == [3, 3]
        assert not any("merge_selector_base" in engine for node in engines() for engine in node)

        assert schema.migrate(client, cluster.topology) == ["pipeline/12", "pipeline/13"]
        assert hash_tables() == [2, 2]
        assert [len(node) for node in engines()] == [2, 2]
        assert all("merge_selector_base = 1.5" in engine for node in engines() for engine in node)

        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version >= 11")
        with pytest.raises(migrations.SchemaError, match="pipeline migration 11 is written for one node"):
            schema.migrate(client, cluster.topology)
        applied = {version for (version,) in client.query(
            "SELECT version FROM schema_migrations WHERE owner = 'pipeline'").result_rows}
        assert applied.isdisjoint({11, 12, 13})
    finally:
        client.close()
