"""Insights benchmark: forecast accuracy against the baselines, and the cost of forecasts and idle
advice for many tenants beside a plain aggregate over the same rows.

    .venv/bin/python -m benchmarks.insights_benchmark [--seeds 5 7] [--tenants 1000] [--weeks 16]

Accuracy: simulated fleets (16 weeks each, one per seed; daily and weekly rhythm and growth),
every tenant's spend and GPU-hours backtested over 8 weekly folds: month-end WAPE of
Holt-Winters, the run rate (last 7 days) and seasonal naive (last week repeated), and how often
the 80 % interval held the truth. Seeds 11, 23, 37 and 41 chose the model's weights; the default
seeds here are others.

Scale: ``--tenants`` histories (the fleet's series, scaled and shifted so no two are alike) are
forecast (backtest, choice, forecast: what `gpumeter insights` does per tenant and metric),
timed beside summing the same hourly values per tenant; and the idle rule runs over 24 hours of
10-minute GPU windows of 5 pods per tenant, timed beside summing those windows' list cost per
tenant. Printed as seconds and ratios; written to benchmarks/results/insights-latest.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchmarks.result_file import write_results
from insights.forecast import History, backtest, forecast_tenant, summarize
from insights.idle import GpuWindow, find_idle
from testkit.usage_history import fleet_histories

RESULTS = Path(__file__).resolve().parent / "results" / "insights-latest.json"


def accuracy(seeds: list[int], weeks: int) -> dict[str, Any]:
    histories = [h for seed in seeds for h in fleet_histories(weeks, seed)]
    tests = [backtest(h, h.end) for h in histories]
    return {metric: summarize([t for t in tests if t.metric == metric]) for metric in ("spend", "gpu_hours")}


def many_tenants(base: list[History], tenants: int) -> list[History]:
    """``tenants`` x 2 series derived from the fleet's: scaled 0.5-1.5x and rotated by whole days."""
    derived = []
    pairs = [(base[i], base[i + 1]) for i in range(0, len(base), 2)]
    for n in range(tenants):
        spend, hours = pairs[n % len(pairs)]
        scale = Decimal(50 + n % 101) / 100
        shift = 24 * (n % 7)
        for series in (spend, hours):
            values = series.values[shift:] + series.values[:shift]
            scaled = tuple(v * scale for v in values)
            derived.append(History(f"t{n:04d}", series.metric, series.start, scaled))
    return derived


def time_forecasts(histories: list[History]) -> dict[str, float]:
    origin = histories[0].end
    started = time.perf_counter()
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for history in histories:
        totals[(history.tenant, history.metric)] += sum(history.values, Decimal(0))
    aggregate = time.perf_counter() - started
    started = time.perf_counter()
    for history in histories:
        forecast_tenant(history, origin)
    forecasting = time.perf_counter() - started
    return {"series": len(histories), "aggregate_s": aggregate, "forecast_s": forecasting,
            "forecast_per_series_ms": 1000 * forecasting / len(histories), "ratio": forecasting / aggregate}


def idle_windows(tenants: int, pods: int = 5, hours: int = 24) -> tuple[list[GpuWindow], datetime]:
    at = datetime(2026, 11, 20, tzinfo=UTC)
    windows = []
    price, cost = Decimal("2.50"), Decimal("0.416666666666666667")
    for n in range(tenants):
        for p in range(pods):
            idle = (n + p) % 4 == 0  # a quarter of the pods idle
            for w in range(hours * 6):
                start = at - timedelta(minutes=10 * (hours * 6 - w))
                util = Decimal("0.01") if idle else Decimal("0.60")
                windows.append(GpuWindow(
                    f"t{n:04d}", "c", f"node-{p}", f"t{n:04d}", f"pod-{p}", f"uid-{n}-{p}", "H100-SXM-80GB",
                    None, "on-demand", start, start + timedelta(minutes=10), Decimal(1), util, price,
                    Decimal(1), cost))
    return windows, at


def time_idle(tenants: int) -> dict[str, float]:
    windows, at = idle_windows(tenants)
    started = time.perf_counter()
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for window in windows:
        totals[window.tenant] += window.list_cost
    aggregate = time.perf_counter() - started
    started = time.perf_counter()
    advice = find_idle(windows, at)
    rule = time.perf_counter() - started
    return {"windows": len(windows), "idle_pods": len(advice), "aggregate_s": aggregate, "idle_s": rule,
            "ratio": rule / aggregate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[5, 7])
    parser.add_argument("--weeks", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=1000)
    args = parser.parse_args()

    started = time.perf_counter()
    result: dict[str, Any] = {"seeds": args.seeds, "weeks": args.weeks,
                              "accuracy": accuracy(args.seeds, args.weeks)}
    for metric, pooled in result["accuracy"].items():
        print(f"{metric:9s} WAPE Holt-Winters {pooled['wape_model']:.4f}  "
              f"run rate {pooled['wape_run_rate']:.4f}  seasonal naive {pooled['wape_seasonal_naive']:.4f}  "
              f"80% coverage {pooled['coverage']:.3f}  "
              f"({pooled['folds']} folds, Holt-Winters shipped for {pooled['model_used']}/"
              f"{pooled['series']})")
    base = fleet_histories(args.weeks, args.seeds[0])
    result["forecasts"] = time_forecasts(many_tenants(base, args.tenants))
    f = result["forecasts"]
    print(f"forecasts for {args.tenants} tenants ({f['series']} series, with backtests): "
          f"{f['forecast_s']:.1f} s ({f['forecast_per_series_ms']:.1f} ms/series); plain sum of the same "
          f"rows {f['aggregate_s']:.2f} s; ratio {f['ratio']:.0f}x")
    result["idle"] = time_idle(args.tenants)
    i = result["idle"]
    print(f"idle advice for {args.tenants} tenants ({i['windows']:,} windows, {i['idle_pods']} idle pods): "
          f"{i['idle_s']:.2f} s; plain sum of list cost {i['aggregate_s']:.2f} s; ratio {i['ratio']:.1f}x")
    result["wall_s"] = time.perf_counter() - started
    write_results(RESULTS, result, default=str)
    print(f"written {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
