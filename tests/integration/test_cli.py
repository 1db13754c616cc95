"""The CLI at its boundaries: exit codes, one-line errors, up/down/status, finalize + adjustment."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from testkit.builders import big_h100_user
from tests.services import REPO, free_port, run_cli

pytestmark = pytest.mark.integration


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumeter.app.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300, check=False)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["invoice", "--tenant", "t", "--period", "2026-13"], "period must be YYYY-MM",
                     id="invoice-month-13"),
        pytest.param(
            ["invoice", "--period", "2026-11"], "one of the arguments --tenant --all-tenants is required",
            id="invoice-without-tenant",
        ),
        pytest.param(["frobnicate"], "invalid choice", id="unknown-command"),
        pytest.param(["drain", "--timeout", "-3"], "must be > 0", id="drain-negative-timeout"),
    ],
)
def test_bad_usage_exits_2_with_one_line(args: list[str], needle: str) -> None:
    result = cli(*args)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_config_file_exits_2_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "gpumeter.yaml"
    config.write_text("kafka:\n  partitions: {samples: 0}\n")
    result = cli("--config", str(config), "status")
    assert result.returncode == 2
    assert str(config) in result.stderr and "samples" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_rate_card_exits_2(settings: Settings, tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text('version: "x"\ncurrency: USD\neffective_from: "2026-11-01T00:00:00Z"\n'
                    'capacity_multipliers: {on-demand: "1"}\nrates: []\n')
    settings.rate_cards = card
    result = run_cli(settings, "invoice", "--tenant", "team-a", "--period", "2026-11", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "capacity_multipliers is missing reserved, spot" in result.stderr


def test_ingest_of_a_missing_file_exits_2_and_pdf_is_a_format(settings: Settings, tmp_path: Path) -> None:
    missing = run_cli(settings, "ingest", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    # team-a has a commitment in the default tenants file: a draft PDF even without usage.
    pdf = run_cli(settings, "invoice", "--tenant", "team-a", "--period", "2026-11", "--format", "pdf",
                  "--paper", "Letter", "--out", str(tmp_path / "pdf"))
    assert pdf.returncode == 0, pdf.stderr
    (written,) = (tmp_path / "pdf").glob("*.pdf")
    assert written.name == "invoice-team-a-2026-11.pdf" and written.read_bytes().startswith(b"%PDF-")
    paper = run_cli(settings, "invoice", "--tenant", "team-a", "--period", "2026-11", "--paper", "A3")
    assert paper.returncode == 2 and "invalid choice: 'A3'" in paper.stderr


def test_ingest_from_stdin(settings: Settings) -> None:
    lines = "\n".join(json.dumps(s) for s in big_h100_user(seed=2, windows=3)) + "\n\n"
    result = run_cli(settings, "ingest", "-", stdin=lines.encode())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "accepted 3, rejected 0"


def test_ingest_keeps_going_past_a_line_with_an_integer_python_cannot_convert(settings: Settings) -> None:
    """Issue 31, point 1: a 5,000-digit integer used to abort the whole file with a traceback."""
    good = [json.dumps(s) for s in big_h100_user(seed=4, windows=2)]
    lines = "\n".join([good[0], '{"priority": ' + "9" * 5_000 + "}", good[1]]) + "\n"
    result = run_cli(settings, "ingest", "-", stdin=lines.encode())
    assert result.returncode == 2, result.stderr  # bad input was seen; both good lines still went out
    assert result.stdout.strip() == "accepted 2, rejected 1"
    assert "Traceback" not in result.stderr
    assert "line 2: not JSON" in result.stderr


def test_drain_without_a_worker_times_out_with_exit_1(settings: Settings, tmp_path: Path) -> None:
    usage = tmp_path / "u.jsonl"
    usage.write_text(json.dumps(big_h100_user(seed=3, windows=1)[0]) + "\n")
    assert run_cli(settings, "ingest", str(usage)).returncode == 0
    result = run_cli(settings, "drain", "--timeout", "3")
    assert result.returncode == 1
    assert "still unprocessed" in result.stderr and "gpumeter worker" in result.stderr


def test_up_status_down_on_free_ports(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()),
        "GPUMETER_DATA_DIR": str(tmp_path / "data"),
        "GPUMETER_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "GPUMETER_KAFKA_CONTROLLER_PORT": str(free_port()),
        "GPUMETER_CLICKHOUSE_DSN": f"http://127.0.0.1:{free_port()}/gpumeter",
        "GPUMETER_KAFKA_HEAP": "384m",
    }
    try:
        first = cli("up", env=env)
        assert first.returncode == 0, first.stderr
        assert "started Kafka" in first.stdout and "started ClickHouse" in first.stdout
        # A fresh database gets every owner's first migration (the pipeline's tables, the invoices).
        assert "applied schema migrations pipeline/1, " in first.stdout
        assert "pricing/1" in first.stdout
        second = cli("up", env=env)  # starting twice is harmless
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stdout
        status = cli("status", env=env)
        lines = dict(line.split(None, 1) for line in status.stdout.strip().splitlines())
        assert lines["kafka.answers"] == "yes" and lines["clickhouse.answers"] == "yes"
        assert lines["kafka.pid"].isdigit() and lines["clickhouse.pid"].isdigit()
        assert "gpumeter.usage.samples.v1" in lines["topics"] and "gpumeter.deadletter.v1" in lines["topics"]
    finally:
        down = cli("down", env=env)
    assert down.returncode == 0
    assert "stopped ClickHouse" in down.stdout and "stopped Kafka" in down.stdout
    after = dict(line.split(None, 1) for line in cli("status", env=env).stdout.strip().splitlines())
    assert after["kafka.answers"] == "no" and after["clickhouse.answers"] == "no"


def test_finalized_invoice_never_changes_and_late_usage_is_an_adjustment(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    # team-a holds 8 H100s: 120 h -> 960 GPU-hours, then 10 late hours -> 1040, across the 1000 h edge.
    samples = big_h100_user(seed=9, windows=130)
    on_time, late = samples[:120], samples[120:]
    worker_factory(settings)

    def ingest(batch: list[dict[str, str]], name: str) -> None:
        path = tmp_path / name
        path.write_text("\n".join(json.dumps(s) for s in batch) + "\n")
        assert run_cli(settings, "ingest", str(path)).returncode == 0
        assert run_cli(settings, "drain", "--timeout", "120").returncode == 0

    def invoice(out: str, *extra: str) -> dict[str, Any]:
        result = run_cli(settings, "invoice", "--tenant", "team-a", "--period", "2026-11", "--out",
                         str(tmp_path / out), *extra)
        assert result.returncode == 0, result.stderr
        (path,) = (tmp_path / out).glob("*.json")
        return json.loads(path.read_text())

    ingest(on_time, "on-time.jsonl")
    final = invoice("final", "--finalize")
    assert final["status"] == "final"
    # 960 h x 2.50 = 2400.00; commitment 1000 is met; credits 250 -> 2150.00.
    assert final["lines"][0]["amount"] == "2400.00" and final["total"] == "2150.00"

    ingest(late, "late.jsonl")
    adjustment = invoice("adjustment")
    assert adjustment["status"] == "adjustment"
    (line,) = adjustment["lines"]
    # 1040 h in full = 1000 x 2.50 + 40 x 2.25 = 2590.00; minus the 2400.00 already billed.
    assert line["quantity"] == "80.000000" and line["amount"] == "190.00"
    assert adjustment["credits"] == "0.00" and adjustment["total"] == "190.00"

    again = invoice("final-again")  # the finalized invoice is still what was issued... plus nothing new
    assert again == adjustment  # unfinalized adjustment is recomputed identically
    issued = invoice("issued-adjustment", "--finalize")
    # Issued: the same contract-4b figures, now numbered and referencing the final.
    assert {key: issued[key] for key in adjustment} == adjustment
    assert issued["adjusts"] == final["number"] and issued["number"] > final["number"]
    unchanged = invoice("after-all")
    assert unchanged["status"] == "adjustment" and Decimal(unchanged["total"]) == Decimal("190.00")


def test_collect_simulated_publishes_what_the_fleet_emits(settings: Settings) -> None:
    from collectors.sim.fleet import FleetConfig, SimulatedFleet
    from gpumeter.core import topics
    from gpumeter.core.records import split
    from gpumeter.infra import kafka

    expected = SimulatedFleet(FleetConfig(seed=5))
    expected_ids = {s["event_id"] for _ in range(3) for s in expected.step_dicts()}
    result = run_cli(settings, "collect", "--source", "simulated", "--seed", "5", "--windows", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"published {len(expected_ids)} samples"
    ends = kafka.end_offsets(settings.kafka, [settings.kafka.topic(topics.SAMPLES)])
    consumer = kafka.KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, enable_auto_commit=False)
    consumer.assign(list(ends))
    consumer.seek_to_beginning()
    seen: set[str] = set()
    while any(consumer.position(tp) < end for tp, end in ends.items()):
        for records in consumer.poll(timeout_ms=1000).values():
            seen.update(json.loads(line)["event_id"] for r in records for line in split(r.value))
    consumer.close()
    assert seen == expected_ids
