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

    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        schema.migrate(client)
    finally:
        client.close()
    run_worker(settings, loglevel=args.loglevel)
    return 0
