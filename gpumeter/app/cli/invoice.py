"""`gpumeter invoice`: invoices from ClickHouse, one tenant or all."""

from __future__ import annotations

import argparse
import sys

from gpumeter.app.cli.errors import UsageError
from gpumeter.core.settings import Settings


def run(settings: Settings, args: argparse.Namespace) -> int:
    from pricing.issue import issue_invoices

    if args.format == "pdf":
        raise UsageError("PDF invoices are not available yet; use --format json or csv")
    written = issue_invoices(settings, args.period, None if args.all_tenants else args.tenant,
                             args.format, args.out, finalize=args.finalize)
    for path in written:
        print(path)
    if not written:
        print(f"no usage in {args.period}", file=sys.stderr)
    return 0
