"""A worker restarted onto a backlog, again and again, on real Kafka and ClickHouse: each time
every samples partition's commit reaches its end, and every sample is billed once.

This is the defect streams/faust_consumer.py fixes: records fetched while faust seeks the
stream partitions after recovering the quota ledger were dropped, and the partition's commit
then stayed behind them for as long as the worker ran (`gpumeter drain` timed out). Each start
onto a backlog gave it a chance (about one start in three here, before the fix), so the test
restarts several times.
"""

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
    publish_lines,
)
from tests.services import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

RESTARTS = 5
PER_RESTART = 1500


def test_every_restart_onto_a_backlog_commits_each_partition_to_its_end(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    valid = random_samples(seed=59, count=RESTARTS * PER_RESTART)
    lines = [json.dumps(s).encode() for s in valid]
    for restart in range(RESTARTS):
        # The backlog is there before the worker starts: it recovers the quota ledger's
        # changelog (written by the previous run) and then seeks onto waiting records.
        publish_lines(settings, lines[restart * PER_RESTART:(restart + 1) * PER_RESTART])
        worker = worker_factory(settings, f"start-{restart}")
        drained = run_cli(settings, "drain", "--timeout", "90")
        assert drained.returncode == 0, f"start {restart}: {drained.stderr}\n{worker.log_tail()}"
        worker.stop()

    assert_every_sample_stored_once(settings, valid)
    assert_invoices_are_the_reference(settings, valid, tmp_path / "out")
