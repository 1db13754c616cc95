"""`gpumeter report --period YYYY-MM --out DIR`: the offline finance report of one month.

The same document the demo writes (dashboards/finance_report.py): daily list spend per tenant
as a chart, the month's invoices (issued where the month is closed, drafts otherwise), the
forecasts, quota status and idle-GPU costs, and a CSV of every table in it. Read-only: the
insights are evaluated, not published.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from gpumeter.app.cli.arguments import yyyy_mm
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--period", type=yyyy_mm, required=True, help="YYYY-MM (UTC)")
    parser.add_argument("--out", type=Path, default=Path("gpumeter-out"))


def run(settings: Settings, args: argparse.Namespace) -> int:
    from dashboards.enforcement_report import enforcement_series
    from dashboards.finance_report import InsightsView, daily_spend, write_report
    from dashboards.insights_job import evaluate
    from gpumeter.core.tenants import load_tenants
    from pricing.issue import MonthData, billable_tenants, billing, invoice_for

    period: str = args.period
    console = Console(stderr=True)
    documents = []
    with console.status(f"building the {period} report..."), billing(settings, batch=True) as context:
        month = MonthData.load(context.client, period)
        for tenant in billable_tenants(context, period, month):
            documents.append(invoice_for(context, tenant, period, prefetched=month).to_document())
        spend = [day for day in daily_spend(context.client) if f"{day.day:%Y-%m}" == period]
        tenants = load_tenants(settings.tenants)
        result = evaluate(context.client, tenants)
        # Crossings and evictions (refusals are the extender's answers: not stored).
        enforcement = enforcement_series(context.client, tenants)
        insights = None if result.at is None else InsightsView(
            at=result.at, forecasts=result.forecasts, idle=result.idle)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    report = write_report(args.out, spend, documents, generated, insights, enforcement)
    if not documents:
        console.print(f"no usage in {period}: the report is empty")
    print(f"finance report for {period}: {report} ({len(documents)} invoices, CSVs beside it)")
    return 0
