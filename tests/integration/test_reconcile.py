"""`gpumeter reconcile` on the real engine: passes on a clean run through the pipeline, and fails
naming tenant, line and both figures when a stored row, a final invoice or the dead letters are
tampered with in ClickHouse. Figures in the assertions are hand arithmetic."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.app.schema import OWNERS
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from gpumeter.infra.tables import LOCAL_SUFFIX, Table
from testkit.builders import L4, big_h100_user, sample
from tests.integration.billing_data import configure, ingest_and_drain, ledger_rows, store_rated
from tests.services import run_cli

pytestmark = pytest.mark.integration

TENANTS = [{"tenant": "team-a", "commitment": "1000.00", "credits": "250.00"}]
H100_LINE = "2026-11/gpu/H100-SXM-80GB/-/on-demand"


def reconcile(settings: Settings, period: str = "2026-11") -> tuple[int, str, str]:
    result = run_cli(settings, "reconcile", "--period", period)
    return result.returncode, result.stdout, result.stderr


def mutate(settings: Settings, statement: str) -> None:
    """Tamper as an operator would; on a sharded database, in each shard's own table of a
    sharded one (a Distributed table takes no mutation)."""
    if settings.clickhouse.sharded:
        name = statement.split()[2]
        if any(table.name == name and table.shard_by is not None
               for owner in OWNERS for table in owner.current if isinstance(table, Table)):
            statement = statement.replace(f" {name} ", f" {name}{LOCAL_SUFFIX} ON CLUSTER "
                                                       f"{settings.clickhouse.cluster} ", 1)
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        client.command(statement, settings={"mutations_sync": 2})
    finally:
        client.close()


def test_clean_pipeline_run_reconciles_and_pending_late_usage_does_not(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    configure(settings, tmp_path, TENANTS)
    worker_factory(settings)
    h100 = big_h100_user(seed=31, windows=12)
    l4 = [
        sample(f"l4-{i}", tenant="solo", gpu_model=L4, quantity="2", start=f"2026-11-2{i}T00:00:00Z")
        for i in range(3)
    ]
    # Exact repeats are dropped; a copy of a billed event_id with another quantity is a
    # duplicate_conflict dead letter (contract 1), which reconciliation accepts by design.
    conflict = {**l4[0], "quantity": "5"}
    ingest_and_drain(settings, [*h100, *l4, h100[0], l4[1], conflict], tmp_path / "usage.jsonl")

    client = clickhouse.connect(settings.clickhouse.dsn)
    dead = client.query("SELECT event_id, reason_code FROM dead_letters").result_rows
    client.close()
    assert ("l4-0", "duplicate_conflict") in dead  # the case the billed-and-dead check must allow
    draft = reconcile(settings)  # nothing issued yet: drafts against rated and re-rated
    assert draft[0] == 0, draft[2]
    assert "reconciled 2026-11: 2 tenant(s), 15 stored sample(s) re-rated" in draft[1]
    closed = run_cli(settings, "invoice", "close", "--period", "2026-11", "--out", str(tmp_path / "out"))
    assert closed.returncode == 0, closed.stderr
    code, out, err = reconcile(settings)
    assert code == 0, err
    # team-a: 8 GPUs x 12 h = 96 GPU-hours; solo: 2 x 3 h = 6
    assert "96.000000" in out and "6.000000" in out and "GM-" in out

    late = big_h100_user(seed=31, windows=14)[12:]  # 2 more hours of 8 H100s
    ingest_and_drain(settings, late, tmp_path / "late.jsonl")
    code, out, err = reconcile(settings)
    assert code == 1
    assert f"tenant team-a line {H100_LINE}: invoiced vs rated unit-hours: 96.000000 vs 112.000000" in err
    closed = run_cli(settings, "invoice", "close", "--period", "2026-11", "--out", str(tmp_path / "out2"))
    assert closed.returncode == 0, closed.stderr
    assert reconcile(settings)[0] == 0


def closed_month(settings: Settings, tmp_path: Path) -> None:
    configure(settings, tmp_path, TENANTS)
    store_rated(settings, big_h100_user(seed=41, windows=10))  # 80 GPU-hours of team-a
    closed = run_cli(settings, "invoice", "close", "--period", "2026-11", "--out", str(tmp_path / "out"))
    assert closed.returncode == 0, closed.stderr
    assert reconcile(settings)[0] == 0


def test_a_tampered_quantity_is_named_with_both_figures(settings: Settings, tmp_path: Path) -> None:
    closed_month(settings, tmp_path)
    mutate(settings, "ALTER TABLE rated_usage UPDATE quantity = 9 WHERE event_id = 'h100-41-3'")
    code, out, err = reconcile(settings)
    assert code == 1
    # stored unit_seconds still say 8 GPU-hours for that row; re-rating its quantity gives 9
    assert (
        f"tenant team-a line {H100_LINE}: rated vs re-rated from stored samples: 80.000000 vs 81.000000"
        in out
    )
    assert "event h100-41-3: stored vs re-rated unit-seconds: 28800" in out
    assert err.startswith("gpumeter: error: reconcile 2026-11:") and err.count("\n") == 1


def test_a_tampered_rated_amount_shows_as_invoiced_vs_rated(settings: Settings, tmp_path: Path) -> None:
    closed_month(settings, tmp_path)
    mutate(
        settings,
        "ALTER TABLE rated_usage UPDATE unit_seconds = unit_seconds * 2 WHERE event_id = 'h100-41-0'",
    )
    code, out, err = reconcile(settings)
    assert code == 1
    assert f"tenant team-a line {H100_LINE}: invoiced vs rated unit-hours: 80.000000 vs 88.000000" in err
    assert (
        f"tenant team-a line {H100_LINE}: rated vs re-rated from stored samples: 88.000000 vs 80.000000"
        in out
    )


def test_a_tampered_final_invoice_is_named_by_its_number(settings: Settings, tmp_path: Path) -> None:
    closed_month(settings, tmp_path)
    (row,) = ledger_rows(settings)
    document = json.loads(row["document"])
    # 80 h x 2.50 = 200.00; commitment 1000.00 -> true-up 800.00; 250.00 credits -> 750.00
    assert document["total"] == "750.00"
    mutate(
        settings,
        "ALTER TABLE invoice_ledger UPDATE document = replace(document, "
        '\'"total":"750.00"\', \'"total":"75.00"\') WHERE seq = 1',
    )
    code, _out, err = reconcile(settings)
    assert code == 1
    tampered = json.loads(ledger_rows(settings)[0]["document"])
    assert tampered["total"] == "75.00"
    assert (
        f"tenant team-a line invoice {row['number']}: stored content hash vs hash of the stored document: "
        f"{row['content_sha256']} vs"
    ) in err


def test_a_billed_sample_that_is_also_a_dead_letter_fails(settings: Settings, tmp_path: Path) -> None:
    closed_month(settings, tmp_path)
    mutate(
        settings,
        "INSERT INTO dead_letters (reason_code, reason, raw, source_topic, source_partition, "
        "source_offset, source_index, event_id, tenant, rejected_at) VALUES ('invalid', 'x', '{}', "
        "'samples', 0, 99, 0, 'h100-41-7', 'team-a', now64(3))",
    )
    code, _out, err = reconcile(settings)
    assert code == 1
    assert (
        "tenant team-a line event h100-41-7: billed and dead-lettered: billed vs dead letter (invalid)" in err
    )


def test_a_row_stored_twice_counts_twice_in_the_rollup_and_reconcile_names_the_line(
    settings: Settings, tmp_path: Path
) -> None:
    """Two racing sinks can both store one sample (docs/contracts.md, "drafts and usage from the
    rollup"): rated_usage FINAL folds the copies, the hourly rollup behind drafts, month-to-date
    usage and the dashboards adds both. Reconcile compares the two."""
    closed_month(settings, tmp_path)  # 80 GPU-hours of team-a
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        # What the second sink's insert does: the same row again, in a block of its own.
        client.command("INSERT INTO rated_usage SELECT * FROM rated_usage WHERE event_id = 'h100-41-3'",
                       settings={"insert_distributed_sync": 1})
    finally:
        client.close()
    code, out, err = reconcile(settings)
    assert code == 1
    # the row is 8 GPUs x 1 h: the rollup says 88 GPU-hours, rated_usage FINAL 80
    assert (f"tenant team-a line {H100_LINE}: hourly rollup vs rated unit-hours: 88.000000 vs 80.000000"
            in err)
    assert "invoiced vs rated" not in out  # the invoice itself is right
