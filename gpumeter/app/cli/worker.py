"""`gpumeter worker`: the stream processors (rating, sink, dead letters)."""

from __future__ import annotations

import argparse

from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loglevel", default="warn", choices=["debug", "info", "warn", "error"])


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app import schema
    from gpumeter.infra import clickhouse
    from streams.app import run_worker

    # Migrations are `gpumeter migrate`'s, under its lock (`gpumeter up` and the demo run it for
    # the local runtime): a worker never changes the schema, it only refuses one that is behind.
    client = clickhouse.connect(settings.clickhouse.connection_dsn(), create_database=False)
    try:
        schema.require_current(client, clickhouse.parse_dsn(settings.clickhouse.dsn).url)
    finally:
        client.close()
    run_worker(settings, loglevel=args.loglevel)
    return 0
