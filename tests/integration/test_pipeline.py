"""The backbone end to end on a real Kafka broker and a real ClickHouse engine.

Expected invoices come from tests/unit/reference_billing.py, an independent Fraction-based
implementation of contract 3 that shares no code with pricing/. The worker killed mid-stream
is tests/chaos/test_worker_kill.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from testkit.builders import OMIT, big_h100_user, random_samples, sample
from tests.integration.invoice_checks import (
    assert_invoices_match,
    count_rows,
    expected_invoices,
    produced_invoices,
    scrape,
)
from tests.integration.usage_files import MALFORMED, write_usage_file
from tests.services import free_port, run_cli

pytestmark = pytest.mark.integration

# Half an hour of cpu before the first rate card: the worker dead-letters it as no_rate.
NO_RATE_SAMPLE = sample(
    "before-any-card", kind="cpu", cluster="it", node="n", tenant="team-b", namespace="team-b", pod="p",
    pod_uid="u", start="2026-09-30T23:00:00Z", end="2026-09-30T23:30:00Z", quantity="2", capacity_type=OMIT,
)


def test_ingest_with_duplicates_and_malformed_lines_bills_exactly(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    valid = random_samples(seed=11, count=2500) + big_h100_user(seed=11, windows=140) + [NO_RATE_SAMPLE]
    usage = tmp_path / "usage.jsonl"
    write_usage_file(usage, valid, duplicates=300, seed=11)

    settings.worker.metrics_port = free_port()
    worker_factory(settings)
    ingest = run_cli(settings, "ingest", str(usage))
    assert ingest.returncode == 2, ingest.stderr  # rejected lines make it exit 2
    assert ingest.stdout.strip().splitlines()[-1] == f"accepted {len(valid) + 300}, rejected {len(MALFORMED)}"
    reported = [line for line in ingest.stderr.splitlines() if line.startswith("line ")]
    assert len(reported) == len(MALFORMED)
    assert any("gpu_model is required" in line for line in reported)
    assert any("not JSON" in line for line in reported)

    drained = run_cli(settings, "drain", "--timeout", "240")
    assert drained.returncode == 0, drained.stderr
    # faust's own files live in the data directory, not in the directory the worker started in.
    assert (settings.data_dir / "faust").is_dir()
    assert not (Path.cwd() / f"{settings.kafka.topic_prefix}{settings.worker.group}-data").exists()

    unique = len({s["event_id"] for s in valid}) - 1  # the no-rate sample is not stored
    assert count_rows(settings, "SELECT count() FROM rated_usage") == unique  # no duplicate rows at all
    dead = count_rows(settings, "SELECT count() FROM dead_letters FINAL")
    assert dead == len(MALFORMED) + 1  # ingest's rejections plus the worker's no_rate
    assert count_rows(settings, "SELECT count() FROM dead_letters FINAL WHERE reason_code = 'no_rate'") == 1
    # The hourly rollup sums the same unit-seconds as the base table, to the last digit.
    assert count_rows(
        settings,
        "SELECT (SELECT sum(unit_seconds) FROM usage_hourly) = (SELECT sum(unit_seconds) FROM rated_usage)",
    ) == 1

    expected = expected_invoices(valid)
    produced = produced_invoices(settings, {p for _, p in expected}, tmp_path / "out")
    assert_invoices_match(produced, expected)
    # The worker's own account agrees: every line it read is rated, dead-lettered or a duplicate.
    metrics = scrape(settings.worker.metrics_port)
    assert metrics['gpumeter_worker_samples_total{outcome="rated"}'] == unique
    assert metrics['gpumeter_worker_samples_total{outcome="dead_letter"}'] == 1
    assert metrics['gpumeter_worker_samples_total{outcome="duplicate"}'] == 300
    assert metrics['gpumeter_worker_dead_letters_total{reason="no_rate"}'] == 1
    assert metrics["gpumeter_worker_rows_stored_total"] == unique

    team_a = produced[("team-a", "2026-11")]
    h100 = [ln for ln in team_a["lines"] if ln["gpu_model"] == "H100-SXM-80GB"
            and ln["capacity_type"] == "on-demand"]
    assert h100 and float(h100[0]["quantity"]) > 1000  # the tier edge was crossed


def test_csv_export_carries_the_same_lines(settings: Settings, worker_factory: Callable[..., WorkerProcess],
                                           tmp_path: Path) -> None:
    valid = random_samples(seed=5, count=300)
    usage = tmp_path / "usage.jsonl"
    write_usage_file(usage, valid, duplicates=0, seed=5)
    worker_factory(settings)
    run_cli(settings, "ingest", str(usage))
    assert run_cli(settings, "drain", "--timeout", "240").returncode == 0
    expected = expected_invoices(valid)
    (tenant, period), document = sorted(expected.items())[0]
    result = run_cli(settings, "invoice", "--tenant", tenant, "--period", period, "--format", "csv",
                     "--out", str(tmp_path / "csv"))
    assert result.returncode == 0, result.stderr
    rows = (tmp_path / "csv" / f"invoice-{tenant}-{period}.csv").read_text().splitlines()
    header = rows[0].split(",")
    records = [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]
    lines = [r for r in records if r["rate_card"]]
    assert [(r["kind"], r["gpu_model"] or None, r["mig_profile"] or None, r["capacity_type"], r["quantity"],
             r["amount"]) for r in lines] == [
        (ln["kind"], ln["gpu_model"], ln["mig_profile"], ln["capacity_type"], ln["quantity"], ln["amount"])
        for ln in document["lines"]
    ]
    totals = {r["kind"]: r["amount"] for r in records if not r["rate_card"]}
    assert totals == {k: document[k] for k in ("subtotal", "commitment_true_up", "credits", "total")}
