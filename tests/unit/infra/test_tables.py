"""Unit tests of the table declaration (pure: DDL text only, no server)."""

from __future__ import annotations

from gpumeter.infra.schema import EVENT_IDS
from gpumeter.infra.tables import Column, Table


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
