"""`gpumeter invoice`: invoices from ClickHouse, one tenant or all; `gpumeter invoice close`
issues a month's invoices through the ledger."""

from __future__ import annotations

import argparse
import sys

from gpumeter.app.cli.errors import UsageError
from gpumeter.core.settings import Settings


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
