"""Poison input never wedges the worker (contract 1, amended ranges; issue: exactly once at scale).

A sample that validates but cannot be stored used to make its batch retry forever, so
nothing after it was ever acknowledged. These run on the real broker and the real
ClickHouse engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.records import join
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from gpumeter.infra.schema import RATED_USAGE
from gpumeter.infra.tables import Topology
from streams.sink import ClickHouseSink, connector
from testkit.builders import OMIT, random_samples, sample
from tests.integration.invoice_checks import count_rows, publish_lines
from tests.services import run_cli, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.security]

POISON: dict[str, dict[str, Any]] = {
    "priority-3e9": {"priority": 3_000_000_000},
    "huge-utilization": {"utilization": "100000000000000000000"},
    "window-in-2400": {"window_start": "2400-01-01T00:00:00Z", "window_end": "2400-01-01T00:01:00Z"},
}
NANO_SAMPLE = sample(
    "go-agent-nano", cluster="it", node="n", tenant="team-b", namespace="team-b", pod="p", pod_uid="u",
    start="2026-11-10T00:00:00.000000001Z", end="2026-11-10T00:01:00.000000002Z",
    quantity="0.142857142857",  # a 1g MIG slice of 7
    capacity_type=OMIT, mig_profile=OMIT,
)


def publish_record(settings: Settings, tenant: str, record: bytes) -> None:
    producer = kafka.make_producer(settings.kafka)
    producer.send(settings.kafka.topic(topics.SAMPLES), key=tenant.encode(), value=record)
    producer.flush(timeout=60)
    producer.close()


def poisoned(base: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**base, **changes, "event_id": f"poison-{name}"} for name, changes in POISON.items()]


def test_a_poisoned_sample_is_a_dead_letter_and_everything_else_is_billed(
    settings: Settings, worker_factory: Callable[..., WorkerProcess]
) -> None:
    ordinary = random_samples(seed=31, count=400)
    lines = [json.dumps(s).encode() for s in ordinary[:200] + poisoned(ordinary[0]) + [NANO_SAMPLE]
             + ordinary[200:]]
    worker_factory(settings)
    publish_lines(settings, lines)
    # An integer Python will not convert (over 4,300 digits) between two valid samples of one
    # record: its plain ValueError once left the record unacknowledged, the partition's commit
    # stuck behind it and its neighbours unbilled (issue 31, point 1).
    beside = [{**s, "event_id": f"beside-{i}"} for i, s in enumerate(random_samples(seed=33, count=2))]
    huge = b'{"event_id": "poison-huge-int", "priority": ' + b"9" * 5_000 + b"}"
    publish_record(settings, beside[0]["tenant"], join([json.dumps(beside[0]).encode(), huge,
                                                        json.dumps(beside[1]).encode()]))
    publish_lines(settings, [json.dumps(s).encode() for s in random_samples(seed=34, count=20)])

    # Before the fix this never finished: the batch holding the poison retried forever.
    drained = run_cli(settings, "drain", "--timeout", "90")
    assert drained.returncode == 0, drained.stderr

    assert count_rows(settings, "SELECT count() FROM rated_usage") == len(ordinary) + 1 + 2 + 20
    for name in POISON:
        reason = count_rows(
            settings, f"SELECT count() FROM dead_letters FINAL WHERE event_id = 'poison-{name}' "
            "AND reason_code = 'invalid'")
        assert reason == 1, name
    assert count_rows(settings, "SELECT count() FROM dead_letters FINAL WHERE reason_code = 'not_json'") == 1
    # RFC3339Nano: 60.000000001 s x 0.142857142857 GPU = 21 decimal places, every one kept.
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        stored = clickhouse.scalar(
            client, "SELECT unit_seconds FROM rated_usage WHERE event_id = 'go-agent-nano'")
    finally:
        client.close()
    assert stored == Decimal("60.000000001") * Decimal("0.142857142857")
    assert stored == Decimal("8.571428571562857142857")


def rated_row_values(event_id: str, **changes: Any) -> list[Any]:
    values: dict[str, Any] = {
        "event_id": event_id, "tenant": "team-a", "period": "2026-11", "kind": "gpu", "cluster": "c",
        "node": "n", "namespace": "ns", "pod": "p", "pod_uid": "u",
        "window_start": datetime(2026, 11, 1, tzinfo=UTC),
        "window_end": datetime(2026, 11, 1, 0, 1, tzinfo=UTC),
        "quantity": Decimal(1), "unit_seconds": Decimal(60), "gpu_model": "H100-SXM-80GB",
        "mig_profile": None,
        "capacity_type": "on-demand", "priority": 0, "rate_card": "2026-11", "currency": "USD",
        "unit_price": Decimal("2.5"), "capacity_multiplier": Decimal(1), "list_cost": Decimal("0.0416"),
        "utilization": None, "energy_joules": None, "labels": {}, "source_partition": 0, "source_offset": 0,
    }
    values.update(changes)
    return [values[column] for column in RATED_USAGE.insert_columns]


def test_the_sink_stores_the_batch_and_returns_rows_the_engine_refuses(settings: Settings) -> None:
    """Defence in depth behind validation: the real client and engine judge what is storable."""
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    good = [tuple(rated_row_values(f"good-{i}")) for i in range(7)]
    bad_priority = tuple(rated_row_values("bad-priority", priority=3_000_000_000))
    bad_energy = tuple(rated_row_values("bad-energy", energy_joules=Decimal("1e40")))
    try:
        result = sink.store_rated([*good[:3], bad_priority, *good[3:5], bad_energy, *good[5:]])
    finally:
        sink.close()
    assert result.stored == len(good)
    assert sorted(row[0] for row, _ in result.rejected) == ["bad-energy", "bad-priority"]
    reasons = dict((row[0], reason) for row, reason in result.rejected)
    assert "priority" in reasons["bad-priority"]
    assert count_rows(settings, "SELECT count() FROM rated_usage") == len(good)
    assert count_rows(settings, "SELECT count() FROM rated_usage WHERE event_id LIKE 'bad-%'") == 0


def test_sigterm_stops_a_worker_that_cannot_store_and_commits_nothing(
    settings: Settings, worker_factory: Callable[..., WorkerProcess]
) -> None:
    settings.worker.sink_max_backoff_seconds = 60.0  # a worker deep in its back-off
    worker = worker_factory(settings)
    group = settings.kafka.topic_prefix + settings.worker.group
    samples_topic = settings.kafka.topic(topics.SAMPLES)
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("DROP TABLE usage_hourly_mv")
        client.command("DROP TABLE rated_usage")  # every insert now fails: the sink retries
    finally:
        client.close()
    publish_lines(settings, [json.dumps(s).encode() for s in random_samples(seed=32, count=50)])
    wait_until(lambda: worker.log_tail(200).count("storing") >= 5, 90, "the sink to back off")

    assert worker.process is not None
    worker.process.terminate()
    # A functional bound, not a benchmark: before the fix the worker ignored SIGTERM while retrying.
    worker.process.wait(timeout=25)

    committed = {tp: offset for tp, offset in kafka.committed_offsets(settings.kafka, group).items()
                 if tp.topic == samples_topic}
    assert sum(committed.values()) == 0, committed
