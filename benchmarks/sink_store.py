"""The ClickHouse sink alone: `ClickHouseSink.store_rated` beside a raw bulk insert, same rows.

    .venv/bin/python -m benchmarks.sink_store [--samples 60000] [--batch 5000]

On the local services of `gpumeter up` (started if needed), in a database of its own that is
removed afterwards: N simulated samples are rated once, then
- raw insert: the rated rows bulk-inserted into a plain MergeTree (no lookups, no tokens);
- sink: the same rows through the worker's store path, batch by batch (event_ids lookup,
  rated_usage lookup, rated_usage insert with its token and the usage_hourly view, event_ids
  insert), with the wall time of each step.
Prints rows/s and the ratio sink / raw, with the CPU each side spent per row: this process
(the client) and, when the server is the local one, the ClickHouse server, during the stores
and again a few seconds later (the merges they set off; whatever else the server does meanwhile
counts too, so run it on a server at rest). Machines are noisy; ratios travel better.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.pipeline import cpu_seconds, isolated_namespace, make_payloads, raw_insert, service_pids
from gpumeter.app.runtime import services
from gpumeter.core import jsonio
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.infra.rows import rated_row
from gpumeter.infra.tables import Topology
from streams.sink import ClickHouseSink, connector
from streams.stage import RatingStage, encode_rated

console = Console()
MERGE_SETTLE_SECONDS = 5.0


def timed(phases: dict[str, float], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - started
    return wrapper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=5_000,
                        help="rows per store (the worker's sink_batch_size)")
    args = parser.parse_args(argv)

    settings, client, _ = isolated_namespace("sinkbench")
    server_pid = service_pids(settings).get("ClickHouse server")
    try:
        samples = make_payloads(args.samples)
        with console.status("raw ClickHouse bulk insert..."):
            raw_per_s = raw_insert(settings, samples, args.batch)
        with console.status("rating the samples..."):
            stage = RatingStage(load_rate_cards(settings.rate_cards), "bench")
            rows = []
            for index, sample in enumerate(samples):
                outcome = stage.process(jsonio.dumpb(sample), 0, index)
                assert outcome.rated is not None, outcome.dead
                rows.append(rated_row(outcome.rated, encode_rated(outcome.rated)))  # as the worker sends them
        sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
        phases: dict[str, float] = {}
        # Instance attributes shadow the methods: each step of store_rated is timed as it runs.
        sink._horizon = timed(phases, "event_id_hashes horizon", sink._horizon)  # type: ignore[method-assign]
        sink._first_claims = timed(phases, "event_ids lookup", sink._first_claims)  # type: ignore[method-assign]
        sink._claim = timed(phases, "event_ids claim", sink._claim)  # type: ignore[method-assign]
        sink._contested = timed(phases, "event_ids contest", sink._contested)  # type: ignore[method-assign]
        sink._already_inserted = timed(phases, "rated_usage lookup", sink._already_inserted)  # type: ignore[method-assign]
        sink._insert_splitting = timed(phases, "rated_usage insert", sink._insert_splitting)  # type: ignore[method-assign]
        server_before = cpu_seconds(server_pid) if server_pid else 0.0
        client_before = time.process_time()
        started = time.perf_counter()
        with console.status(f"sink: {len(rows):,} rows in batches of {args.batch:,}..."):
            for first in range(0, len(rows), args.batch):
                sink.store_rated(rows[first:first + args.batch])
        elapsed = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        server_cpu = cpu_seconds(server_pid) - server_before if server_pid else None
        time.sleep(MERGE_SETTLE_SECONDS)
        server_settled = cpu_seconds(server_pid) - server_before if server_pid else None
        sink.close()
        stored = int(client.query("SELECT count() FROM rated_usage").result_rows[0][0])
    finally:
        client.close()
        services.drop_namespace(settings)

    sink_per_s = len(rows) / elapsed
    batches = -(-len(rows) // args.batch)
    phases["event_ids insert and the rest"] = elapsed - sum(phases.values())
    table = Table("measure", "value", title=f"ClickHouse sink, {len(rows):,} rated rows",
                  title_justify="left")
    table.add_row("raw bulk insert, plain MergeTree", f"{raw_per_s:,.0f} rows/s")
    table.add_row("sink store_rated", f"{sink_per_s:,.0f} rows/s ({stored:,} stored)")
    table.add_row("  ratio sink / raw", f"{sink_per_s / raw_per_s:.3f}")
    for name, seconds in phases.items():
        table.add_row(f"  {name}",
                      f"{seconds / batches * 1000:.1f} ms a batch, {seconds / len(rows) * 1e6:.1f} µs a row")
    table.add_row("client CPU a row", f"{client_cpu / len(rows) * 1e6:.1f} µs")
    if server_cpu is not None and server_settled is not None:
        table.add_row("server CPU a row, storing", f"{server_cpu / len(rows) * 1e6:.1f} µs")
        table.add_row(f"  with the next {MERGE_SETTLE_SECONDS:.0f} s (merges)",
                      f"{server_settled / len(rows) * 1e6:.1f} µs")
    else:
        table.add_row("server CPU a row", "not measured (not the local server)")
    console.print(table)
    return 0 if stored == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
