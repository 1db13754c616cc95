"""`gpumeter up` / `down` / `status`: the local Kafka broker(s) and ClickHouse server."""

from __future__ import annotations

import argparse
import json

from gpumeter.app.cli.arguments import positive_int
from gpumeter.core.settings import Settings

MAX_BROKERS = 9


def up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--brokers", type=positive_int, default=None,
        help=f"KRaft nodes (broker + controller) to run, 1-{MAX_BROKERS}; topics are replicated "
             "min(3, N) times with min ISR min(2, N) (default: as last started, else 1)")


def status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def up(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.cli.errors import UsageError
    from gpumeter.app.runtime import services

    if args.brokers is not None and args.brokers > MAX_BROKERS:
        raise UsageError(f"--brokers {args.brokers}: at most {MAX_BROKERS} local nodes")
    for line in services.up(settings, brokers=args.brokers) or ["already running"]:
        print(line)
    args.json = False
    return status(settings, args)


def down(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.runtime import services

    for line in services.down(settings) or ["nothing was running"]:
        print(line)
    return 0


def status(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.runtime import services

    if args.json:
        print(json.dumps(services.status_document(settings)))
        return 0
    report = services.status(settings)
    width = max(len(key) for key in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    return 0
