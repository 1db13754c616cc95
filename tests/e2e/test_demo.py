"""`gpumeter demo` end to end, on its own local services (free ports, temporary data dir):
the main job of `make demo` keeps working, and what it reports adds up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tests.services import REPO, free_port

pytestmark = pytest.mark.integration


def test_demo_runs_and_its_numbers_add_up(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
    env.update({
        "GPUMETER_DATA_DIR": str(tmp_path / "data"),
        "GPUMETER_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "GPUMETER_KAFKA_CONTROLLER_PORT": str(free_port()),
        "GPUMETER_KAFKA_HEAP": "512m",
        "GPUMETER_CLICKHOUSE_DSN": f"http://127.0.0.1:{free_port()}/gpumeter",
        "GPUMETER_WORKER_METRICS_PORT": "0",
    })
    run = [sys.executable, "-m", "gpumeter.app.cli"]
    try:
        demo = subprocess.run([*run, "demo", "--seconds", "15"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
    finally:
        subprocess.run([*run, "down"], cwd=REPO, env=env, capture_output=True, timeout=120, check=False)
    assert demo.returncode == 0, demo.stderr[-2000:]

    out = tmp_path / "gpumeter-out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_stored"] > 0 and summary["malformed_injected"] > 0
    # Every published sample is stored, dead-lettered or dropped as a duplicate, and the
    # demo's injected bad input and duplicates are exactly what was dead-lettered and dropped.
    assert summary["dead_letters"] == summary["malformed_injected"]
    assert summary["duplicates_dropped"] == summary["duplicates_injected"]
    assert (summary["samples_stored"] + summary["dead_letters"] + summary["duplicates_dropped"]
            == summary["samples_published"])

    report = (out / "finance-report.html").read_text()
    assert "<svg" in report and all(doc["tenant"] in report for doc in summary["invoices"])

    invoices = sorted((out / "invoices").glob("*.json"))
    assert invoices and len(invoices) == len(summary["invoices"])
    for path in invoices:
        document = json.loads(path.read_text())
        assert (out / "invoices" / path.name.replace(".json", ".csv")).exists()
        amounts = [Decimal(line["amount"]) for line in document["lines"]]
        assert Decimal(document["subtotal"]) == sum(amounts, Decimal(0))
        assert (Decimal(document["subtotal"]) + Decimal(document["commitment_true_up"])
                - Decimal(document["credits"]) == Decimal(document["total"]))
        assert Decimal(document["total"]) >= 0
