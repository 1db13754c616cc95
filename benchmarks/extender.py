"""Extender latency over real HTTP, beside an empty HTTP round trip on the same server.

    .venv/bin/python -m benchmarks.extender [--nodes 1000 5000] [--requests 400] [--seed 7]

For each cluster size, a fresh `gpumeter hooks` server (the real aiohttp app and state, in a
process of its own so client and server do not share one GIL) holds N nodes of mixed
layouts (8x H100 NVSwitch, 8x A100 NVLink, 4x L40S PCIe) with random allocations. The client
keeps one connection open, as kube-scheduler's HTTP client does, and for a 4-GPU pod sends
what kube-scheduler sends with ``nodeCacheCapable: true``: ``/kube/filter`` with every node
name, then ``/kube/prioritize`` with the names that passed. Interleaved with them, an empty
round trip (``GET /healthz``) on the same connection is the baseline. Every pod gets a new
uid, so nothing can be cached per request body.

Prints p50/p99 per call and the ratios to the empty round trip; target: filter + prioritize
p99 < 5 ms at 5,000 nodes. Results go to benchmarks/results/extender-latest.json, with the
machine's load average (the figures are only as quiet as the machine was).

Sending every node is the worst case (``percentageOfNodesToScore: 100``): with the default,
kube-scheduler stops filtering once it has found max(100, N x (50 - N/125) %) feasible nodes
and sends only those to extenders, about 500 names at 5,000 nodes (schedule_one.go,
numFeasibleNodesToFind).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import os
import random
import socket
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.result_file import write_results
from gpumeter.core.models import GpuAssignment, GpuDevice, NodeAllocation, NodeTopology

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "extender-latest.json"
TARGET_P99_S = 0.005
GPUS_PER_POD = 4
AT = datetime(2026, 11, 5, tzinfo=UTC)


def node_records(index: int, rng: random.Random) -> tuple[NodeTopology, NodeAllocation]:
    """One node: the layout by index (60 % H100, 25 % A100, 15 % L40S), a random allocation."""
    name = f"node-{index:05d}"
    kind = rng.random()
    if kind < 0.60:
        model, count, link = "H100-SXM-80GB", 8, lambda a, b: "NV18"
    elif kind < 0.85:
        model, count, link = "A100-SXM-40GB", 8, lambda a, b: "NV12"
    else:
        model, count, link = "L40S-48GB", 4, lambda a, b: "PIX" if a // 2 == b // 2 else "SYS"
    gpus = [GpuDevice(index=i, uuid=f"GPU-{name}-{i}", model=model, numa_node=i * 2 // count)
            for i in range(count)]
    links = {f"{a}-{b}": link(a, b) for a in range(count) for b in range(a + 1, count)}
    taken = sorted(rng.sample(range(count), rng.randint(0, count)))
    assignments = [GpuAssignment(namespace="busy", pod=f"p-{name}", pod_uid=f"u-{name}", gpu_indices=taken)]
    topology = NodeTopology(cluster="bench", node=name, gpus=gpus, links=links, at=AT)
    allocation = NodeAllocation(cluster="bench", node=name, assignments=assignments if taken else [], at=AT)
    return topology, allocation


def serve(nodes: int, seed: int, ports: Any) -> None:
    """Server process: the real state and app, loaded with ``nodes`` nodes, on a free port."""
    import asyncio

    from scheduler_hooks.cluster.state import ALLOCATION, TOPOLOGY, HooksState
    from scheduler_hooks.extender.server import HooksServer, freeze_heap

    async def main() -> None:
        state = HooksState()
        state.expect(TOPOLOGY, ALLOCATION)  # as the record feeds do: ready once both are read
        rng = random.Random(seed)
        for index in range(nodes):
            topology, allocation = node_records(index, rng)
            state.apply_topology(topology)
            state.apply_allocation(allocation)
        state.loaded(TOPOLOGY)
        state.loaded(ALLOCATION)  # ready: builds the fit tables of 1, 2, 4 and 8 GPUs
        freeze_heap()  # as `gpumeter hooks` does once its state is loaded
        server = HooksServer(state, "127.0.0.1:0")
        await server.start()
        ports.put(server.port)
        await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


def pod(serial: int) -> dict[str, Any]:
    gpus = str(GPUS_PER_POD)
    return {
        "metadata": {"name": f"trainer-{serial}", "namespace": "team-a", "uid": f"uid-{serial:08d}"},
        "spec": {"containers": [{"name": "main", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": gpus},
                                               "requests": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Pending"},
    }


class Client:
    """One keep-alive HTTP/1.1 connection with TCP_NODELAY; ``call`` returns (seconds, status, body)."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.connection.connect()
        # As Go's net package does for kube-scheduler's client: without it, Nagle holds the
        # tail of a large request body back until the server's delayed ACK.
        self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[float, int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        started = time.perf_counter()
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        return time.perf_counter() - started, response.status, data

    def close(self) -> None:
        self.connection.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def server_side(exposition: str, verb: str) -> tuple[float, float]:
    """(mean seconds, upper bound of the p99 bucket) of one verb from the /metrics histogram."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in exposition.splitlines():
        if f'verb="{verb}"' not in line or line.startswith("#"):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("gpumeter_hooks_request_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), value))
        elif line.startswith("gpumeter_hooks_request_seconds_sum"):
            total = value
        elif line.startswith("gpumeter_hooks_request_seconds_count"):
            count = value
    p99 = next((bound for bound, seen in sorted(buckets) if seen >= 0.99 * count), float("inf"))
    return (total / count if count else 0.0), p99


def measure(nodes: int, requests: int, seed: int, progress: Progress) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    server = context.Process(target=serve, args=(nodes, seed, ports), daemon=True)
    server.start()
    try:
        port = int(ports.get(timeout=300))
        client = Client(port)
        names = [f"node-{i:05d}" for i in range(nodes)]
        timings: dict[str, list[float]] = {name: [] for name in ("empty", "filter", "prioritize",
                                                                 "filter+prioritize")}
        passed_counts: list[int] = []
        warmup = max(20, requests // 10)
        task = progress.add_task(f"{nodes:,} nodes", total=warmup + requests)
        cold_filter = 0.0
        # The client stands in for kube-scheduler: its own pauses are not the extender's latency.
        # Its collector stays off while measuring (Go's runs concurrently), and the progress bar
        # redraws between requests only (auto_refresh would redraw from a thread of this process
        # in the middle of a timed call).
        gc.disable()
        for serial in range(warmup + requests):
            body = json.dumps({"Pod": pod(serial), "Nodes": None, "NodeNames": names}).encode()
            empty, status, _ = client.call("GET", "/healthz")
            assert status == 200
            filtered, status, answer = client.call("POST", "/kube/filter", body)
            assert status == 200, answer[:200]
            passed = json.loads(answer)["NodeNames"]
            body = json.dumps({"Pod": pod(serial), "Nodes": None, "NodeNames": passed}).encode()
            scored, status, answer = client.call("POST", "/kube/prioritize", body)
            assert status == 200, answer[:200]
            if serial == 0:
                cold_filter = filtered
            if serial >= warmup:
                timings["empty"].append(empty)
                timings["filter"].append(filtered)
                timings["prioritize"].append(scored)
                timings["filter+prioritize"].append(filtered + scored)
                passed_counts.append(len(passed))
            progress.advance(task)
            if serial % 20 == 0:
                progress.refresh()
        _, _, exposition = client.call("GET", "/metrics")
        client.close()
    finally:
        gc.enable()
        server.terminate()
        server.join(10)
    result: dict[str, Any] = {"nodes": nodes, "requests": requests, "pod_gpus": GPUS_PER_POD,
                              "passed_filter_mean": statistics.fmean(passed_counts),
                              "first_filter_ms": cold_filter * 1000}
    for name, values in timings.items():
        result[f"{name}_p50_ms"] = percentile(values, 0.50) * 1000
        result[f"{name}_p99_ms"] = percentile(values, 0.99) * 1000
    # The server's own view (body read to answer written), warm-up included: mean, and the
    # histogram bucket holding the 99th percentile (an upper bound).
    for verb in ("filter", "prioritize"):
        mean, p99_bound = server_side(exposition.decode(), f"kube.{verb}")
        result[f"server_{verb}_mean_ms"] = mean * 1000
        result[f"server_{verb}_p99_bound_ms"] = p99_bound * 1000
    for name in ("filter", "prioritize", "filter+prioritize"):
        result[f"{name}_p50_ratio"] = result[f"{name}_p50_ms"] / result["empty_p50_ms"]
        result[f"{name}_p99_ratio"] = result[f"{name}_p99_ms"] / result["empty_p99_ms"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    results = []
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        for nodes in args.nodes:
            before = os.getloadavg()[0]
            result = measure(nodes, args.requests, args.seed, progress)
            result["load_average_1m"] = [before, os.getloadavg()[0]]
            results.append(result)
    table = Table(title=f"extender over HTTP, {GPUS_PER_POD}-GPU pod, NodeNames only")
    table.add_column("nodes", justify="right")
    table.add_column("call")
    for column in ("p50 ms", "p99 ms", "p50 / empty", "p99 / empty"):
        table.add_column(column, justify="right")
    for result in results:
        table.add_row(f"{result['nodes']:,}", "empty (GET /healthz)", f"{result['empty_p50_ms']:.3f}",
                      f"{result['empty_p99_ms']:.3f}", "1", "1")
        for name in ("filter", "prioritize", "filter+prioritize"):
            table.add_row("", name, f"{result[f'{name}_p50_ms']:.3f}", f"{result[f'{name}_p99_ms']:.3f}",
                          f"{result[f'{name}_p50_ratio']:.1f}", f"{result[f'{name}_p99_ratio']:.1f}")
        for verb in ("filter", "prioritize"):
            table.add_row("", f"server: {verb}", f"mean {result[f'server_{verb}_mean_ms']:.3f}",
                          f"<= {result[f'server_{verb}_p99_bound_ms']:.1f}", "", "")
    console.print(table)
    for result in results:
        verdict = "met" if result["filter+prioritize_p99_ms"] < TARGET_P99_S * 1000 else "NOT met"
        console.print(f"{result['nodes']:,} nodes: filter+prioritize p99 "
                      f"{result['filter+prioritize_p99_ms']:.2f} ms (target < {TARGET_P99_S * 1000:.0f} ms: "
                      f"{verdict}); first filter (cold caches) {result['first_filter_ms']:.1f} ms; "
                      f"{result['passed_filter_mean']:.0f} nodes passed the filter on average; "
                      f"load average {result['load_average_1m'][0]:.1f} -> "
                      f"{result['load_average_1m'][1]:.1f} on {os.cpu_count()} CPUs")
    write_results(RESULTS, {"runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
