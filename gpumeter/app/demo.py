"""`gpumeter demo`: the whole pipeline on a simulated fleet, with live progress and invoices.

The fleet is governed as a cluster would be (gpumeter/app/enforcement.py): its scheduler asks
the real extender before it places a pod and the real actuator evicts from it, so the report
shows quotas enforced (crossings, refusals, evictions), not only metered.

Each run starts clean in its own namespace (topic prefix ``demo.``, database ``demo``) on
the local services, so a second run shows the same story instead of deduplicating it away.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from gpumeter.app import schema
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from gpumeter.infra.clickhouse import to_decimal

DEMO_PREFIX = "demo."
DEMO_DATABASE = "demo"
MAX_IN_FLIGHT = 30_000  # published but not yet stored: the fleet waits beyond this
# A malformed sample and a duplicate every this many windows: dead letters and dedup at work.
BAD_INPUT_EVERY = 25
WINDOW_SECONDS = 600  # the fleet's window
# Pacing for enforcement: the fleet steps on only while the rated samples stored reach within
# this many windows of its clock (the quota stage reads the same rated topic as the sink).
LAG_WINDOWS = 18
# The stated pipeline lag, in windows: LAG_WINDOWS, one for the quota stage to emit after the
# sink stored, one for the eviction's countdown to see the next window's clock (enforcement.py
# holds the fleet until the extender has read each event and the actuator has handled it).
STATED_LAG_WINDOWS = LAG_WINDOWS + 2
# Pods that hold GPUs and compute nothing (a forgotten notebook, a stuck job): the idle-GPU
# advice has something to find. (tenant, model, GPUs); they run for the whole demo.
IDLE_PODS: tuple[tuple[str, str, int], ...] = (
    ("research", "L40S-48GB", 1), ("research", "A100-SXM-40GB", 2), ("team-a", "L4-24GB", 1))


@dataclass
class DemoStats:
    published: int = 0
    injected_bad: int = 0
    injected_duplicates: int = 0
    stored: int = 0
    dead: int = 0
    fleet_clock: datetime | None = None
    spend: dict[str, Decimal] = field(default_factory=dict)
    fleet_events: dict[str, int] = field(default_factory=dict)  # the simulated fleet's realism events
    enforcement: dict[str, Any] = field(default_factory=dict)  # refusals, notices, evictions


def progress_view(stats: DemoStats, started: float, stage: str) -> Group:
    elapsed = time.monotonic() - started
    head = Table.grid(padding=(0, 2))
    head.add_row("stage", f"[bold]{stage}")
    head.add_row("wall time", f"{elapsed:6.1f} s")
    clock = stats.fleet_clock.strftime("%Y-%m-%d %H:%M UTC") if stats.fleet_clock else "-"
    head.add_row("fleet clock", clock)
    head.add_row("samples published", f"{stats.published:,}")
    rate = stats.stored / max(elapsed, 1e-9)
    head.add_row("rated and stored", f"{stats.stored:,}  ({rate:,.0f}/s)")
    head.add_row("dead letters", f"{stats.dead:,}")
    spend = Table("tenant", "list spend (USD)", title="real-time spend", title_justify="left")
    for tenant, amount in sorted(stats.spend.items()):
        spend.add_row(tenant, f"{amount:,.2f}")
    return Group(Panel(head, title="gpumeter demo"), spend)


def poll(client: Any, stats: DemoStats) -> None:
    stats.stored = int(clickhouse.scalar(client, "SELECT count() FROM rated_usage"))
    stats.dead = int(clickhouse.scalar(client, "SELECT count() FROM dead_letters FINAL"))
    rows = client.query("SELECT tenant, sum(list_cost) FROM usage_hourly GROUP BY tenant").result_rows
    stats.spend = {str(tenant): to_decimal(cost) for tenant, cost in rows}


def stored_until(client: Any) -> datetime | None:
    """The end of the latest window with rated samples stored (None before any)."""
    value = clickhouse.scalar(client, "SELECT max(window_end) FROM rated_usage WHERE window_end > 0")
    if not isinstance(value, datetime) or value.year < 2000:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def submit_idle_pods(fleet: Any) -> None:
    for tenant, model, gpus in IDLE_PODS:
        fleet.submit(tenant, model=model, gpus=gpus, duration_seconds=90 * 86_400, idle=True)


def run_demo(settings: Settings, wall_seconds: float, out_dir: Path) -> int:
    from collectors.sim.fleet import FleetConfig, SimulatedFleet
    from collectors.sim.runner import FleetPublisher
    from gpumeter.app.drain import drain
    from gpumeter.app.enforcement import DemoEnforcement
    from gpumeter.app.runtime import services
    from gpumeter.app.runtime.worker_process import WorkerProcess

    console = Console()
    console.print("[bold]gpumeter demo[/]: local Kafka + ClickHouse, a simulated GPU fleet, real billing")
    with console.status("starting local Kafka and ClickHouse (first run fetches the Kafka jars)..."):
        for line in services.up(settings):
            console.print(f"  {line}")
    settings = services.namespaced(settings, DEMO_PREFIX, DEMO_DATABASE, "gpumeter-demo")
    with console.status("resetting the demo namespace..."):
        services.drop_namespace(settings)
        kafka.ensure_topics(settings.kafka)
        client = clickhouse.connect(settings.clickhouse.connection_dsn())
        schema.migrate(client)
    out_dir.mkdir(parents=True, exist_ok=True)
    worker = WorkerProcess(settings, out_dir / "worker.log").start()
    # Every model, MIG on A100 and H100, time-sliced L4s; spot reclaims and agent outages
    # (backfilled) a little more often than the defaults, so a short run shows them.
    fleet = SimulatedFleet(FleetConfig(
        seed=7, window_seconds=WINDOW_SECONDS,
        nodes={"H100-SXM-80GB": 10, "H200-SXM-141GB": 2, "B200-SXM-180GB": 2, "A100-SXM-40GB": 4,
               "L40S-48GB": 3, "L4-24GB": 3},
        time_sliced_nodes={"L4-24GB": 2},
        spot_reclaims_per_day=1.0, agent_outages_per_day=0.3,
    ))
    submit_idle_pods(fleet)
    publisher = FleetPublisher(settings, fleet)
    lock = threading.Lock()
    enforcement = DemoEnforcement(settings, fleet, lock, out_dir / "enforcement.log")
    stats = DemoStats()
    started = time.monotonic()
    try:
        publisher.publish_topology()
        publisher.flush()
        with console.status("starting the extender and the actuator against the simulated cluster..."):
            enforcement.start()
        last_poll = 0.0
        windows = 0
        stored_end: datetime | None = None
        window = fleet.config.window
        with Live(progress_view(stats, started, "streaming"), console=console, refresh_per_second=4) as live:
            while time.monotonic() - started < wall_seconds:
                if not worker.alive():
                    raise RuntimeError(f"the worker exited:\n{worker.log_tail(10)}")
                if not enforcement.alive():
                    raise RuntimeError("the demo's extender and actuator stopped: see enforcement.log")
                ahead = (stored_end is None and windows < LAG_WINDOWS) or (
                    stored_end is not None and fleet.clock - stored_end < window * LAG_WINDOWS)
                if not ahead:
                    stored_end = stored_until(client)
                if ahead and stats.published - stats.stored - stats.dead < MAX_IN_FLIGHT:
                    enforcement.wait_caught_up()
                    with lock:
                        samples = publisher.publish_window()
                    enforcement.sync()
                    windows += 1
                    stats.fleet_clock = fleet.clock
                    if windows % BAD_INPUT_EVERY == 0 and samples:
                        publisher.send_raw(b"demo", b'{"event_id": "demo-bad", "kind": "tpu"}')
                        publisher.send_raw(samples[0]["tenant"].encode(), json.dumps(samples[0]).encode())
                        stats.injected_bad += 1
                        stats.injected_duplicates += 1
                    stats.published = publisher.published
                else:
                    time.sleep(0.02)
                if time.monotonic() - last_poll > 0.5:
                    poll(client, stats)
                    last_poll = time.monotonic()
                    live.update(progress_view(stats, started, "streaming"))
            publisher.flush()
            live.update(progress_view(stats, started, "draining"))

            def show_drain(stage: str, behind: int) -> None:
                poll(client, stats)
                live.update(progress_view(stats, started, f"draining: {stage}, {behind:,} behind"))

            drain(settings, timeout=600, on_progress=show_drain)
            enforcement.wait_caught_up()
            poll(client, stats)
            live.update(progress_view(stats, started, "done"))
        elapsed = time.monotonic() - started
        stats.enforcement = enforcement_summary(enforcement)
        stats.fleet_events = {
            "spot_reclaims": fleet.stats.spot_reclaims,
            "pods_reclaimed": fleet.stats.jobs_reclaimed,
            "agent_outages": fleet.stats.agent_outages,
            "node_windows_backfilled": fleet.stats.windows_backfilled,
            "node_windows_unreported": fleet.stats.windows_unreported,
        }
    finally:
        enforcement.stop()
        publisher.close()
        worker.stop()
    return finish(settings, client, stats, elapsed, out_dir, console)


def enforcement_summary(enforcement: Any) -> dict[str, Any]:
    """What the extender refused and the actuator did, with the fleet's clock (for the report)."""
    gateway, refusals = enforcement.gateway, enforcement.filter.refusals if enforcement.filter else []
    return {
        "stated_lag_windows": STATED_LAG_WINDOWS,
        "extender_calls": enforcement.filter.calls if enforcement.filter else 0,
        "extender_failures": enforcement.filter.failures if enforcement.filter else 0,
        "paced_wait_seconds": round(enforcement.waited_seconds, 1),
        "refusals": [{"at": r.at.isoformat(), "tenant": r.tenant, "pod": r.pod, "gpus": r.gpus,
                      "message": r.message} for r in refusals],
        "evictions": len(gateway.evicted),
        "events": [{"at": e.at.isoformat(), "namespace": e.namespace, "pod": e.pod, "reason": e.reason,
                    "message": e.message} for e in gateway.events],
    }


def demo_enforcement(settings: Settings, client: Any, stats: DemoStats) -> list[Any]:
    """The report's enforcement section, with the refusals the fleet's scheduler got."""
    from datetime import timedelta

    from dashboards.enforcement_report import Mark, enforcement_series
    from gpumeter.core.tenants import load_tenants

    refusals = [(r["tenant"], Mark(datetime.fromisoformat(r["at"]), "refusal", r["message"]))
                for r in stats.enforcement.get("refusals", ())]
    window = timedelta(seconds=WINDOW_SECONDS)
    return enforcement_series(client, load_tenants(settings.tenants), refusals, window,
                              window * STATED_LAG_WINDOWS)


def finish(settings: Settings, client: Any, stats: DemoStats, elapsed: float, out_dir: Path,
           console: Console) -> int:
    from dashboards.finance_report import daily_spend, write_report
    from dashboards.insights_job import run_for_report
    from pricing.exports import write_invoice
    from pricing.issue import MonthData, billable_tenants, billing, invoice_for

    periods = [str(row[0]) for row in client.query(
        "SELECT DISTINCT period FROM rated_usage ORDER BY period").result_rows]
    invoice_dir = out_dir / "invoices"
    table = Table("tenant", "period", "lines", "subtotal", "true-up", "credits", "total",
                  title="invoices (USD)", title_justify="left")
    documents = []
    with billing(settings) as context:
        for period in periods:
            month = MonthData.load(context.client, period)
            for tenant in billable_tenants(context, period, month):
                invoice = invoice_for(context, tenant, period, prefetched=month)
                for fmt in ("json", "csv"):
                    write_invoice(invoice, fmt, invoice_dir)
                document = invoice.to_document()
                documents.append(document)
                table.add_row(tenant, period, str(len(invoice.lines)), str(document["subtotal"]),
                              str(document["commitment_true_up"]), str(document["credits"]),
                              str(document["total"]))
    console.print(table)
    summary = {
        "wall_seconds": round(elapsed, 1),
        "samples_published": stats.published,
        "samples_stored": stats.stored,
        "duplicates_injected": stats.injected_duplicates,
        "malformed_injected": stats.injected_bad,
        "dead_letters": stats.dead,
        # Measured, not assumed: what was published and neither stored nor dead-lettered.
        "duplicates_dropped": stats.published - stats.stored - stats.dead,
        "stored_per_second": round(stats.stored / elapsed, 1),
        "fleet_clock_end": stats.fleet_clock.isoformat() if stats.fleet_clock else None,
        "fleet_events": stats.fleet_events,
        "enforcement": stats.enforcement,
        "invoices": documents,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    # Idle GPUs and forecasts: advice events and tables like `gpumeter insights`, and report sections.
    insights = run_for_report(settings, client)
    report = write_report(out_dir, daily_spend(client), documents, generated, insights,
                          demo_enforcement(settings, client, stats))
    console.print(
        f"stored {stats.stored:,} rated samples in {elapsed:.0f} s ({summary['stored_per_second']:,}/s), "
        f"{stats.dead} dead letters, {summary['duplicates_dropped']} duplicates dropped "
        f"({stats.injected_duplicates} injected); "
        f"invoices in {invoice_dir}/, finance report {report}, summary {out_dir / 'summary.json'}"
    )
    console.print("Kafka and ClickHouse keep running for exploration; `gpumeter down` stops them.")
    client.close()
    return 0
