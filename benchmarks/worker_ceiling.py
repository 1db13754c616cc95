"""How fast one worker goes when storing costs nothing: the store's share of the throughput gap.

    .venv/bin/python -m benchmarks.worker_ceiling [--samples 100000] [--rounds 2]

On the local services of `gpumeter up` (started if needed), alternating in one run, each
round in a namespace of its own (removed afterwards):
- real: `gpumeter worker` as deployed, samples published at once, timed until the worker's
  own counter of stored rows (its /metrics) reaches them all;
- null store: the same worker with ``ClickHouseSink.store_rated`` replaced, in the worker
  process only, by one that reports every row stored without sending anything (rating,
  the rated topic, the quota agent, faust and Kafka unchanged).
Prints samples/s and the worker's CPU per sample for both, and null / real. If the null store
is not much faster, the store is not what holds one worker below its target (issue 8:
20,000 samples/s): the rest of the worker is. Never run the null store against data you keep:
it acknowledges samples it did not store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.pipeline import cpu_seconds, free_port, isolated_namespace, make_payloads, publish, wait_count
from gpumeter.app.runtime import services
from gpumeter.core.settings import settings_env

console = Console()
ROOT = Path(__file__).resolve().parent.parent
# Runs as the worker process: the product's CLI, with the sink's store replaced first.
NULL_STORE_WORKER = """
import sys
import streams.sink as sink

def store_rated(self, rows):
    result = sink.StoreResult()
    result.stored = len(rows)
    self.counters.stored += len(rows)
    return result

sink.ClickHouseSink.store_rated = store_rated
from gpumeter.app.cli import main
sys.exit(main(["worker", "--loglevel", "warn"]))
"""


def rows_stored(port: int) -> int:
    """The worker's own count of rows its store reported stored (0 until it serves metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("gpumeter_worker_rows_stored_total"):
            return int(float(line.split()[-1]))
    return 0


def wait_rows(port: int, target: int, timeout: float) -> float:
    return wait_count(lambda: rows_stored(port), target, timeout, "rows stored")


def one_round(null_store: bool, samples: list[dict[str, Any]]) -> dict[str, float]:
    settings, client, tag = isolated_namespace("ceiling")
    port = free_port()
    settings.worker.metrics_port = port
    argv = ([sys.executable, "-c", NULL_STORE_WORKER] if null_store
            else [sys.executable, "-m", "gpumeter.app.cli", "worker", "--loglevel", "warn"])
    log_path = Path("/tmp") / f"gpumeter-ceiling-{tag}.log"
    with open(log_path, "ab") as log:
        worker = subprocess.Popen(argv, env={**os.environ, **settings_env(settings)}, cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        publish(settings, samples[:1], None)  # the worker has its partitions and is warm
        wait_rows(port, 1, 180)
        cpu_before = cpu_seconds(worker.pid)
        first = time.time()
        publish(settings, samples[1:], None)
        last = wait_rows(port, len(samples), 900)
        cpu = cpu_seconds(worker.pid) - cpu_before
    finally:
        worker.terminate()
        worker.wait(30)
        client.close()
        services.drop_namespace(settings)
    measured = len(samples) - 1
    return {"per_s": measured / (last - first), "cpu_us": cpu / measured * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of (real, null store) runs")
    args = parser.parse_args(argv)
    samples = make_payloads(args.samples + 1)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for index in range(args.rounds):
        for null_store in (False, True):
            label = "null store" if null_store else "real store"
            with console.status(f"round {index + 1}/{args.rounds}: {label}, {args.samples:,} samples..."):
                runs[null_store].append(one_round(null_store, samples))
    table = Table("worker", "samples/s (each round)", "CPU µs a sample", "samples per CPU-second",
                  title=f"one worker, {args.samples:,} samples published at once", title_justify="left")
    medians: dict[bool, float] = {}
    for null_store, results in runs.items():
        medians[null_store] = statistics.median(r["per_s"] for r in results)
        cpu = statistics.median(r["cpu_us"] for r in results)
        table.add_row("null store" if null_store else "real store",
                      ", ".join(f"{r['per_s']:,.0f}" for r in results), f"{cpu:.1f}", f"{1e6 / cpu:,.0f}")
    console.print(table)
    console.print(f"null / real (medians): {medians[True] / medians[False]:.2f}; "
                  f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
