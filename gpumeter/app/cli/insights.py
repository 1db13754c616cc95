"""`gpumeter insights`: idle GPUs with what they cost per day, per-tenant forecasts to month end and
quota exhaustion, and the backtest that decided which forecast to trust. Advice only.

By default the results are published (advice events on gpumeter.advice.v1; rows in the advice,
forecasts, budget_lines and insight_runs tables the dashboards read); ``--no-publish`` only prints.
With the forecasts, every tenant's budget lines (limit, grants, used, remaining and runway per
limit and GPU model key, as `gpumeter report` states them) are stored for the Tenant dashboard.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from gpumeter.app.cli.arguments import aware_time, positive_number
from gpumeter.app.cli.errors import Failure, UsageError
from gpumeter.core.money import format_money
from gpumeter.core.settings import Settings

if TYPE_CHECKING:
    from insights.forecast import Forecast


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M}"


def _ratio(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--at", type=aware_time, default=None,
                        help="evaluate as of this RFC 3339 time (default: the latest gpu window)")
    parser.add_argument("--threshold", type=positive_number, default=0.05,
                        help="idle below this GPU utilization (0-1, default 0.05)")
    parser.add_argument("--sustain-minutes", type=positive_number, default=60.0,
                        help="for at least this long (default 60)")
    parser.add_argument("--no-forecasts", action="store_true", help="idle GPUs only")
    parser.add_argument("--no-publish", action="store_true",
                        help="print only: no advice events, nothing written to ClickHouse")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from dashboards.insights_job import evaluate, publish_advice, read_grants, store
    from gpumeter.app import schema
    from gpumeter.core.tenants import load_tenants
    from gpumeter.infra import clickhouse
    from insights.forecast import summarize
    from insights.idle import IdleRule, per_tenant

    try:
        rule = IdleRule(threshold=Decimal(str(args.threshold)),
                        sustain=timedelta(minutes=args.sustain_minutes))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped or captured: wide tables, not 80 truncated columns
    client = clickhouse.connect(settings.clickhouse.connection_dsn())
    try:
        if not args.no_publish:
            schema.migrate(client)
        try:
            # Forecasts run against base + grants: rows that do not add up are refused, not guessed.
            grants = read_grants(client)
        except ValueError as exc:
            raise Failure(f"quota_grants: {exc}") from None
        with console.status("reading usage, detecting idle GPUs, backtesting and forecasting..."):
            result = evaluate(client, load_tenants(settings.tenants), args.at, rule,
                              forecasts=not args.no_forecasts, grants=grants)
        if result.at is None:
            console.print("no gpu usage in ClickHouse yet: nothing to advise")
            return 0
        console.print(f"[bold]gpumeter insights[/] as of {result.at:%Y-%m-%d %H:%M} UTC "
                      f"(advice only: nothing is evicted or blocked by it)")
        idle = Table("tenant", "pod", "node", "GPU", "GPUs", "idle since", "idle h", "mean util",
                     "cost/day", "wasted so far",
                     title=f"idle GPUs: under {rule.threshold * 100:.0f}% utilization "
                     f"for {args.sustain_minutes:g}+ min", title_justify="left")
        for item in result.idle:
            idle.add_row(item.tenant, f"{item.namespace}/{item.pod}", item.node,
                         item.gpu_model + (f" {item.mig_profile}" if item.mig_profile else ""),
                         f"{item.gpus.normalize():f}", _when(item.idle_since), f"{item.idle_hours:.1f}",
                         f"{item.mean_utilization * 100:.1f}%", format_money(item.cost_per_day),
                         format_money(item.wasted_so_far))
        console.print(idle)
        tenants = Table("tenant", "idle pods", "idle GPUs", "cost/day", title="idle GPU cost per tenant",
                        title_justify="left")
        for total in per_tenant(result.idle):
            tenants.add_row(total.tenant, str(total.pods), f"{total.gpus.normalize():f}",
                            f"{format_money(total.cost_per_day)} {total.currency}")
        console.print(tenants)
        if result.forecasts:
            _print_forecasts(console, result.forecasts, summarize([f.backtest for f in result.forecasts
                                                                   if f.backtest is not None]))
        if not args.no_publish:
            sent = publish_advice(settings, result.idle)
            store(client, result)
            console.print(f"published {sent} advice event(s) to gpumeter.advice.v1; stored advice, "
                          f"{len(result.forecasts)} forecast(s), {len(result.budgets)} budget line(s) "
                          "and the run in ClickHouse")
        return 0
    finally:
        client.close()


def _print_forecasts(console: Console, forecasts: Sequence[Forecast],
                     pooled: Mapping[str, float | int | None]) -> None:
    table = Table("tenant", "metric", "month to date", "month end (80% interval)", "model", "quota",
                  "limit reached (80% interval)", "P(reached)", title=f"forecasts for {forecasts[0].period}",
                  title_justify="left")
    for item in forecasts:
        quota = "-" if item.quota_limit is None else (
            f"{item.quota_used:,} / {item.quota_limit:,} per {item.quota_period}")
        reached = "-"
        if item.quota_limit is not None and item.exhaust_at is not None:
            late = _when(item.exhaust_late) if item.exhaust_late is not None else "after the period"
            reached = f"{_when(item.exhaust_at)} ({_when(item.exhaust_early)} .. {late})"
        elif item.quota_limit is not None:
            reached = "not by the period's end (median)"
        table.add_row(item.tenant, item.metric, f"{item.month_to_date:,}",
                      f"{item.month_end:,} ({item.month_end_low:,} .. {item.month_end_high:,})",
                      item.model, quota, reached,
                      "-" if item.quota_limit is None else f"{float(item.exhaust_probability):.0%}")
    console.print(table)
    backtests = Table("tenant", "metric", "folds", "WAPE Holt-Winters", "WAPE run rate",
                      "WAPE seasonal naive",
                      "80% coverage", "shipped", "why", title="backtest: month-end WAPE over weekly folds",
                      title_justify="left")
    for item in forecasts:
        test = item.backtest
        backtests.add_row(item.tenant, item.metric, str(test.folds if test else 0),
                          _ratio(test.wape_model if test else None),
                          _ratio(test.wape_run_rate if test else None),
                          _ratio(test.wape_seasonal_naive if test else None),
                          _ratio(test.coverage if test else None), item.model, item.reason)
    if pooled["series"]:
        backtests.add_row("all", "", str(pooled["folds"]), _ratio(pooled["wape_model"]),
                          _ratio(pooled["wape_run_rate"]), _ratio(pooled["wape_seasonal_naive"]),
                          _ratio(pooled["coverage"]), f"{pooled['model_used']}/{pooled['series']} series",
                          "pooled, folds-weighted", style="bold")
    console.print(backtests)
