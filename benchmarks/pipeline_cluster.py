"""Pipeline throughput on a Kafka cluster and with two workers, in one run (issue 28, point 7).

    .venv/bin/python -m benchmarks.pipeline_cluster [--samples 100000] [--quick]

Four set-ups, measured one after the other in the same run (the machine is shared and noisy:
only ratios within one run compare):
- 1 broker (the local one of `gpumeter up`, replication 1), one worker;
- 3 brokers (a KRaft cluster this run starts on free loopback ports: replication 3,
  min.insync.replicas 2, every producer acks=all), one worker;
- 1 broker, two workers (one consumer group: each owns half of the partitions);
- 3 brokers, two workers.
Each: the same samples published at once (a fleet of 40 tenants, so that keys spread over
every samples partition), timed until all are visible in ClickHouse, beside a raw Kafka
produce+consume of the same bytes on the same brokers. Also the CPU of each worker, of the
brokers and of ClickHouse a sample, and how busy the machine's cores were.

Goals: replication costs under 25 % of one worker's throughput (3 brokers / 1 broker ≥ 0.75);
two workers give at least 1.6 x one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.fleet_realtime import fleet_config
from benchmarks.pipeline import cpu_seconds, free_port, publish, raw_kafka, service_pids, wait_stored
from benchmarks.result_file import write_results
from collectors.sim.fleet import SimulatedFleet
from gpumeter.app import schema
from gpumeter.app.runtime import services
from gpumeter.app.runtime.kafka_broker import LocalKafkaCluster
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import KafkaSettings, Settings, load_settings
from gpumeter.infra import clickhouse, kafka

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "pipeline-cluster-latest.json"
TENANTS = 40


def payloads(count: int) -> list[dict[str, Any]]:
    """``count`` samples of a fleet of TENANTS tenants (keys over every partition)."""
    fleet = SimulatedFleet(fleet_config(TENANTS * 10, 60, 3, datetime(2026, 12, 1, tzinfo=UTC)))
    samples: list[dict[str, Any]] = []
    while len(samples) < count:
        samples.extend(fleet.step_dicts())
    return samples[:count]


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot (/proc/stat)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


def start_cluster(home: Path, heap: str) -> LocalKafkaCluster:
    ports = [free_port() for _ in range(3)]
    controllers = [free_port() for _ in range(3)]
    cluster = LocalKafkaCluster.on_ports(home, "127.0.0.1", ports, controllers, heap)
    cluster.start()
    kafka.wait_for_broker(KafkaSettings(bootstrap=cluster.bootstrap, replication_factor=3), timeout=120)
    return cluster


def setup(base: Settings, brokers: LocalKafkaCluster | None) -> tuple[Settings, Any]:
    tag = uuid.uuid4().hex[:8]
    settings = services.namespaced(base, f"cluster-{tag}.", f"cluster_{tag}", "gpumeter-cluster")
    settings.worker.metrics_port = 0  # two workers on one host: no port to share
    if brokers is not None:
        settings.kafka = KafkaSettings.model_validate({
            **settings.kafka.model_dump(), "bootstrap": brokers.bootstrap,
            "replication_factor": 3, "min_insync_replicas": 2})
    kafka.ensure_topics(settings.kafka)
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client)
    return settings, client


def measure(base: Settings, brokers: LocalKafkaCluster | None, workers: int, warmup: list[dict[str, Any]],
            samples: list[dict[str, Any]], label: str) -> dict[str, Any]:
    settings, client = setup(base, brokers)
    logs = [Path("/tmp") / f"gpumeter-cluster-{uuid.uuid4().hex[:6]}.log" for _ in range(workers)]
    processes = [WorkerProcess(settings, log, "warn") for log in logs]
    result: dict[str, Any] = {"setup": label, "brokers": 1 if brokers is None else 3, "workers": workers,
                              "samples": len(samples)}
    try:
        with console.status(f"{label}: raw Kafka produce+consume..."):
            result["raw_kafka_per_s"] = raw_kafka(settings, samples)
        with console.status(f"{label}: starting {workers} worker(s)..."):
            for process in processes:
                process.start()
            publish(settings, warmup, None)
            wait_stored(client, len(warmup), 180)
            time.sleep(3.0)  # a second worker's rebalance settles before the clock starts
        with console.status(f"{label}: {len(samples):,} samples through {workers} worker(s)..."):
            pids = {f"worker {i + 1}": p.process.pid for i, p in enumerate(processes) if p.process}
            if brokers is None:
                pids.update(service_pids(base))
            else:
                pids.update({f"Kafka node {n.node_id}": pid for n in brokers.nodes if (pid := n.pid())})
                local = services.LocalServices.from_settings(base)
                if local.clickhouse is not None and (ch := local.clickhouse.pid()):
                    pids["ClickHouse server"] = ch
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            busy_before, total_before = machine_busy()
            first = time.time()
            publish(settings, samples, None)
            last = wait_stored(client, len(warmup) + len(samples), 900)
            busy_after, total_after = machine_busy()
            result["pipeline_per_s"] = len(samples) / (last - first)
            result["seconds"] = last - first
            result["cpu_us_per_sample"] = {name: (cpu_seconds(pid) - before[name]) / len(samples) * 1e6
                                           for name, pid in pids.items()}
            cores = len([line for line in Path("/proc/stat").read_text().splitlines()
                         if line.startswith("cpu") and line[3:4].isdigit()])
            result["machine_busy_cores"] = (busy_after - busy_before) / (total_after - total_before) * cores
            distinct = clickhouse.scalar(client, "SELECT uniqExact(event_id) FROM rated_usage")
            result["stored_distinct"] = int(distinct)
            result["stored_rows"] = int(clickhouse.scalar(client, "SELECT count() FROM rated_usage"))
    finally:
        for process in processes:
            process.stop()
        client.close()
        services.drop_namespace(settings)
    result["ratio_vs_raw_kafka"] = result["pipeline_per_s"] / result["raw_kafka_per_s"]
    return result


def worker_us(result: dict[str, Any]) -> float:
    """CPU µs a sample of the set-up's workers together."""
    return sum(micros for name, micros in result["cpu_us_per_sample"].items() if name.startswith("worker"))


def total_us(result: dict[str, Any]) -> float:
    """CPU µs a sample of every process measured: workers, brokers, ClickHouse."""
    return sum(result["cpu_us_per_sample"].values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="40,000 samples a set-up (about 4 minutes)")
    parser.add_argument("--heap", default="512m", help="heap of each node of the 3-broker cluster")
    args = parser.parse_args(argv)
    count = 40_000 if args.quick else args.samples

    base = load_settings()
    with console.status("starting local services..."):
        services.up(base)
    every = payloads(count + TENANTS * 4)
    warmup, samples = every[:TENANTS * 4], every[TENANTS * 4:]
    results: list[dict[str, Any]] = []
    home = Path(tempfile.mkdtemp(prefix="gpumeter-3-brokers-"))
    with console.status("starting a 3-broker cluster..."):
        cluster = start_cluster(home, args.heap)
    try:
        # Interleaved, so that a change of load on the shared machine falls on both sides of a ratio.
        setups = ((None, 1, "1 broker, 1 worker"), (cluster, 1, "3 brokers, 1 worker"),
                  (None, 2, "1 broker, 2 workers"), (cluster, 2, "3 brokers, 2 workers"))
        for brokers, workers, label in setups:
            results.append(measure(base, brokers, workers, warmup, samples, label))
    finally:
        cluster.stop()

    by = {(r["brokers"], r["workers"]): r for r in results}
    ratios = {
        "replicated_vs_single_1_worker": by[3, 1]["pipeline_per_s"] / by[1, 1]["pipeline_per_s"],
        "replicated_vs_single_2_workers": by[3, 2]["pipeline_per_s"] / by[1, 2]["pipeline_per_s"],
        "two_vs_one_worker_1_broker": by[1, 2]["pipeline_per_s"] / by[1, 1]["pipeline_per_s"],
        "two_vs_one_worker_3_brokers": by[3, 2]["pipeline_per_s"] / by[3, 1]["pipeline_per_s"],
    }
    # CPU a sample travels better than wall time on a shared machine: the workers' own (their
    # samples per CPU-second) and everything's (what the machine spends on a sample).
    ratios.update({
        "worker_cpu_replicated_vs_single": worker_us(by[1, 1]) / worker_us(by[3, 1]),
        "machine_cpu_two_vs_one_worker": total_us(by[1, 1]) / total_us(by[1, 2]),
    })
    table = Table("set-up", "samples/s", "x raw Kafka", "raw Kafka/s", "cores busy", "CPU µs a sample",
                  title="gpumeter pipeline: brokers and workers", title_justify="left")
    for r in results:
        cpu = ", ".join(f"{name} {micros:.1f}" for name, micros in r["cpu_us_per_sample"].items())
        table.add_row(r["setup"], f"{r['pipeline_per_s']:,.0f}", f"{r['ratio_vs_raw_kafka']:.3f}",
                      f"{r['raw_kafka_per_s']:,.0f}", f"{r['machine_busy_cores']:.2f}", cpu)
    console.print(table)
    cost = 1 - ratios["replicated_vs_single_1_worker"]
    console.print(f"replication 3 (acks=all, min ISR 2) costs {cost:.0%} of one worker's throughput "
                  f"(goal < 25 %): {'met' if cost < 0.25 else 'missed'}; with two workers "
                  f"{1 - ratios['replicated_vs_single_2_workers']:.0%}")
    busy = ", ".join(f"{r['machine_busy_cores']:.2f}" for r in results)
    console.print(f"by CPU: the worker's samples per CPU-second on 3 brokers are "
                  f"{ratios['worker_cpu_replicated_vs_single']:.2f} x those on 1; the machine's CPU a sample "
                  f"with one worker is {ratios['machine_cpu_two_vs_one_worker']:.2f} x that with two "
                  f"(cores busy: {busy} of "
                  f"{os.cpu_count()})")
    scale = ratios["two_vs_one_worker_1_broker"]
    console.print(f"two workers give {scale:.2f} x one on 1 broker, "
                  f"{ratios['two_vs_one_worker_3_brokers']:.2f} x on 3 (goal ≥ 1.6): "
                  f"{'met' if scale >= 1.6 else 'missed'}")
    write_results(RESULTS, {"samples": count, "setups": results, **ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
