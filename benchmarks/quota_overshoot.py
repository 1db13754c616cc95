"""Quota overshoot: GPU-hours used past a `gpu_hours` limit, measured, against the stated bound.

    .venv/bin/python -m benchmarks.quota_overshoot [--quick] [--nodes 1250] [--crossings 100]
        [--per-window 10] [--first-window 4] [--max-grace 5] [--window-seconds 15]

quota/overshoot.py states how far past its `gpu_hours` limit a `preempt` tenant can get:
GPUs held x (window + pipeline p99 lag + grace), which `gpumeter quota status` shows per quota.
This measures the real overshoot of ``--crossings`` crossings on the 10,000-GPU fleet of
benchmarks/fleet_realtime.py (``--nodes`` 8-GPU nodes, a tenant per 10 nodes, one window of
samples every ``--window-seconds`` of wall time), everything real but the GPUs and the cluster:

- Kafka and ClickHouse of `gpumeter up` (started if needed; topics and a database of this run's
  own, dropped afterwards), one `gpumeter worker` process (rating, quota accounting, sink);
- the real actuator and the real extender (gpumeter/app/enforcement.py, as `gpumeter demo`
  runs them) against the fleet behind the ClusterGateway (collectors/sim/cluster_gateway.py),
  on the wall clock: a notice, the policy's grace, then the eviction, which ends the pod at
  that moment; the fleet bills it up to then (rounded up to the second). The extender refuses
  new pods of a blocked tenant, as kube-scheduler's extender does.

Limits. The fleet is deterministic, so a dry run of it (no Kafka, same seed) gives each tenant's
GPU-hours per window; tenant i of the first ``--crossings`` is given the limit its use reaches
inside window ``--first-window + i // --per-window`` (at a fraction of that window spread over
10-90 %), so ``--per-window`` crossings fall in each window from the first on, staggered in
real time. Its `grace_seconds` is ``i % (--max-grace + 1)``, its period the month, its
`on_exceed` preempt. Once a tenant is preempted, others place queued jobs on the GPUs it
freed, so later crossings may come a little earlier than planned: the limits only stagger
them; what is measured does not depend on the plan.

Measured per crossing, from ClickHouse once every sample published is stored (rated_usage
FINAL, each event_id once, gpu samples, quota/overshoot.measured_overshoot):
- the crossing window: the first at whose end the tenant's use reaches its limit; the GPUs
  held in it (Σ quantity, as `max_gpus` counts them);
- the overshoot: the tenant's GPU-hours up to the end of the last window any of its evicted
  pods (its victims) billed, minus the limit: what it used past the limit when its last victim
  was gone;
- the lag: its last eviction request minus its grace minus the crossing window's end (when a
  node agent sends the window): the sample -> eviction request delay, with the fleet's own time
  to compute and send the window in it;
- the bound: overshoot_bound with those GPUs held and grace, with the configured
  `quota.pipeline_lag_seconds` and with the p99 of the lags measured in this run.
Prints both ratios overshoot / bound (max, p50), how many crossings are within each bound,
and what the tenants used after their last victim was gone (pods the actuator did not evict).
Writes benchmarks/results/quota-overshoot-latest.json.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from benchmarks.fleet_realtime import fleet_config
from benchmarks.pipeline import isolated_namespace, make_payloads, publish, stored, wait_stored
from benchmarks.result_file import write_results
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from collectors.sim.runner import FleetPublisher
from gpumeter.app.enforcement import DemoEnforcement
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.money import MICRO, exact
from gpumeter.core.settings import Settings
from quota.overshoot import (
    SECONDS_PER_HOUR,
    EnforcementDelays,
    MeasuredOvershoot,
    WindowUsage,
    measured_overshoot,
    overshoot_bound,
)

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "quota-overshoot-latest.json"
QUICK_RESULTS = RESULTS.with_name("quota-overshoot-quick-latest.json")  # the full run's file stays
AFTER_WINDOWS = 2  # windows published once every victim is gone: what the tenants use afterwards
SPARE_WINDOWS = 20  # windows past the last planned crossing before the run gives up waiting
QUICK = {"nodes": 250, "crossings": 20, "per_window": 5, "first_window": 3}


# -- the plan: limits from a dry run of the same fleet ------------------------------------------------


def usage_per_window(config: FleetConfig, windows: int) -> dict[str, list[Decimal]]:
    """Each tenant's gpu unit-seconds in windows 0 .. windows-1 of the fleet, run dry."""
    fleet = SimulatedFleet(config)
    seconds = Decimal(config.window_seconds)
    usage: dict[str, list[Decimal]] = {tenant: [] for tenant in fleet.tenants()}
    for _ in range(windows):
        this = dict.fromkeys(usage, Decimal(0))
        for sample in fleet.step_dicts():
            if sample["kind"] == "gpu":
                this[sample["tenant"]] += Decimal(sample["quantity"]) * seconds
        for tenant, value in this.items():
            usage[tenant].append(value)
    return usage


@dataclass(frozen=True)
class Planned:
    tenant: str
    window: int  # the window its use should reach the limit in
    limit: Decimal  # GPU-hours
    grace_seconds: int


def plan(usage: dict[str, list[Decimal]], crossings: int, first_window: int, per_window: int,
         max_grace: int) -> list[Planned]:
    """Limits reached inside staggered windows (see the module's docstring)."""
    planned: list[Planned] = []
    tenants = [t for t in sorted(usage) if any(usage[t][first_window:])]
    for tenant in tenants:
        index = len(planned)
        if index == crossings:
            break
        window = first_window + index // per_window
        while window < len(usage[tenant]) and not usage[tenant][window]:
            window += 1  # nothing used in that window: the next one that has use
        if window >= len(usage[tenant]):
            continue
        before = sum(usage[tenant][:window], Decimal(0))
        fraction = Decimal(1 + (index * 7) % 9) / 10  # 0.1 .. 0.9 of the window's use
        with exact():
            limit = ((before + usage[tenant][window] * fraction) / SECONDS_PER_HOUR).quantize(
                MICRO, rounding=ROUND_CEILING)
        planned.append(Planned(tenant, window, limit, index % (max_grace + 1)))
    if len(planned) < crossings:
        raise RuntimeError(f"only {len(planned)} tenants use GPUs from window {first_window} on: "
                           f"fewer than {crossings} crossings (more --nodes?)")
    return planned


def write_tenants(path: Path, planned: Iterable[Planned]) -> None:
    path.write_text(yaml.safe_dump({"tenants": [
        {"tenant": p.tenant, "period": "month", "gpu_hours": str(p.limit), "on_exceed": "preempt",
         "grace_seconds": p.grace_seconds}
        for p in planned
    ]}))


# -- the run --------------------------------------------------------------------------------------------


@dataclass
class RunState:
    first_at: float
    window_seconds: int
    published: int = 0  # samples
    windows: int = 0
    late_max_s: float = 0.0  # how late a window's publishing started, at most
    step_max_s: float = 0.0  # the longest time to compute and send a window
    sent_after: dict[int, float] = field(default_factory=dict)  # window -> its end to all of it sent
    load_max: float = 0.0


def gpu_pods_left(fleet: SimulatedFleet, tenants: set[str]) -> dict[str, dict[str, int]]:
    """Per tenant: its running pods the actuator evicts (`nvidia.com/gpu`: whole GPUs and
    time-sliced replicas) and those it does not (MIG devices)."""
    left = {tenant: {"evictable": 0, "mig": 0} for tenant in tenants}
    for pod in fleet.running_pods():
        if pod["tenant"] in left:
            left[pod["tenant"]]["mig" if pod["request"] == "mig" else "evictable"] += 1
    return left


def run(settings: Settings, args: argparse.Namespace, planned: list[Planned], workdir: Path,
        client: Any) -> tuple[RunState, DemoEnforcement, dict[str, Any]]:
    window = args.window_seconds
    first_at = math.ceil((time.time() + 10) / window) * window
    config = fleet_config(args.nodes, window, args.seed, datetime.fromtimestamp(first_at - window, UTC))
    fleet = SimulatedFleet(config)
    publisher = FleetPublisher(settings, fleet)
    lock = threading.Lock()
    enforcement = DemoEnforcement(settings, fleet, lock, workdir / "enforcement.log",
                                  clock=lambda: datetime.now(UTC))
    state = RunState(first_at, window)
    limited = {p.tenant for p in planned}
    last_planned = max(p.window for p in planned)
    publisher.publish_topology()
    publisher.flush()
    with console.status("starting the extender and the actuator against the simulated fleet..."):
        enforcement.start()
    if time.time() > first_at - 1:  # the start took long: the next boundary
        raise RuntimeError("the extender took longer to start than the fleet's first window")
    gone_since: int | None = None
    left: dict[str, dict[str, int]] = {}
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console)
    try:
        with progress:
            task = progress.add_task("windows", total=last_planned + 1 + AFTER_WINDOWS)
            for index in range(last_planned + SPARE_WINDOWS):
                due = first_at + index * window
                time.sleep(max(0.0, due - time.time()))
                started = time.time()
                state.late_max_s = max(state.late_max_s, started - due)
                with lock:
                    samples = publisher.publish_window()
                publisher.flush()
                state.step_max_s = max(state.step_max_s, time.time() - started)
                state.sent_after[index] = time.time() - due
                state.published += len(samples)
                state.windows += 1
                enforcement.sync()
                state.load_max = max(state.load_max, os.getloadavg()[0])
                if not enforcement.alive():
                    raise RuntimeError(f"the extender and actuator stopped: see {workdir}/enforcement.log")
                with lock:
                    left = gpu_pods_left(fleet, limited)
                evicted = set(enforcement.gateway.evicted_namespace.values())
                done = {t for t in evicted if not left[t]["evictable"]}
                progress.update(task, completed=index + 1, description=(
                    f"window {index}: {len(evicted)}/{len(planned)} tenants preempted, "
                    f"{len(done)} with every victim gone · load {os.getloadavg()[0]:.1f}"))
                if len(done) == len(planned) and index >= last_planned:
                    gone_since = index if gone_since is None else gone_since
                    if index - gone_since >= AFTER_WINDOWS:
                        break
        with console.status(f"waiting for {state.published:,} samples to be stored..."):
            wait_stored(client, 1 + state.published, 600)  # + the warm-up sample
    finally:
        publisher.close()
    stats = fleet.stats
    extra = {"fleet_stats": {"jobs_evicted": stats.jobs_evicted, "spot_reclaims": stats.spot_reclaims,
                             "agent_outages": stats.agent_outages},
             "pods_left_at_end": {t: v for t, v in left.items() if v["evictable"] or v["mig"]},
             "extender_refusals": len(enforcement.filter.refusals) if enforcement.filter else 0,
             "gpus": sum(config.gpus_on(model) * count for model, count in config.nodes.items()),
             "origin": config.start.isoformat()}
    return state, enforcement, extra


# -- measuring --------------------------------------------------------------------------------------------


def _at(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, UTC)


def stored_windows(client: Any, tenants: list[str]) -> dict[str, list[WindowUsage]]:
    """Each tenant's gpu use per window, each event_id once (rated_usage FINAL)."""
    rows = client.query(
        # Aliases apart from the columns' names: ClickHouse would read the WHERE's through them.
        "SELECT t, toUnixTimestamp64Micro(w), toString(sum(s)), toString(sum(q)) FROM ("
        " SELECT event_id, any(tenant) AS t, any(window_start) AS w, any(unit_seconds) AS s,"
        " any(quantity) AS q"
        " FROM rated_usage FINAL WHERE kind = 'gpu' AND tenant IN %(tenants)s GROUP BY event_id"
        ") GROUP BY t, w",
        parameters={"tenants": tenants},
    ).result_rows
    out: dict[str, list[WindowUsage]] = {tenant: [] for tenant in tenants}
    for tenant, start, seconds, quantity in rows:
        out[tenant].append(WindowUsage(_at(int(start)), Decimal(seconds), Decimal(quantity)))
    return out


def victims_last_window(client: Any, victims: dict[str, str]) -> dict[str, datetime]:
    """Per tenant, the last window any of its evicted pods billed."""
    if not victims:
        return {}
    rows = client.query(
        "SELECT tenant, toUnixTimestamp64Micro(max(window_start)) FROM rated_usage FINAL "
        "WHERE kind = 'gpu' AND pod_uid IN %(uids)s GROUP BY tenant",
        parameters={"uids": list(victims)},
    ).result_rows
    return {tenant: _at(int(last)) for tenant, last in rows}


def exceeded_events(client: Any) -> dict[str, int]:
    rows = client.query(
        "SELECT tenant, count() FROM quota_events FINAL WHERE metric = 'gpu_hours' AND level = 'exceeded' "
        "GROUP BY tenant").result_rows
    return {tenant: int(count) for tenant, count in rows}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(client: Any, settings: Settings, planned: list[Planned], enforcement: DemoEnforcement,
            window_seconds: int, state: RunState) -> dict[str, Any]:
    tenants = [p.tenant for p in planned]
    windows = stored_windows(client, tenants)
    victims = dict(enforcement.gateway.evicted_namespace)  # pod uid -> tenant
    last_window = victims_last_window(client, victims)
    last_request: dict[str, datetime] = {}
    victims_per_tenant: dict[str, int] = {}
    for uid, tenant in victims.items():
        at = enforcement.gateway.evicted[uid]
        last_request[tenant] = max(at, last_request.get(tenant, at))
        victims_per_tenant[tenant] = victims_per_tenant.get(tenant, 0) + 1
    events = exceeded_events(client)
    window = timedelta(seconds=window_seconds)

    crossings: list[dict[str, Any]] = []
    measured: dict[str, MeasuredOvershoot] = {}
    missing: list[dict[str, Any]] = []
    for p in planned:
        until = last_window.get(p.tenant)
        found = None if until is None else measured_overshoot(windows[p.tenant], p.limit, until)
        if until is None or found is None:
            total = sum((w.unit_seconds for w in windows[p.tenant]), Decimal(0)) / SECONDS_PER_HOUR
            missing.append({"tenant": p.tenant, "limit": str(p.limit), "used": str(total.quantize(MICRO)),
                            "victims": victims_per_tenant.get(p.tenant, 0),
                            "exceeded_events": events.get(p.tenant, 0)})
            continue
        measured[p.tenant] = found
        after = sum((w.unit_seconds for w in windows[p.tenant] if w.window_start > until), Decimal(0))
        lag = (last_request[p.tenant] - (found.crossing_window + window)).total_seconds() - p.grace_seconds
        # The fleet's part of the lag: computing the crossing window and sending all of it.
        crossing_index = round((found.crossing_window.timestamp() + window_seconds - state.first_at)
                               / window_seconds)
        crossings.append({
            "tenant": p.tenant, "limit": p.limit, "grace_seconds": p.grace_seconds,
            "planned_window": p.window, "crossing_window": found.crossing_window.isoformat(),
            "gpus_held": found.gpus_held, "victims": victims_per_tenant.get(p.tenant, 0),
            "exceeded_events": events.get(p.tenant, 0), "used": found.used, "overshoot": found.overshoot,
            "lag_s": lag, "fleet_sent_window_after_s": state.sent_after.get(crossing_index),
            "last_victim_window": until.isoformat(),
            "gpu_hours_after_last_victim": after / SECONDS_PER_HOUR,
        })
    lags = [c["lag_s"] for c in crossings]
    configured = Decimal(settings.quota.pipeline_lag_seconds)
    measured_p99 = Decimal(str(percentile(lags, 0.99))).quantize(Decimal("0.001"), rounding=ROUND_CEILING) \
        if lags else configured
    for label, lag_seconds in (("configured", configured), ("measured", max(measured_p99, Decimal(0)))):
        delays = EnforcementDelays(Decimal(window_seconds), lag_seconds)
        for c in crossings:
            bound = overshoot_bound("gpu_hours", "preempt", c["gpus_held"], c["grace_seconds"], delays)
            assert bound is not None  # gpu_hours + preempt always has one
            c[f"bound_{label}"] = bound
            with exact():
                c[f"ratio_{label}"] = float(c["overshoot"] / bound) if bound else math.inf
            c[f"within_{label}"] = c["overshoot"] <= bound
    return {
        "crossings_planned": len(planned),
        "crossings_measured": len(crossings),
        "not_measured": missing,
        "lag_configured_s": configured,
        "lag_measured_p50_s": statistics.median(lags) if lags else None,
        "lag_measured_p99_s": measured_p99,
        "lag_measured_max_s": max(lags, default=None),
        "crossings": crossings,
    }


def summarize(results: dict[str, Any]) -> None:
    crossings = results["crossings"]
    for label in ("configured", "measured"):
        ratios = [c[f"ratio_{label}"] for c in crossings]
        results[f"ratio_{label}_max"] = max(ratios, default=None)
        results[f"ratio_{label}_p50"] = statistics.median(ratios) if ratios else None
        results[f"within_{label}"] = sum(1 for c in crossings if c[f"within_{label}"])
    results["overshoot_gpu_hours_total"] = sum((c["overshoot"] for c in crossings), Decimal(0))
    results["gpu_hours_after_last_victim_total"] = sum(
        (c["gpu_hours_after_last_victim"] for c in crossings), Decimal(0))
    results["tenants_using_after_last_victim"] = sum(1 for c in crossings if c["gpu_hours_after_last_victim"])


# -- report ---------------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> None:
    crossings = results["crossings"]
    table = Table("measure", "value", title_justify="left",
                  title=f"quota overshoot: {results['crossings_measured']} of {results['crossings_planned']} "
                        f"crossings on a fleet of {results['gpus']:,} GPUs, "
                        f"window {results['window_seconds']} s")
    table.add_row("lag (window end -> last eviction request - grace)",
                  f"p50 {results['lag_measured_p50_s']:.2f} s · p99 {results['lag_measured_p99_s']} s · "
                  f"max {results['lag_measured_max_s']:.2f} s" if crossings else "-")
    lags = (("configured", results["lag_configured_s"]), ("measured", results["lag_measured_p99_s"]))
    for label, lag in lags:
        if results[f"ratio_{label}_max"] is None:
            continue
        table.add_row(f"overshoot / bound, lag {lag} s ({label})",
                      f"max {results[f'ratio_{label}_max']:.3f} · p50 {results[f'ratio_{label}_p50']:.3f} · "
                      f"within the bound: {results[f'within_{label}']} of {len(crossings)}")
    table.add_row("GPU-hours past the limits (all crossings)", f"{results['overshoot_gpu_hours_total']:.6f}")
    table.add_row("GPU-hours used after the last victim",
                  f"{results['gpu_hours_after_last_victim_total']:.6f} "
                  f"({results['tenants_using_after_last_victim']} tenants)")
    sent = [c["fleet_sent_window_after_s"] for c in crossings if c["fleet_sent_window_after_s"] is not None]
    if sent:
        table.add_row("of the lag: the fleet computing and sending the crossing window",
                      f"p50 {statistics.median(sent):.2f} s · max {max(sent):.2f} s")
    table.add_row("fleet windows", f"{results['windows']} · started at most {results['late_max_s']:.2f} s "
                  f"late · computed and sent in at most {results['step_max_s']:.2f} s")
    table.add_row("load average (1 min) start / max / end",
                  f"{results['load_average_start']:.2f} / {results['load_max']:.2f} / "
                  f"{results['load_average_end']:.2f} on {os.cpu_count()} cores")
    console.print(table)
    worst = sorted(crossings, key=lambda c: c["ratio_configured"], reverse=True)[:10]
    detail = Table("tenant", "GPUs held", "grace", "overshoot GPU-h", "bound (configured)", "ratio",
                   "bound (measured)", "ratio", "lag s", title_justify="left",
                   title="the ten largest overshoots relative to their bound")
    for c in worst:
        style = None if c["within_configured"] else "red"
        detail.add_row(c["tenant"], f"{c['gpus_held']:.3f}", f"{c['grace_seconds']} s",
                       f"{c['overshoot']:.6f}", f"{c['bound_configured']}", f"{c['ratio_configured']:.3f}",
                       f"{c['bound_measured']}", f"{c['ratio_measured']:.3f}", f"{c['lag_s']:.2f}",
                       style=style)
    console.print(detail)
    for m in results["not_measured"]:
        console.print(f"[red]not measured: {m}")
    if results["pods_left_at_end"]:
        console.print(f"pods of limited tenants still running at the end: {results['pods_left_at_end']}")
    ok = results["crossings_measured"] == results["crossings_planned"] and \
        results["within_configured"] == len(crossings)
    console.print(Text(f"every crossing within its bound (configured lag): {'yes' if ok else 'NO'}",
                       style="bold green" if ok else "bold red"))


def _json(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"not JSON: {type(value)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK['nodes']} nodes, {QUICK['crossings']} crossings")
    parser.add_argument("--nodes", type=int, default=1250, help="8-GPU nodes (1,250 = 10,000 GPUs)")
    parser.add_argument("--crossings", type=int, default=100)
    parser.add_argument("--per-window", type=int, default=10, help="crossings planned per window")
    parser.add_argument("--first-window", type=int, default=4, help="the window of the first crossings")
    parser.add_argument("--max-grace", type=int, default=5, help="grace_seconds go 0 .. this")
    parser.add_argument("--window-seconds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if min(args.nodes, args.crossings, args.per_window, args.first_window, args.window_seconds) < 1 \
            or args.max_grace < 0:
        parser.error("--nodes, --crossings, --per-window, --first-window, --window-seconds must be "
                     "positive, --max-grace >= 0")

    last = args.first_window + (args.crossings - 1) // args.per_window
    dry = fleet_config(args.nodes, args.window_seconds, args.seed, datetime(2026, 1, 1, tzinfo=UTC))
    with console.status(f"dry run of the fleet ({args.nodes * 8:,} GPUs, {last + 4} windows) "
                        "to place the limits..."):
        planned = plan(usage_per_window(dry, last + 4), args.crossings, args.first_window, args.per_window,
                       args.max_grace)

    settings, client, _tag = isolated_namespace("overshoot")
    settings.quota.window_seconds = args.window_seconds
    workdir = Path(tempfile.mkdtemp(prefix="gpumeter-overshoot-"))
    tenants_file = workdir / "tenants.yaml"
    write_tenants(tenants_file, planned)
    settings.tenants = tenants_file
    worker = WorkerProcess(settings, workdir / "worker.log", "warn")
    results: dict[str, Any] = {"nodes": args.nodes, "window_seconds": args.window_seconds, "seed": args.seed,
                               "quick": args.quick, "load_average_start": os.getloadavg()[0]}
    enforcement: DemoEnforcement | None = None
    try:
        with console.status("starting the worker..."):
            worker.start()
            publish(settings, make_payloads(1), None)  # warm-up: the worker has joined and stores
            wait_stored(client, 1, 120)
        state, enforcement, extra = run(settings, args, planned, workdir, client)
        if not worker.alive():
            raise RuntimeError(f"the worker exited:\n{worker.log_tail()}")
        results.update(extra)
        results.update({"windows": state.windows, "samples": state.published, "stored_rows": stored(client),
                        "late_max_s": state.late_max_s, "step_max_s": state.step_max_s,
                        "load_max": state.load_max})
        results.update(measure(client, settings, planned, enforcement, args.window_seconds, state))
    finally:
        if enforcement is not None:
            enforcement.stop()
        worker.stop()
        client.close()
        services.drop_namespace(settings)
        if args.keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    results["load_average_end"] = os.getloadavg()[0]
    summarize(results)
    report(results)
    write_results(QUICK_RESULTS if args.quick else RESULTS, results, default=_json)
    ok = results["crossings_measured"] == results["crossings_planned"] and \
        results["within_configured"] == results["crossings_measured"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
