"""`gpumeter migrate` under its lock, and the worker that refuses a schema behind (contract 9)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.app.schema import OWNERS
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, migrations
from gpumeter.infra.tables import Migration, SchemaOwner
from testkit.builders import random_samples
from tests.integration.invoice_checks import expected_invoices, produced_invoices
from tests.integration.test_dedup import ROLLUP_TOTALS, TOTALS, rewind_to_pipeline_3
from tests.services import run_cli
from tests.support.migrations import pipeline_since

APPLIED = ("SELECT owner, version, count() FROM schema_migrations GROUP BY owner, version "
           "ORDER BY owner, version")


@pytest.mark.single_node
def test_four_migrate_commands_at_once_apply_each_migration_once_and_keep_every_row(
    settings: Settings,
) -> None:
    rewind_to_pipeline_3(settings)
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        before = client.query(TOTALS).result_rows
        rollup_before = client.query(ROLLUP_TOTALS).result_rows
        assert sum(row[2] for row in before) == 3000

        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda _: run_cli(settings, "migrate"), range(4)))

        assert [run.returncode for run in runs] == [0, 0, 0, 0], [run.stderr for run in runs]
        reported = [run.stdout for run in runs if "applied" in run.stdout]
        assert len(reported) == 1, [run.stdout for run in runs]  # one applied, three found it done
        assert ", ".join(pipeline_since(4)) in reported[0]
        assert client.query(TOTALS).result_rows == before
        assert client.query(ROLLUP_TOTALS).result_rows == rollup_before
        counts = client.query(APPLIED).result_rows
        assert {(str(owner), int(version)) for owner, version, _ in counts} == {
            (owner.owner, m.version) for owner in OWNERS for m in owner.migrations}
        assert all(count == 1 for _, _, count in counts), counts
        assert "ORDER BY (tenant, window_start, event_id)" in clickhouse.scalar(
            client, "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
                    "AND name = 'rated_usage'")
        state = migrations.lock_state(client)
        assert state is not None and state[2] == "released"
    finally:
        client.close()


def test_a_worker_on_a_schema_behind_refuses_with_one_line_saying_to_migrate(settings: Settings) -> None:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version = 8")
    finally:
        client.close()
    worker = run_cli(settings, "worker", timeout=120)
    assert worker.returncode == 1
    lines = worker.stderr.strip().splitlines()
    assert len(lines) == 1, worker.stderr
    assert "pipeline/8 not applied" in lines[0] and "run `gpumeter migrate`" in lines[0]


def test_a_worker_on_a_schema_newer_than_its_code_refuses_with_one_line(settings: Settings) -> None:
    """A worker of an older release beside a database a newer one migrated (a rolling upgrade
    gone wrong) would write by the old rules: since pipeline migration 13 a sink of before it
    claimed ids without their hashes, which the newer sinks' lookups cannot see. It refuses."""
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("INSERT INTO schema_migrations (owner, version, name) "
                       "VALUES ('pipeline', 999, 'from a newer gpumeter')")
    finally:
        client.close()
    try:
        worker = run_cli(settings, "worker", timeout=120)
    finally:
        client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
        try:
            client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version = 999")
        finally:
            client.close()
    assert worker.returncode == 1
    lines = worker.stderr.strip().splitlines()
    assert len(lines) == 1, worker.stderr
    assert "pipeline/999" in lines[0] and "newer than this gpumeter" in lines[0]


def test_an_unknown_cluster_is_one_line_naming_the_setting_and_changes_nothing(settings: Settings) -> None:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("DELETE FROM schema_migrations WHERE owner = 'pipeline' AND version = 8")
        before = client.query(APPLIED).result_rows
        lock_before = migrations.lock_state(client)
        on_cluster = settings.model_copy(deep=True)
        on_cluster.clickhouse = on_cluster.clickhouse.model_copy(
            update={"cluster": "no_such_cluster", "replicated": True})
        run = run_cli(on_cluster, "migrate")
        assert run.returncode == 1
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, run.stderr
        assert lines[0].startswith("gpumeter: error: clickhouse.cluster 'no_such_cluster': ")
        assert client.query(APPLIED).result_rows == before
        assert migrations.lock_state(client) == lock_before
    finally:
        client.close()


@pytest.mark.single_node
def test_a_failed_migration_leaves_the_lock_released_and_its_version_unrecorded(settings: Settings) -> None:
    broken = SchemaOwner("broken", (
        Migration(1, "fine", ("CREATE TABLE IF NOT EXISTS fine (x UInt8) ENGINE = MergeTree ORDER BY x",)),
        Migration(2, "fails", ("ALTER TABLE no_such_table ADD COLUMN y UInt8",)),
    ))
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        with pytest.raises(Exception, match="no_such_table"):
            migrations.migrate(client, [broken])
        assert ("broken", 1) in migrations.applied_migrations(client)
        assert ("broken", 2) not in migrations.applied_migrations(client)
        state = migrations.lock_state(client)
        assert state is not None and state[2] == "released"
        # The lock is free: the next run takes it at once (a held lock would wait, then time out).
        with pytest.raises(Exception, match="no_such_table"):
            migrations.migrate(client, [broken], lock_timeout=1)
    finally:
        client.close()


def test_migrate_waits_for_a_step_longer_than_the_interactive_timeout(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy step of a fleet-sized table takes minutes (pipeline migration 11 copies rated_usage
    a day at a time); `gpumeter migrate` must wait for it as the month's batch commands do, not
    give up after the workers' interactive timeout (60 s, 1 s here)."""
    from gpumeter.app import schema
    from gpumeter.app.cli import migrate

    slow = SchemaOwner("slow", (Migration(1, "a step of 2 s", ("SELECT sleep(2)",)),))
    monkeypatch.setattr(clickhouse, "RECEIVE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(schema, "OWNERS", (*schema.OWNERS, slow))
    assert migrate.run(settings, argparse.Namespace(lock_timeout=30.0)) == 0
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        assert ("slow", 1) in migrations.applied_migrations(client)
    finally:
        client.close()


def test_a_held_lock_makes_migrate_wait_then_give_up_with_one_line(settings: Settings) -> None:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        with migrations.schema_lock(client) as holder:
            run = run_cli(settings, "migrate", "--lock-timeout", "2")
        assert run.returncode == 1
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and f"the schema lock is held by {holder}" in lines[0], run.stderr
    finally:
        client.close()


def test_an_upgrade_in_the_charts_order_refuses_then_migrates_then_bills(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path,
) -> None:
    """Issue 30's upgrade fault on the real engine, in the order a Helm upgrade runs things: the
    database an older release left (pipeline migration 3, with its rows), a worker of this
    version started before the migrate Job has run (it refuses: one line, exit 1, nothing
    stored), then `gpumeter migrate` (the pre-upgrade Job's command), then the worker starts
    and bills what waited in Kafka meanwhile, the older rows kept as they were."""
    rewind_to_pipeline_3(settings)
    samples = random_samples(seed=30, count=400)
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        before = client.query(TOTALS).result_rows
        assert migrations.pending(client, OWNERS) == pipeline_since(4)
        # The agents keep sending through the upgrade: the samples wait in Kafka.
        ingest = run_cli(settings, "ingest", str(usage))
        assert ingest.returncode == 0, ingest.stderr
        assert ingest.stdout.strip().splitlines()[-1] == f"accepted {len(samples)}, rejected 0"

        early = run_cli(settings, "worker", timeout=120)
        assert early.returncode == 1, early.stderr
        lines = early.stderr.strip().splitlines()
        assert len(lines) == 1, early.stderr
        assert f"(pipeline/4 and {len(pipeline_since(4)) - 1} more not applied)" in lines[0], lines[0]
        assert lines[0].endswith("run `gpumeter migrate`"), lines[0]
        assert client.query(TOTALS).result_rows == before  # it wrote nothing

        migrate = run_cli(settings, "migrate")
        assert migrate.returncode == 0, migrate.stderr
        assert migrations.pending(client, OWNERS) == []

        worker_factory(settings)
        drained = run_cli(settings, "drain", "--timeout", "240")
        assert drained.returncode == 0, drained.stderr
        new_tenants = {s["tenant"] for s in samples}
        assert [row for row in client.query(TOTALS).result_rows if row[0] not in new_tenants] == before
    finally:
        client.close()
    expected = expected_invoices(samples)
    produced = produced_invoices(settings, {period for _, period in expected}, tmp_path / "out")
    for key, document in expected.items():
        assert produced.get(key) == document, f"invoice {key} differs from the reference"
