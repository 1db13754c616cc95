"""Several workers on one samples topic: two start, a third joins and one is killed (SIGKILL)
mid-stream, so partitions move twice while batches are pending. Afterwards every sample is
billed once, the hourly rollup finance reads equals the deduplicated base table, and the
invoices equal the independent reference. Real Kafka and ClickHouse."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from testkit.builders import random_samples
from tests.integration.invoice_checks import (
    assert_every_sample_stored_once,
    assert_invoices_are_the_reference,
    count_rows,
    publish_lines,
)
from tests.services import run_cli, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def totals(settings: Settings, sql: str) -> dict[tuple[str, str], tuple[int, Decimal]]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        return {(tenant, period): (int(samples), Decimal(seconds))
                for tenant, period, samples, seconds in client.query(sql).result_rows}
    finally:
        client.close()


def test_workers_joining_and_dying_mid_stream_bill_every_sample_once(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    valid = random_samples(seed=41, count=15000)
    lines = [json.dumps(s).encode() for s in valid]
    settings.worker.sink_batch_size = 300  # many small batches: pending ones when partitions move
    first = worker_factory(settings, "first")
    worker_factory(settings, "second")
    publish_lines(settings, lines[:9000])
    wait_until(lambda: count_rows(settings, "SELECT count() FROM rated_usage") >= 1500, 180,
               "the first two workers stored nothing")
    worker_factory(settings, "third")  # a rebalance while batches are pending
    first.kill9()  # and another when its session times out
    stored_at_kill = count_rows(settings, "SELECT count() FROM rated_usage")
    assert stored_at_kill < 9000, "the kill came too late to test anything"
    publish_lines(settings, lines[9000:])
    drained = run_cli(settings, "drain", "--timeout", "300")
    assert drained.returncode == 0, drained.stderr

    assert_every_sample_stored_once(settings, valid)
    base = totals(settings, "SELECT tenant, period, count(), sum(unit_seconds) FROM rated_usage FINAL "
                            "GROUP BY tenant, period")
    rollup = totals(settings, "SELECT tenant, period, sum(samples), sum(unit_seconds) FROM usage_hourly "
                              "GROUP BY tenant, period")
    assert rollup == base
    assert_invoices_are_the_reference(settings, valid, tmp_path / "out")
