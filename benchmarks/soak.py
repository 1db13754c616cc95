"""The soak: the 10,000-GPU fleet in real time into two workers on three brokers, with faults
(issue 28, point 6). A benchmark, not a CI test: it runs for an hour by default.

    .venv/bin/python -m benchmarks.soak [--minutes 60] [--fault-every 10] [--nodes 1250]
        [--window-seconds 15] [--rss-from 10]

Everything it uses it starts itself, on free loopback ports in a temporary directory, and stops
at the end: a 3-node KRaft cluster (topics replicated 3 times, min.insync.replicas 2, producers
acks=all), a ClickHouse server, two `gpumeter worker` processes in one group, and the fleet of
benchmarks/fleet_realtime.py (1,250 8-GPU nodes, 125 tenants) publishing each window as it
closes. Every ``--fault-every`` minutes one fault, in turn:
- worker: SIGKILL one worker (alternately the first and the second), start a new one at once;
- broker: SIGKILL one Kafka node (in turn), ``--down-seconds`` later start it again;
- ClickHouse: stop the server and start it again (the workers back off and retry).

Reports, each with a verdict:
- every window stored exactly once: count() = uniqExact(event_id) = the distinct ids published;
- consumer lag (how long ago the oldest uncommitted samples record was sent, read every second
  from the group's committed offsets) back under one window within two windows of each fault;
- the resident memory of every process (workers, Kafka nodes, ClickHouse, the publisher) grows by
  less than 10 % from ``--rss-from`` minutes after it started to the end of the run;
- the invoices of `gpumeter invoice --all-tenants` equal the independent reference
  (tests/unit/reference_billing.py, exact fractions, sharing no code with pricing/) computed
  from every sample on the samples topic, read back raw at the end.
Writes benchmarks/results/soak-latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from benchmarks.fleet_realtime import (
    MP,
    GroupOffsets,
    SentLog,
    Window,
    committed_all,
    fleet_config,
    lag_chart,
    publisher_main,
)
from benchmarks.pipeline import cpu_seconds, free_port, make_payloads, percentile, publish, wait_stored
from benchmarks.pipeline_cluster import start_cluster
from benchmarks.result_file import write_results
from gpumeter.app import schema
from gpumeter.app.runtime.chserver import LocalClickHouse
from gpumeter.app.runtime.kafka_broker import LocalKafkaCluster
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.records import split
from gpumeter.core.settings import KafkaSettings, Settings, load_settings
from gpumeter.infra import clickhouse, kafka
from testkit.builders import shipped_rate_card_documents, shipped_tenant_documents
from tests.integration.invoice_checks import produced_invoices
from tests.unit.reference_billing import reference_invoices

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "soak-latest.json"
FAULTS = ("worker", "broker", "clickhouse")
RSS_GROWTH_LIMIT = 0.10


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Tracked:
    """One process whose memory is followed: (run time, RSS) readings from its start."""

    name: str
    pid: int
    started: float  # run time (s) it was started or first seen
    readings: list[tuple[float, int]] = field(default_factory=list)


class Memory:
    def __init__(self) -> None:
        self.processes: dict[int, Tracked] = {}

    def see(self, name: str, pid: int | None, now: float) -> None:
        if pid is None:
            return
        tracked = self.processes.setdefault(pid, Tracked(name, pid, now))
        if (rss := rss_bytes(pid)) is not None:
            tracked.readings.append((now, rss))

    def growth(self, after_seconds: float) -> list[dict[str, Any]]:
        """Per process: RSS at ``after_seconds`` past its start against its last reading."""
        rows = []
        for tracked in self.processes.values():
            later = [(t, rss) for t, rss in tracked.readings if t >= tracked.started + after_seconds]
            if len(later) < 2:
                rows.append({"process": tracked.name, "pid": tracked.pid, "from_s": None, "growth": None,
                             "rss_end": tracked.readings[-1][1] if tracked.readings else None})
                continue
            (t0, first), (t1, last) = later[0], later[-1]
            rows.append({"process": tracked.name, "pid": tracked.pid, "from_s": t0, "to_s": t1,
                         "rss_from": first, "rss_end": last, "growth": last / first - 1})
        return rows


@dataclass
class Fault:
    kind: str
    target: str
    started: float  # run time
    ended: float | None = None
    recovered_after_s: float | None = None  # fault start -> lag back under one window for good
    lag_max_s: float = 0.0


class Faults(threading.Thread):
    """Carries out one fault in the background, so that lag keeps being read meanwhile."""

    def __init__(self, soak: Soak, fault: Fault, index: int) -> None:
        super().__init__(name=f"fault-{fault.kind}", daemon=True)
        self.soak, self.fault, self.index = soak, fault, index
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.soak.inflict(self.fault, self.index)
        except BaseException as exc:  # reported with the run, not lost in a thread
            self.error = exc
        finally:
            self.fault.ended = self.soak.now()


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.home = Path(tempfile.mkdtemp(prefix="gpumeter-soak-"))
        self.started_at = time.time()
        self.cluster: LocalKafkaCluster | None = None
        self.clickhouse = LocalClickHouse(self.home / "clickhouse", "127.0.0.1", free_port(), free_port())
        self.workers: list[WorkerProcess] = []
        self.settings: Settings | None = None
        self.lock = threading.Lock()

    def now(self) -> float:
        return time.time() - self.started_at

    def start(self) -> Settings:
        with console.status("starting 3 Kafka nodes and a ClickHouse server..."):
            self.cluster = start_cluster(self.home / "kafka", self.args.heap)
            self.clickhouse.start()
        settings = load_settings()
        settings.data_dir = self.home / "data"
        settings.kafka = KafkaSettings.model_validate({
            **settings.kafka.model_dump(), "bootstrap": self.cluster.bootstrap, "topic_prefix": "soak.",
            "replication_factor": 3, "min_insync_replicas": 2})
        settings.clickhouse.dsn = f"{self.clickhouse.url}/soak"
        settings.worker.group = "gpumeter-soak"
        settings.worker.metrics_port = 0
        kafka.ensure_topics(settings.kafka)
        client = clickhouse.connect(settings.clickhouse.dsn)
        schema.migrate(client)
        client.close()
        self.settings = settings
        self.workers = [self.new_worker(i) for i in range(2)]
        return settings

    def new_worker(self, slot: int) -> WorkerProcess:
        assert self.settings is not None
        log = self.home / f"worker-{slot + 1}-{uuid.uuid4().hex[:4]}.log"
        return WorkerProcess(self.settings, log, "warn").start()

    def inflict(self, fault: Fault, index: int) -> None:
        assert self.cluster is not None
        if fault.kind == "worker":
            slot = index % 2
            fault.target = f"worker {slot + 1}"
            self.workers[slot].kill9()
            with self.lock:
                self.workers[slot] = self.new_worker(slot)
        elif fault.kind == "broker":
            node = self.cluster.nodes[index % len(self.cluster.nodes)]
            fault.target = f"Kafka node {node.node_id}"
            pid = node.pid()
            if pid is None:
                raise RuntimeError(f"Kafka node {node.node_id} is not running")
            os.kill(pid, 9)
            time.sleep(self.args.down_seconds)
            node.start()
            deadline = time.time() + 120
            while not node.answers() and time.time() < deadline:
                time.sleep(0.5)
        else:
            fault.target = "ClickHouse"
            self.clickhouse.stop()
            self.clickhouse.start(timeout=120)

    def pids(self) -> Iterator[tuple[str, int | None]]:
        with self.lock:
            workers = list(self.workers)
        for slot, worker in enumerate(workers):
            yield f"worker {slot + 1}", worker.process.pid if worker.process else None
        assert self.cluster is not None
        for node in self.cluster.nodes:
            yield f"Kafka node {node.node_id}", node.pid()
        yield "ClickHouse", self.clickhouse.pid()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.cluster is not None:
            self.cluster.stop()
        self.clickhouse.stop()
        if not self.args.keep:
            shutil.rmtree(self.home, ignore_errors=True)


class Offsets:
    """GroupOffsets (benchmarks/fleet_realtime.py) that survives a broker restart: each read is
    bounded in time, and after a failed one the clients are made anew (a client of a restarted
    node kept timing out)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reader = GroupOffsets(settings)

    def read(self) -> tuple[dict[int, int], dict[int, int]]:
        try:
            committed = {
                tp.partition: meta.offset
                for tp, meta in self.reader._admin.list_group_offsets(
                    {self.reader.group: self.reader.partitions})[self.reader.group].items()
                if meta is not None and meta.offset >= 0
            }
            ends = self.reader._consumer.end_offsets(self.reader.partitions, timeout_ms=5000)
            return committed, {tp.partition: offset for tp, offset in ends.items()}
        except Exception:
            self.close()
            self.reader = GroupOffsets(self.settings)
            raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.reader.close()


def recovery(fault: Fault, series: list[dict[str, float]], window: float, until: float) -> None:
    """From the fault's start to the last reading, before the next fault, at or over one window."""
    points = [p for p in series if fault.started <= p["t"] < until]
    fault.lag_max_s = max((p["lag_seconds"] for p in points), default=0.0)
    over = [p["t"] for p in points if p["lag_seconds"] >= window]
    if not over:
        fault.recovered_after_s = 0.0
        return
    after = [p["t"] for p in points if p["t"] > over[-1]]
    fault.recovered_after_s = (after[0] - fault.started) if after else None


def published_samples(settings: Settings) -> Iterator[dict[str, Any]]:
    """Every sample on the samples topic, read raw from the beginning (the reference's input)."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=None,
                             enable_auto_commit=False, max_partition_fetch_bytes=16 * 1024 * 1024)
    try:
        topic = settings.kafka.topic(topics.SAMPLES)
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        remaining = {tp for tp in partitions if ends[tp] > 0}
        while remaining:
            for batch in consumer.poll(timeout_ms=1000, max_records=2000).values():
                for record in batch:
                    for line in split(record.value):
                        yield json.loads(line)
            remaining = {tp for tp in remaining if consumer.position(tp) < ends[tp]}
    finally:
        consumer.close()


def run(soak: Soak, settings: Settings, client: Any) -> dict[str, Any]:
    args = soak.args
    window = args.window_seconds
    windows = max(1, round(args.minutes * 60 / window))
    first_at = math.ceil((time.time() + 8) / window) * window
    config = fleet_config(args.nodes, window, args.seed, datetime.fromtimestamp(first_at - window, UTC))
    gpus = sum(config.gpus_on(model) * count for model, count in config.nodes.items())
    out: Any = MP.Queue()
    stop = MP.Event()
    child = MP.Process(target=publisher_main, args=(settings, config, windows, first_at, out, stop),
                       daemon=True)
    child.start()
    offsets = Offsets(settings)
    log = SentLog()
    pending: list[Window] = []
    published: list[dict[str, Any]] = []
    series: list[dict[str, float]] = []
    faults: list[Fault] = []
    running: Faults | None = None
    fault_errors: list[str] = []
    memory = Memory()
    in_flight: float | None = None
    offset_errors = 0
    cpu_prev, t_prev = 0.0, time.time()
    while time.time() < first_at:
        time.sleep(0.05)
    soak.started_at = first_at  # run time 0 = the first window goes out
    next_fault = args.fault_every * 60
    finished = False
    drain_deadline: float | None = None
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    with progress:
        task = progress.add_task("windows published", total=windows)
        tick = 0
        while True:
            tick += 1
            time.sleep(max(0.0, first_at + tick * args.sample_seconds - time.time()))
            now_run = soak.now()
            alive = child.is_alive()
            while True:
                try:
                    message = out.get_nowait()
                except queue.Empty:
                    break
                if message[0] == "start":
                    in_flight = message[2]
                elif message[0] == "window":
                    report = message[1]
                    log.add(report["records"])
                    pending.append(Window(report["index"], report["started"], report["records"]))
                    published.append({k: v for k, v in report.items() if k != "records"})
                    in_flight = None
                    progress.advance(task)
                elif message[0] == "done":
                    finished = True
            if running is None or not running.is_alive():
                if running is not None and running.error is not None:
                    fault_errors.append(f"{running.fault.kind}: {running.error}")
                running = None
                if not finished and now_run >= next_fault:
                    kind = FAULTS[len(faults) % len(FAULTS)]
                    fault = Fault(kind, "", now_run)
                    faults.append(fault)
                    running = Faults(soak, fault, len(faults) // len(FAULTS))
                    running.start()
                    next_fault += args.fault_every * 60
            if tick % 5 == 0:
                for name, pid in soak.pids():
                    memory.see(name, pid, now_run)
                memory.see("publisher", child.pid, now_run)
            try:
                committed, ends = offsets.read()
            except Exception:  # a node down: its partitions' offsets are unknown for a while
                offset_errors += 1
                continue
            now = time.time()
            lag_samples, oldest = log.behind(committed)
            unreported = any(ends.get(p, 0) > max(log.known_end(p), committed.get(p, 0)) for p in ends)
            if unreported and in_flight is not None:
                oldest = in_flight if oldest is None else min(oldest, in_flight)
            worker_cpu = 0.0
            for name, pid in soak.pids():
                if name.startswith("worker") and pid is not None:
                    with contextlib.suppress(OSError):
                        worker_cpu += cpu_seconds(pid)
            point = {
                "t": now_run,
                "lag_records": float(sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())),
                "lag_samples": float(lag_samples),
                "lag_seconds": 0.0 if oldest is None else max(0.0, now - oldest),
                # Both workers, as a share of one core (a restarted worker's CPU starts at 0).
                "worker_cpu_pct": max(0.0, worker_cpu - cpu_prev) / max(1e-3, now - t_prev) * 100,
            }
            cpu_prev, t_prev = worker_cpu, now
            series.append(point)
            for item in list(pending):
                if committed_all(item.records, committed):
                    item.committed_after = now - item.started
                    pending.remove(item)
            fault_note = f" · fault: {running.fault.kind}" if running is not None else ""
            progress.update(task, description=(
                f"lag {point['lag_seconds']:5.1f} s · {len(faults)} faults{fault_note}"))
            if finished and not pending and point["lag_records"] == 0 and running is None:
                break
            if not alive and not finished:
                raise RuntimeError(f"the publisher exited with code {child.exitcode}")
            if finished:
                drain_deadline = drain_deadline or now + 20 * window + 120
                if now > drain_deadline:
                    behind = point["lag_records"]
                    console.print(f"[red]still {behind:.0f} records behind after the last window")
                    break
    child.join(timeout=30)
    offsets.close()
    for index, fault in enumerate(faults):
        until = faults[index + 1].started if index + 1 < len(faults) else float("inf")
        recovery(fault, series, window, until)

    distinct = sum(w["distinct"] for w in published) + 1  # + the warm-up sample
    deadline = time.time() + 300
    count_sql = "SELECT count() FROM rated_usage"
    while time.time() < deadline and int(clickhouse.scalar(client, count_sql)) < distinct:
        time.sleep(1)
    rows = int(clickhouse.scalar(client, "SELECT count() FROM rated_usage"))
    distinct_rows = int(clickhouse.scalar(client, "SELECT uniqExact(event_id) FROM rated_usage"))

    with console.status("invoices against the independent reference..."):
        expected = reference_invoices(published_samples(settings), shipped_rate_card_documents(),
                                      shipped_tenant_documents())
        produced = produced_invoices(settings, {period for _, period in expected}, soak.home / "invoices")
        differing = sorted(f"{t}/{p}" for (t, p), doc in expected.items() if produced.get((t, p)) != doc)
        extra = sorted(f"{t}/{p}" for (t, p), doc in produced.items()
                       if (t, p) not in expected and (doc["lines"] or doc["subtotal"] != "0.00"))

    rss = memory.growth(args.rss_from * 60)
    lag_s = sorted(p["lag_seconds"] for p in series) or [0.0]
    return {
        "minutes": args.minutes,
        "fault_every_minutes": args.fault_every,
        "shortened": args.minutes < 60,
        "window_seconds": window,
        "nodes": config.nodes,
        "gpus": gpus,
        "tenants": len(config.tenants),
        "windows": len(published),
        "samples": sum(w["samples"] for w in published),
        "published_distinct": distinct,
        "stored_rows": rows,
        "stored_distinct": distinct_rows,
        "exactly_once": rows == distinct_rows == distinct,
        "faults": [fault.__dict__ for fault in faults],
        "fault_errors": fault_errors,
        "lag_recovered_within_two_windows": all(
            f.recovered_after_s is not None and f.recovered_after_s <= 2 * window for f in faults),
        "lag_seconds_p50": percentile(lag_s, 0.5),
        "lag_seconds_p99": percentile(lag_s, 0.99),
        "lag_seconds_max": lag_s[-1],
        "offset_read_errors": offset_errors,
        "rss": rss,
        "rss_growth_under_10pct": all(r["growth"] is None or r["growth"] < RSS_GROWTH_LIMIT for r in rss),
        "rss_from_minutes": args.rss_from,
        "invoices": len(expected),
        "invoices_differing": differing + extra,
        "invoices_equal_reference": not differing and not extra and bool(expected),
        "load_average_end": os.getloadavg()[0],
        "series": series,
    }


def report(results: dict[str, Any]) -> None:
    window = results["window_seconds"]
    title = (f"gpumeter soak: {results['gpus']:,} GPUs, 2 workers, 3 brokers, {results['minutes']:g} min, "
             f"a fault every {results['fault_every_minutes']:g} min"
             + (" (SHORTENED from 60 min)" if results["shortened"] else ""))
    table = Table("check", "result", "met", title=title, title_justify="left")

    def verdict(ok: bool) -> Text:
        return Text("yes", style="green") if ok else Text("no", style="bold red")

    table.add_row("stored exactly once", f"count {results['stored_rows']:,} · uniqExact "
                  f"{results['stored_distinct']:,} · published {results['published_distinct']:,}",
                  verdict(results["exactly_once"]))
    for fault in results["faults"]:
        recovered = fault["recovered_after_s"]
        table.add_row(f"  {fault['kind']} fault at {fault['started'] / 60:4.1f} min",
                      f"lag max {fault['lag_max_s']:.1f} s, under one window "
                      + ("never" if recovered is None else f"{recovered:.0f} s after the fault"),
                      verdict(recovered is not None and recovered <= 2 * window))
    table.add_row(f"lag back under {window} s within {2 * window} s of each fault",
                  f"lag p50 / p99 / max {results['lag_seconds_p50']:.1f} / "
                  f"{results['lag_seconds_p99']:.1f} / {results['lag_seconds_max']:.1f} s",
                  verdict(results["lag_recovered_within_two_windows"]))
    for row in results["rss"]:
        if row["growth"] is None:
            table.add_row(f"  RSS {row['process']} (pid {row['pid']})",
                          f"lived < {results['rss_from_minutes']:g} min: not judged", "")
            continue
        table.add_row(f"  RSS {row['process']} (pid {row['pid']})",
                      f"{row['rss_from'] / 2**20:,.0f} -> {row['rss_end'] / 2**20:,.0f} MiB "
                      f"({row['growth']:+.1%})", verdict(row["growth"] < RSS_GROWTH_LIMIT))
    table.add_row(f"RSS growth after minute {results['rss_from_minutes']:g} < 10 %", "",
                  verdict(results["rss_growth_under_10pct"]))
    table.add_row("invoices equal the reference", f"{results['invoices']} invoices, "
                  f"{len(results['invoices_differing'])} differ",
                  verdict(results["invoices_equal_reference"]))
    table.add_row("load average at the end", f"{results['load_average_end']:.2f}", "")
    console.print(table)
    console.print(lag_chart(results["series"], window))
    if results["fault_errors"]:
        console.print(f"[red]faults that failed: {results['fault_errors']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--fault-every", type=float, default=10.0, help="minutes between faults")
    parser.add_argument("--nodes", type=int, default=1250, help="8-GPU nodes (1,250 = 10,000 GPUs)")
    parser.add_argument("--window-seconds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sample-seconds", type=float, default=1.0, help="how often the lag is read")
    parser.add_argument("--down-seconds", type=float, default=15.0, help="a killed broker's time down")
    parser.add_argument("--rss-from", type=float, default=10.0,
                        help="minutes after a process started from which its RSS growth is judged")
    parser.add_argument("--heap", default="512m", help="heap of each Kafka node")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.fault_every <= 0 or args.nodes < 1:
        parser.error("--minutes, --fault-every and --nodes must be positive")

    # SIGTERM as Ctrl-C: the finally below stops every process this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    soak = Soak(args)
    try:
        settings = soak.start()
        client = clickhouse.connect(settings.clickhouse.dsn)
        with console.status("warm-up: both workers store a sample..."):
            publish(settings, make_payloads(1), None)
            wait_stored(client, 1, 180)
        results = run(soak, settings, client)
        client.close()
    finally:
        soak.stop()
    report(results)
    write_results(RESULTS, results)
    checks = ("exactly_once", "lag_recovered_within_two_windows", "rss_growth_under_10pct",
              "invoices_equal_reference")
    return 0 if all(results[check] for check in checks) and not results["fault_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
