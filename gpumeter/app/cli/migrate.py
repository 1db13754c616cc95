"""`gpumeter migrate`: apply the ClickHouse migrations under the schema lock (contract 9)."""

from __future__ import annotations

import argparse

from gpumeter.app.cli.arguments import positive_number
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lock-timeout", type=positive_number, default=300.0, metavar="S",
                        help="wait this long for another `gpumeter migrate` to finish (default 300)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app import schema
    from gpumeter.infra import clickhouse

    # batch: a copy-and-exchange step of a fleet-sized table takes minutes (docs/capacity.md).
    client = clickhouse.connect(settings.clickhouse.connection_dsn(), batch=True)
    try:
        applied = schema.migrate(client, schema.topology(settings.clickhouse), lock_timeout=args.lock_timeout)
    finally:
        client.close()
    where = clickhouse.parse_dsn(settings.clickhouse.dsn).url
    print(f"applied {', '.join(applied)} to {where}" if applied else f"{where} is up to date")
    return 0
