"""Quota accounting in the worker on the real broker and the real ClickHouse engine (contract 4).

Two tenants stream GPU usage through `gpumeter ingest` (one Kafka record per tenant and
step) until both cross their monthly GPU-hour quotas; a December sample then rolls the
period over. The worker is killed with SIGKILL as soon as the exceeding crossings are
published, its group's committed offsets are rewound to 0 (a crash before any commit,
made deterministic), and a second worker replays everything and finishes the stream:
every crossing is announced, none twice, and the ledger counted no usage twice.

Expected events are worked out by hand from the steps below (1 GPU x 1 h = 1 GPU-hour per
sample), not read back from the code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import MemberToRemove
from kafka.structs import OffsetAndMetadata

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from tests.services import run_cli, wait_until

pytestmark = pytest.mark.integration

TENANTS_FILE = """\
tenants:
  - tenant: alpha
    period: month
    gpu_hours: 10
    warn_at: [0.5, 0.8]
    on_exceed: block
  - tenant: beta
    gpu_hours: 4
    warn_at: [0.75]
    on_exceed: notify
"""

# Step -> (tenant, pods, window start): one sample per pod, 1 H100 for 1 hour.
STEPS: list[list[tuple[str, list[str], str]]] = [
    [("alpha", ["a1", "a2"], "2026-11-10T00:00:00Z"), ("beta", ["b1"], "2026-11-10T00:00:00Z")],
    [("alpha", ["a1", "a2"], "2026-11-10T01:00:00Z"), ("beta", ["b1"], "2026-11-10T01:00:00Z")],
    # alpha jumps from 4 to 9 GPU-hours in one record: over 0.5 and 0.8 of 10 at once.
    [("alpha", ["a1", "a2", "a3", "a4", "a5"], "2026-11-10T02:00:00Z"),
     ("beta", ["b1"], "2026-11-10T02:00:00Z")],
    [("alpha", ["a1", "a2"], "2026-11-10T03:00:00Z"), ("beta", ["b1", "b2"], "2026-11-10T03:00:00Z")],
    # A new month: November's exceeded quotas recover.
    [("alpha", ["a1"], "2026-12-01T00:00:00Z"), ("beta", ["b1"], "2026-12-01T00:00:00Z")],
]

# (tenant, metric, level, threshold, period, used, limit), by the step that causes it.
# alpha: 2, 4, 9, 11 GPU-hours of 10; beta: 1, 2, 3, 5 of 4.
WARNINGS = {
    ("alpha", "gpu_hours", "warning", "0.5", "2026-11", "9.000000", "10.000000"),
    ("alpha", "gpu_hours", "warning", "0.8", "2026-11", "9.000000", "10.000000"),
    ("beta", "gpu_hours", "warning", "0.75", "2026-11", "3.000000", "4.000000"),
}
EXCEEDED = {
    ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "11.000000", "10.000000"),
    ("beta", "gpu_hours", "exceeded", "1", "2026-11", "5.000000", "4.000000"),
}
RECOVERED = {
    ("alpha", "gpu_hours", "recovered", "1", "2026-11", "11.000000", "10.000000"),
    ("beta", "gpu_hours", "recovered", "1", "2026-11", "5.000000", "4.000000"),
}


def sample(tenant: str, pod: str, start: str) -> dict[str, Any]:
    begin = datetime.fromisoformat(start.replace("Z", "+00:00"))
    return {
        "event_id": f"{tenant}-{pod}-{start}", "kind": "gpu", "cluster": "it", "node": f"node-{tenant}",
        "tenant": tenant, "namespace": tenant, "pod": pod, "pod_uid": f"uid-{tenant}-{pod}",
        "window_start": start, "window_end": (begin + timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
        "quantity": "1", "gpu_model": "H100-SXM-80GB",
    }


def ingest_step(settings: Settings, tmp_path: Path, step: int) -> None:
    path = tmp_path / f"step-{step}.jsonl"
    path.write_text("".join(json.dumps(sample(tenant, pod, start)) + "\n"
                            for tenant, pods, start in STEPS[step] for pod in pods))
    result = run_cli(settings, "ingest", str(path))
    assert result.returncode == 0, result.stderr


def topic_events(settings: Settings) -> list[dict[str, Any]]:
    """Every record on the quota events topic, in partition order, with its key checked."""
    topic = settings.kafka.topic(topics.QUOTA_EVENTS)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, enable_auto_commit=False,
                             group_id=None)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        found: list[dict[str, Any]] = []
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            for messages in consumer.poll(timeout_ms=500).values():
                for message in messages:
                    event = json.loads(message.value)
                    assert message.key == event["tenant"].encode()  # key = tenant
                    found.append(event)
        return found
    finally:
        consumer.close()


def rewind_group(settings: Settings) -> int:
    """Evict the killed worker from its group (as its session timeout would) and rewind every
    committed offset to 0: the worst case of a crash, where nothing was ever committed, so the
    next worker re-rates every sample and re-reads every rated record. Returns how many
    records that replays."""
    group = settings.kafka.topic_prefix + settings.worker.group
    committed = kafka.committed_offsets(settings.kafka, group)
    admin = kafka.admin(settings.kafka)
    try:
        members = admin.describe_groups([group])[group]["members"]
        if members:
            admin.remove_group_members(group, [MemberToRemove(member_id=m["member_id"]) for m in members])
        errors = admin.alter_group_offsets(group, {tp: OffsetAndMetadata(0, "", -1) for tp in committed})
    finally:
        admin.close()
    assert all(error.__name__ == "NoError" for error in errors.values()), errors
    return sum(committed.values())


def committed_past(settings: Settings, ends: dict[TopicPartition, int]) -> bool:
    committed = kafka.committed_offsets(settings.kafka, settings.kafka.topic_prefix + settings.worker.group)
    return all(committed.get(tp, 0) >= end for tp, end in ends.items())


def summary(event: dict[str, Any]) -> tuple[str, ...]:
    return (event["tenant"], event["metric"], event["level"], event["threshold"], event["period"],
            event["used"], event["limit"])


def stored_events(settings: Settings) -> list[tuple[Any, ...]]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        return [tuple(row) for row in client.query(
            "SELECT event_id, tenant, metric, level, threshold, period, used, `limit` FROM quota_events FINAL"
        ).result_rows]
    finally:
        client.close()


def stored_summaries(settings: Settings) -> list[tuple[str, ...]]:
    """ClickHouse rows as event summaries; Decimal columns compared by value, shown like the event."""
    rows: list[tuple[str, ...]] = []
    for _id, tenant, metric, level, threshold, period, used, limit in stored_events(settings):
        rows.append((tenant, metric, level, _plain(threshold), period, f"{used:.6f}", f"{limit:.6f}"))
    return rows


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")


def quota_status(settings: Settings, *args: str) -> dict[str, dict[str, Any]]:
    result = run_cli(settings, "quota", "status", "--json", *args)
    assert result.returncode == 0, result.stderr
    return {entry["tenant"]: entry for entry in json.loads(result.stdout)["tenants"]}


def gpu_hours(entry: dict[str, Any]) -> dict[str, Any]:
    return next(metric for metric in entry["metrics"] if metric["metric"] == "gpu_hours")


def test_quota_crossings_once_each_through_a_worker_kill(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS_FILE)
    settings.tenants = tenants
    settings.quota.reload_seconds = 0.5
    first = worker_factory(settings, "first")

    for step in range(3):
        ingest_step(settings, tmp_path, step)
    wait_until(lambda: len(stored_events(settings)) >= 3, 180,
               f"three warnings stored; worker log: {first.log_tail()}")
    # Before any crash: each warning exactly once on the topic and in ClickHouse.
    assert sorted(summary(e) for e in topic_events(settings)) == sorted(WARNINGS)
    assert sorted(stored_summaries(settings)) == sorted(WARNINGS)

    # The exceeding record, and a SIGKILL as soon as its events are published; then every
    # committed offset goes back to 0, so the second worker replays the whole stream.
    ingest_step(settings, tmp_path, 3)
    wait_until(lambda: {summary(e) for e in topic_events(settings)} >= EXCEEDED, 120,
               f"exceeded published; worker log: {first.log_tail()}")
    first.kill9()
    rated = settings.kafka.topic(topics.RATED)
    replayed = rewind_group(settings)
    assert replayed > 0

    second = worker_factory(settings, "second")
    rated_end = kafka.end_offsets(settings.kafka, [rated])
    wait_until(lambda: committed_past(settings, rated_end), 240,
               f"the second worker re-read every rated record; its log: {second.log_tail()}")
    wait_until(lambda: gpu_hours(quota_status(settings)["alpha"])["used"] == "11.000000"
               and len(stored_events(settings)) >= 5, 240,
               f"the second worker took over; its log: {second.log_tail()}")
    status = quota_status(settings)
    assert status["alpha"]["state"] == "blocked"  # on_exceed: block, exceeded and not recovered
    assert status["alpha"]["blocked"] == ["gpu_hours"]
    assert gpu_hours(status["alpha"]) == {"metric": "gpu_hours", "period": "2026-11", "used": "11.000000",
                                          "limit": "10.000000", "fraction": "1.100000", "state": "exceeded",
                                          "overshoot_bound": None}  # block: no bound stated
    assert status["beta"]["state"] == "exceeded"  # on_exceed: notify never blocks
    assert gpu_hours(status["beta"])["used"] == "5.000000"
    table = run_cli(settings, "quota", "status")
    assert table.returncode == 0, table.stderr
    assert "blocked" in table.stdout and "alpha" in table.stdout

    ingest_step(settings, tmp_path, 4)
    expected = WARNINGS | EXCEEDED | RECOVERED
    wait_until(lambda: len(stored_events(settings)) >= len(expected), 180,
               f"recoveries stored; worker log: {second.log_tail()}")

    # No crossing missing, none announced twice: a replay republishes the same event_id,
    # and ClickHouse holds each id once.
    published = topic_events(settings)
    ids = {e["event_id"]: summary(e) for e in published}
    assert sorted(ids.values()) == sorted(expected)
    for event in published:
        assert ids[event["event_id"]] == summary(event)  # a republished id is the same crossing
    stored = stored_events(settings)
    assert len(stored) == len(expected)
    assert {row[0] for row in stored} == set(ids)
    assert sorted(stored_summaries(settings)) == sorted(expected)

    # The ledger counted every sample once, across the kill: November still adds up.
    november = quota_status(settings, "--at", "2026-11-30T12:00:00Z")
    assert gpu_hours(november["alpha"])["used"] == "11.000000"
    assert gpu_hours(november["beta"])["used"] == "5.000000"
    december = quota_status(settings)
    assert gpu_hours(december["alpha"]) == {"metric": "gpu_hours", "period": "2026-12", "used": "1.000000",
                                            "limit": "10.000000", "fraction": "0.100000", "state": "ok",
                                            "overshoot_bound": None}
    assert december["alpha"]["state"] == "ok" and december["beta"]["state"] == "ok"


def test_quota_status_refuses_bad_input(settings: Settings, tmp_path: Path) -> None:
    bad_time = run_cli(settings, "quota", "status", "--at", "next tuesday")
    assert bad_time.returncode == 2
    assert bad_time.stderr.strip().splitlines() == [
        "gpumeter: error: --at: not an RFC 3339 time: 'next tuesday'"]
    unknown = run_cli(settings, "quota", "status", "--tenant", "nobody-here")
    assert unknown.returncode == 2
    assert "nobody-here" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    broken = tmp_path / "tenants.yaml"
    broken.write_text("tenants:\n  - tenant: alpha\n    gpu_hours: lots\n")
    settings.tenants = broken
    refused = run_cli(settings, "quota", "status")
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and str(broken) in line and "gpu_hours" in line
