"""`gpumeter report`'s Budgets section (issue 33 point 6) on the real ClickHouse engine: a grant
made with `gpumeter budget grant`, a rollover grant in the tenants file, per-model limits, and
the budget lines equal to values worked out by hand below.

team-a's rated usage (rate card 2026-11: H100-SXM-80GB 2.50 an hour, other models 1.80):
- October 20: 30 samples of 1 H100 x 1 h = 30 GPU-hours (for the carry);
- November 1, 00:00-10:00: 10 samples of 2 H100 x 1 h = 20 GPU-hours (50.00) and 5 of 1
  A100-SXM-40GB x 1 h = 5 GPU-hours (9.00).
The budgets are stated at the latest usage, November 1 10:00 (10 h into the month).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from dashboards.budget_report import stored_exhaustions
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.models import UsageSample
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from gpumeter.infra.schema import RATED_USAGE
from insights.tables import FORECASTS
from pricing.rating import Rater
from quota.accounting import format_value
from quota.budget import ExhaustionForecast
from testkit.builders import card_set, sample, shipped_rate_card_documents
from tests.services import run_cli, wait_until

pytestmark = pytest.mark.integration

TENANTS = """\
tenants:
  - tenant: team-a
    gpu_hours: 40
    spend: "1000.00"
    gpu_hours_by_model: {H100-SXM-80GB: 24, "A100-": 100}
    grants:
      - {id: q4, metric: gpu_hours, amount: 20, effective_at: "2026-10-05T00:00:00Z", rollover: true}
  - tenant: team-b
    max_gpus: 4
"""


def usage_documents() -> list[dict[str, Any]]:
    """team-a's samples: 30 GPU-hours in October (the rollover's period), then in November 10 h
    of 2 H100s and 5 h of one A100."""
    documents = [sample(f"oct-{i}", start=datetime(2026, 10, 20, tzinfo=UTC) + timedelta(hours=i),
                        pod="old", pod_uid="uid-old") for i in range(30)]
    documents += [sample(f"h100-{i}", start=datetime(2026, 11, 1, i, tzinfo=UTC), quantity="2")
                  for i in range(10)]
    documents += [sample(f"a100-{i}", start=datetime(2026, 11, 1, i, tzinfo=UTC), gpu_model="A100-SXM-40GB",
                         pod="a100", pod_uid="uid-a100") for i in range(5)]
    return documents


def seed(settings: Settings) -> None:
    documents = usage_documents()
    rater = Rater(card_set(shipped_rate_card_documents()))
    rows = [RATED_USAGE.row_of(rater.rate(UsageSample.model_validate(d))) for d in documents]
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.insert(RATED_USAGE.name, rows, column_names=list(RATED_USAGE.insert_columns))
    finally:
        client.close()


def test_the_report_states_each_budget_line_with_grants_carry_and_runway(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    settings.tenants = path
    seed(settings)
    granted = run_cli(settings, "budget", "grant", "--tenant", "team-a", "--gpu-hours", "10",
                      "--effective", "2026-11-01T00:00:00Z", "--note", "month-start top-up")
    assert granted.returncode == 0, granted.stderr

    out = tmp_path / "report"
    result = run_cli(settings, "report", "--period", "2026-11", "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr
    with (out / "budgets.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    lines = {(row["tenant"], row["metric"], row["gpu_model"]): row for row in rows}
    # team-b caps GPUs held at once only: no budget line.
    assert set(lines) == {("team-a", "gpu_hours", "all"), ("team-a", "spend", "all"),
                          ("team-a", "gpu_hours", "A100-"), ("team-a", "gpu_hours", "H100-SXM-80GB")}

    hours = lines[("team-a", "gpu_hours", "all")]
    # October used 30 of base 40, so q4's 20 are unused: carry min(20, max(0, 40 + 20 - 30)) = 20.
    # Limit 40 + #1 10 + carry 20 = 70; used 20 + 5 = 25; 45 left at 2.5 an hour: 18 h.
    assert (hours["period"], hours["base_limit"], hours["grants"], hours["limit"]) == (
        "2026-11", "40.000000", "30.000000", "70.000000")
    assert (hours["used"], hours["remaining"], hours["used_share"]) == ("25.000000", "45.000000", "35.7%")
    assert (hours["runway_hours"], hours["runway_until"]) == ("18.0", "2026-11-02 04:00")
    # 12 days of history: the forecast is the run rate, so the period's run rate gives the runway.
    assert hours["runway_from"].startswith("run-rate")
    assert hours["grant_detail"] == "file:q4 20.000000 (carried of 20.000000); #1 10.000000"

    spend = lines[("team-a", "spend", "all")]
    # 20 h x 2.50 + 5 h x 1.80 = 59.00 in 10 h; 941.00 left: 941 / 5.9 = 159.49 h
    assert (spend["limit"], spend["used"], spend["remaining"], spend["runway_hours"]) == (
        "1000.00", "59.00", "941.00", "159.5")

    h100 = lines[("team-a", "gpu_hours", "H100-SXM-80GB")]
    # 20 of 24: 4 left at 2 an hour = 2 h; per-model limits take no grants
    assert (h100["limit"], h100["grants"], h100["used"], h100["runway_hours"]) == (
        "24.000000", "0.000000", "20.000000", "2.0")
    a100 = lines[("team-a", "gpu_hours", "A100-")]
    # 5 of 100: 95 left at 0.5 an hour = 190 h
    assert (a100["used"], a100["remaining"], a100["runway_hours"]) == ("5.000000", "95.000000", "190.0")

    page = (out / "finance-report.html").read_text(encoding="utf-8")
    assert "Budgets per tenant and GPU model" in page and 'aria-label="GPU-hours budgets' in page
    assert "team-a · H100-SXM-80GB" in page


def test_budget_show_takes_the_runway_from_a_stored_forecast_that_beat_the_run_rate(
    settings: Settings, tmp_path: Path
) -> None:
    """A Holt-Winters forecast stored by the insights job, made this month against the limit
    with grants (70: base 40 + q4's carry, nothing used in October so all 20, + #1 10), gives the
    runway: November 1 10:00 to its exhaustion at 20:30 is 10.5 h."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    settings.tenants = path
    granted = run_cli(settings, "budget", "grant", "--tenant", "team-a", "--gpu-hours", "10",
                      "--effective", "2026-11-01T00:00:00Z")
    assert granted.returncode == 0, granted.stderr
    row = {"tenant": "team-a", "period": "2026-11", "metric": "gpu_hours",
           "computed_at": datetime(2026, 11, 1, 9, tzinfo=UTC), "model": "holt-winters", "reason": "test",
           "month_to_date": Decimal(0), "month_end": Decimal(0), "month_end_low": Decimal(0),
           "month_end_high": Decimal(0), "interval_level": Decimal("0.8"), "quota_period": "month",
           "quota_limit": Decimal(70), "quota_used": Decimal(0),
           "exhaust_at": datetime(2026, 11, 1, 20, 30, tzinfo=UTC), "exhaust_probability": Decimal(1),
           "backtest_folds": 8}
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.insert(FORECASTS.name, [FORECASTS.row_from(row)], column_names=list(FORECASTS.insert_columns))
        said = stored_exhaustions(client, "team-a")
    finally:
        client.close()
    assert said == {"gpu_hours": ExhaustionForecast(True, "holt-winters", "2026-11", Decimal(70),
                                                    datetime(2026, 11, 1, 20, 30, tzinfo=UTC))}
    shown = run_cli(settings, "budget", "show", "--tenant", "team-a", "--at", "2026-11-01T10:00:00Z",
                    "--json")
    assert shown.returncode == 0, shown.stderr
    lines = {(m["metric"], m["gpu_model"]): m for m in json.loads(shown.stdout)["metrics"]}
    hours = lines[("gpu_hours", None)]
    assert (hours["limit"], hours["runway_from"], hours["runway_hours"]) == ("70.000000", "forecast", "10.5")
    assert hours["runway_until"] == "2026-11-01T20:30:00Z"
    # spend has no forecast: the run rate, and nothing used yet in the ledger.
    assert lines[("spend", None)]["runway_from"] == "run-rate"
    assert set(lines) == {("gpu_hours", None), ("spend", None), ("gpu_hours", "A100-"),
                          ("gpu_hours", "H100-SXM-80GB")}


def test_gpumeter_insights_stores_the_lines_budget_show_prints(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The same usage through the real worker: its quota ledger (what `budget show` counts) and
    ClickHouse's rollup (what `gpumeter insights` counts) hold the same samples, so the rows the
    insights run stores in budget_lines are the figures `budget show --json` prints at the run's
    time, line for line; and those are the report's hand-worked ones (limit 70 = 40 + carry 20 + #1
    10, used 25; spend 59.00 of 1000.00; H100 20 of 24; A100- 5 of 100)."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    settings.tenants = path
    settings.quota.reload_seconds = 0.5
    settings.quota.grants_poll_seconds = 0.5
    granted = run_cli(settings, "budget", "grant", "--tenant", "team-a", "--gpu-hours", "10",
                      "--effective", "2026-11-01T00:00:00Z")
    assert granted.returncode == 0, granted.stderr
    worker = worker_factory(settings)
    documents = usage_documents()
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(d) + "\n" for d in documents))
    ingested = run_cli(settings, "ingest", str(samples))
    assert ingested.returncode == 0, ingested.stderr

    at = "2026-11-01T10:00:00Z"

    def shown() -> dict[tuple[str, str], dict[str, Any]]:
        result = run_cli(settings, "budget", "show", "--tenant", "team-a", "--at", at, "--json")
        assert result.returncode == 0, result.stderr
        return {(m["metric"], m["gpu_model"] or ""): m for m in json.loads(result.stdout)["metrics"]}

    def stored_usage() -> int:
        client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
        try:
            return int(client.query("SELECT count() FROM rated_usage FINAL").result_rows[0][0])
        finally:
            client.close()

    wait_until(lambda: stored_usage() == len(documents) and shown()[("spend", "")]["used"] == "59.00"
               and shown()[("gpu_hours", "")]["used"] == "25.000000", 180,
               f"the worker counted and stored every sample; its log: {worker.log_tail()}")

    insights = run_cli(settings, "insights", timeout=600)
    assert insights.returncode == 0, insights.stderr
    assert "4 budget line(s)" in insights.stdout, insights.stdout
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        rows = client.query(
            "SELECT metric, model_key, period, base_limit, granted, `limit`, used, remaining, runway_hours, "
            "runway_until, runway_source, computed_at FROM budget_lines FINAL WHERE tenant = 'team-a'"
        ).result_rows
    finally:
        client.close()
    # The run's time: the end of the latest gpu window, November 1 10:00.
    assert {row[11].replace(tzinfo=UTC) for row in rows} == {datetime(2026, 11, 1, 10, tzinfo=UTC)}
    printed = shown()
    assert {(row[0], row[1]) for row in rows} == set(printed)
    for metric, key, period, base, granted_now, limit, used, remaining, hours, until, source, _ in rows:
        line = printed[(metric, key)]

        def show(value: Decimal, metric: str = metric) -> str:
            return format_value("spend" if metric == "spend" else "gpu_hours", value)

        grants = sum((Decimal(g["amount"]) for g in line["grants"]), Decimal(0))
        assert (period, show(base), show(granted_now), show(limit), show(used), show(remaining)) == (
            line["period"], line["base_limit"], show(grants), line["limit"], line["used"],
            line["remaining"]), (metric, key)
        assert (None if hours is None else str(hours), source) == (line["runway_hours"], line["runway_from"])
        stated = None if until is None else until.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")
        assert stated == line["runway_until"], (metric, key)
    hours = printed[("gpu_hours", "")]
    assert (hours["limit"], hours["used"]) == ("70.000000", "25.000000")
    assert [(g["grant"], g["amount"], g["carried"]) for g in hours["grants"]] == [
        ("file:q4", "20.000000", True), ("#1", "10.000000", False)]
    assert (printed[("spend", "")]["limit"], printed[("spend", "")]["used"]) == ("1000.00", "59.00")
    assert printed[("gpu_hours", "H100-SXM-80GB")]["used"] == "20.000000"
    assert printed[("gpu_hours", "A100-")]["remaining"] == "95.000000"
