"""ClickHouse DSNs (gpumeter/infra/clickhouse.py): parsing, moving to another database, redaction."""

from __future__ import annotations

import pytest

from gpumeter.infra.clickhouse import ClickHouseConfigError, parse_dsn, without_password

pytestmark = pytest.mark.security


def test_dsn_round_trips_with_another_database_and_keeps_credentials() -> None:
    for text in ("http://127.0.0.1:8123/gpumeter", "https://fin%40ops:p%3Ass@ch.example:8443/billing",
                 "chdb:///var/lib/gm?database=gpumeter"):
        dsn = parse_dsn(text)
        assert parse_dsn(dsn.text) == dsn
        moved = parse_dsn(dsn.with_database("demo").text)
        assert moved.database == "demo" and moved.username == dsn.username and moved.password == dsn.password
    assert "p:ss" not in parse_dsn("https://u:p%3Ass@h:8443/db").url  # messages never show passwords



SECRET = "hunter2-Secret"


@pytest.mark.parametrize(
    "dsn",
    [
        pytest.param(f"ftp://gpumeter:{SECRET}@ch.example:8123/db", id="bad-scheme"),
        pytest.param(f"https://gpumeter:{SECRET}@ch.example:port/db", id="bad-port"),
        pytest.param(f"https://gpumeter:{SECRET}@ch.example:8443/not-an-identifier!", id="bad-database"),
    ],
)
def test_a_dsn_error_never_shows_its_password(dsn: str) -> None:
    """Issue 31, point 5: DSN errors printed the ClickHouse password."""
    with pytest.raises(ClickHouseConfigError) as raised:
        parse_dsn(dsn)
    assert SECRET not in str(raised.value)
    assert "gpumeter:***@ch.example" in str(raised.value) or "not-an-identifier" in str(raised.value)


def test_without_password_keeps_everything_but_the_password() -> None:
    assert without_password(f"https://gpumeter:{SECRET}@ch.example:8443/db") == \
        "https://gpumeter:***@ch.example:8443/db"
    assert without_password("http://127.0.0.1:8123/gpumeter") == "http://127.0.0.1:8123/gpumeter"
    assert SECRET not in parse_dsn(f"https://gpumeter:{SECRET}@ch.example:8443/db").url
