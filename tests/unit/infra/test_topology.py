"""The schema rendered per topology (contract 9): golden files, and the rules they follow."""

from __future__ import annotations

import re

import pytest

from gpumeter.infra.tables import Topology
from tests.unit.infra.golden_ddl import CLUSTER, GOLDEN, TOPOLOGIES, statements, text

CREATE = re.compile(r"^CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS (\w+)")
NEVER_SHARDED = ("schema_migrations", "schema_lock", "invoices", "invoice_ledger")


def created(topology: Topology) -> dict[str, str]:
    found = {}
    for statement in statements(topology):
        match = CREATE.match(statement)
        assert match is not None, statement
        found[match.group(1)] = statement
    return found


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in TOPOLOGIES])
def test_the_rendered_ddl_is_the_golden_file(name: str) -> None:
    # Regenerate deliberately: PYTHONPATH=. python -m tests.unit.infra.golden_ddl, then read the diff.
    assert text(TOPOLOGIES[name]) == (GOLDEN / f"{name}.sql").read_text()


def test_a_single_node_gets_plain_engines_and_no_on_cluster() -> None:
    for statement in statements(TOPOLOGIES["plain"]):
        assert " ON CLUSTER " not in statement
        assert "Replicated" not in statement and "Distributed" not in statement


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in TOPOLOGIES if name != "plain"])
def test_every_statement_on_a_cluster_goes_on_cluster(name: str) -> None:
    for table, statement in created(TOPOLOGIES[name]).items():
        assert f"{table} ON CLUSTER {CLUSTER} " in statement


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in TOPOLOGIES if name != "plain"])
def test_the_ledger_invoices_and_migration_tables_are_one_replica_set_never_sharded(name: str) -> None:
    tables = created(TOPOLOGIES[name])
    for table in NEVER_SHARDED:
        assert f"{table}_local" not in tables
        assert (f"ENGINE = ReplicatedMergeTree('/clickhouse/tables/global/{{database}}/{table}', "
                "'{shard}-{replica}')") in tables[table]


def test_replicated_tables_live_under_their_shard_with_their_replica() -> None:
    tables = created(TOPOLOGIES["replicated"])
    assert ("ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rated_usage', "
            "'{replica}')") in tables["rated_usage"]
    # An engine's own arguments follow the Keeper path and replica name.
    assert ("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/advice', '{replica}', "
            "detected_at)") in tables["advice"]
    # Replicated tables keep their insert tokens in Keeper: the window is the replicated one.
    assert "replicated_deduplication_window = 10000" in tables["rated_usage"]
    assert "non_replicated_deduplication_window" not in tables["rated_usage"]


@pytest.mark.parametrize(("table", "key"), [
    pytest.param("rated_usage", "cityHash64(tenant)", id="usage-by-tenant"),
    pytest.param("usage_hourly", "cityHash64(tenant)", id="rollup-by-tenant"),
    pytest.param("event_ids", "sipHash64(event_id)", id="ids-by-id-hash"),
    pytest.param("event_id_hashes", "id_hash", id="hashes-by-id-hash"),
])
@pytest.mark.parametrize("name", [pytest.param("sharded", id="sharded"),
                                  pytest.param("replicated-sharded", id="replicated-sharded")])
def test_a_sharded_table_is_local_tables_behind_a_distributed_one(name: str, table: str, key: str) -> None:
    tables = created(TOPOLOGIES[name])
    assert f"ENGINE = Distributed({CLUSTER}, currentDatabase(), {table}_local, {key})" in tables[table]
    replicated = "Replicated" in tables[f"{table}_local"]
    assert replicated == TOPOLOGIES[name].replicated


def test_views_connect_the_local_tables_of_a_shard() -> None:
    view = created(TOPOLOGIES["sharded"])["usage_hourly_mv"]
    assert "TO usage_hourly_local AS SELECT" in view
    assert "FROM rated_usage_local\n" in view


@pytest.mark.parametrize(("cluster", "replicated", "sharded", "says"), [
    pytest.param(None, True, False, "need clickhouse.cluster", id="replicated-without-cluster"),
    pytest.param(None, False, True, "need clickhouse.cluster", id="sharded-without-cluster"),
    pytest.param("c", False, False, "needs clickhouse.replicated or clickhouse.sharded", id="cluster-alone"),
    pytest.param("c; DROP", True, False, "not a plain identifier", id="not-an-identifier"),
])
def test_a_topology_that_cannot_be_laid_out_is_refused(
    cluster: str | None, replicated: bool, sharded: bool, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        Topology(cluster, replicated, sharded)


IDENTIFIERS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FOLDING = ("Replacing", "Summing", "Aggregating", "Collapsing", "VersionedCollapsing")


def test_a_folding_tables_sharding_key_columns_are_in_its_sort_key() -> None:
    """What makes FINAL (and Summing merges) exact on a Distributed table: rows that fold share
    a sort key, so they share the sharding key's columns, so they sit on one shard. A table
    sharded by a column outside its sort key could leave two copies on two shards, unfolded."""
    from gpumeter.app.schema import OWNERS
    from gpumeter.infra.tables import Table

    checked = []
    for owner in OWNERS:
        for table in owner.current:
            if not isinstance(table, Table) or table.shard_by is None or not table.engine.startswith(FOLDING):
                continue
            columns = {column.name for column in table.columns}
            keyed = {name for name in IDENTIFIERS.findall(table.shard_by) if name in columns}
            sorted_by = set(IDENTIFIERS.findall(table.order_by or ""))
            assert keyed and keyed <= sorted_by, (table.name, table.shard_by, table.order_by)
            checked.append(table.name)
    expected = {"rated_usage", "usage_hourly", "dead_letters", "quota_events", "advice", "forecasts"}
    assert expected <= set(checked)
