"""ClickHouse stops mid-stream: the sink retries with back-off, commits nothing it has not
stored, and after the restart every invoice is exact."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gpumeter.app import schema
from gpumeter.app.runtime.chserver import LocalClickHouse
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from testkit.builders import random_samples
from tests.integration.invoice_checks import (
    assert_invoices_are_the_reference,
    count_rows,
    publish_lines,
)
from tests.services import (
    Endpoints,
    Namespaces,
    isolated_settings,
    run_cli,
    start_local_clickhouse,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def committed_samples(settings: Settings) -> int:
    """How many samples the worker's group has committed (= claims to have rated and stored).

    All samples in this test are valid and unique, so each committed one must be a stored row.
    """
    group = settings.kafka.topic_prefix + settings.worker.group
    samples = settings.kafka.topic(topics.SAMPLES)
    return sum(o for tp, o in kafka.committed_offsets(settings.kafka, group).items() if tp.topic == samples)


@pytest.fixture
def own_clickhouse(tmp_path: Path) -> Iterator[LocalClickHouse]:
    server = start_local_clickhouse(tmp_path / "clickhouse")
    yield server
    server.stop()


def test_clickhouse_outage_mid_stream(endpoints: Endpoints, own_clickhouse: LocalClickHouse,
                                      namespaces: Namespaces, worker_factory: Callable[..., WorkerProcess],
                                      tmp_path: Path) -> None:
    settings = isolated_settings(endpoints, tmp_path / "data", clickhouse_url=own_clickhouse.url)
    namespaces.add(settings, database=False)  # the database lives on this test's own server
    kafka.ensure_topics(settings.kafka)
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client)
    client.close()

    valid = random_samples(seed=31, count=9000)
    lines = [json.dumps(s).encode() for s in valid]
    worker = worker_factory(settings)
    publish_lines(settings, lines[:4000])
    wait_until(lambda: count_rows(settings, "SELECT count() FROM rated_usage") >= 1000, 180,
               "nothing stored before the outage")

    own_clickhouse.stop()
    publish_lines(settings, lines[4000:])
    time.sleep(3)  # commits of what was stored before the stop have gone out by now
    committed_early = committed_samples(settings)
    time.sleep(6)  # the sink keeps failing and backing off meanwhile
    committed_late = committed_samples(settings)
    assert worker.alive(), worker.log_tail()
    assert committed_late == committed_early, "offsets were committed while nothing could be stored"

    own_clickhouse.start(timeout=90)
    # Every sample committed during the outage had been stored before it.
    assert committed_late <= count_rows(settings, "SELECT count() FROM rated_usage")
    assert "storing" in Path(worker.log_path).read_text() and "failed" in Path(worker.log_path).read_text()

    # Invoices can be produced while the worker is still catching up.
    mid = run_cli(settings, "invoice", "--tenant", "team-a", "--period", "2026-11", "--format", "json",
                  "--out", str(tmp_path / "mid"))
    assert mid.returncode == 0, mid.stderr
    document = json.loads((tmp_path / "mid" / "invoice-team-a-2026-11.json").read_text())
    assert Decimal(document["subtotal"]) == sum(Decimal(line["amount"]) for line in document["lines"])

    drained = run_cli(settings, "drain", "--timeout", "300")
    assert drained.returncode == 0, drained.stderr + worker.log_tail()
    assert count_rows(settings, "SELECT count() FROM rated_usage") == len(valid)
    assert_invoices_are_the_reference(settings, valid, tmp_path / "out")
