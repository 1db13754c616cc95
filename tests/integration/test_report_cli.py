"""`gpumeter report --period YYYY-MM --out DIR` (contract 5) on real Kafka and ClickHouse: the
month's finance report with its invoices as the independent reference computes them."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from testkit.builders import random_samples
from tests.integration.invoice_checks import expected_invoices, publish_lines
from tests.services import run_cli

pytestmark = pytest.mark.integration


def test_the_report_of_a_month_carries_its_invoices_and_only_its_days(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    samples = random_samples(seed=52, count=600)
    worker_factory(settings)
    publish_lines(settings, [json.dumps(s).encode() for s in samples])
    drained = run_cli(settings, "drain", "--timeout", "120")
    assert drained.returncode == 0, drained.stderr
    expected = expected_invoices(samples)
    period = sorted({p for _, p in expected})[0]

    out = tmp_path / "report"
    result = run_cli(settings, "report", "--period", period, "--out", str(out))
    assert result.returncode == 0, result.stderr
    html = (out / "finance-report.html").read_text(encoding="utf-8")
    totals = {(tenant, p): document["total"] for (tenant, p), document in expected.items() if p == period}
    assert totals
    for (tenant, _), total in totals.items():
        assert tenant in html and total in html, (tenant, total)
    tables = {path.name: list(csv.reader(path.open(encoding="utf-8"))) for path in out.glob("*.csv")}
    assert tables, "no CSV beside the report"
    days = [row[0] for rows in tables.values() for row in rows[1:] if row and row[0][:4].isdigit()
            and len(row[0]) == 10]
    assert days and all(day.startswith(period) for day in days), days


def test_a_malformed_period_is_refused_with_one_line(settings: Settings) -> None:
    result = run_cli(settings, "report", "--period", "2026-13")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "YYYY-MM" in result.stderr
