"""ClickHouse DSNs (gpumeter/infra/clickhouse.py): parsing, moving to another database, redaction."""

from __future__ import annotations

from gpumeter.infra.clickhouse import parse_dsn


def test_dsn_round_trips_with_another_database_and_keeps_credentials() -> None:
    for text in ("http://127.0.0.1:8123/gpumeter", "https://fin%40ops:p%3Ass@ch.example:8443/billing",
                 "chdb:///var/lib/gm?database=gpumeter"):
        dsn = parse_dsn(text)
        assert parse_dsn(dsn.text) == dsn
        moved = parse_dsn(dsn.with_database("demo").text)
        assert moved.database == "demo" and moved.username == dsn.username and moved.password == dsn.password
    assert "p:ss" not in parse_dsn("https://u:p%3Ass@h:8443/db").url  # messages never show passwords

