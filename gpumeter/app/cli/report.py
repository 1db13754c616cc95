"""`gpumeter report --period YYYY-MM --out DIR`: the offline finance report of one month.

The same document the demo writes (dashboards/finance_report.py): daily list spend per tenant
as a chart, the month's invoices (issued where the month is closed, drafts otherwise), the
forecasts, quota status and idle-GPU costs, the budgets (limit, grants, used and runway per
tenant and GPU model, dashboards/budget_report.py) and a CSV of every table in it. Read-only:
the insights are evaluated, not published.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from gpumeter.app.cli.arguments import yyyy_mm
from gpumeter.app.cli.errors import Failure
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--period", type=yyyy_mm, required=True, help="YYYY-MM (UTC)")
    parser.add_argument("--out", type=Path, default=Path("gpumeter-out"))


def run(settings: Settings, args: argparse.Namespace) -> int:
    from dashboards.budget_report import budgets, report_moment
    from dashboards.enforcement_report import enforcement_series
    from dashboards.finance_report import InsightsView, daily_spend, write_report
    from dashboards.insights_job import evaluate, read_grants
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
        try:
            grants = read_grants(context.client)
        except ValueError as exc:  # quota_grants rows that do not add up (quota.grants.fold)
            raise Failure(f"quota_grants: {exc}") from None
        result = evaluate(context.client, tenants, grants=grants, budget_lines=False)
        # Budgets as of the month's latest usage (its last instant once it is over).
        lines = budgets(context.client, tenants, grants, report_moment(period, result.at), result.forecasts)
        # Crossings and evictions (refusals are the extender's answers: not stored).
        enforcement = enforcement_series(context.client, tenants)
        insights = None if result.at is None else InsightsView(
            at=result.at, forecasts=result.forecasts, idle=result.idle)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    report = write_report(args.out, spend, documents, generated, insights, enforcement, lines)
    if not documents:
        console.print(f"no usage in {period}: the report is empty")
    print(f"finance report for {period}: {report} ({len(documents)} invoices, CSVs beside it)")
    return 0
