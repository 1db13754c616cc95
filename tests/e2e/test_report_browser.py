"""The finance report opens in a real browser (headless Chromium): no console errors, a
screenshot that is not blank, and every chart drawn with data (issue 12's report check).

The report comes from `gpumeter report` over a real pipeline run (Kafka, worker, ClickHouse).
Chromium is Debian's `chromium`, installed by `make test` where missing; without it this test
fails rather than skips.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from testkit.builders import random_samples, sample
from tests.integration.invoice_checks import expected_invoices, publish_lines
from tests.services import run_cli

pytestmark = pytest.mark.integration


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is not installed: run `make test` (it installs Debian's chromium)"
    return found


def test_the_report_renders_in_chromium_with_every_chart_drawn(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    samples = random_samples(seed=61, count=800)
    # One GPU held and idle (1% busy) for the last two hours of the data: the idle-GPU chart's data.
    end = max(datetime.fromisoformat(s["window_end"]) for s in samples)
    samples += [
        sample(f"idle-{i}", tenant="team-a", pod="idle-notebook", pod_uid="idle-uid", node="node-idle",
               start=end - timedelta(minutes=15 * (i + 1)), seconds=900, utilization="0.01")
        for i in range(8)
    ]
    worker_factory(settings)
    publish_lines(settings, [json.dumps(s).encode() for s in samples])
    drained = run_cli(settings, "drain", "--timeout", "120")
    assert drained.returncode == 0, drained.stderr
    period = sorted({p for _, p in expected_invoices(samples)})[0]
    out = tmp_path / "report"
    made = run_cli(settings, "report", "--period", period, "--out", str(out))
    assert made.returncode == 0, made.stderr
    report = out / "finance-report.html"

    shot = tmp_path / "report.png"
    browser = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--window-size=1280,1600", f"--screenshot={shot}",
         report.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert browser.returncode == 0, browser.stderr[-2000:]
    console = [line for line in browser.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console

    image = Image.open(shot).convert("L")
    low, high = image.getextrema()  # one band ("L"): two ints
    assert isinstance(low, int) and isinstance(high, int)
    assert high - low > 100, "the screenshot is blank"
    assert len(set(image.resize((64, 80)).getdata())) > 8, "the screenshot has almost no content"

    html = report.read_text(encoding="utf-8")
    charts = re.findall(r"<svg\b.*?</svg>", html, flags=re.DOTALL)
    assert charts, "no chart in the report"
    for chart in charts:
        marks = re.findall(r"<(?:rect|path|polyline|circle|line)\b[^>]*>", chart)
        data_marks = [m for m in marks if not re.search(r'(?:width|height)="0(?:\.0+)?"', m)]
        assert data_marks, f"a chart without data: {chart[:200]}"
