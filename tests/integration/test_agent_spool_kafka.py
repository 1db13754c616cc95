"""End to end with a real broker: Kafka goes away, samples spool to disk, Kafka comes back, the spool
replays oldest first and every sample arrives.

Needs the ``kafka_service`` fixture (tests/conftest.py: an object with ``.bootstrap``, ``.stop()``,
``.start()`` controlling a real broker that keeps its data across stop/start).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer

from collectors.agent.publisher import Publisher
from collectors.agent.samples import event_id
from collectors.agent.spool import Spool
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.models import UsageSample, parse_sample
from gpumeter.core.records import split
from gpumeter.core.settings import KafkaSettings
from gpumeter.core.topics import SAMPLES
from gpumeter.infra import clickhouse
from testkit.builders import OMIT, usage_sample
from tests.services import Endpoints, Namespaces, isolated_settings, prepared, run_cli

pytestmark = [pytest.mark.agent, pytest.mark.integration]

START = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)


def window(n: int, tenant: str) -> list[UsageSample]:
    """Window ``n`` (15 s) of five pods of ``tenant``, one H100 each, with the agent's event ids."""
    start = START + timedelta(seconds=15 * n)
    return [
        usage_sample(
            event_id("c", "gpu-node-1", f"uid-{tenant}-{pod}", "gpu", "GPU-0", start),
            cluster="c", node="gpu-node-1", tenant=tenant, namespace=tenant, pod=f"pod-{pod}",
            pod_uid=f"uid-{tenant}-{pod}", start=start, seconds=15, capacity_type=OMIT, mig_profile=OMIT,
        )
        for pod in range(5)
    ]


def consume(kafka: KafkaSettings, expected: int, timeout: float = 60) -> list[UsageSample]:
    consumer = KafkaConsumer(
        kafka.topic(SAMPLES),
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    got: list[UsageSample] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(parse_sample(line) for record in records for line in split(record.value))
    finally:
        consumer.close()
    return got


def test_kafka_outage_spools_and_replays_everything(
    kafka_service: Any, endpoints: Endpoints, namespaces: Namespaces,
    worker_factory: Callable[..., WorkerProcess], tmp_path: Path,
) -> None:
    broker = kafka_service
    settings = isolated_settings(endpoints, tmp_path / "data")
    namespaces.add(settings, topics=False)  # the topics live on this test's own broker
    settings.kafka.bootstrap = broker.bootstrap
    kafka = settings.kafka
    prepared(settings)  # topics on this broker, the database migrated (the worker will not)
    publisher = Publisher(kafka, Spool(tmp_path / "spool"), send_timeout=3.0, retry_seconds=1.0)
    windows = [window(n, tenant) for n in range(6) for tenant in ("team-a", "team-b")]
    try:
        assert publisher.publish(windows[0] + windows[1]).sent == 10

        broker.stop()
        for batch in windows[2:8]:
            result = publisher.publish(batch)
            assert result.sent == 0 and result.dropped == 0
        assert publisher.spool.records == 30 and not publisher.kafka_up

        broker.start()
        deadline = time.monotonic() + 90
        while publisher.spool.records and time.monotonic() < deadline:
            time.sleep(1.0)
            publisher.publish([])
        assert publisher.spool.records == 0, "the spool did not drain after Kafka came back"
        for batch in windows[8:]:
            assert publisher.publish(batch).sent == 5
    finally:
        publisher.close()

    every = [s for batch in windows for s in batch]
    got = consume(kafka, len(every))
    assert {s.event_id for s in got} == {s.event_id for s in every}  # nothing lost (duplicates allowed)
    for tenant in ("team-a", "team-b"):  # one key, one partition: windows arrive oldest first
        starts = [s.window_start for s in got if s.tenant == tenant]
        first_seen = list(dict.fromkeys(starts))
        assert first_seen == sorted(first_seen)
    assert not list(Path(tmp_path / "spool").glob("*.seg"))

    # Through the worker into ClickHouse: every sample exactly once by event_id.
    worker_factory(settings)
    drained = run_cli(settings, "drain", "--timeout", "240")
    assert drained.returncode == 0, drained.stderr
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        stored = client.query("SELECT event_id, count() FROM rated_usage GROUP BY event_id").result_rows
    finally:
        client.close()
    assert {event_id for event_id, _ in stored} == {s.event_id for s in every}
    assert all(copies == 1 for _, copies in stored)
