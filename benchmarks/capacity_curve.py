"""The month at fleet scale (issue 29 point 7): the cost curve of ingest, the sink's id lookup,
`invoice close`, the dashboards and disk as one month's rated rows grow, on one node and on
two shards.

    .venv/bin/python -m benchmarks.capacity_curve [--sizes 30000000,100000000,300000000]
        [--samples 30000] [--rounds 3] [--warmup 5000] [--sink-batches 1] [--min-free-gb 15]
        [--two-shards-at 100000000]

On the local services of `gpumeter up` (started if needed), two namespaces of their own (topics,
database, consumer group, one `gpumeter worker` each), dropped afterwards:
- empty: rated_usage holds only what the rounds add (the baseline of every ratio below);
- curve: one database grown server-side (INSERT ... SELECT FROM numbers(), no pipeline) to each
  of ``--sizes`` in turn. The rows are a 10,000-GPU fleet's month from its first second, as the
  sink would have stored them: 1,500 samples/s (``benchmarks/fleet_realtime.py``), so 22,500
  rated rows per 15 s window; 7,500 pods on 1,250 nodes of 8 GPUs (10,000 GPUs held), each pod
  one gpu, cpu and memory row per window; 1,000 tenants; event_ids gets each row's claim and
  event_id_hashes its hash, the rollup view fills usage_hourly; inserted_at is the window's end
  + 20 s, as a worker keeping up would have stored it. 300 million rows are the
  month's first 55.6 hours; the month is ~3.9 billion.

At each size, after background merges settle (bounded by ``--settle``):
- ingest: ``--rounds`` rounds, each publishing the same ``--samples`` fresh samples to both
  namespaces, in alternating order; samples/s = samples / (last row visible - first publish);
  the ratio is the median of the rounds' curve / empty (goal >= 0.8 at the largest size);
- the sink alone on ``--sink-batches`` batches of ``worker.sink_batch_size`` fresh rows: the id
  lookup (ClickHouseSink._first_claims, the per-batch probe of event_id_hashes/event_ids) and the
  whole store_rated, ms per batch, curve and empty;
- `invoice close` of 2026-11 (pricing.issue.close_month: every tenant, JSON files), the ledger
  emptied first so every size measures a first close, against a plain aggregate of the same rows
  (no FINAL) and the close's own FINAL aggregate alone (goal: close <= 1.5 x the plain aggregate);
- every panel of every dashboard (dashboards/panels.py), expanded as Grafana and the plugin expand
  it (tests/support/grafana_macros.py) over the board's default range ending at the last filled
  row, "All" tenants: the time of each and the heaviest;
- disk: bytes on disk per row of each table (system.parts, active parts, this node).

``--merge-ids`` (one node): before each size's measurements, ``event_id_hashes`` and ``event_ids``
are merged into one part each (``OPTIMIZE ... FINAL``), so the sink's id probes run at the
floor of every merge policy; results to capacity-curve-ids-merged-latest.json.

``--two-shards-at N`` then drops the one-node database and grows a database on a local two-shard
cluster (testkit/clickhouse_cluster.py, both shards on this machine) to N rows, and measures the
same there. Growth stops before a size whose rows would leave less than ``--min-free-gb`` free.
Results are written after every size (benchmarks/results/capacity-curve-latest.json;
``--skip-one-node`` runs to capacity-curve-two-shards-latest.json).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.month_end import PLAIN_AGGREGATE, free_port, open_database, patient_client, publish
from benchmarks.pipeline import stored, wait_stored
from benchmarks.result_file import write_results
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from dashboards.panels import DASHBOARDS
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import jsonio
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.settings import Settings, load_settings
from gpumeter.infra import clickhouse
from gpumeter.infra.rows import rated_row
from gpumeter.infra.schema import EVENT_ID_HASHES, EVENT_IDS
from gpumeter.infra.tables import Topology
from pricing import store
from pricing.issue import close_month
from streams.sink import ClickHouseSink, connector
from streams.stage import RatingStage, encode_rated
from testkit.clickhouse_cluster import TwoShards, two_shards
from tests.support.grafana_macros import ALL, Request, Variable, expand

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "capacity-curve-latest.json"
RESULTS_SHARDS = RESULTS.with_name("capacity-curve-two-shards-latest.json")  # --skip-one-node runs
RESULTS_IDS_MERGED = RESULTS.with_name("capacity-curve-ids-merged-latest.json")  # --merge-ids runs
MONTH_START = datetime(2026, 11, 1, tzinfo=UTC)
SAMPLES_START = datetime(2026, 11, 20, tzinfo=UTC)  # the rounds' samples: after the filled hours
WINDOW_S = 15
PER_WINDOW = 22_500  # 1,500 samples/s x 15 s
TENANTS = 1_000
CHUNK = 4_000_000
FILL_CLUSTER = "capacity-fill"
BYTES_PER_ROW_GUESS = 130  # before the first measurement; ~110 measured at 10 M rows (month_end)

# One rated row per number n, as the sink stores a 10,000-GPU fleet's samples: window n / 22,500,
# slot n % 22,500 -> pod slot / 3 (7,500 pods, node pod % 1,250, tenant pod % 1,000), kind slot % 3.
# Contract-3 arithmetic on the 2026-11 card in SQL: unit_seconds = quantity x 15; list cost =
# unit-hours x unit price x capacity multiplier (scale 36 before the division: products < 100 fit).
GENERATOR = """
SELECT
    concat(kind, '-', lower(hex(sipHash128(n, 'capacity')))) AS event_id,
    concat('tenant-', leftPad(toString(pod % {tenants}), 4, '0')) AS tenant,
    '2026-11' AS period,
    ['gpu', 'cpu', 'memory'][1 + slot % 3] AS kind,
    '{cluster}' AS cluster, concat('node-', leftPad(toString(pod % 1250), 4, '0')) AS node,
    tenant AS namespace, concat('pod-', toString(pod)) AS pod_name, concat('uid-', toString(pod)) AS pod_uid,
    toDateTime64('2026-11-01 00:00:00', 6, 'UTC') + toIntervalSecond({window} * intDiv(n, {per_window}))
        AS window_start,
    window_start + toIntervalSecond({window}) AS window_end,
    toDecimal128(multiIf(kind = 'gpu', 1 + (pod % 3 = 0), kind = 'cpu', 1 + pod % 16, 4 * (1 + pod % 16)), 12)
        AS quantity,
    toDecimal128(quantity * {window}, 21) AS unit_seconds,
    if(kind = 'gpu', multiIf(pod % 1250 % 10 < 6, 'H100-SXM-80GB', pod % 1250 % 10 < 8, 'A100-SXM-40GB',
                             'L40S-48GB'), NULL) AS gpu_model,
    CAST(NULL, 'Nullable(String)') AS mig_profile,
    ['on-demand', 'on-demand', 'reserved', 'spot'][1 + pod % 4] AS capacity_type,
    0 AS priority, '2026-11' AS rate_card, 'USD' AS currency,
    multiIf(kind = 'cpu', toDecimal128('0.04', 12), kind = 'memory', toDecimal128('0.005', 12),
            gpu_model = 'H100-SXM-80GB', toDecimal128('2.50', 12), gpu_model = 'A100-SXM-40GB',
            toDecimal128('1.80', 12), toDecimal128('1.80', 12)) AS unit_price,
    multiIf(capacity_type = 'reserved', toDecimal128('0.6', 12),
            capacity_type = 'spot', toDecimal128('0.35', 12), toDecimal128('1', 12)) AS capacity_multiplier,
    toDecimal128(quantity * unit_price * capacity_multiplier * {window} / 3600, 18) AS list_cost,
    if(kind = 'gpu', toDecimal64(((pod * 37 + intDiv(n, {per_window})) % 101) / 100, 6), NULL) AS utilization,
    if(kind = 'gpu', toDecimal128(quantity * {window} * 350, 6), NULL) AS energy_joules,
    toInt32(n % 12) AS source_partition, toInt64(intDiv(n, 12)) AS source_offset
FROM (SELECT number + {offset} AS n, n % {per_window} AS slot, intDiv(slot, 3) AS pod FROM numbers({count}))
"""

RATED_FILL = """
INSERT INTO rated_usage (event_id, tenant, period, kind, cluster, node, namespace, pod, pod_uid,
    window_start, window_end, quantity, unit_seconds, gpu_model, mig_profile, capacity_type, priority,
    rate_card, currency, unit_price, capacity_multiplier, list_cost, utilization, energy_joules, labels,
    source_partition, source_offset, inserted_at)
SELECT event_id, tenant, period, kind, cluster, node, namespace, pod_name, pod_uid, window_start, window_end,
    quantity, unit_seconds, gpu_model, mig_profile, capacity_type, priority, rate_card, currency, unit_price,
    capacity_multiplier, list_cost, utilization, energy_joules, map(), source_partition, source_offset,
    toDateTime64(window_end + toIntervalSecond(20), 3, 'UTC')
FROM ({generator})
"""

CLAIM_FILL = "INSERT INTO event_ids ({columns}) SELECT {columns} FROM ({generator})"
# The claims' hashes, as the sink stores them beside its claims (pipeline migration 13).
HASH_FILL = "INSERT INTO event_id_hashes (id_hash) SELECT sipHash64(event_id) FROM ({generator})"


def generator(offset: int, count: int) -> str:
    return GENERATOR.format(tenants=TENANTS, cluster=FILL_CLUSTER, window=WINDOW_S, per_window=PER_WINDOW,
                            offset=offset, count=count)


def filled_until(rows: int) -> datetime:
    """The end of the last window the first ``rows`` generated rows reach."""
    return MONTH_START + timedelta(seconds=WINDOW_S * -(-rows // PER_WINDOW))


def free_gb() -> float:
    return shutil.disk_usage("/").free / 1e9


@dataclass
class Namespace:
    level: str
    settings: Settings
    client: Any
    worker: WorkerProcess
    node_urls: list[str] = field(default_factory=list)  # each shard's server, on two shards
    rows: int = 0  # generated rows so far
    rounds: list[float] = field(default_factory=list)

    @property
    def sharded(self) -> bool:
        return bool(self.node_urls)


def open_namespace(base: Settings, level: str, tag: str, cluster: TwoShards | None = None) -> Namespace:
    settings, client = open_database(base, "capacity", level, tag, cluster)
    worker = WorkerProcess(settings, Path("/tmp") / f"gpumeter-capacity-{level}-{tag}.log", "warn")
    return Namespace(level, settings, client, worker,
                     node_urls=cluster.node_urls() if cluster is not None else [])


def disk_per_row(client: Any) -> dict[str, dict[str, float]]:
    parts = client.query(
        "SELECT table, sum(rows), sum(bytes_on_disk), count() FROM system.parts "
        "WHERE database = currentDatabase() AND active GROUP BY table").result_rows
    return {str(t): {"rows": int(r), "bytes": int(b), "parts": int(c), "bytes_per_row": int(b) / int(r)}
            for t, r, b, c in parts if int(r)}


STOP_FILE = Path("/tmp/gpumeter-capacity-stop")  # created by hand: measure at the rows reached, then stop


def grow(ns: Namespace, target: int, min_free_gb: float, bytes_per_row: float) -> bool:
    """Grow the namespace's month to ``target`` generated rows; False when the disk would not allow it.
    Stops early (True, fewer rows) when STOP_FILE exists: the time box ends before the size."""
    needed = (target - ns.rows) * bytes_per_row / 1e9
    if free_gb() - needed < min_free_gb:
        console.print(f"[yellow]not growing {ns.level} to {target:,}: {needed:.1f} GB more would leave "
                      f"{free_gb() - needed:.1f} GB free (< {min_free_gb} GB)")
        return False
    client = patient_client(ns.settings.clickhouse.dsn)
    columns = ", ".join(c for c in EVENT_IDS.insert_columns if c != "id_hash" and c != "recorded_at")
    try:
        while ns.rows < target:
            count = min(CHUNK, target - ns.rows)
            text = generator(ns.rows, count)
            settings = {"max_insert_threads": 2, "max_execution_time": 0}
            client.command(RATED_FILL.format(generator=text), settings=settings)
            client.command(HASH_FILL.format(generator=text), settings=settings)
            client.command(CLAIM_FILL.format(columns=columns, generator=text), settings=settings)
            ns.rows += count
            console.log(f"{ns.level}: {ns.rows:,} rows generated, {free_gb():.1f} GB free, "
                        f"load {os.getloadavg()[0]:.1f}")
            if free_gb() < min_free_gb:
                console.print(f"[red]stopping the fill: {free_gb():.1f} GB free")
                return False
            if STOP_FILE.exists():
                console.print(f"[yellow]{STOP_FILE} exists: measuring at {ns.rows:,} rows, then stopping")
                return True
    finally:
        client.close()
    return True


def settle(client: Any, limit_s: float) -> float:
    """Wait (bounded) for background merges: a month of ingest would have merged its parts."""
    began = time.time()
    while time.time() - began < limit_s and int(clickhouse.scalar(
            client, "SELECT count() FROM system.merges WHERE database = currentDatabase()")) > 0:
        time.sleep(3)
    return time.time() - began


def fleet_samples(count: int) -> list[dict[str, Any]]:
    fleet = SimulatedFleet(FleetConfig(seed=29, window_seconds=WINDOW_S, start=SAMPLES_START,
                                       nodes={"H100-SXM-80GB": 40, "A100-SXM-40GB": 12, "L40S-48GB": 12}))
    samples: list[dict[str, Any]] = []
    while len(samples) < count:
        samples.extend(fleet.step_dicts())
    return samples[:count]


def pipeline_round(ns: Namespace, samples: list[dict[str, Any]]) -> float:
    target = stored(ns.client) + len(samples)
    first = time.time()
    publish(ns.settings, samples)
    return len(samples) / (wait_stored(ns.client, target, 1800) - first)


def sink_alone(ns: Namespace, samples: list[dict[str, Any]], offset: int) -> dict[str, list[float]]:
    """Per sink batch of fresh rows: the id lookup alone, then the whole store_rated (ms)."""
    stage = RatingStage(load_rate_cards(ns.settings.rate_cards), "capacity")
    rows = []
    for index, sample in enumerate(samples):
        outcome = stage.process(jsonio.dumpb(sample), 0, offset + index)
        assert outcome.rated is not None, outcome.dead
        rows.append(rated_row(outcome.rated, encode_rated(outcome.rated)))
    size = ns.settings.worker.sink_batch_size
    sink = ClickHouseSink(connector(ns.settings.clickhouse.dsn), Topology.of(ns.settings.clickhouse))
    lookup, whole = [], []
    try:
        for start in range(0, len(rows), size):
            batch = rows[start:start + size]
            client = sink._client_or_connect()
            began = time.perf_counter()
            sink._first_claims(client, [row[0] for row in batch])  # the product's per-batch probe
            lookup.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            sink.store_rated(batch)
            whole.append((time.perf_counter() - began) * 1000)
    finally:
        sink.close()
    return {"lookup_ms": lookup, "store_ms": whole}


def timed_query(client: Any, sql: str) -> float:
    began = time.perf_counter()
    client.query(sql, settings={"max_execution_time": 0})
    return time.perf_counter() - began


def close_times(ns: Namespace) -> dict[str, Any]:
    """`invoice close` of 2026-11 (a first close: the ledger emptied), beside a plain aggregate of
    the same rows and the close's own FINAL aggregate alone."""
    patient = patient_client(ns.settings.clickhouse.dsn)
    try:
        if not ns.sharded:
            for table in ("invoice_ledger", "invoices"):
                patient.command(f"TRUNCATE TABLE IF EXISTS {table}")
        plain = timed_query(patient, PLAIN_AGGREGATE)
        began = time.perf_counter()
        store.usage_lines_by_tenant(patient, "2026-11")
        final = time.perf_counter() - began
    finally:
        patient.close()
    out = Path(tempfile.mkdtemp(prefix="gpumeter-capacity-close-"))
    result: dict[str, Any] = {"plain_aggregate_s": plain, "final_aggregate_s": final}
    began = time.perf_counter()
    try:
        result["invoices"] = len(close_month(ns.settings, "2026-11", "json", out))
        result["close_s"] = time.perf_counter() - began
        result["close_vs_plain"] = result["close_s"] / plain
    except Exception as exc:  # the product's client gives up after 60 s: a finding, not a crash
        result["close_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        result["close_failed_after_s"] = time.perf_counter() - began
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return result


SPAN = re.compile(r"now-(\d+)([mhd])")
UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str) -> int:
    match = re.fullmatch(r"(\d+)([smhd])", text)
    return int(match.group(1)) * UNIT[match.group(2)] if match else 0


def panel_times(ns: Namespace, end: datetime) -> dict[str, float]:
    """Seconds of every panel's SQL, over its board's default range ending at ``end``."""
    tenants = [f"tenant-{i:04d}" for i in range(TENANTS)]
    patient = patient_client(ns.settings.clickhouse.dsn)
    times: dict[str, float] = {}
    try:
        for spec in DASHBOARDS:
            match = SPAN.fullmatch(spec.time_from)
            span = timedelta(days=30)
            if match:
                span = timedelta(seconds=int(match.group(1)) * UNIT[match.group(2)])
            variables = {v.name: Variable(current=[ALL] if v.include_all else [tenants[1]], options=tenants,
                                          multi=v.multi) for v in spec.variables}
            for panel in spec.panels():
                if "$__timeFilter(inserted_at)" in panel.sql:
                    now = datetime.now(UTC)  # panels on insertion time look at the wall clock
                    start, stop = now - span, now
                else:
                    start, stop = end - span, end
                interval = max(int(span.total_seconds()) // 1000, _seconds(panel.min_interval or ""), 1)
                sql = expand(panel.sql, Request(start, stop, timedelta(seconds=interval), variables))
                try:
                    times[f"{spec.uid} / {panel.title}"] = timed_query(patient, sql)
                except Exception as exc:
                    console.print(f"[red]{spec.uid} / {panel.title}: {str(exc).splitlines()[0][:200]}")
    finally:
        patient.close()
    return times


def measure(ns: Namespace, empty: Namespace, rounds: list[list[dict[str, Any]]],
            sink_sets: list[list[dict[str, Any]]], sink_offset: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rows_generated": ns.rows, "rows_stored": stored(ns.client),
                           "load_before": list(os.getloadavg())}
    pairs, curve_rates, empty_rates, loads = [], [], [], []
    for number, samples in enumerate(rounds):
        rates = {}
        for side in (empty, ns) if number % 2 == 0 else (ns, empty):
            with console.status(f"{ns.rows:,} rows: round {number + 1}, {side.level}..."):
                rates[side.level] = pipeline_round(side, samples)
        loads.append(os.getloadavg()[0])
        curve_rates.append(rates[ns.level])
        empty_rates.append(rates[empty.level])
        pairs.append(rates[ns.level] / rates[empty.level])
    out.update({"ingest_per_s": curve_rates, "ingest_empty_per_s": empty_rates, "ingest_ratios": pairs,
                "ingest_ratio": statistics.median(pairs), "load_rounds": loads})
    for side in (ns, empty):
        with console.status(f"{ns.rows:,} rows: the sink alone, {side.level}..."):
            timings = [sink_alone(side, part, sink_offset + 1_000_000 * i)
                       for i, part in enumerate(sink_sets)]
        key = "sink" if side is ns else "sink_empty"
        out[f"{key}_lookup_ms"] = [v for t in timings for v in t["lookup_ms"]]
        out[f"{key}_store_ms"] = [v for t in timings for v in t["store_ms"]]
    with console.status(f"{ns.rows:,} rows: invoice close of 2026-11..."):
        out["close"] = close_times(ns)
    with console.status(f"{ns.rows:,} rows: every dashboard panel..."):
        panels = panel_times(ns, filled_until(ns.rows))
    heaviest = max(panels, key=lambda k: panels[k]) if panels else None
    out.update({"panels_s": panels, "heaviest_panel": heaviest,
                "heaviest_panel_s": panels[heaviest] if heaviest else None})
    # Every day of a closed month as the engine leaves it an hour after the day's last
    # insert (rated_usage's min_age_to_force_merge): one part a day. The fill's rows all fall
    # on the month's first day(s), so the close above read them as the month's last day is
    # read at its end (several parts, merged by FINAL); this is the other 29 days.
    with console.status(f"{ns.rows:,} rows: each day merged into one part, as a closed month's are..."):
        out["force_merge_s"] = force_merge(ns)
        out["close_closed_days"] = close_times(ns)
    out["disk"] = disk_per_row(ns.client)
    out["load_after"] = list(os.getloadavg())
    return out


def force_merge(ns: Namespace) -> float:
    """What min_age_to_force_merge does to each day an hour after its last insert, done now."""
    return optimize_final(ns, "rated_usage")


def merge_ids(ns: Namespace) -> float:
    """Each id table merged into one part: the sink's probes at the floor of every merge policy."""
    return optimize_final(ns, EVENT_ID_HASHES.name, EVENT_IDS.name)


def optimize_final(ns: Namespace, *tables: str) -> float:
    """``OPTIMIZE ... FINAL`` of ``tables`` (on two shards, each shard's local table in turn)."""
    database = clickhouse.parse_dsn(ns.settings.clickhouse.dsn).database
    targets = ([(f"{url}/{database}", f"{table}_local") for table in tables for url in ns.node_urls]
               if ns.sharded else [(ns.settings.clickhouse.dsn, table) for table in tables])
    seconds = 0.0
    for dsn, table in targets:
        patient = patient_client(dsn)
        try:
            seconds += timed_query(patient, f"OPTIMIZE TABLE {table} FINAL")
        finally:
            patient.close()
    return seconds


def summary(level: str, m: dict[str, Any]) -> Table:
    title = f"capacity curve: {level}, {m['rows_generated']:,} rows of 2026-11"
    table = Table("measure", "value", title=title, title_justify="left")
    table.add_row("ingest samples/s, full / empty (rounds)",
                  ", ".join(f"{c:,.0f} / {e:,.0f}" for c, e in zip(m["ingest_per_s"], m["ingest_empty_per_s"],
                                                                    strict=True)))
    table.add_row("  ratio full / empty, median (goal >= 0.8)", f"{m['ingest_ratio']:.3f}")
    for key, name in (("sink", "full"), ("sink_empty", "empty")):
        table.add_row(f"id lookup / store_rated per batch, {name}",
                      f"{statistics.median(m[f'{key}_lookup_ms']):,.0f} ms / "
                      f"{statistics.median(m[f'{key}_store_ms']):,.0f} ms")
    close = m["close"]
    if "close_s" in close:
        table.add_row(f"invoice close ({close['invoices']} invoices)",
                      f"{close['close_s']:.2f} s; plain aggregate {close['plain_aggregate_s']:.2f} s, "
                      f"FINAL aggregate {close['final_aggregate_s']:.2f} s; "
                      f"close / plain {close['close_vs_plain']:.2f} (goal <= 1.5)")
    else:
        table.add_row("invoice close",
                      f"FAILED after {close['close_failed_after_s']:.0f} s: {close['close_error']}")
    closed = m.get("close_closed_days")
    if closed and "close_s" in closed:
        table.add_row(f"  each day in one part (merged in {m['force_merge_s']:.0f} s)",
                      f"{closed['close_s']:.2f} s; plain aggregate {closed['plain_aggregate_s']:.2f} s, "
                      f"FINAL aggregate {closed['final_aggregate_s']:.2f} s; "
                      f"close / plain {closed['close_vs_plain']:.2f} (goal <= 1.5)")
    if m["heaviest_panel"]:
        table.add_row("heaviest panel", f"{m['heaviest_panel']}: {m['heaviest_panel_s']:.2f} s")
    table.add_row("disk bytes per row", ", ".join(
        f"{t} {d['bytes_per_row']:.1f} ({d['parts']} parts)" for t, d in sorted(m["disk"].items())
        if d["rows"] > 1000))
    table.add_row("load (1 min) before / rounds / after",
                  f"{m['load_before'][0]:.1f} / {', '.join(f'{v:.1f}' for v in m['load_rounds'])} / "
                  f"{m['load_after'][0]:.1f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="30000000,100000000,300000000")
    parser.add_argument("--samples", type=int, default=30_000, help="samples per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--sink-batches", type=int, default=1, help="sink-alone batches per size and table")
    parser.add_argument("--settle", type=float, default=600, help="longest wait for merges per size (s)")
    parser.add_argument("--min-free-gb", type=float, default=15)
    parser.add_argument("--two-shards-at", type=int, default=0, help="rows on two shards (0: none)")
    parser.add_argument("--skip-one-node", action="store_true", help="only the two-shard measurement")
    parser.add_argument("--merge-ids", action="store_true",
                        help="one node: merge event_ids and event_id_hashes into one part each before "
                             "measuring (the id probes' floor); results to "
                             "capacity-curve-ids-merged-latest.json")
    args = parser.parse_args(argv)
    if args.merge_ids and (args.skip_one_node or args.two_shards_at):
        parser.error("--merge-ids measures one node only (no --skip-one-node, no --two-shards-at)")

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the clean-up below: workers, namespaces

    signal.signal(signal.SIGTERM, stop)
    sizes = [] if args.skip_one_node else [int(s) for s in args.sizes.split(",") if s]
    stages = len(sizes) + (1 if args.two_shards_at else 0)
    path = RESULTS_SHARDS if args.skip_one_node else RESULTS_IDS_MERGED if args.merge_ids else RESULTS

    base = load_settings()
    with console.status("starting local services..."):
        services.up(base)
    tag = uuid.uuid4().hex[:8]
    batch = base.worker.sink_batch_size
    per_stage = args.rounds * args.samples + args.sink_batches * batch
    with console.status("simulating the rounds' samples..."):
        samples = fleet_samples(args.warmup + stages * per_stage)
    warmup, rest = samples[:args.warmup], samples[args.warmup:]
    results: dict[str, Any] = {"sizes": sizes, "two_shards_at": args.two_shards_at, "samples_per_round":
                               args.samples, "rounds": args.rounds, "sink_batch_size": batch,
                               "fleet": {"samples_per_s": PER_WINDOW / WINDOW_S, "window_s": WINDOW_S,
                                         "tenants": TENANTS, "pods": PER_WINDOW // 3, "nodes": 1250,
                                         "gpus": 10_000},
                               "started_at": datetime.now(UTC).isoformat(), "one_node": {}, "two_shards": {}}

    def stage_samples(index: int) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
        chunk = rest[index * per_stage:(index + 1) * per_stage]
        rounds = [chunk[i * args.samples:(i + 1) * args.samples] for i in range(args.rounds)]
        sink = chunk[args.rounds * args.samples:]
        return rounds, [sink[i * batch:(i + 1) * batch] for i in range(args.sink_batches)]

    namespaces: list[Namespace] = []
    with contextlib.ExitStack() as stack:
        def cleanup() -> None:
            for ns in namespaces:
                with contextlib.suppress(Exception):
                    ns.worker.stop()
                    ns.client.close()
                if not ns.sharded:
                    with contextlib.suppress(Exception):
                        services.drop_namespace(ns.settings)
        stack.callback(cleanup)
        empty = open_namespace(base, "empty", tag)
        namespaces.append(empty)
        stage = 0

        def start(ns: Namespace) -> None:
            with console.status(f"starting the {ns.level} worker, warming up..."):
                ns.worker.start()
                target = stored(ns.client) + len(warmup)
                publish(ns.settings, warmup)
                wait_stored(ns.client, target, 600)

        start(empty)
        bytes_per_row = BYTES_PER_ROW_GUESS
        if sizes:
            curve = open_namespace(base, "curve", tag)
            namespaces.append(curve)
            start(curve)
            for size in sizes:
                began = time.perf_counter()
                if not grow(curve, size, args.min_free_gb, bytes_per_row):
                    results["one_node_stopped_before"] = size
                    break
                fill_s = time.perf_counter() - began
                settle_s = settle(curve.client, args.settle)
                ids_merged_s = None
                if args.merge_ids:
                    with console.status(f"{curve.rows:,} rows: the id tables merged into one part each..."):
                        ids_merged_s = merge_ids(curve)
                rounds, sink_sets = stage_samples(stage)
                measured = measure(curve, empty, rounds, sink_sets, 100_000_000 * (1 + stage))
                stage += 1
                measured.update({"fill_s": fill_s, "settle_s": settle_s, "ids_merged_s": ids_merged_s})
                disk = measured["disk"]
                bytes_per_row = sum(d["bytes"] for d in disk.values()) / curve.rows * 1.3  # merges' headroom
                results["one_node"][str(curve.rows)] = measured
                console.print(summary("one node", measured))
                write_results(path, results)
                if STOP_FILE.exists():
                    results["one_node_stopped_before"] = size
                    break
            curve.worker.stop()
            curve.client.close()
            services.drop_namespace(curve.settings)  # its disk, before the two shards take theirs
            namespaces.remove(curve)
        if args.two_shards_at:
            home = Path(tempfile.mkdtemp(prefix="gpumeter-capacity-shards-"))
            stack.callback(shutil.rmtree, home, True)
            with console.status("starting two local shards..."):
                ports = [(free_port(), free_port()) for _ in range(2)]
                cluster = stack.enter_context(two_shards(home, ports))
            sharded = open_namespace(base, "curve-2shards", tag, cluster)
            namespaces.append(sharded)
            start(sharded)
            began = time.perf_counter()
            if grow(sharded, args.two_shards_at, args.min_free_gb, bytes_per_row):
                fill_s = time.perf_counter() - began
                settle_s = max(settle(clickhouse.connect(url + "/" + clickhouse.parse_dsn(
                    sharded.settings.clickhouse.dsn).database, create_database=False), args.settle)
                    for url in cluster.node_urls())
                rounds, sink_sets = stage_samples(stage)
                measured = measure(sharded, empty, rounds, sink_sets, 100_000_000 * (1 + stage))
                measured.update({"fill_s": fill_s, "settle_s": settle_s})
                results["two_shards"][str(args.two_shards_at)] = measured
                console.print(summary("two shards", measured))
            else:
                results["two_shards_stopped_before"] = args.two_shards_at
    results["finished_at"] = datetime.now(UTC).isoformat()
    write_results(path, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
