"""Closing a month and serving invoices, each beside a plain baseline measured in the same run.

    .venv/bin/python -m benchmarks.invoices [--rows 30000000] [--tenants 1000] [--clients 50]

On the ClickHouse server of the settings (`gpumeter up`'s by default), in a database of its own
that is dropped afterwards:
- rated rows for ``--tenants`` tenants in 2026-11 are generated server-side (INSERT ... SELECT
  FROM numbers(), no Python in the loop), spread over GPU models, capacity types and cpu/memory;
- baseline: the plain aggregate query invoices are priced from (Σ unit_seconds per tenant and
  line over rated_usage FINAL);
- close: `gpumeter invoice close` for the month (one final per tenant, each a claimed ledger
  position), run in this process with the real engine;
- a running month (2026-12, ``--rows`` / 4 rows over the whole month) is left open: its
  invoices are drafts, priced from the hourly rollup;
- API: `gpumeter api` on uvicorn in its own process. A first pass fetches every issued invoice
  once per format (JSON, CSV, PDF: each rendered once from the stored document; printed as the
  cold pass). Then ``--clients`` concurrent clients fetch random tenants' issued invoices as
  JSON, as CSV, as PDF, the running month's drafts, its month-to-date usage, and ``/healthz``
  (an empty endpoint, the baseline), ``--seconds`` each: p50 / p99 of each and the ratio of its
  p99 to ``/healthz``'s (targets: issued <= 2x, drafts and usage <= 4x);
- burst: ``--burst`` requests at once over as many connections, across all of those endpoints:
  every one must answer 200 within the client's timeout (30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from benchmarks.pipeline import free_port
from benchmarks.result_file import write_results
from gpumeter.app import schema
from gpumeter.app.runtime import services
from gpumeter.core.settings import Settings, load_settings, settings_env
from gpumeter.infra import clickhouse
from pricing.issue import billing, close

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "invoices-latest.json"
REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-finance-token"
RUNNING = "2026-12"  # the month left open: its invoices are drafts
CHUNK = 500_000  # each INSERT ... SELECT well inside the client's 60 s read timeout

# Server-side generator of rated rows: contract-3 arithmetic done in SQL on the 2026-11 card
# (unit_seconds = quantity x 3600 for one-hour windows; list cost at the first band price).
GENERATE = """
INSERT INTO rated_usage (event_id, tenant, period, kind, cluster, node, namespace, pod, pod_uid,
    window_start, window_end, quantity, unit_seconds, gpu_model, mig_profile, capacity_type, priority,
    rate_card, currency, unit_price, capacity_multiplier, list_cost, utilization, energy_joules, labels,
    source_partition, source_offset)
SELECT
    concat('bench-', toString(n)) AS event_id,
    concat('t', leftPad(toString(n % {tenants}), 5, '0')) AS tenant,
    '{period}' AS period,
    ['gpu', 'gpu', 'gpu', 'cpu', 'memory'][1 + intDiv(n, {tenants}) % 5] AS kind,
    'bench' AS cluster, concat('node-', toString(n % 97)) AS node, tenant AS namespace,
    concat('pod-', toString(n % 1013)) AS pod, concat('uid-', toString(n % 1013)) AS pod_uid,
    toDateTime64('{period}-01 00:00:00', 6, 'UTC') + toIntervalHour(intDiv(n, {tenants} * 5) % 720)
        AS window_start,
    window_start + toIntervalHour(1) AS window_end,
    toDecimal128(1 + n % 8, 12) AS quantity,
    toDecimal128(quantity * 3600, 21) AS unit_seconds,
    if(kind = 'gpu', ['H100-SXM-80GB', 'A100-SXM-40GB', 'L40S-48GB'][1 + n % 3], NULL) AS gpu_model,
    CAST(NULL, 'Nullable(String)') AS mig_profile,
    ['on-demand', 'on-demand', 'reserved', 'spot'][1 + intDiv(n, 7) % 4] AS capacity_type,
    0 AS priority, '2026-11' AS rate_card, 'USD' AS currency,
    multiIf(kind = 'cpu', toDecimal128('0.04', 12), kind = 'memory', toDecimal128('0.005', 12),
            gpu_model = 'H100-SXM-80GB', toDecimal128('2.50', 12), toDecimal128('1.80', 12)) AS unit_price,
    multiIf(capacity_type = 'reserved', toDecimal128('0.6', 12),
            capacity_type = 'spot', toDecimal128('0.35', 12), toDecimal128('1', 12)) AS capacity_multiplier,
    toDecimal128(quantity * unit_price * capacity_multiplier, 18) AS list_cost,
    NULL, NULL, map(), 0, toInt64(n)
FROM (SELECT number + {offset} AS n FROM numbers({count}))
"""

AGGREGATE = ("SELECT tenant, rate_card, kind, gpu_model, mig_profile, capacity_type, sum(unit_seconds) "
             "FROM rated_usage FINAL WHERE period = '2026-11' "
             "GROUP BY tenant, rate_card, kind, gpu_model, mig_profile, capacity_type")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def generate(client: Any, rows: int, tenants: int, period: str = "2026-11", first: int = 0) -> float:
    started = time.perf_counter()
    for offset in range(0, rows, CHUNK):
        count = min(CHUNK, rows - offset)
        client.command(GENERATE.format(tenants=tenants, offset=first + offset, count=count, period=period),
                       settings={"max_insert_threads": 2})
    # No OPTIMIZE: on 30M rows it outlasts the client's read timeout; FINAL in both the baseline
    # and the close reads whatever the background merges have left.
    return time.perf_counter() - started


def timed_aggregate(client: Any, repeats: int = 3) -> tuple[float, int]:
    times, lines = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        lines = len(client.query(AGGREGATE).result_rows)
        times.append(time.perf_counter() - started)
    return statistics.median(times), lines


async def burst(url: str, paths: list[str], count: int, timeout: float = 30.0) -> dict[str, int]:
    """``count`` requests at once, each on its own connection: how many answered 200, how many
    answered otherwise, how many timed out or failed."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    outcome = {"ok": 0, "error": 0, "timeout": 0}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, limits=limits) as http:

        async def one(path: str) -> None:
            try:
                response = await http.get(path)
            except httpx.TimeoutException:
                outcome["timeout"] += 1
                return
            except httpx.TransportError:
                outcome["error"] += 1
                return
            outcome["ok" if response.status_code == 200 else "error"] += 1

        await asyncio.gather(*(one(paths[n % len(paths)]) for n in range(count)))
    return outcome


async def each_once(url: str, paths: list[str], clients: int) -> list[float]:
    """Every path once, ``clients`` at a time."""
    latencies: list[float] = []
    queue = list(paths)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
            while queue:
                path = queue.pop()
                started = time.perf_counter()
                response = await http.get(path)
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


async def load(url: str, paths: list[str], clients: int, seconds: float) -> list[float]:
    """``clients`` concurrent clients, each a keep-alive connection, for ``seconds``."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await http.get(rng.choice(paths))
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"{response.status_code} {response.text[:200]}")

    await asyncio.gather(*(client(n) for n in range(clients)))
    return latencies


def serve(settings: Settings, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    tokens = tmp / "tokens.yaml"
    tokens.write_text(json.dumps({"tokens": [{"sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
                                               "role": "finance"}]}))
    settings = settings.model_copy(deep=True)
    settings.api.tokens = tokens
    settings.api.listen = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "gpumeter.app.cli", "api"], env=settings_env(settings),
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp / "api.log").open("wb"))
    url = f"http://{settings.api.listen}"
    for _ in range(300):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.2)
    server.terminate()
    raise RuntimeError(f"gpumeter api did not start: {(tmp / 'api.log').read_text()[-2000:]}")


# (name, path of tenant t, p99 target as a multiple of /healthz's)
PHASES = (
    ("issued JSON", "/v1/tenants/{t}/invoices/2026-11", 2.0),
    ("issued CSV", "/v1/tenants/{t}/invoices/2026-11?format=csv", 2.0),
    ("issued PDF", "/v1/tenants/{t}/invoices/2026-11?format=pdf", 2.0),
    ("draft (running month)", "/v1/tenants/{t}/invoices/" + RUNNING, 4.0),
    ("usage (running month)", "/v1/tenants/{t}/usage?period=" + RUNNING, 4.0),
)


def summary(latencies: list[float], seconds: float) -> dict[str, float]:
    return {"requests": len(latencies), "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * percentile(latencies, 0.99), "per_s": len(latencies) / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0, help="load duration per API phase")
    parser.add_argument("--burst", type=int, default=500, help="requests sent at once")
    args = parser.parse_args(argv)

    base = load_settings()
    tag = uuid.uuid4().hex[:8]
    settings = services.namespaced(base, f"bench-{tag}.", f"bench_inv_{tag}", "gpumeter-bench")
    settings.tenants = None  # every tenant billed on usage alone: one final per generated tenant
    tmp = Path("/tmp") / f"gpumeter-bench-invoices-{tag}"
    tmp.mkdir(parents=True)
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client)
    results: dict[str, Any] = {"rows": args.rows, "tenants": args.tenants, "clients": args.clients,
                               "seconds": args.seconds, "phases": {}}
    server = None
    try:
        running_rows = args.rows // 4
        total = args.rows + running_rows
        with console.status(f"generating {total:,} rated rows for {args.tenants:,} tenants..."):
            results["generate_s"] = generate(client, args.rows, args.tenants)
            results["generate_s"] += generate(client, running_rows, args.tenants, RUNNING, first=args.rows)
        with console.status("baseline: the plain aggregate query..."):
            results["aggregate_s"], results["lines"] = timed_aggregate(client)
        with console.status(f"closing 2026-11 for {args.tenants:,} tenants..."), billing(settings) as context:
            started = time.perf_counter()
            issued = close(context, "2026-11", now=lambda: datetime.now(UTC))
            results["close_s"] = time.perf_counter() - started
            results["invoices_issued"] = len(issued)
        server, url = serve(settings, tmp)
        tenants = [f"t{n:05d}" for n in range(args.tenants)]
        with console.status("cold pass: every issued invoice once per format..."):
            cold: list[float] = []
            for _, path, target in PHASES:
                if target == 2.0:
                    cold += asyncio.run(each_once(url, [path.format(t=t) for t in tenants], args.clients))
            results["cold"] = summary(cold, 1.0)
        for name, path, target in PHASES:
            with console.status(f"API: {args.clients} clients x {args.seconds:.0f} s, {name}..."):
                latencies = asyncio.run(load(url, [path.format(t=t) for t in tenants], args.clients,
                                             args.seconds))
                results["phases"][name] = {**summary(latencies, args.seconds), "target": target}
        with console.status(f"API: {args.clients} clients x {args.seconds:.0f} s, /healthz..."):
            results["empty"] = summary(asyncio.run(load(url, ["/healthz"], args.clients, args.seconds)),
                                       args.seconds)
        with console.status(f"burst: {args.burst} requests at once..."):
            mixed = [path.format(t=t) for t in tenants[:100] for _, path, _ in PHASES] + ["/healthz"]
            random.Random(7).shuffle(mixed)
            results["burst"] = {"requests": args.burst, **asyncio.run(burst(url, mixed, args.burst))}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        client.close()
        clickhouse.drop_database(settings.clickhouse.dsn)

    empty = results["empty"]
    results["close_vs_aggregate"] = results["close_s"] / results["aggregate_s"]
    table = Table("measure", "value", title="gpumeter invoices benchmark", title_justify="left")
    table.add_row("rated rows / tenants / lines",
                  f"{args.rows:,} (+{running_rows:,} running month) / {args.tenants:,} / "
                  f"{results['lines']:,}")
    table.add_row("plain aggregate query (FINAL, per tenant and line)", f"{results['aggregate_s']:.2f} s")
    table.add_row(f"close 2026-11: {results['invoices_issued']:,} finals", f"{results['close_s']:.2f} s")
    table.add_row("  ratio close / aggregate", f"{results['close_vs_aggregate']:.2f}")
    table.add_row(f"cold pass (each issued invoice rendered once per format, {args.clients} clients): "
                  "p50 / p99", f"{results['cold']['p50_ms']:.0f} / {results['cold']['p99_ms']:.0f} ms")
    table.add_row(f"/healthz, {args.clients} clients: p50 / p99",
                  f"{empty['p50_ms']:.0f} / {empty['p99_ms']:.0f} ms ({empty['per_s']:.0f} req/s)")
    met = True
    for name, phase in results["phases"].items():
        phase["p99_vs_empty"] = phase["p99_ms"] / empty["p99_ms"]
        ok = phase["p99_vs_empty"] <= phase["target"]
        met = met and ok
        table.add_row(f"{name}, {args.clients} clients: p50 / p99",
                      f"{phase['p50_ms']:.0f} / {phase['p99_ms']:.0f} ms ({phase['per_s']:.0f} req/s)")
        table.add_row(f"  ratio p99 / healthz (target <= {phase['target']:.0f})",
                      f"{phase['p99_vs_empty']:.2f} {'met' if ok else 'MISSED'}")
    b = results["burst"]
    table.add_row(f"burst of {b['requests']} at once: ok / error / timeout",
                  f"{b['ok']} / {b['error']} / {b['timeout']}")
    results["targets_met"] = met and b["ok"] == b["requests"]
    console.print(table)
    write_results(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
