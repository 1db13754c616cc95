"""Quota periods (contract 4): a UTC calendar month "YYYY-MM" or UTC day "YYYY-MM-DD"."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Literal

PeriodKind = Literal["month", "day"]

_KEY = re.compile(r"^(\d{4})-(\d{2})(?:-(\d{2}))?$", re.ASCII)


def _utc(moment: datetime) -> datetime:
    # A naive time would silently be read as the host's local time: refuse it.
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a quota period needs an aware datetime, got naive {moment.isoformat()}")
    return moment.astimezone(UTC)


def period_key(moment: datetime, period: PeriodKind) -> str:
    """The UTC month ("2026-11") or UTC day ("2026-11-05") that ``moment`` falls in."""
    utc = _utc(moment)
    # Explicit padding: strftime("%Y") does not zero-pad years below 1000 on every platform.
    month = f"{utc.year:04d}-{utc.month:02d}"
    if period == "month":
        return month
    if period == "day":
        return f"{month}-{utc.day:02d}"
    raise ValueError(f"period must be 'month' or 'day', got {period!r}")


def period_kind(key: str) -> PeriodKind:
    """Whether ``key`` names a month or a day."""
    _parse(key)
    return "month" if len(key) == 7 else "day"


def period_start(key: str) -> datetime:
    """First instant of the period, UTC."""
    return _parse(key)


def period_end(key: str) -> datetime:
    """First instant after the period (exclusive end), UTC."""
    start = _parse(key)
    if len(key) == 10:
        return start + timedelta(days=1)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


def in_period(key: str, moment: datetime) -> bool:
    """period_start(key) <= moment < period_end(key)."""
    return period_start(key) <= _utc(moment) < period_end(key)


def _parse(key: str) -> datetime:
    match = _KEY.match(key)
    if match is None:
        raise ValueError(f"not a quota period key (YYYY-MM or YYYY-MM-DD): {key!r}")
    year, month, day = match.groups()
    try:
        return datetime(int(year), int(month), int(day or 1), tzinfo=UTC)
    except ValueError:
        raise ValueError(f"not a valid quota period: {key!r}") from None
