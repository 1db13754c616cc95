"""Unit tests of the table declaration (pure: DDL text only, no server)."""

from __future__ import annotations

from dataclasses import replace

from gpumeter.infra.schema import EVENT_IDS
from gpumeter.infra.tables import (
    Column,
    CopyByPartition,
    Drop,
    Migration,
    ModifySettings,
    Table,
    Topology,
    View,
)


def test_a_column_codec_follows_its_default_and_comment() -> None:
    # ClickHouse's column grammar: name type [DEFAULT expr] [COMMENT '...'] [CODEC(...)].
    column = Column("h", "UInt64", default="sipHash64(x)", comment="it's a hash", codec="NONE")
    assert column.ddl == "h UInt64 DEFAULT sipHash64(x) COMMENT 'it''s a hash' CODEC(NONE)"
    assert Column("x", "String").ddl == "x String"


def test_a_column_with_a_codec_is_still_an_inserted_column_unless_it_has_a_default() -> None:
    table = Table("t", (Column("a", "String", codec="LZ4"), Column("b", "UInt64", default="1")),
                  engine="MergeTree", order_by="a")
    assert table.insert_columns == ("a",)
    assert "a String CODEC(LZ4)" in table.create_sql()


def test_event_ids_stores_its_sort_key_uncompressed() -> None:
    assert "id_hash UInt64 DEFAULT sipHash64(event_id) CODEC(NONE)" in EVENT_IDS.create_sql()


def test_a_settings_step_alters_the_table_that_holds_the_rows_on_every_topology() -> None:
    ids = Table(name="ids", columns=(Column("h", "UInt64"),), engine="MergeTree", order_by="h", shard_by="h")
    ledger = Table(name="ledger", columns=(Column("h", "UInt64"),), engine="MergeTree", order_by="h")
    step = ModifySettings(ids, "merge_selector_base = 1.5")
    assert step.statements() == ("ALTER TABLE ids MODIFY SETTING merge_selector_base = 1.5",)
    assert step.statements(Topology("c1", replicated=True)) == (
        "ALTER TABLE ids ON CLUSTER c1 MODIFY SETTING merge_selector_base = 1.5",)
    assert step.statements(Topology("c1", sharded=True)) == (
        "ALTER TABLE ids_local ON CLUSTER c1 MODIFY SETTING merge_selector_base = 1.5",)
    assert ModifySettings(ledger, "x = 1").statements(Topology("c1", sharded=True)) == (
        "ALTER TABLE ledger ON CLUSTER c1 MODIFY SETTING x = 1",)


def test_a_drop_step_drops_the_distributed_table_then_the_rows_on_every_topology() -> None:
    ids = Table(name="ids", columns=(Column("h", "UInt64"),), engine="MergeTree", order_by="h", shard_by="h")
    hashes = replace(ids, name="hashes")
    view = View("hashes_mv", hashes, ids, "SELECT h FROM {source}")
    assert Drop(ids).statements() == ("DROP TABLE IF EXISTS ids SYNC",)
    assert Drop(ids).statements(Topology("c1", replicated=True)) == (
        "DROP TABLE IF EXISTS ids ON CLUSTER c1 SYNC",)
    assert Drop(ids).statements(Topology("c1", sharded=True)) == (
        "DROP TABLE IF EXISTS ids ON CLUSTER c1 SYNC", "DROP TABLE IF EXISTS ids_local ON CLUSTER c1 SYNC")
    assert Drop(view).statements() == ("DROP VIEW IF EXISTS hashes_mv SYNC",)
    assert Drop(view).statements(Topology("c1", sharded=True)) == (
        "DROP VIEW IF EXISTS hashes_mv ON CLUSTER c1 SYNC",)


def test_only_a_migration_of_settings_and_drop_steps_is_written_for_every_topology() -> None:
    ids = Table(name="ids", columns=(Column("h", "UInt64"),), engine="MergeTree", order_by="h")
    assert Migration(1, "settings", (ModifySettings(ids, "x = 1"),)).for_every_topology
    assert Migration(4, "settings and drops", (ModifySettings(ids, "x = 1"), Drop(ids))).for_every_topology
    assert not Migration(5, "drop and a statement", (Drop(ids), "CREATE TABLE ids2 AS ids")
                         ).for_every_topology
    assert not Migration(2, "mixed", (ModifySettings(ids, "x = 1"), "ALTER TABLE ids ADD COLUMN y UInt8")
                         ).for_every_topology
    assert not Migration(3, "copy", (CopyByPartition("a", "b", by="h"),)).for_every_topology
