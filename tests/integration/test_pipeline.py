"""The backbone end to end on a real Kafka broker and a real ClickHouse engine.

Expected invoices come from tests/unit/reference_billing.py, an independent Fraction-based
implementation of contract 3 that shares no code with pricing/.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from tests.integration.usage_files import (
    MALFORMED,
    big_h100_user,
    load_cards_as_documents,
    load_tenants_as_documents,
    make_samples,
    write_usage_file,
)
from tests.services import free_port, run_cli, wait_until
from tests.unit.reference_billing import reference_invoices

pytestmark = pytest.mark.integration

NO_RATE_SAMPLE = {
    "event_id": "before-any-card", "kind": "cpu", "cluster": "it", "node": "n", "tenant": "team-b",
    "namespace": "team-b", "pod": "p", "pod_uid": "u", "window_start": "2026-09-30T23:00:00Z",
    "window_end": "2026-09-30T23:30:00Z", "quantity": "2",
}


def expected_invoices(samples: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return reference_invoices(samples, load_cards_as_documents(), load_tenants_as_documents())


def produced_invoices(
    settings: Settings, periods: set[str], out: Path
) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for period in sorted(periods):
        result = run_cli(settings, "invoice", "--all-tenants", "--period", period, "--format", "json",
                         "--out", str(out))
        assert result.returncode == 0, result.stderr
    for path in out.glob("invoice-*.json"):
        document = json.loads(path.read_text())
        found[(document["tenant"], document["period"])] = document
    return found


def assert_invoices_match(produced: dict[tuple[str, str], dict[str, Any]],
                          expected: dict[tuple[str, str], dict[str, Any]]) -> None:
    for key, document in expected.items():
        assert key in produced, f"no invoice for {key}"
        assert produced[key] == document, f"invoice {key} differs from the reference"
    # --all-tenants also bills tenants whose commitment applies without usage: nothing else.
    for key in set(produced) - set(expected):
        assert produced[key]["lines"] == [], key
        assert produced[key]["subtotal"] == "0.00", key


def scrape(port: int) -> dict[str, float]:
    """The worker's /metrics as {name{labels}: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines() if line and not line.startswith("#")
    }


def count_rows(settings: Settings, sql: str) -> int:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        return int(clickhouse.scalar(client, sql))
    finally:
        client.close()


def publish_lines(settings: Settings, lines: list[bytes]) -> None:
    producer = kafka.make_producer(settings.kafka)
    topic = settings.kafka.topic(topics.SAMPLES)
    for line in lines:
        producer.send(topic, key=json.loads(line)["tenant"].encode(), value=line)
    producer.flush(timeout=60)
    producer.close()


def test_ingest_with_duplicates_and_malformed_lines_bills_exactly(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    valid = make_samples(seed=11, count=2500) + big_h100_user(seed=11, windows=140) + [NO_RATE_SAMPLE]
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
    valid = make_samples(seed=5, count=300)
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


@pytest.mark.chaos
def test_worker_killed_mid_stream_loses_nothing_and_bills_nothing_twice(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    valid = make_samples(seed=23, count=12000)
    lines = [json.dumps(s).encode() for s in valid]
    publish_lines(settings, lines[:8000])
    first = worker_factory(settings, "first")
    wait_until(lambda: count_rows(settings, "SELECT count() FROM rated_usage") >= 1500, 180,
               "the first worker stored nothing")
    first.kill9()
    stored_at_kill = count_rows(settings, "SELECT count() FROM rated_usage")
    assert stored_at_kill < 8000, "the kill came too late to test anything"
    # Everything again (as a restarted producer would replay), plus the rest.
    publish_lines(settings, lines)
    worker_factory(settings, "second")
    drained = run_cli(settings, "drain", "--timeout", "300")
    assert drained.returncode == 0, drained.stderr

    assert count_rows(settings, "SELECT count() FROM rated_usage") == len(valid)
    assert count_rows(settings, "SELECT uniqExact(event_id) FROM rated_usage") == len(valid)
    expected = expected_invoices(valid)
    produced = produced_invoices(settings, {p for _, p in expected}, tmp_path / "out")
    assert_invoices_match(produced, expected)
