"""Ingest at the end of a month runs as fast as at its start: one worker, empty table vs full;
and a full month on two shards beside one node (contract 9).

    .venv/bin/python -m benchmarks.month_end [--samples 60000] [--fill 30000000] [--rounds 3] [--warmup 10000]
                                             [--two-shards]

On the local services of `gpumeter up` (started if needed), two namespaces of their own
(topics, database, consumer group, one `gpumeter worker` each), removed afterwards
(``--keep`` keeps them for a look):
- empty: rated_usage holds only what the rounds add;
- full: first ``--fill`` rated rows of 2026-11 (the month of the samples), same tenants,
  random-looking event_ids, inserted server-side (INSERT ... SELECT FROM numbers(), no
  pipeline); a table the sink looks ids up in beside rated_usage is filled as the product
  fills it (a materialized view fills itself; a table the sink writes gets the same rows);
  then background merges are allowed to settle, as a month's parts would have.
After ``--warmup`` samples per table (not measured: at the end of a month the caches are
warm), each round publishes the same ``--samples`` new samples to both namespaces, one right after
the other in alternating order, so the shared machine's load falls on both alike; samples/s
= samples / (last row visible - first publish). The ratio is the median of the rounds'
full / empty (target >= 0.8). Each round also times the product's sink alone
(ClickHouseSink.store_rated on batches of ``sink_batch_size`` freshly rated rows) on both
tables: the dedup lookups plus the insert, without Kafka or rating around them.

``--two-shards`` adds a third namespace, ``full-2shards``: the same ``--fill`` rows on a local
two-shard cluster (testkit/clickhouse_cluster.py: two chserver processes of chdb's engine, tables
``_local`` + Distributed, migrated through the cluster's DDL path), with a worker of its own
that, as every client here, talks to shard 1. It gets the same rounds, and after the rounds
each full namespace times the month's ``invoice close`` (pricing.issue.close_month, every
tenant) beside a plain aggregate of the month (Σ unit-seconds and list cost per tenant and
line, no FINAL). Printed: two shards / one node for samples/s, the sink alone and the close.
Both shards run on this one machine, so the ratio shows the cost of the Distributed layer
(one more hop, GLOBAL IN, synchronous inserts), not the gain of a second machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import clickhouse_connect
from rich.console import Console
from rich.table import Table

from benchmarks.pipeline import stored, wait_stored
from benchmarks.result_file import write_results
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.app import schema
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import jsonio, topics
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import tenant_records
from gpumeter.core.settings import Settings, load_settings
from gpumeter.infra import clickhouse, kafka
from gpumeter.infra import schema as tables
from gpumeter.infra.rows import rated_row
from gpumeter.infra.tables import Topology
from pricing.issue import close_month
from streams.sink import ClickHouseSink, connector
from streams.stage import RatingStage, encode_rated
from testkit.clickhouse_cluster import TwoShards, two_shards

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "month-end-latest.json"
RESULTS_SHARDS = RESULTS.with_name("month-end-two-shards-latest.json")
FILL_CLUSTER = "month-end-fill"  # marks the generated rows
SAMPLES_START = datetime(2026, 11, 20, tzinfo=UTC)  # the generated rows fill 2026-11-01 .. 11-20
CHUNK = 2_000_000

# Rated rows of 2026-11 generated server-side (one-minute windows spread evenly over the 27,360
# minutes of 2026-11-01 .. 11-20), contract-3 arithmetic in SQL on the 2026-11 card
# (one-minute windows: unit_seconds = quantity x 60). Ids look like the fleet's: kind, '-',
# 32 hex digits of a hash, so they scatter over any index keyed by event_id as real ids do.
FILL = """
INSERT INTO rated_usage (event_id, tenant, period, kind, cluster, node, namespace, pod, pod_uid,
    window_start, window_end, quantity, unit_seconds, gpu_model, mig_profile, capacity_type, priority,
    rate_card, currency, unit_price, capacity_multiplier, list_cost, utilization, energy_joules, labels,
    source_partition, source_offset)
SELECT
    concat(kind, '-', lower(hex(sipHash128(n, 'month-end')))) AS event_id,
    {tenants}[1 + n % length({tenants})] AS tenant,
    '2026-11' AS period,
    ['gpu', 'gpu', 'cpu', 'memory', 'storage'][1 + intDiv(n, 7) % 5] AS kind,
    '{cluster}' AS cluster, concat('node-', toString(n % 1250)) AS node, tenant AS namespace,
    concat('pod-', toString(n % 20011)) AS pod, concat('uid-', toString(n % 20011)) AS pod_uid,
    toDateTime64('2026-11-01 00:00:00', 6, 'UTC') + toIntervalMinute(intDiv(n * 27360, {total}))
        AS window_start,
    window_start + toIntervalSecond(60) AS window_end,
    toDecimal128(1 + n % 8, 12) AS quantity,
    toDecimal128(quantity * 60, 21) AS unit_seconds,
    if(kind = 'gpu', ['H100-SXM-80GB', 'A100-SXM-40GB', 'L40S-48GB'][1 + n % 3], NULL) AS gpu_model,
    CAST(NULL, 'Nullable(String)') AS mig_profile,
    ['on-demand', 'on-demand', 'reserved', 'spot'][1 + intDiv(n, 11) % 4] AS capacity_type,
    0 AS priority, '2026-11' AS rate_card, 'USD' AS currency,
    multiIf(kind = 'cpu', toDecimal128('0.04', 12), kind = 'memory', toDecimal128('0.005', 12),
            kind = 'storage', toDecimal128('0.0002', 12),
            gpu_model = 'H100-SXM-80GB', toDecimal128('2.50', 12), toDecimal128('1.80', 12)) AS unit_price,
    multiIf(capacity_type = 'reserved', toDecimal128('0.6', 12),
            capacity_type = 'spot', toDecimal128('0.35', 12), toDecimal128('1', 12)) AS capacity_multiplier,
    toDecimal128(quantity * unit_price * capacity_multiplier / 60, 18) AS list_cost,
    NULL, NULL, map(), -1, toInt64(n)
FROM (SELECT number + {offset} AS n FROM numbers({count}))
"""


def fleet_samples(count: int) -> list[dict[str, Any]]:
    fleet = SimulatedFleet(FleetConfig(seed=17, window_seconds=60, start=SAMPLES_START,
                                       nodes={"H100-SXM-80GB": 40, "A100-SXM-40GB": 12, "L40S-48GB": 12}))
    samples: list[dict[str, Any]] = []
    while len(samples) < count:
        samples.extend(fleet.step_dicts())
    return samples[:count]


def publish(settings: Settings, samples: list[dict[str, Any]]) -> None:
    """As node agents do: one record per tenant of up to the batcher's size."""
    producer = kafka.make_producer(settings.kafka)
    topic = settings.kafka.topic(topics.SAMPLES)
    for key, record in tenant_records(samples):
        producer.send(topic, key=key, value=record)
    producer.flush()
    producer.close()


def pipeline_round(settings: Settings, client: Any, samples: list[dict[str, Any]]) -> float:
    """Samples per second through the running worker, publish to visible."""
    target = stored(client) + len(samples)
    first = time.time()
    publish(settings, samples)
    return len(samples) / (wait_stored(client, target, 1800) - first)


def sink_batches(settings: Settings, samples: list[dict[str, Any]], offset: int) -> list[float]:
    """Seconds per store_rated call of the product's sink, one call per sink batch."""
    stage = RatingStage(load_rate_cards(settings.rate_cards), "month-end")
    rows = []
    for index, sample in enumerate(samples):
        outcome = stage.process(jsonio.dumpb(sample), 0, offset + index)
        assert outcome.rated is not None, outcome.dead
        rows.append(rated_row(outcome.rated, encode_rated(outcome.rated)))  # as the worker sends them
    size = settings.worker.sink_batch_size
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    spent = []
    try:
        for start in range(0, len(rows), size):
            began = time.perf_counter()
            sink.store_rated(rows[start:start + size])
            spent.append(time.perf_counter() - began)
    finally:
        sink.close()
    return spent


def view_targets(client: Any) -> set[str]:
    """Tables a materialized view on rated_usage writes to (filled by the INSERT itself)."""
    views = client.query(
        "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
        "AND engine = 'MaterializedView'").result_rows
    database = client.database
    targets = set()
    for (query,) in views:
        text = str(query)
        if f"FROM {database}.rated_usage" in text and " TO " in text:
            targets.add(text.split(" TO ", 1)[1].split()[0].split(".")[-1].strip("`"))
    return targets


def patient_client(dsn: str) -> Any:
    """A client that waits for long server-side statements (the product's gives up after 60 s)."""
    target = clickhouse.parse_dsn(dsn)
    return clickhouse_connect.get_client(host=target.host, port=target.port, username=target.username,
                                         password=target.password, database=target.database,
                                         secure=target.scheme == "https", send_receive_timeout=3600,
                                         settings=dict(clickhouse.SESSION_SETTINGS))


def fill(client: Any, rows: int, tenants: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    names = "[" + ", ".join(f"'{t}'" for t in tenants) + "]"
    for offset in range(0, rows, CHUNK):
        client.command(FILL.format(tenants=names, cluster=FILL_CLUSTER, total=rows, offset=offset,
                                   count=min(CHUNK, rows - offset)),
                       settings={"max_insert_threads": 2, "max_execution_time": 0})
    side = getattr(tables, "EVENT_IDS", None)
    filled_side = None
    if side is not None and side.name not in view_targets(client):
        # The sink writes this table itself: give it the generated rows as it would have.
        columns = ", ".join(side.insert_columns)
        for offset in range(0, rows, CHUNK):
            client.command(f"INSERT INTO {side.name} ({columns}) SELECT {columns} FROM rated_usage "
                           f"WHERE cluster = '{FILL_CLUSTER}' AND source_offset >= {offset} "
                           f"AND source_offset < {offset + CHUNK}", settings={"max_execution_time": 0})
        filled_side = side.name
        hashes = getattr(tables, "EVENT_ID_HASHES", None)
        if hashes is not None and hashes.name not in view_targets(client):
            # Since pipeline migration 13 the sink writes the claims' hashes too.
            client.command(f"INSERT INTO {hashes.name} (id_hash) SELECT id_hash FROM {side.name}",
                           settings={"max_execution_time": 0})
    generated = time.perf_counter() - started
    # Let background merges settle (bounded): a month of ingest would have merged its parts.
    deadline = time.time() + 900
    while time.time() < deadline and int(clickhouse.scalar(
            client, "SELECT count() FROM system.merges WHERE database = currentDatabase()")) > 0:
        time.sleep(2)
    disk = {str(table): (int(rows), int(size)) for table, rows, size in client.query(
        "SELECT table, sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = currentDatabase() "
        "AND active GROUP BY table").result_rows}
    parts = {str(table): int(count) for table, count in client.query(
        "SELECT table, count() FROM system.parts WHERE database = currentDatabase() AND active "
        "GROUP BY table").result_rows}
    return {"fill_seconds": generated, "settle_seconds": time.perf_counter() - started - generated,
            "side_table_filled_by_benchmark": filled_side, "active_parts": parts,
            # On this node only (on two shards: shard 1's part of the rows).
            "disk_bytes_per_row": {table: size / rows for table, (rows, size) in disk.items() if rows}}


@dataclass
class Side:
    """One namespace of the comparison: its own topics, database and worker."""

    level: str
    settings: Settings
    client: Any
    worker: WorkerProcess
    rounds: list[float] = field(default_factory=list)
    sink: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    sharded: bool = False


def open_side(base: Settings, level: str, tag: str, cluster: TwoShards | None = None) -> Side:
    settings, client = open_database(base, "month-end", level, tag, cluster)
    worker = WorkerProcess(settings, Path("/tmp") / f"gpumeter-month-end-{level}-{tag}.log", "warn")
    return Side(level, settings, client, worker, sharded=cluster is not None)


def open_database(base: Settings, benchmark: str, level: str, tag: str,
                  cluster: TwoShards | None = None) -> tuple[Settings, Any]:
    """Settings and a client for one side of a benchmark: its own topics and database, migrated
    (on ``cluster``: through its DDL path, then every client on shard 1)."""
    own_database = f"{benchmark}_{level}_{tag}".replace("-", "_")
    settings = services.namespaced(base, f"{benchmark}-{level}-{tag}.", own_database,
                                   f"gpumeter-{benchmark}-{level}")
    kafka.ensure_topics(settings.kafka)
    if cluster is not None:
        # DDL through the cluster's DDL path (ON CLUSTER); every other client talks to shard 1.
        database = clickhouse.parse_dsn(settings.clickhouse.dsn).database
        settings.clickhouse.cluster, settings.clickhouse.sharded = cluster.topology.cluster, True
        migrating = clickhouse.connect(f"{cluster.url}/{database}")
        try:
            schema.migrate(migrating, cluster.topology)
        finally:
            migrating.close()
        settings.clickhouse.dsn = f"{cluster.node_urls()[0]}/{database}"
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=cluster is None)
    if cluster is None:
        schema.migrate(client)
    return settings, client


PLAIN_AGGREGATE = (
    "SELECT tenant, kind, gpu_model, mig_profile, capacity_type, rate_card, sum(unit_seconds), "
    "sum(list_cost) FROM rated_usage WHERE period = '2026-11' "
    "GROUP BY tenant, kind, gpu_model, mig_profile, capacity_type, rate_card")


def close_times(side: Side, out: Path) -> dict[str, float]:
    """Seconds for the month's `invoice close` and for a plain aggregate of the same rows."""
    began = time.perf_counter()
    side.client.query(PLAIN_AGGREGATE, settings={"max_execution_time": 0})
    plain = time.perf_counter() - began
    began = time.perf_counter()
    issued = close_month(side.settings, "2026-11", "json", out)
    return {"close_s": time.perf_counter() - began, "plain_aggregate_s": plain, "invoices": len(issued)}


def report(results: dict[str, Any]) -> Table:
    size = results["sink_batch_size"]
    table = Table("measure", "value", title="gpumeter month-end benchmark (one worker per table)",
                  title_justify="left")
    for level in ("empty", "full"):
        rows, rate = results[f"rows_{level}"], results[f"pipeline_{level}_per_s"]
        each = ", ".join(f"{v:,.0f}" for v in results[f"rounds_{level}"])
        table.add_row(f"pipeline, {rows:,} rows in rated_usage", f"{rate:,.0f} samples/s  (rounds: {each})")
    table.add_row("  ratio full / empty, median of paired rounds (target >= 0.8)",
                  f"{results['ratio_full_vs_empty']:.3f}  (pairs: "
                  + ", ".join(f"{v:.2f}" for v in results["paired_ratios"]) + ")")
    for level in ("empty", "full"):
        table.add_row(f"sink alone, {size:,}-row batch, {level}",
                      f"{results[f'sink_{level}_batch_s'] * 1000:,.0f} ms")
    table.add_row("  sink time empty / full", f"{results['sink_ratio_full_vs_empty']:.3f}")
    table.add_row("fill (server-side) + settle",
                  f"{results['fill_seconds']:.0f} s + {results['settle_seconds']:.0f} s")
    table.add_row("active parts after fill", json.dumps(results["active_parts"]))
    per_row = results.get("disk_bytes_per_row", {})
    table.add_row("disk bytes per row after fill",
                  ", ".join(f"{name} {per_row[name]:.1f}" for name in sorted(per_row) if name in (
                      "rated_usage", "event_ids", "event_id_hashes")))
    if "pipeline_full-2shards_per_s" in results:
        rows, rate = results["rows_full-2shards"], results["pipeline_full-2shards_per_s"]
        table.add_row(f"pipeline, two shards, {rows:,} rows", f"{rate:,.0f} samples/s")
        table.add_row("  ratio two shards / one node (full), median of paired rounds",
                      f"{results['ratio_2shards_vs_one']:.3f}")
        table.add_row("  sink alone, two shards / one node (time)",
                      f"{results['sink_ratio_2shards_vs_one']:.3f}")
        for level in ("full", "full-2shards"):
            close = results[f"close_{level}"]
            table.add_row(f"invoice close, {level} ({close['invoices']} invoices)",
                          f"{close['close_s']:.2f} s  (plain aggregate {close['plain_aggregate_s']:.2f} s, "
                          f"close / aggregate {close['close_s'] / close['plain_aggregate_s']:.1f})")
        table.add_row("  invoice close, two shards / one node (time)",
                      f"{results['close_ratio_2shards_vs_one']:.3f}")
    loads = [statistics.mean(results[f"load_{level}"]) for level in ("empty", "full")]
    table.add_row("load average (1 min), empty / full rounds", f"{loads[0]:.1f} / {loads[1]:.1f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=60_000, help="samples per round")
    parser.add_argument("--fill", type=int, default=30_000_000, help="rows of the month, server-side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10_000,
                        help="samples per table before the rounds, not measured (caches, first merges)")
    parser.add_argument("--sink-batches", type=int, default=2, help="sink-only batches per round and table")
    parser.add_argument("--keep", action="store_true", help="keep the namespaces afterwards")
    parser.add_argument("--two-shards", action="store_true",
                        help="also a full month on a local two-shard cluster, and the invoice close times")
    args = parser.parse_args(argv)

    base = load_settings()
    with console.status("starting local services..."):
        services.up(base)
    tag = uuid.uuid4().hex[:8]
    per_round, sink_size = args.samples, base.worker.sink_batch_size
    sink_count = args.sink_batches * sink_size
    samples = fleet_samples(args.warmup + args.rounds * (per_round + sink_count))
    warmup, rest = samples[:args.warmup], samples[args.warmup:]
    rounds = [rest[i * per_round:(i + 1) * per_round] for i in range(args.rounds)]
    sink_rest = rest[args.rounds * per_round:]
    sink_sets = [sink_rest[i * sink_count:(i + 1) * sink_count] for i in range(args.rounds)]
    results: dict[str, Any] = {"samples_per_round": per_round, "rounds": args.rounds, "fill_rows": args.fill,
                               "sink_batch_size": sink_size, "started_at": datetime.now(UTC).isoformat()}
    sides: list[Side] = []
    with contextlib.ExitStack() as stack:
        cluster = None
        if args.two_shards:
            home = Path(tempfile.mkdtemp(prefix="gpumeter-month-end-shards-"))
            stack.callback(shutil.rmtree, home, True)
            with console.status("starting two local shards..."):
                cluster = stack.enter_context(
                    two_shards(home, [(free_port(), free_port()) for _ in range(2)]))
        run(args, base, tag, samples, warmup, rounds, sink_sets, results, sides, cluster)
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(args: argparse.Namespace, base: Settings, tag: str, samples: list[dict[str, Any]],
        warmup: list[dict[str, Any]], rounds: list[list[dict[str, Any]]],
        sink_sets: list[list[dict[str, Any]]], results: dict[str, Any], sides: list[Side],
        cluster: TwoShards | None) -> None:
    per_round = args.samples
    try:
        sides += [open_side(base, "empty", tag), open_side(base, "full", tag)]
        if cluster is not None:
            sides.append(open_side(base, "full-2shards", tag, cluster))
        for full in sides[1:]:
            with console.status(f"filling {args.fill:,} rows of 2026-11 server-side ({full.level})..."):
                patient = patient_client(full.settings.clickhouse.dsn)
                try:
                    filled = fill(patient, args.fill, sorted({s["tenant"] for s in samples}))
                finally:
                    patient.close()
            suffix = "" if full.level == "full" else f"_{full.level}"
            results.update({f"{key}{suffix}": value for key, value in filled.items()})
        with console.status("starting the workers, warming up..."):
            for side in sides:
                side.worker.start()
                target = stored(side.client) + len(warmup)
                publish(side.settings, warmup)
                wait_stored(side.client, target, 600)
        for number in range(args.rounds):
            # Both tables get the same samples, one right after the other, in alternating
            # order: the shared machine's load falls on both alike.
            for side in sides if number % 2 == 0 else sides[::-1]:
                with console.status(f"round {number + 1}, {side.level} table: {per_round:,} samples..."):
                    side.rounds.append(pipeline_round(side.settings, side.client, rounds[number]))
                    side.loads.append(os.getloadavg()[0])
                with console.status(f"round {number + 1}, {side.level} table: the sink alone..."):
                    offset = 10_000_000 * (1 + number)  # source offsets no worker uses
                    side.sink.extend(sink_batches(side.settings, sink_sets[number], offset))
        for side in sides:
            results[f"rows_{side.level}"] = stored(side.client)
        if cluster is not None:
            for side in sides[1:]:
                with console.status(f"invoice close of 2026-11, {side.level}..."):
                    out = Path(tempfile.mkdtemp(prefix=f"gpumeter-month-end-close-{side.level}-"))
                    results[f"close_{side.level}"] = close_times(side, out)
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        for side in sides:
            side.worker.stop()
            side.client.close()
            if not args.keep and not side.sharded:  # the two shards go with their directory
                services.drop_namespace(side.settings)

    for side in sides:
        results[f"rounds_{side.level}"] = side.rounds
        results[f"pipeline_{side.level}_per_s"] = statistics.median(side.rounds)
        results[f"sink_{side.level}_batches"] = side.sink
        results[f"sink_{side.level}_batch_s"] = statistics.median(side.sink)
        results[f"load_{side.level}"] = side.loads
    results["paired_ratios"] = [f / e for e, f in zip(sides[0].rounds, sides[1].rounds, strict=True)]
    results["ratio_full_vs_empty"] = statistics.median(results["paired_ratios"])
    results["sink_ratio_full_vs_empty"] = results["sink_empty_batch_s"] / results["sink_full_batch_s"]
    if cluster is not None:
        results["paired_ratios_2shards_vs_one"] = [
            s / f for f, s in zip(sides[1].rounds, sides[2].rounds, strict=True)]
        results["ratio_2shards_vs_one"] = statistics.median(results["paired_ratios_2shards_vs_one"])
        results["sink_ratio_2shards_vs_one"] = (results["sink_full-2shards_batch_s"]
                                                / results["sink_full_batch_s"])
        results["close_ratio_2shards_vs_one"] = (results["close_full-2shards"]["close_s"]
                                                 / results["close_full"]["close_s"])
    console.print(report(results))
    write_results(RESULTS if cluster is None else RESULTS_SHARDS, results)


if __name__ == "__main__":
    sys.exit(main())
