"""Quota ledger recovery: changelog size and a restarted worker's time to ready (issue 28, point 5).

    .venv/bin/python -m benchmarks.ledger_recovery [--tenants 100 1000] [--windows 8]
        [--history-windows 104] [--restart term kill9]

The worker keeps one quota ledger per tenant in a faust table whose compacted changelog topic
it reads back whole at every start (streams/quota_agent.py). Per tenant count, in a namespace
of its own on the local services of `gpumeter up` (started if needed):

1. Feed: ``--windows`` windows of 15 s, each tenant one pod of ``--gpus`` GPUs (a gpu sample per
   device, a cpu and a memory sample per pod), published through one real `gpumeter worker`
   until every rated record is accounted (the group committed the rated topic to its end):
   every tenant has a ledger the worker stored.
2. History: ``--history-windows`` more windows, counted by the worker's own QuotaProcessor
   (streams/quota.py) from those ledgers, each tenant's ledger written to its home partition
   once a window, as the quota agent writes it in real time (one persist per window's burst).
   The default 104 windows (26 minutes) fill every ledger's replay guard (1,024 recent event
   ids at 10 samples a window), so ledgers end at the size they keep in steady state. This
   stands in for the worker rating those windows itself, which on this shared machine takes
   longer than the whole benchmark should. Then the benchmark waits until the topic's size on
   disk is stable (the broker's log cleaner has had its go, as between restarts in service).
3. Measure: the changelog's bytes on disk (DescribeLogDirs) and the records a consumer reads;
   the raw baseline: those records read from the beginning by a plain kafka-python consumer
   (the floor of any recovery); then the worker is stopped (``term``: SIGTERM, it leaves the
   group; ``kill9``: SIGKILL, the group holds its dead member until the session times out)
   and started again, timed from the start to faust's ``Worker ready`` (logged once recovery
   is complete and the streams resume), split into waiting for the group and reading the
   changelog from the log's own timestamps.

Goal: at 1,000 tenants a restarted worker is ready in under 30 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from aiokafka.partitioner import DefaultPartitioner
from kafka import KafkaConsumer, TopicPartition
from rich.console import Console
from rich.table import Table

from benchmarks.pipeline import publish, stored, wait_count, wait_stored
from benchmarks.result_file import write_results
from gpumeter.app import schema
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.records import join
from gpumeter.core.settings import Settings, load_settings
from gpumeter.core.tenants import load_tenants
from gpumeter.core.topics import ledger_changelog_topic
from gpumeter.infra import clickhouse, kafka
from streams.quota import MemoryLedgerStore, QuotaProcessor, decode_state, encode_state

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "ledger-recovery-latest.json"
WINDOW_SECONDS = 15
GOAL_SECONDS = 30.0
# faust's log line: "[2026-12-06 07:30:01,123] [4242] [INFO] [^---Recovery]: Worker ready"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


# -- the feed ----------------------------------------------------------------------------------------


def tenant_names(count: int) -> list[str]:
    return [f"tenant-{index:04d}" for index in range(count)]


def window_samples(tenants: list[str], gpus: int, start: datetime) -> list[dict[str, Any]]:
    """One window: per tenant one pod holding ``gpus`` H100s (a sample each) plus its cpu and memory."""
    end = start + timedelta(seconds=WINDOW_SECONDS)
    stamp = start.isoformat()
    samples = []
    for tenant in tenants:
        pod_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, tenant))
        common: dict[str, Any] = {
                  "cluster": "bench", "node": f"node-{tenant}", "tenant": tenant, "namespace": tenant,
                  "pod": f"train-{tenant}", "pod_uid": pod_uid, "window_start": stamp,
                  "window_end": end.isoformat(), "capacity_type": "on-demand", "priority": 0,
                  "labels": {"gpumeter.io/source": "benchmark"}}
        devices = [("gpu", str(i), "1") for i in range(gpus)] + [("cpu", "", "8"), ("memory", "", "64")]
        for kind, device, quantity in devices:
            identity = "\x1f".join((tenant, kind, device, stamp)).encode()
            sample = {**common, "event_id": hashlib.sha256(identity).hexdigest()[:40], "kind": kind,
                      "quantity": quantity}
            if kind == "gpu":
                sample.update(gpu_model="H100-SXM-80GB", mig_profile=None,
                              labels={**common["labels"], "gpu_index": device})
            samples.append(sample)
    return samples


def tenants_file(path: Path, tenants: list[str]) -> Path:
    """A quota for every tenant (far from its limits: no crossing interferes with the timing)."""
    policies = [{"tenant": tenant, "gpu_hours": 1_000_000, "spend": "100000000.00", "max_gpus": 4096,
                 "warn_at": [0.8]} for tenant in tenants]
    path.write_text(yaml.safe_dump({"tenants": policies}))
    return path


def accounted(settings: Settings) -> bool:
    """The worker group committed every rated partition to its end (the quota agent acknowledges a
    rated record only once the ledger it changed is written to the changelog)."""
    rated = settings.kafka.topic(topics.RATED)
    ends = kafka.end_offsets(settings.kafka, [rated])
    committed = kafka.committed_offsets(settings.kafka, settings.kafka.topic_prefix + settings.worker.group)
    return bool(ends) and all(committed.get(tp, 0) >= end for tp, end in ends.items())


# -- the changelog -----------------------------------------------------------------------------------


def changelog_partitions(settings: Settings, topic: str) -> list[TopicPartition]:
    return sorted(kafka.end_offsets(settings.kafka, [topic]), key=lambda tp: tp.partition)


def read_changelog(settings: Settings, topic: str) -> tuple[dict[bytes, tuple[int, bytes]], int, int, float]:
    """A plain consumer reads the topic from its beginning to its end: each key's latest
    (partition, value), the records and bytes read, and the seconds it took (the raw baseline)."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=None,
                             enable_auto_commit=False, fetch_max_bytes=64 * 1024 * 1024,
                             max_partition_fetch_bytes=16 * 1024 * 1024)
    partitions = changelog_partitions(settings, topic)
    latest: dict[bytes, tuple[int, bytes]] = {}
    records = size = 0
    try:
        started = time.perf_counter()
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        remaining = {tp for tp in partitions if ends[tp] > 0}
        while remaining:
            for tp, batch in consumer.poll(timeout_ms=1000, max_records=10_000).items():
                for record in batch:
                    records += 1
                    size += len(record.value or b"") + len(record.key or b"")
                    latest[record.key] = (tp.partition, record.value)
            remaining = {tp for tp in remaining if consumer.position(tp) < ends[tp]}
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    return latest, records, size, elapsed


def rated_record(samples: list[dict[str, Any]], partition: int, offset: int) -> bytes:
    """A rated record as the rating agent writes it, for quota accounting: one line a sample."""
    lines = []
    for sample in samples:
        quantity = Decimal(sample["quantity"])
        lines.append(json.dumps({
            "event_id": sample["event_id"], "kind": sample["kind"], "tenant": sample["tenant"],
            "namespace": sample["namespace"], "pod": sample["pod"], "pod_uid": sample["pod_uid"],
            "window_start": sample["window_start"], "window_end": sample["window_end"],
            "quantity": str(quantity), "unit_seconds": str(quantity * WINDOW_SECONDS),
            "list_cost": str(quantity * Decimal("0.0125")), "capacity_type": "on-demand", "priority": 0,
            "source_partition": partition, "source_offset": offset,
        }).encode())
    return join(lines)


def append_history(settings: Settings, topic: str, tenants: list[str], gpus: int,
                   latest: dict[bytes, tuple[int, bytes]], first: datetime, windows: int) -> int:
    """``windows`` more windows of each tenant, counted by the worker's own QuotaProcessor
    (streams/quota.py) from the ledgers the worker stored, each tenant's ledger written to its
    home partition once a window, as the worker's quota agent writes it in real time (one
    persist a window's burst; streams/quota_agent.py). Returns the bytes appended."""
    store = MemoryLedgerStore()
    for key, (_, value) in latest.items():
        store.put(key.decode(), decode_state(value))
    processor = QuotaProcessor(store, load_tenants(settings.tenants))
    partitions = len(changelog_partitions(settings, topic))
    partitioner = DefaultPartitioner()  # the producer's, as the quota agent's home()
    home = {t: int(partitioner(t.encode(), list(range(partitions)), [])) for t in tenants}
    producer = kafka.make_producer(settings.kafka, linger_ms=20, batch_size=1024 * 1024,
                                   max_request_size=8 * 1024 * 1024)
    written = 0
    offset = 10**9  # past any samples offset the real feed used: never taken for a replay
    try:
        for index in range(windows):
            by_tenant: dict[str, list[dict[str, Any]]] = {}
            for sample in window_samples(tenants, gpus, first + timedelta(seconds=WINDOW_SECONDS * index)):
                by_tenant.setdefault(sample["tenant"], []).append(sample)
            for tenant, samples in by_tenant.items():
                offset += 1
                processor.process_record(rated_record(samples, home[tenant], offset))
                state = store.get(tenant)
                assert state is not None
                key, value = tenant.encode(), encode_state(state)
                producer.send(topic, key=key, value=value, partition=home[tenant])
                written += len(key) + len(value)
        producer.flush()
    finally:
        producer.close()
    return written


def disk_bytes(settings: Settings, topic: str) -> int:
    """The topic's size on the brokers' disks, one replica of each partition (DescribeLogDirs)."""
    client = kafka.admin(settings.kafka)
    try:
        answers = client.describe_log_dirs([topic])
    finally:
        client.close()
    sizes: dict[int, int] = {}
    for answer in answers:
        for log_dir in answer["log_dirs"]:
            for entry in log_dir.get("topics", []):
                if entry.get("name") != topic:
                    continue
                for partition in entry.get("partitions", []):
                    index = partition["partition_index"]
                    sizes[index] = max(sizes.get(index, 0), int(partition["partition_size"]))
    return sum(sizes.values())


def settle(settings: Settings, topic: str, quiet_seconds: float, timeout: float) -> tuple[int, float]:
    """Wait until the topic's size on disk has not changed for ``quiet_seconds`` (the log cleaner
    is done, or never started); returns the size and how long that took."""
    started = time.time()
    size, since = disk_bytes(settings, topic), time.time()
    while time.time() - started < timeout:
        time.sleep(2)
        now = disk_bytes(settings, topic)
        if now != size:
            size, since = now, time.time()
        elif time.time() - since >= quiet_seconds:
            break
    return size, time.time() - started


def topic_config(settings: Settings, topic: str) -> dict[str, str]:
    from kafka.admin import ConfigResource, ConfigResourceType

    keys = ("cleanup.policy", "segment.bytes", "segment.ms", "min.cleanable.dirty.ratio")
    client = kafka.admin(settings.kafka)
    try:
        described = client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, dict.fromkeys(keys))], config_filter="all")
    finally:
        client.close()
    found: dict[str, str] = {}
    for by_name in described.values():
        for values in by_name.values():
            found.update({key: str(values[key]["value"]) for key in keys if key in values})
    return found


# -- the restart -------------------------------------------------------------------------------------


def log_lines(path: Path) -> Iterator[str]:
    try:
        yield from path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return


def stamped(path: Path, text: str) -> float | None:
    """The time of the first log line containing ``text`` (faust's own timestamp, local time)."""
    for line in log_lines(path):
        if text in line and (match := STAMP.match(line)):
            return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def restart(settings: Settings, worker: WorkerProcess, how: str, tag: str, timeout: float) -> tuple[
        WorkerProcess, dict[str, float | None]]:
    """Stop ``worker`` (SIGTERM or SIGKILL), start a new one and time it to ``Worker ready``."""
    if how == "kill9":
        worker.kill9()
    else:
        worker.stop()
    log = Path("/tmp") / f"gpumeter-ledger-{tag}-{how}-{uuid.uuid4().hex[:6]}.log"
    fresh = WorkerProcess(settings, log, "info")
    started = time.time()
    fresh.start()
    ready = wait_count(lambda: 1 if stamped(log, "Worker ready") else 0, 1, timeout, "worker ready")
    restoring = stamped(log, "Restoring state from changelog topics")
    done = stamped(log, "Done reading from changelog topics")
    ready_at = stamped(log, "Worker ready") or ready
    return fresh, {
        "ready_s": ready_at - started,
        "until_recovery_starts_s": None if restoring is None else restoring - started,
        "reading_changelog_s": None if restoring is None or done is None else done - restoring,
        "log": str(log),  # type: ignore[dict-item]
    }


# -- one scenario ------------------------------------------------------------------------------------


def scenario(tenant_count: int, args: argparse.Namespace) -> dict[str, Any]:
    base = load_settings()
    tag = uuid.uuid4().hex[:8]
    settings = services.namespaced(base, f"ledger-{tag}.", f"ledger_{tag}", "gpumeter-ledger")
    tenants = tenant_names(tenant_count)
    settings.tenants = tenants_file(Path("/tmp") / f"gpumeter-ledger-{tag}-tenants.yaml", tenants)
    kafka.ensure_topics(settings.kafka)
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client)
    changelog = ledger_changelog_topic(settings.kafka.topic_prefix, settings.worker.group)
    worker = WorkerProcess(settings, Path("/tmp") / f"gpumeter-ledger-{tag}.log", "info")
    result: dict[str, Any] = {"tenants": tenant_count, "windows": args.windows,
                              "history_windows": args.history_windows}
    try:
        worker.start()
        first = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(
            seconds=WINDOW_SECONDS * args.windows)
        published = 0
        label = f"{tenant_count:,} tenants"
        with console.status(f"{label}: feeding {args.windows} windows through the worker..."):
            started = time.time()
            for index in range(args.windows):
                start = first + timedelta(seconds=WINDOW_SECONDS * index)
                samples = window_samples(tenants, args.gpus, start)
                publish(settings, samples, None)
                published += len(samples)
            wait_stored(client, published, 1800)
            wait_count(lambda: int(accounted(settings)), 1, 600, "rated topic accounted")
            result["feed_samples"] = published
            result["feed_seconds"] = time.time() - started
        with console.status(f"{label}: appending {args.history_windows} windows of ledger writes..."):
            latest, fed_records, _, _ = read_changelog(settings, changelog)
            states = [value for _, value in latest.values()]
            result["tenants_with_ledger"] = len(latest)
            result["feed_changelog_records"] = fed_records
            result["state_bytes_mean"] = sum(len(v) for v in states) / max(1, len(states))
            result["state_bytes_max"] = max((len(v) for v in states), default=0)
            after_feed = first + timedelta(seconds=WINDOW_SECONDS * args.windows)
            appended = append_history(settings, changelog, tenants, args.gpus, latest, after_feed,
                                      args.history_windows)
            result["history_bytes_appended"] = appended
        with console.status(f"{tenant_count:,} tenants: waiting for the log cleaner..."):
            size_on_disk, settled_in = settle(settings, changelog, args.quiet_seconds, 600)
            result["disk_bytes"], result["settle_seconds"] = size_on_disk, settled_in
            result["topic_config"] = topic_config(settings, changelog)
        with console.status(f"{tenant_count:,} tenants: raw read of the changelog..."):
            _, records, size, elapsed = read_changelog(settings, changelog)
            result.update(changelog_records=records, changelog_value_bytes=size, raw_read_s=elapsed)
        for how in args.restart:
            with console.status(f"{tenant_count:,} tenants: restart ({how}) to ready..."):
                worker, timing = restart(settings, worker, how, tag, args.ready_timeout)
                result[f"restart_{how}"] = timing
                result[f"ratio_{how}_vs_raw_read"] = float(timing["ready_s"] or 0) / max(elapsed, 1e-9)
        # The restarted worker works: a probe window is rated and stored.
        probe = window_samples(tenants[:1], args.gpus, datetime.now(UTC).replace(microsecond=0))
        publish(settings, probe, None)
        wait_stored(client, published + len(probe), 300)
        result["stored_after_restarts"] = stored(client)
    finally:
        worker.stop()
        client.close()
        services.drop_namespace(settings)
    return result


def report(results: list[dict[str, Any]], restarts: list[str]) -> Table:
    table = Table("measure", *(f"{r['tenants']:,} tenants" for r in results), title_justify="left",
                  title="quota ledger changelog and restart-to-ready (one worker)")

    def row(name: str, cell: Any) -> None:
        table.add_row(name, *(cell(r) for r in results))

    row("tenants with a ledger", lambda r: f"{r['tenants_with_ledger']:,}")
    row("ledger after the feed (mean / max)", lambda r: f"{r['state_bytes_mean'] / 1024:,.1f} / "
        f"{r['state_bytes_max'] / 1024:,.1f} KiB")
    row("ledger writes appended", lambda r: f"{r['history_windows']} windows · "
        f"{r['history_bytes_appended'] / 2**20:,.0f} MiB")
    row("changelog on disk", lambda r: f"{r['disk_bytes'] / 2**20:,.1f} MiB")
    row("changelog records read", lambda r: f"{r['changelog_records']:,} "
        f"({r['changelog_value_bytes'] / 2**20:,.1f} MiB)")
    row("raw consumer read", lambda r: f"{r['raw_read_s']:.2f} s")
    for how in restarts:
        row(f"restart ({how}) -> ready", lambda r, h=how: f"{r[f'restart_{h}']['ready_s']:.1f} s")
        row("  waiting for the group",
            lambda r, h=how: _seconds(r[f"restart_{h}"]["until_recovery_starts_s"]))
        row("  reading the changelog", lambda r, h=how: _seconds(r[f"restart_{h}"]["reading_changelog_s"]))
        row("  ratio to the raw read", lambda r, h=how: f"{r[f'ratio_{h}_vs_raw_read']:.1f}")
    row("segment.bytes / segment.ms", lambda r: f"{r['topic_config'].get('segment.bytes')} / "
        f"{r['topic_config'].get('segment.ms')}")
    row("min.cleanable.dirty.ratio", lambda r: r["topic_config"].get("min.cleanable.dirty.ratio", "?"))
    return table


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of each tenant's pod")
    parser.add_argument("--windows", type=int, default=8, help="15 s windows fed through the worker")
    parser.add_argument("--history-windows", type=int, default=104,
                        help="windows after the feed, counted by the worker's QuotaProcessor and written "
                             "to the changelog once a tenant a window, as the worker does in real time")
    parser.add_argument("--restart", nargs="+", choices=["term", "kill9"], default=["term", "kill9"])
    parser.add_argument("--quiet-seconds", type=float, default=40.0,
                        help="the changelog's size unchanged this long = the cleaner is done")
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    if min(args.tenants) < 1 or args.windows < 1 or args.history_windows < 0:
        parser.error("--tenants and --windows must be positive, --history-windows not negative")

    with console.status("starting local services..."):
        services.up(load_settings())
    results = [scenario(count, args) for count in args.tenants]
    console.print(report(results, args.restart))
    largest = max(results, key=lambda r: r["tenants"])
    ready = max(largest[f"restart_{how}"]["ready_s"] for how in args.restart)
    met = ready < GOAL_SECONDS
    console.print(f"[{'green' if met else 'red'}]at {largest['tenants']:,} tenants ready in {ready:.1f} s: "
                  f"goal < {GOAL_SECONDS:.0f} s {'met' if met else 'missed'}")
    write_results(RESULTS, {"scenarios": results, "goal_seconds": GOAL_SECONDS, "goal_met": met})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
