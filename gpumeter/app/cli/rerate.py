"""`gpumeter rerate --period YYYY-MM [--tenant T] [--dry-run]`: re-rate a stored month with the
rate cards now loaded (contract 3.2) and print, per tenant, the total before, after and the
difference; a tenant whose month has a final invoice gets a numbered adjustment instead.

Exit 2 for a month no card covers, stored rows the cards cannot rate, or a tenant with nothing
in the month (nothing is written then).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpumeter.app.cli.arguments import yyyy_mm
from gpumeter.app.cli.errors import UsageError
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--period", type=yyyy_mm, required=True, help="YYYY-MM (UTC)")
    parser.add_argument("--tenant", help="one tenant (default: every tenant of the month)")
    parser.add_argument("--dry-run", action="store_true", help="print the differences, write nothing")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.core.money import format_money
    from gpumeter.infra import clickhouse
    from pricing.issue import billing
    from pricing.rerate import RerateRefused, apply, prepare

    console = Console(highlight=False, width=160)
    with billing(settings, batch=True) as context:
        try:
            prepared = prepare(context, args.period, args.tenant)
        except RerateRefused as exc:
            raise UsageError(str(exc)) from None
        verb = "reading (dry run)" if args.dry_run else "re-rating"
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(f"{verb} {args.period}", total=prepared.rows)
            dsn = settings.clickhouse.connection_dsn()
            result = apply(context, prepared, lambda: clickhouse.connect(dsn, batch=True),
                           dry_run=args.dry_run, advance=lambda rows: progress.advance(task, rows))

    title = f"rerate {result.period}" + (" (dry run: nothing written)" if result.dry_run else "")
    table = Table("tenant", "rows re-rated", "invoice", "currency", "total before", "total after",
                  "difference", "list cost before", "list cost after", "adjustment", title=title,
                  title_justify="left")
    for change in result.tenants:
        difference = change.difference
        table.add_row(
            change.tenant, str(change.rows), "billed" if change.invoiced else "draft", change.currency,
            "unpriced" if change.total_before is None else format_money(change.total_before),
            format_money(change.total_after),
            "-" if difference is None else _signed(format_money(difference)),
            format_money(change.list_cost_before), format_money(change.list_cost_after),
            change.adjustment or ("due" if result.dry_run and change.invoiced and difference else "-"),
        )
    console.print(table)
    issued = sum(1 for change in result.tenants if change.adjustment)
    done = "would re-rate" if result.dry_run else "re-rated"
    console.print(f"{done} {result.period}: {result.rows} row(s) in {result.chunks} chunk(s), "
                  f"{len(result.tenants)} tenant(s), {issued} adjustment(s) issued", soft_wrap=True)
    return 0


def _signed(text: str) -> str:
    return text if text.startswith("-") else f"+{text}"
