"""The fleet of the mission, in real time: consumer lag and worker CPU over a sustained run.

    .venv/bin/python -m benchmarks.fleet_realtime [--minutes 10] [--nodes 1250] [--window-seconds 15]

A simulated fleet (collectors/sim) of ``--nodes`` 8-GPU nodes (1,250 nodes = 10,000 GPUs: H100,
H200, B200, A100 with MIG, L40S partly time-sliced; a tenant per 10 nodes, warm-started so most
GPUs are busy from the first window) publishes one window of gpu, cpu, memory and storage samples
every ``--window-seconds`` of wall time, as node agents do when a window closes, for ``--minutes``.
It runs as `gpumeter collect` does (runner.FleetPublisher) in a process of its own, so its CPU is
measured apart. One `gpumeter worker` consumes, on the local services of `gpumeter up` (started if
needed), in a namespace of topics, consumer group and database of its own, dropped afterwards.

Every ``--sample-seconds`` (1 s by default: 5 s would alias with a 15 s publish period and see the
same phase of each window) it reads the worker group's committed offsets on the samples topic and
the topic's end offsets, and derives the lag:
- records: end offset minus committed offset, summed over partitions;
- samples: the lines of the records not yet committed (the publisher reports each record's
  partition, offset and line count);
- seconds: how long ago the oldest record not yet committed was sent. The worker commits an offset
  only once its samples are stored, so this is how late billing data is; it must stay under one
  window, or the worker falls behind the fleet.
At the end every published sample must be visible in ClickHouse. Prints lag p50/p99/max, the
worker's CPU (share of one core, µs per sample), the publisher's CPU, the lag per 30 s as a bar
chart, and writes benchmarks/results/fleet-realtime-latest.json with the time series.
"""

from __future__ import annotations

import argparse
import bisect
import math
import multiprocessing
import os
import queue
import resource
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from benchmarks.pipeline import (
    cpu_seconds,
    isolated_namespace,
    make_payloads,
    percentile,
    publish,
    stored,
    wait_stored,
)
from benchmarks.result_file import write_results
from collectors.sim.config import FleetConfig, TenantSpec
from collectors.sim.fleet import SimulatedFleet
from collectors.sim.runner import FleetPublisher
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka

console = Console()
# Spawned, not forked: this process holds Kafka client threads that a fork would copy mid-flight.
MP = multiprocessing.get_context("spawn")
RESULTS = Path(__file__).resolve().parent / "results" / "fleet-realtime-latest.json"
# The default fleet's model mix without the 4-GPU L4 boards, so that nodes x 8 = GPUs.
MODEL_SHARES: dict[str, float] = {
    "H100-SXM-80GB": 0.40,
    "H200-SXM-141GB": 0.12,
    "B200-SXM-180GB": 0.12,
    "A100-SXM-40GB": 0.24,
    "L40S-48GB": 0.12,
}
NODES_PER_TENANT = 10
CHART_BUCKET_SECONDS = 30
CHART_WIDTH = 40  # characters for one window of lag


# -- the fleet ---------------------------------------------------------------------------------------


def fleet_nodes(total: int) -> dict[str, int]:
    """``total`` nodes split by MODEL_SHARES (largest remainder, so the counts sum to ``total``)."""
    exact = {model: total * share for model, share in MODEL_SHARES.items()}
    counts = {model: int(value) for model, value in exact.items()}
    by_remainder = sorted(exact, key=lambda model: exact[model] - counts[model], reverse=True)
    for model in by_remainder[: total - sum(counts.values())]:
        counts[model] += 1
    return counts


def fleet_config(nodes: int, window_seconds: int, seed: int, start: datetime) -> FleetConfig:
    """A fleet whose GPUs are mostly busy from the first window to the last.

    Each tenant warm-starts a full queue of jobs (32, the queue's cap, placed in window 0) and
    submits 12 more an hour: about what finishing jobs free (training runs last 20 min to 12 h).
    No diurnal dip, so the load is the same all run long.
    """
    counts = fleet_nodes(nodes)
    tenants = tuple(
        TenantSpec(f"fleet-{index:03d}", 12.0, mig_share=0.05, inference_share=0.2, shared_share=0.05)
        for index in range(max(1, nodes // NODES_PER_TENANT))
    )
    return FleetConfig(
        seed=seed,
        cluster="fleet-bench",
        nodes=counts,
        gpus_per_node=8,
        time_sliced_nodes={"L40S-48GB": counts["L40S-48GB"] // 10},
        tenants=tenants,
        window_seconds=window_seconds,
        start=start,
        warm_start_jobs=32,
        max_queue_per_tenant=64,
        diurnal=False,
    )


# -- the publisher, in its own process ---------------------------------------------------------------


class _RecordingProducer:
    """The publisher's producer, noting each samples record's send time and line count."""

    def __init__(self, producer: Any, samples_topic: str) -> None:
        self._producer = producer
        self._topic = samples_topic
        self.pending: list[tuple[Any, float, int]] = []  # (future, sent at, samples in the record)

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, **options: Any) -> Any:
        future = self._producer.send(topic, key=key, value=value, **options)
        if topic == self._topic and value is not None:
            # Records are newline-joined JSON documents (gpumeter/core/records.py); JSON has no raw newline.
            self.pending.append((future, time.time(), value.count(b"\n") + 1))
        return future

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def _cpu_self() -> float:
    """User + system CPU of this whole process, every thread included (kafka-python sends from one)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def publisher_main(settings: Settings, config: FleetConfig, windows: int, first_at: float,
                    out: Any, stop: Any) -> None:
    """Publishes window k at ``first_at + k * window`` (wall clock); reports each window on ``out``."""
    setup_started = _cpu_self()
    fleet = SimulatedFleet(config)
    publisher = FleetPublisher(settings, fleet)
    recorder = _RecordingProducer(publisher.producer, publisher.samples_topic)
    publisher.producer = recorder  # duck-typed: FleetPublisher only calls send/flush/close
    publisher.publish_topology()
    publisher.flush()
    out.put(("ready", {"setup_cpu_s": _cpu_self() - setup_started}))
    try:
        for index in range(windows):
            due = first_at + index * config.window_seconds
            if stop.wait(max(0.0, due - time.time())):
                break
            cpu_before, started = _cpu_self(), time.time()
            out.put(("start", index, started))
            samples = publisher.publish_window()
            publisher.flush()
            records = []
            for future, sent_at, lines in recorder.pending:
                metadata = future.get(timeout=60)
                records.append((metadata.partition, metadata.offset, sent_at, lines))
            recorder.pending.clear()
            out.put(("window", {
                "index": index,
                "due": due,
                "started": started,
                "published": time.time(),
                "cpu_s": _cpu_self() - cpu_before,
                "samples": len(samples),
                "distinct": len({sample["event_id"] for sample in samples}),
                "kinds": sorted({sample["kind"] for sample in samples}),
                "gpus_in_use": len({(s["node"], s["labels"].get("gpu_index"))
                                    for s in samples if s["kind"] == "gpu"}),
                "pods": len({sample["pod_uid"] for sample in samples}),
                "records": records,
            }))
    finally:
        publisher.close()
        out.put(("done", {"cpu_s": _cpu_self()}))


# -- lag ---------------------------------------------------------------------------------------------


@dataclass
class SentLog:
    """The samples records sent, per partition in offset order: when, and how many samples each."""

    offsets: dict[int, list[int]] = field(default_factory=dict)
    sent_at: dict[int, list[float]] = field(default_factory=dict)
    cumulative: dict[int, list[int]] = field(default_factory=dict)  # samples up to and including each record

    def add(self, records: list[tuple[int, int, float, int]]) -> None:
        for partition, offset, sent_at, lines in sorted(records):
            offsets = self.offsets.setdefault(partition, [])
            if offsets and offset <= offsets[-1]:
                continue  # already logged (never expected: one producer, offsets only grow)
            cumulative = self.cumulative.setdefault(partition, [])
            offsets.append(offset)
            self.sent_at.setdefault(partition, []).append(sent_at)
            cumulative.append((cumulative[-1] if cumulative else 0) + lines)

    def known_end(self, partition: int) -> int:
        offsets = self.offsets.get(partition)
        return offsets[-1] + 1 if offsets else 0

    def behind(self, committed: Mapping[int, int]) -> tuple[int, float | None]:
        """Samples in records at or past each partition's committed offset, and the oldest such
        record's send time (None: nothing logged is uncommitted)."""
        samples, oldest = 0, None
        for partition, offsets in self.offsets.items():
            first = bisect.bisect_left(offsets, committed.get(partition, 0))
            if first == len(offsets):
                continue
            cumulative = self.cumulative[partition]
            samples += cumulative[-1] - (cumulative[first - 1] if first else 0)
            sent = self.sent_at[partition][first]
            oldest = sent if oldest is None else min(oldest, sent)
        return samples, oldest


class GroupOffsets:
    """The worker group's committed offsets and the end offsets of the samples topic."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.kafka.topic(topics.SAMPLES)
        self.group = settings.kafka.topic_prefix + settings.worker.group
        self._admin = kafka.admin(settings.kafka)
        self._consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=None)
        partitions = self._consumer.partitions_for_topic(self.topic) or set()
        self.partitions = [TopicPartition(self.topic, p) for p in sorted(partitions)]

    def read(self) -> tuple[dict[int, int], dict[int, int]]:
        committed = {
            tp.partition: meta.offset
            for tp, meta in self._admin.list_group_offsets({self.group: self.partitions})[self.group].items()
            if meta is not None and meta.offset >= 0
        }
        ends = {tp.partition: offset for tp, offset in self._consumer.end_offsets(self.partitions).items()}
        return committed, ends

    def close(self) -> None:
        self._consumer.close()
        self._admin.close()


@dataclass
class Window:
    index: int
    started: float
    records: list[tuple[int, int, float, int]]
    committed_after: float | None = None  # seconds from its publish start to all its records committed


def committed_all(records: list[tuple[int, int, float, int]], committed: Mapping[int, int]) -> bool:
    return all(offset < committed.get(partition, 0) for partition, offset, _sent, _lines in records)


# -- the run -----------------------------------------------------------------------------------------


def run(settings: Settings, args: argparse.Namespace, client: Any, worker: WorkerProcess) -> dict[str, Any]:
    window = args.window_seconds
    windows = max(1, round(args.minutes * 60 / window))
    # Wall-clock aligned windows, the first published at a boundary a few seconds away (time for
    # the publisher to start): window k covers [first_at + (k-1)W, first_at + kW) and goes out
    # when it closes, as an agent sends it.
    first_at = math.ceil((time.time() + 8) / window) * window
    config = fleet_config(args.nodes, window, args.seed, datetime.fromtimestamp(first_at - window, UTC))
    gpus = sum(config.gpus_on(model) * count for model, count in config.nodes.items())
    out: Any = MP.Queue()
    stop = MP.Event()
    child = MP.Process(target=publisher_main, args=(settings, config, windows, first_at, out, stop),
                       daemon=True)
    child.start()
    offsets = GroupOffsets(settings)
    log = SentLog()
    pending: list[Window] = []
    done_windows: list[Window] = []
    published: list[dict[str, Any]] = []
    series: list[dict[str, float]] = []
    in_flight: float | None = None  # send start of a window whose records are not reported yet
    publisher: dict[str, float] = {}
    assert worker.process is not None
    pid = worker.process.pid

    while time.time() < first_at:
        time.sleep(0.05)
    load_start = os.getloadavg()[0]
    cpu_start = cpu_prev = cpu_seconds(pid)
    t_prev = time.time()
    finished_publishing = False
    drain_deadline: float | None = None
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    with progress:
        task = progress.add_task("windows published", total=windows)
        tick = 0
        while True:
            tick += 1
            time.sleep(max(0.0, first_at + tick * args.sample_seconds - time.time()))
            publisher_alive = child.is_alive()  # read before the queue: its last message is then in it
            while True:
                try:
                    message = out.get_nowait()
                except queue.Empty:
                    break
                kind = message[0]
                if kind == "ready":
                    publisher.update(message[1])
                elif kind == "start":
                    in_flight = message[2]
                elif kind == "window":
                    report = message[1]
                    log.add(report["records"])
                    pending.append(Window(report["index"], report["started"], report["records"]))
                    published.append({k: v for k, v in report.items() if k != "records"})
                    in_flight = None
                    progress.advance(task)
                elif kind == "done":
                    publisher["total_cpu_s"] = message[1]["cpu_s"]
                    finished_publishing = True
            committed, ends = offsets.read()
            now = time.time()
            cpu_now = cpu_seconds(pid)
            lag_samples, oldest = log.behind(committed)
            # Records Kafka holds that the publisher has not reported yet: the window being sent.
            unreported = any(ends.get(p, 0) > max(log.known_end(p), committed.get(p, 0)) for p in ends)
            if unreported and in_flight is not None:
                oldest = in_flight if oldest is None else min(oldest, in_flight)
            point = {
                "t": now - first_at,
                "lag_records": float(sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())),
                "lag_samples": float(lag_samples),
                "lag_seconds": 0.0 if oldest is None else max(0.0, now - oldest),
                "worker_cpu_pct": (cpu_now - cpu_prev) / (now - t_prev) * 100,
            }
            series.append(point)
            cpu_prev, t_prev = cpu_now, now
            for item in list(pending):
                if committed_all(item.records, committed):
                    item.committed_after = now - item.started
                    pending.remove(item)
                    done_windows.append(item)
            progress.update(task, description=(
                f"lag {point['lag_seconds']:4.1f} s {lag_samples:>6,} samples · "
                f"worker {point['worker_cpu_pct']:3.0f}%"))
            if finished_publishing and not pending and point["lag_records"] == 0:
                break
            if not publisher_alive and not finished_publishing:
                raise RuntimeError(f"the publisher exited with code {child.exitcode}")
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.log_tail()}")
            if finished_publishing:
                drain_deadline = drain_deadline or now + 10 * window + 60
                if now > drain_deadline:
                    console.print(f"[red]still {point['lag_records']:.0f} records behind "
                                  "after the last window")
                    break
    drained_at = time.time()
    worker_cpu = cpu_seconds(pid) - cpu_start
    child.join(timeout=30)
    offsets.close()

    total = sum(w["samples"] for w in published)
    distinct = sum(w["distinct"] for w in published)
    expected_rows = 1 + distinct  # + the warm-up sample
    try:
        visible_at = wait_stored(client, expected_rows, 120)
    except RuntimeError as exc:
        console.print(f"[red]{exc}")
        visible_at = None
    rows = stored(client)
    distinct_rows = int(clickhouse.scalar(client, "SELECT uniqExact(event_id) FROM rated_usage"))

    duration = drained_at - first_at
    lag_s = sorted(p["lag_seconds"] for p in series)
    lag_n = sorted(p["lag_samples"] for p in series)
    lag_r = sorted(p["lag_records"] for p in series)
    committed_after = sorted(w.committed_after for w in done_windows if w.committed_after is not None)
    window_cpu = sum(w["cpu_s"] for w in published)
    late = [w["started"] - w["due"] for w in published]
    return {
        "minutes": args.minutes,
        "window_seconds": window,
        "seed": args.seed,
        "sample_seconds": args.sample_seconds,
        "nodes": config.nodes,
        "gpus": gpus,
        "tenants": len(config.tenants),
        "windows": len(published),
        "samples": total,
        "distinct_samples": distinct,
        "kinds": sorted({k for w in published for k in w["kinds"]}),
        "samples_per_window_mean": total / max(1, len(published)),
        "gpus_in_use_mean": sum(w["gpus_in_use"] for w in published) / max(1, len(published)),
        "pods_mean": sum(w["pods"] for w in published) / max(1, len(published)),
        "offered_samples_per_s": total / (max(1, len(published)) * window),
        "lag_seconds_p50": percentile(lag_s, 0.5),
        "lag_seconds_p99": percentile(lag_s, 0.99),
        "lag_seconds_max": lag_s[-1],
        "lag_samples_p50": percentile(lag_n, 0.5),
        "lag_samples_p99": percentile(lag_n, 0.99),
        "lag_samples_max": lag_n[-1],
        "lag_records_max": lag_r[-1],
        "window_committed_after_p50_s": percentile(committed_after, 0.5) if committed_after else None,
        "window_committed_after_max_s": committed_after[-1] if committed_after else None,
        "windows_committed": len(committed_after),
        # Strict: the sampled lag, and every window's send -> committed time (which also counts the
        # fleet's step and reads up to one sampling interval late), under one window.
        "lag_under_one_window": bool(lag_s[-1] < window and len(committed_after) == len(published)
                                     and bool(committed_after) and committed_after[-1] < window),
        "run_seconds": duration,
        "worker_cpu_s": worker_cpu,
        "worker_cpu_pct_of_core": worker_cpu / duration * 100,
        "worker_cpu_us_per_sample": worker_cpu / max(1, total) * 1e6,
        "publisher_window_cpu_s": window_cpu,
        "publisher_cpu_pct_of_core": window_cpu / (len(published) * window) * 100 if published else 0.0,
        "publisher_setup_cpu_s": publisher.get("setup_cpu_s"),
        "publisher_total_cpu_s": publisher.get("total_cpu_s"),
        "publisher_window_seconds_max": max((w["published"] - w["started"] for w in published), default=0.0),
        "publisher_late_max_s": max(late, default=0.0),
        "stored_rows": rows,
        "stored_distinct_event_ids": distinct_rows,
        "expected_rows": expected_rows,
        "all_visible": visible_at is not None and distinct_rows >= expected_rows,
        "visible_after_drain_s": None if visible_at is None else max(0.0, visible_at - drained_at),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg()[0],
        "series": series,
        "published_windows": published,
    }


# -- report ------------------------------------------------------------------------------------------


def buckets(series: list[dict[str, float]], width: float) -> list[dict[str, float]]:
    """Per ``width`` seconds of the run: the largest lag seen and the mean worker CPU."""
    grouped: dict[int, list[dict[str, float]]] = {}
    for point in series:
        grouped.setdefault(int(point["t"] // width), []).append(point)
    return [
        {
            "from": index * width,
            "lag_seconds_max": max(p["lag_seconds"] for p in points),
            "lag_samples_max": max(p["lag_samples"] for p in points),
            "worker_cpu_pct": sum(p["worker_cpu_pct"] for p in points) / len(points),
        }
        for index, points in sorted(grouped.items())
    ]


def lag_chart(series: list[dict[str, float]], window: int) -> Table:
    """Max lag per 30 s as a bar: the bar reaches the '│' at one window."""
    chart = Table("time", f"max lag (│ = one window, {window} s)", "s", "samples", "worker CPU",
                  title="consumer lag over time", title_justify="left", box=None)
    for bucket in buckets(series, CHART_BUCKET_SECONDS):
        lag = bucket["lag_seconds_max"]
        cells = round(min(lag / window, 1.5) * CHART_WIDTH)
        bar = Text("█" * cells, style="green" if lag < window else "red")
        if cells < CHART_WIDTH:
            bar.append(" " * (CHART_WIDTH - cells - 1) + "│", style="dim")
        start = int(bucket["from"])
        chart.add_row(f"{start // 60:02d}:{start % 60:02d}", bar, f"{lag:.1f}",
                      f"{bucket['lag_samples_max']:,.0f}", f"{bucket['worker_cpu_pct']:.0f}%")
    return chart


def report(results: dict[str, Any]) -> None:
    window = results["window_seconds"]
    table = Table("measure", "value", title_justify="left",
                  title=f"gpumeter fleet in real time: {results['gpus']:,} GPUs, one worker")
    table.add_row("fleet", f"{sum(results['nodes'].values()):,} nodes · {results['gpus']:,} GPUs · "
                  f"{results['tenants']} tenants · {results['pods_mean']:,.0f} pods")
    table.add_row("GPUs in use (mean)", f"{results['gpus_in_use_mean']:,.0f} "
                  f"({results['gpus_in_use_mean'] / results['gpus']:.0%})")
    table.add_row("samples per window", f"{results['samples_per_window_mean']:,.0f} "
                  f"({', '.join(results['kinds'])})")
    table.add_row("offered", f"{results['offered_samples_per_s']:,.0f} samples/s · "
                  f"{results['windows']} windows of {window} s")
    table.add_row("lag p50 / p99 / max", f"{results['lag_seconds_p50']:.1f} / "
                  f"{results['lag_seconds_p99']:.1f} / {results['lag_seconds_max']:.1f} s")
    table.add_row("lag p50 / p99 / max, samples", f"{results['lag_samples_p50']:,.0f} / "
                  f"{results['lag_samples_p99']:,.0f} / {results['lag_samples_max']:,.0f}")
    if results["window_committed_after_max_s"] is not None:
        table.add_row("window sent -> all committed",
                      f"p50 {results['window_committed_after_p50_s']:.1f} s · "
                      f"max {results['window_committed_after_max_s']:.1f} s "
                      f"(±{results['sample_seconds']:g} s sampling)")
    table.add_row("worker CPU", f"{results['worker_cpu_pct_of_core']:.1f}% of one core · "
                  f"{results['worker_cpu_us_per_sample']:,.1f} µs/sample")
    table.add_row("publisher CPU", f"{results['publisher_cpu_pct_of_core']:.1f}% of one core · "
                  f"slowest window sent in {results['publisher_window_seconds_max']:.2f} s · "
                  f"latest start {results['publisher_late_max_s']:.2f} s after due")
    table.add_row("stored", f"{results['stored_distinct_event_ids']:,} of {results['expected_rows']:,} "
                  f"event_ids visible ({results['stored_rows']:,} rows)")
    table.add_row("load average start / end", f"{results['load_average_start']:.2f} / "
                  f"{results['load_average_end']:.2f}")
    console.print(table)
    console.print(lag_chart(results["series"], window))
    verdict = "yes" if results["lag_under_one_window"] else "no"
    style = "bold green" if results["lag_under_one_window"] else "bold red"
    console.print(Text(f"lag stayed under one window ({window} s): {verdict}", style=style))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=1250, help="8-GPU nodes (1,250 = 10,000 GPUs)")
    parser.add_argument("--window-seconds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sample-seconds", type=float, default=1.0, help="how often the lag is read")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.minutes <= 0 or args.sample_seconds <= 0:
        parser.error("--nodes, --minutes and --sample-seconds must be positive")

    settings, client, tag = isolated_namespace("fleet")
    worker = WorkerProcess(settings, Path("/tmp") / f"gpumeter-fleet-{tag}.log", "warn")
    try:
        with console.status("starting the worker..."):
            worker.start()
            publish(settings, make_payloads(1), None)  # warm-up: the worker has joined and stores
            wait_stored(client, 1, 120)
        results = run(settings, args, client, worker)
    finally:
        worker.stop()
        client.close()
        services.drop_namespace(settings)
    report(results)
    write_results(RESULTS, results)
    return 0 if results["lag_under_one_window"] and results["all_visible"] else 1


if __name__ == "__main__":
    sys.exit(main())
