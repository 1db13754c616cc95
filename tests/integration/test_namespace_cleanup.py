"""Removing a namespace (tests' teardown, `drop_namespace` of demo resets and benchmarks) on the
real broker and ClickHouse server: only that namespace's topics and database go."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumeter.core.topics import ALL
from gpumeter.infra import clickhouse, kafka
from tests.services import Endpoints, Namespaces, isolated_settings, wait_until

pytestmark = pytest.mark.integration


def databases(dsn: str) -> set[str]:
    client = clickhouse.connect(clickhouse.parse_dsn(dsn).with_database("default"))
    try:
        return {name for (name,) in client.query("SELECT name FROM system.databases").result_rows}
    finally:
        client.close()


def test_only_the_prefix_topics_are_deleted(endpoints: Endpoints, namespaces: Namespaces,
                                            tmp_path: Path) -> None:
    gone = isolated_settings(endpoints, tmp_path / "gone")
    kept = isolated_settings(endpoints, tmp_path / "kept")
    namespaces.add(kept, database=False)
    created = kafka.ensure_topics(gone.kafka)
    kafka.ensure_topics(kept.kafka)
    client = kafka.admin(gone.kafka)
    try:
        deleted = kafka.delete_topics_under(gone.kafka, client)
        assert sorted(deleted) == sorted(created) and created
        wait_until(lambda: not any(name.startswith(gone.kafka.topic_prefix) for name in client.list_topics()),
                   30, "the deleted topics to disappear")
        remaining = {name for name in client.list_topics() if name.startswith(kept.kafka.topic_prefix)}
        assert remaining == {kept.kafka.topic(spec.name) for spec in ALL}
        assert kafka.delete_topics_under(gone.kafka, client) == []  # nothing left: nothing asked
    finally:
        client.close()


def test_drop_database_removes_that_database_only(endpoints: Endpoints, tmp_path: Path) -> None:
    gone = isolated_settings(endpoints, tmp_path / "gone")
    kept = isolated_settings(endpoints, tmp_path / "kept")
    for dsn in (gone.clickhouse.dsn, kept.clickhouse.dsn):
        clickhouse.connect(dsn).close()  # connecting creates the database
    gone_name = clickhouse.parse_dsn(gone.clickhouse.dsn).database
    kept_name = clickhouse.parse_dsn(kept.clickhouse.dsn).database
    try:
        assert {gone_name, kept_name} <= databases(gone.clickhouse.dsn)
        clickhouse.drop_database(gone.clickhouse.dsn)
        after = databases(kept.clickhouse.dsn)
        assert gone_name not in after and kept_name in after
        clickhouse.drop_database(gone.clickhouse.dsn)  # already gone: not an error
    finally:
        clickhouse.drop_database(kept.clickhouse.dsn)
