"""The two-shard test cluster's stand-in for the DDL worker (testkit/clickhouse_cluster.py) changes
exactly what its docstring says: the ON CLUSTER clause, and Replicated* engines made plain."""

from __future__ import annotations

from testkit.clickhouse_cluster import CLUSTER, as_ddl_worker_runs_it
from tests.unit.infra.golden_ddl import TOPOLOGIES, statements


def test_other_statements_and_other_clusters_are_left_alone() -> None:
    assert as_ddl_worker_runs_it("SELECT 1", CLUSTER) is None
    assert as_ddl_worker_runs_it("CREATE TABLE t ON CLUSTER other (x UInt8) ENGINE = Log", CLUSTER) is None


def test_each_node_runs_the_statement_without_the_clause() -> None:
    assert as_ddl_worker_runs_it(f"CREATE DATABASE IF NOT EXISTS db ON CLUSTER {CLUSTER}", CLUSTER) == (
        "CREATE DATABASE IF NOT EXISTS db")
    assert as_ddl_worker_runs_it(f"ALTER TABLE t_local ON CLUSTER {CLUSTER} DELETE WHERE x = 1", CLUSTER) == (
        "ALTER TABLE t_local DELETE WHERE x = 1")


def test_the_sharded_layouts_replicated_tables_become_their_plain_engines() -> None:
    rendered = {s.split()[5]: s for s in statements(TOPOLOGIES["sharded"])}
    ledger = as_ddl_worker_runs_it(rendered["invoice_ledger"], CLUSTER)
    assert ledger is not None and "ENGINE = MergeTree\n" in ledger and "Replicated" not in ledger
    runs = as_ddl_worker_runs_it(rendered["insight_runs"], CLUSTER)
    assert runs is not None and "ENGINE = ReplacingMergeTree" in runs and "Replicated" not in runs
    lock = as_ddl_worker_runs_it(rendered["schema_lock"], CLUSTER)
    assert lock is not None and "SETTINGS non_replicated_deduplication_window = 10000" in lock
    # The sharded tables' engines are untouched.
    usage = as_ddl_worker_runs_it(rendered["rated_usage_local"], CLUSTER)
    assert usage is not None and "ENGINE = ReplacingMergeTree" in usage
    assert "non_replicated_deduplication_window = 10000" in usage
