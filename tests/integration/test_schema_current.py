"""The current declarations build what the migrations built (issue 29, point 1).

A fresh cluster database gets each owner's ``current`` declarations rendered for its topology
instead of replaying the migrations, which were written for one node. That is right only if the
two paths give the same tables: the same columns (names, types, defaults, codecs), engines, keys
and settings, and the same views. Compared here on one node, on the real engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpumeter.app.schema import OWNERS
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from gpumeter.infra.tables import SINGLE_NODE

pytestmark = pytest.mark.integration

# The migrations runner's own tables are made by the runner on both paths.
RUNNER_TABLES = "('schema_migrations', 'schema_lock')"
COLUMNS = ("SELECT table, name, type, default_kind, default_expression, compression_codec, position "
           f"FROM system.columns WHERE database = currentDatabase() AND table NOT IN {RUNNER_TABLES} "
           "ORDER BY table, position")
TABLES = ("SELECT name, engine, sorting_key, primary_key, partition_key, "
          # Settings as a set: ALTER ... MODIFY SETTING appends where a declaration lists in order.
          "arraySort(splitByString(', ', replaceRegexpAll(engine_full, '.*SETTINGS ', ''))) AS settings, "
          "if(engine = 'MaterializedView', as_select, '') AS view "
          f"FROM system.tables WHERE database = currentDatabase() AND name NOT IN {RUNNER_TABLES} "
          "ORDER BY name")


def schema_of(client: Any) -> tuple[list[Any], list[Any]]:
    return client.query(COLUMNS).result_rows, client.query(TABLES).result_rows


def test_the_current_declarations_build_what_the_migrations_built(settings: Settings) -> None:
    migrated = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    fresh_dsn = clickhouse.parse_dsn(settings.clickhouse.dsn).with_database(
        clickhouse.parse_dsn(settings.clickhouse.dsn).database + "_declared").text
    declared = clickhouse.connect(fresh_dsn)
    try:
        for owner in OWNERS:
            for statement in owner.create_statements(SINGLE_NODE):
                declared.command(statement)
        migrated_columns, migrated_tables = schema_of(migrated)
        declared_columns, declared_tables = schema_of(declared)
    finally:
        migrated.close()
        declared.close()
        clickhouse.drop_database(fresh_dsn)
    database = clickhouse.parse_dsn(settings.clickhouse.dsn).database
    # A view's text names its database: compare it without.
    declared_tables = [(*row[:-1], row[-1].replace(f"{database}_declared.", f"{database}."))
                       for row in declared_tables]
    assert [row[0] for row in declared_tables] == [row[0] for row in migrated_tables]
    assert declared_columns == migrated_columns
    assert declared_tables == migrated_tables
