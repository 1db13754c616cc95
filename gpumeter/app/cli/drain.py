"""`gpumeter drain`: wait until everything published so far is rated and stored."""

from __future__ import annotations

import argparse

from gpumeter.app.cli.errors import Failure
from gpumeter.core.settings import Settings


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.drain import DrainTimeout, drain

    try:
        drain(settings, timeout=args.timeout)
    except DrainTimeout as exc:
        raise Failure(str(exc)) from None
    print("drained: everything published before this command started is rated and stored")
    return 0
