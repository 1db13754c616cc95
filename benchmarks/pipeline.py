"""Pipeline throughput and latency beside raw baselines measured in the same run.

    .venv/bin/python -m benchmarks.pipeline [--samples 60000] [--paced-rate 2000]

Measures, on the local services of `gpumeter up` (started if needed), in a namespace of
its own that is removed afterwards:
- raw Kafka: the same sample bytes produced and consumed with no processing;
- raw insert: the same rated rows bulk-inserted into a plain MergeTree table;
- pipeline, saturated: N samples published at once, time until all are visible in
  ClickHouse (`gpumeter worker`, one process);
- pipeline, paced: samples published at a fixed rate, latency publish -> visible
  (ClickHouse's own insert time of each row minus the producer's send time).
Prints the ratios pipeline / baseline; machines are noisy, ratios travel better.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer
from rich.console import Console
from rich.table import Table

from benchmarks.result_file import write_results
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.app import schema
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import jsonio, topics
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import split, tenant_records
from gpumeter.core.settings import Settings, load_settings
from gpumeter.core.topics import TopicSpec
from gpumeter.infra import clickhouse, kafka
from gpumeter.infra.rows import rated_row
from gpumeter.infra.schema import RATED_USAGE
from streams.stage import RatingStage

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "pipeline-latest.json"


def make_payloads(count: int) -> list[dict[str, Any]]:
    fleet = SimulatedFleet(FleetConfig(seed=3, window_seconds=60,
                                       nodes={"H100-SXM-80GB": 40, "A100-SXM-40GB": 12, "L40S-48GB": 12}))
    samples: list[dict[str, Any]] = []
    while len(samples) < count:
        samples.extend(fleet.step_dicts())
    return samples[:count]


def _consume_until(bootstrap: str, topic: str, expected: int, finished: Any) -> None:
    """Consumer process of the raw baseline: reads until ``expected`` samples, reports the time."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    received = 0
    while received < expected:
        for records in consumer.poll(timeout_ms=500, max_records=5000).values():
            received += sum(len(split(record.value)) for record in records)
    finished.put(time.time())
    consumer.close()


def raw_kafka(settings: Settings, samples: list[dict[str, Any]]) -> float:
    """The same bytes, framed the same way, produced by this process and consumed by another
    with no processing (as the worker is another process): samples per second end to end."""
    framed = list(tenant_records(samples))
    name = settings.kafka.topic("raw")
    kafka.ensure_topics(settings.kafka, [TopicSpec("raw", "samples")])
    finished: Any = multiprocessing.Queue()
    consumer = multiprocessing.Process(
        target=_consume_until, args=(settings.kafka.bootstrap, name, len(samples), finished), daemon=True)
    consumer.start()
    time.sleep(2.0)  # the consumer has its partitions before the clock starts
    producer = kafka.make_producer(settings.kafka)
    started = time.time()
    for key, record in framed:
        producer.send(name, key=key, value=record)
    producer.flush()
    ended = finished.get(timeout=600)
    consumer.join(timeout=30)
    producer.close()
    return len(samples) / (ended - started)


def raw_insert(settings: Settings, samples: list[dict[str, Any]], batch: int) -> float:
    """Bulk insert of the same rated rows into a plain MergeTree: rows per second."""
    stage = RatingStage(load_rate_cards(settings.rate_cards), "bench")
    rows = []
    for index, sample in enumerate(samples):
        outcome = stage.process(jsonio.dumpb(sample), 0, index)
        assert outcome.rated is not None
        rows.append(rated_row(outcome.rated))
    client = clickhouse.connect(settings.clickhouse.dsn)
    client.command("CREATE TABLE raw_rated AS rated_usage ENGINE = MergeTree ORDER BY tuple()")
    started = time.perf_counter()
    for start in range(0, len(rows), batch):
        client.insert("raw_rated", rows[start:start + batch], column_names=list(RATED_USAGE.insert_columns))
    elapsed = time.perf_counter() - started
    client.close()
    return len(rows) / elapsed


def free_port() -> int:
    """A TCP port free on loopback now (for a server this run starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stored(client: Any) -> int:
    return int(clickhouse.scalar(client, "SELECT count() FROM rated_usage"))


def publish(settings: Settings, samples: list[dict[str, Any]], rate: float | None) -> dict[str, float]:
    """Send samples (at ``rate`` per second, or at once); returns send time by event_id."""
    producer = kafka.make_producer(settings.kafka)
    topic = settings.kafka.topic(topics.SAMPLES)
    sent: dict[str, float] = {}
    started = time.time()
    # As a node agent does: one window's samples per tenant in one record. Paced runs send
    # a record per 100 ms tick, so a sample's latency includes at most that wait.
    tick = len(samples) if rate is None else max(1, int(rate / 10))
    for first in range(0, len(samples), tick):
        if rate is not None:
            delay = started + first / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        now = time.time()
        chunk = samples[first:first + tick]
        sent.update((sample["event_id"], now) for sample in chunk)
        for key, record in tenant_records(chunk):
            producer.send(topic, key=key, value=record)
    producer.flush()
    producer.close()
    return sent


def wait_count(read: Callable[[], int], target: int, timeout: float, what: str = "rows visible") -> float:
    """Poll ``read`` until it reaches ``target``; returns the time it did."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if read() >= target:
            return time.time()
        time.sleep(0.05)
    raise RuntimeError(f"only {read()} of {target} {what} after {timeout:.0f} s")


def wait_stored(client: Any, target: int, timeout: float) -> float:
    return wait_count(lambda: stored(client), target, timeout)


def latencies(client: Any, sent: dict[str, float]) -> list[float]:
    rows = client.query(
        "SELECT event_id, toFloat64(inserted_at) FROM rated_usage WHERE event_id IN %(ids)s",
        parameters={"ids": list(sent)}, settings={"max_query_size": 64 * 1024 * 1024},
    ).result_rows
    return sorted(max(0.0, float(at) - sent[event_id]) for event_id, at in rows)


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]


def isolated_namespace(name: str) -> tuple[Settings, Any, str]:
    """The local services of `gpumeter up` (started if needed) and a namespace of this run's own:
    topics ``<name>-<tag>.``, database ``<name>_<tag>``, consumer group ``gpumeter-<name>``, the
    schema migrated. Returns the settings, a ClickHouse client of that database and the tag."""
    base = load_settings()
    with console.status("starting local services..."):
        services.up(base)
    tag = uuid.uuid4().hex[:8]
    settings = services.namespaced(base, f"{name}-{tag}.", f"{name}_{tag}", f"gpumeter-{name}")
    kafka.ensure_topics(settings.kafka)
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client)
    return settings, client, tag


def service_pids(settings: Settings) -> dict[str, int]:
    """Processes of the local services of `gpumeter up` that run here: their CPU per sample is
    the rest of this machine's budget (none when they are elsewhere)."""
    local = services.LocalServices.from_settings(settings)
    nodes = local.kafka.nodes
    found = {("Kafka broker" if len(nodes) == 1 else f"Kafka node {node.node_id}"): node.pid()
             for node in nodes}
    found["ClickHouse server"] = local.clickhouse.pid() if local.clickhouse is not None else None
    return {name: pid for name, pid in found.items() if pid}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--paced-rate", type=float, default=2_000.0, help="samples/s for the latency phase")
    parser.add_argument("--paced-seconds", type=float, default=15.0)
    args = parser.parse_args(argv)

    settings, client, _ = isolated_namespace("bench")
    paced_count = int(args.paced_rate * args.paced_seconds)
    samples = make_payloads(args.samples + paced_count + 1)
    warmup, saturated, paced = samples[0], samples[1:args.samples + 1], samples[args.samples + 1:]
    worker = WorkerProcess(settings, Path("/tmp") / f"gpumeter-bench-{uuid.uuid4().hex[:6]}.log", "warn")
    results: dict[str, Any] = {"samples": args.samples}
    try:
        with console.status("raw Kafka produce+consume..."):
            results["raw_kafka_per_s"] = raw_kafka(settings, saturated)
        with console.status("raw ClickHouse bulk insert..."):
            results["raw_insert_per_s"] = raw_insert(settings, saturated, settings.worker.sink_batch_size)
        with console.status("starting the worker..."):
            worker.start()
            publish(settings, [warmup], None)
            wait_stored(client, 1, 120)
        with console.status(f"pipeline, saturated: {args.samples:,} samples..."):
            assert worker.process is not None
            cpu_before = cpu_seconds(worker.process.pid)
            others = service_pids(settings)
            others_before = {name: cpu_seconds(pid) for name, pid in others.items()}
            first = time.time()
            publish(settings, saturated, None)
            last = wait_stored(client, 1 + len(saturated), 900)
            results["pipeline_per_s"] = len(saturated) / (last - first)
            # CPU time is what a loaded, shared machine distorts least: the worker's own cost
            # per sample, and the samples/s that cost allows one fully available core.
            worker_cpu = cpu_seconds(worker.process.pid) - cpu_before
            results["worker_cpu_us_per_sample"] = worker_cpu / len(saturated) * 1e6
            results["worker_per_cpu_s"] = len(saturated) / worker_cpu
            # The machine's CPU a sample: 20,000 samples/s on 2 cores leaves 100 µs for all of it.
            results["service_cpu_us_per_sample"] = {
                name: (cpu_seconds(pid) - others_before[name]) / len(saturated) * 1e6
                for name, pid in others.items()}
            results["load_average"] = os.getloadavg()[0]
        with console.status(f"pipeline, paced at {args.paced_rate:,.0f}/s for {args.paced_seconds:.0f} s..."):
            sent = publish(settings, paced, args.paced_rate)
            wait_stored(client, 1 + len(saturated) + len(paced), 600)
            lat = latencies(client, sent)
            results.update(
                paced_rate=args.paced_rate,
                latency_p50_s=statistics.median(lat),
                latency_p99_s=percentile(lat, 0.99),
                latency_max_s=lat[-1],
            )
    finally:
        worker.stop()
        client.close()
        services.drop_namespace(settings)

    results["ratio_vs_raw_kafka"] = results["pipeline_per_s"] / results["raw_kafka_per_s"]
    results["ratio_vs_raw_insert"] = results["pipeline_per_s"] / results["raw_insert_per_s"]
    table = Table("measure", "value", title="gpumeter pipeline benchmark (one worker)", title_justify="left")
    table.add_row("raw Kafka produce+consume", f"{results['raw_kafka_per_s']:,.0f} samples/s")
    table.add_row("raw ClickHouse bulk insert", f"{results['raw_insert_per_s']:,.0f} rows/s")
    table.add_row("pipeline ingest -> visible", f"{results['pipeline_per_s']:,.0f} samples/s")
    table.add_row("  ratio vs raw Kafka", f"{results['ratio_vs_raw_kafka']:.3f}")
    table.add_row("  ratio vs raw insert", f"{results['ratio_vs_raw_insert']:.3f}")
    table.add_row("worker CPU per sample", f"{results['worker_cpu_us_per_sample']:,.1f} µs "
                  f"= {results['worker_per_cpu_s']:,.0f}/CPU-s")
    for name, micros in results["service_cpu_us_per_sample"].items():
        table.add_row(f"{name} CPU per sample", f"{micros:,.1f} µs")
    table.add_row("load average, saturated run", f"{results['load_average']:.2f}")
    table.add_row(f"latency at {args.paced_rate:,.0f}/s p50", f"{results['latency_p50_s'] * 1000:,.0f} ms")
    table.add_row(f"latency at {args.paced_rate:,.0f}/s p99", f"{results['latency_p99_s'] * 1000:,.0f} ms")
    console.print(table)
    write_results(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
