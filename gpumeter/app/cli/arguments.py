"""What the commands' arguments share: the parser class (usage errors are one line, exit 2) and
the value types argparse checks (YYYY-MM, RFC 3339 with an offset, a positive number)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import NoReturn

from gpumeter.app.cli.errors import UsageError
from gpumeter.core.tenants import PERIOD_PATTERN

PERIOD = re.compile(PERIOD_PATTERN)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpumeter: error: {message}\n")


def yyyy_mm(value: str) -> str:
    if not PERIOD.match(value):
        raise argparse.ArgumentTypeError(f"period must be YYYY-MM, got {value!r}")
    return value


def aware_time(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an RFC 3339 time, got {value!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"the time needs an offset (e.g. Z), got {value!r}")
    return moment


def instant(flag: str, text: str) -> datetime:
    """``text``, the value of ``flag``, as an aware UTC time; a usage error naming the flag."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{flag}: not an RFC 3339 time: {text!r}") from None
    if moment.tzinfo is None:
        raise UsageError(f"{flag}: needs a UTC offset (e.g. Z): {text!r}")
    return moment.astimezone(UTC)


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def positive_int(value: str) -> int:
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return int(value)
