"""Two workers racing on one event_id (contract 1; issue 28, point 4).

The samples topic is keyed by tenant, so two copies of one event_id that name different
tenants travel on different partitions, and with two workers they are rated and stored by
different processes at the same moment. Each worker's id lookup finds nothing yet; before
the fix both inserted, and the id was billed twice (once per tenant). Contract 1: the first
stored copy wins, the other is a `duplicate_conflict` dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kafka.errors import KafkaError

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.records import join
from gpumeter.core.settings import Settings
from gpumeter.infra import kafka
from testkit.builders import sample
from tests.integration.invoice_checks import count_rows
from tests.services import run_cli, wait_until

pytestmark = pytest.mark.integration

IDS = 12_000
RECORD_LINES = 200


def copies(tenant: str, minute_offset: int) -> list[bytes]:
    """One cpu minute per id under ``tenant``; ``minute_offset`` moves the window too, so the two
    copies of an id differ in more than the tenant."""
    return [
        json.dumps(sample(
            f"race-{index}", kind="cpu", tenant=tenant, namespace=tenant, pod=f"p-{index % 50}",
            start=f"2026-11-{1 + index % 28:02d}T{index % 24:02d}:{minute_offset:02d}:00Z", seconds=60,
            quantity="1", capacity_type="on-demand", gpu_model=None,
        )).encode()
        for index in range(IDS)
    ]


def test_two_workers_bill_each_event_id_once_whatever_tenant_its_copies_name(
    settings: Settings, worker_factory: Callable[..., WorkerProcess]
) -> None:
    first, second = worker_factory(settings, "worker-a"), worker_factory(settings, "worker-b")
    group = settings.kafka.topic_prefix + settings.worker.group
    topic = settings.kafka.topic(topics.SAMPLES)
    partitions = settings.kafka.partitions.samples

    def both_joined() -> bool:
        client = kafka.admin(settings.kafka)
        try:
            description = client.describe_groups([group])[group]
        except KafkaError:  # the group's coordinator is still being elected
            return False
        finally:
            client.close()
        return description.get("group_state") == "Stable" and len(description.get("members") or []) == 2

    wait_until(both_joined, 120, "both workers to join the group")
    assert first.alive() and second.alive()

    # Copy A of every id on partitions 0..n/2-1, copy B on the other half: the workers each own
    # some partitions, and records of both copies are sent interleaved so both are in flight.
    a_lines, b_lines = copies("team-a", 0), copies("team-b", 30)
    producer = kafka.make_producer(settings.kafka)
    try:
        for start in range(0, IDS, RECORD_LINES):
            chunk = start // RECORD_LINES
            a_partition = chunk % (partitions // 2)
            b_partition = partitions // 2 + chunk % (partitions - partitions // 2)
            producer.send(topic, key=b"team-a", value=join(a_lines[start:start + RECORD_LINES]),
                          partition=a_partition)
            producer.send(topic, key=b"team-b", value=join(b_lines[start:start + RECORD_LINES]),
                          partition=b_partition)
        producer.flush(timeout=60)
    finally:
        producer.close()

    drained = run_cli(settings, "drain", "--timeout", "180")
    assert drained.returncode == 0, drained.stderr

    assert count_rows(settings, "SELECT count() FROM rated_usage") == IDS
    assert count_rows(settings, "SELECT uniqExact(event_id) FROM rated_usage") == IDS
    conflicts = count_rows(settings, "SELECT uniqExact(event_id) FROM dead_letters FINAL "
                                     "WHERE reason_code = 'duplicate_conflict'")
    assert conflicts == IDS
    # Billed once means once per id across tenants: what each tenant is billed for adds up.
    per_tenant = count_rows(settings, "SELECT countIf(tenant = 'team-a') + countIf(tenant = 'team-b') "
                                      "FROM rated_usage")
    assert per_tenant == IDS
