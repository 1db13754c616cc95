"""`gpumeter reconcile --period YYYY-MM`: prove invoices = rated usage = the stored samples.

Exit 0 with a summary table; exit 1 naming each tenant and line that differs with both figures.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from gpumeter.app.cli.arguments import yyyy_mm
from gpumeter.app.cli.errors import Failure
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--period", type=yyyy_mm, required=True, help="YYYY-MM (UTC)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.core.money import format_money, format_quantity
    from pricing.issue import billing
    from pricing.reconcile import reconcile

    with billing(settings, batch=True) as context:
        report = reconcile(context.client, context.cards, args.period)
    console = Console(highlight=False, width=160)
    table = Table("tenant", "lines", "samples", "invoiced unit-h", "rated unit-h", "re-rated unit-h",
                  "amount", "invoices", "ok", title=f"reconciliation {report.period}", title_justify="left")
    for summary in report.tenants:
        issued = ", ".join(summary.invoices) if summary.invoices else "draft"
        table.add_row(summary.tenant, str(summary.lines), str(summary.samples),
                      format_quantity(summary.invoiced), format_quantity(summary.rated),
                      format_quantity(summary.rerated), format_money(summary.amount), issued,
                      "yes" if not summary.differences else f"NO ({summary.differences})")
    console.print(table)
    if report.differences:
        for difference in report.differences:
            console.print(f"DIFFERS {difference}", soft_wrap=True)
        raise Failure(f"reconcile {report.period}: {len(report.differences)} difference(s); "
                      f"first: {report.differences[0]}")
    console.print(f"reconciled {report.period}: {len(report.tenants)} tenant(s), {report.samples} stored "
                  f"sample(s) re-rated, {report.ledger_rows} ledger row(s) intact, nothing billed and "
                  "dead-lettered", soft_wrap=True)
    return 0
