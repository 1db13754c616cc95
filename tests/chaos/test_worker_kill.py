"""The worker is killed (SIGKILL) mid-stream on real Kafka and ClickHouse: after a restart and a
replay of everything, no sample is lost and none is billed twice."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from testkit.builders import random_samples
from tests.integration.invoice_checks import (
    assert_every_sample_stored_once,
    assert_invoices_are_the_reference,
    count_rows,
    publish_lines,
)
from tests.services import run_cli, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_worker_killed_mid_stream_loses_nothing_and_bills_nothing_twice(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    valid = random_samples(seed=23, count=12000)
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

    assert_every_sample_stored_once(settings, valid)
    assert_invoices_are_the_reference(settings, valid, tmp_path / "out")
