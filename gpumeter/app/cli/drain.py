"""`gpumeter drain`: wait until everything published so far is rated and stored."""

from __future__ import annotations

import argparse

from gpumeter.app.cli.arguments import positive_number
from gpumeter.app.cli.errors import Failure
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=positive_number, default=300.0)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.drain import DrainTimeout, drain

    try:
        drain(settings, timeout=args.timeout)
    except DrainTimeout as exc:
        raise Failure(str(exc)) from None
    print("drained: everything published before this command started is rated and stored")
    return 0
