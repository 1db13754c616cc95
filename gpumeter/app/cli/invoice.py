"""`gpumeter invoice`: invoices from ClickHouse, one tenant or all; `gpumeter invoice close`
issues a month's invoices through the ledger."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpumeter.app.cli.arguments import yyyy_mm
from gpumeter.app.cli.errors import UsageError
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # An optional verb, so every `gpumeter invoice --tenant ...` form parses as before.
    parser.add_argument("action", nargs="?", choices=["close"],
                        help="close: issue every tenant's invoice of an ended month (numbered, stored, "
                             "never changed; later usage becomes numbered adjustments)")
    who = parser.add_mutually_exclusive_group()  # required unless `close`: checked by run()
    who.add_argument("--tenant")
    who.add_argument("--all-tenants", action="store_true")
    parser.add_argument("--period", type=yyyy_mm, required=True, help="YYYY-MM (UTC)")
    parser.add_argument("--format", choices=["csv", "json", "pdf"], default="json")
    parser.add_argument("--paper", choices=["A4", "Letter"], default="A4", help="PDF page size")
    parser.add_argument("--out", type=Path, default=Path("gpumeter-out"))
    parser.add_argument("--finalize", action="store_true",
                        help="issue the invoice: it is stored and never changes; later usage "
                             "of the month goes on an adjustment invoice")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from pricing.issue import MonthOpen

    try:
        if args.action == "close":
            return _close(settings, args)
        return _invoice(settings, args)
    except MonthOpen as exc:
        raise UsageError(str(exc)) from None


def _invoice(settings: Settings, args: argparse.Namespace) -> int:
    from pricing.issue import issue_invoices

    if not args.tenant and not args.all_tenants:
        raise UsageError("one of the arguments --tenant --all-tenants is required")
    written = issue_invoices(settings, args.period, None if args.all_tenants else args.tenant,
                             args.format, args.out, finalize=args.finalize, paper=args.paper)
    for path in written:
        print(path)
    if not written:
        print(f"no usage in {args.period}", file=sys.stderr)
    return 0


def _close(settings: Settings, args: argparse.Namespace) -> int:
    from pricing.issue import close_month

    if args.tenant or args.all_tenants or args.finalize:
        raise UsageError("`invoice close` issues every tenant's invoices: "
                         "drop --tenant, --all-tenants and --finalize")
    issued = close_month(settings, args.period, args.format, args.out, args.paper)
    for entry, path in issued:
        invoice = entry.invoice
        print(f"{entry.number} {invoice.status} {invoice.tenant} {invoice.currency} {invoice.total} "
              f"sha256:{entry.content_sha256} {path}")
    print(f"closed {args.period}: {len(issued)} invoice(s) issued by this run")
    return 0
