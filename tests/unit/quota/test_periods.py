"""Quota period keys: UTC months and days, boundaries, bad keys."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from quota.periods import PeriodKind, in_period, period_end, period_key, period_kind, period_start
from tests.unit.quota.builders import ts


@pytest.mark.parametrize(
    ("moment", "period", "expected"),
    [
        pytest.param("2026-11-10T12:00:00Z", "month", "2026-11", id="month-mid"),
        pytest.param("2026-11-10T12:00:00Z", "day", "2026-11-10", id="day-mid"),
        pytest.param("2026-11-30T23:59:59.999999Z", "month", "2026-11", id="month-last-microsecond"),
        pytest.param("2026-12-01T00:00:00Z", "month", "2026-12", id="month-first-instant"),
        # 01:00 at +02:00 is 23:00 UTC the day (and month) before.
        pytest.param("2026-12-01T01:00:00+02:00", "month", "2026-11", id="offset-east-previous-month"),
        pytest.param("2026-12-01T01:00:00+02:00", "day", "2026-11-30", id="offset-east-previous-day"),
        pytest.param("2026-11-30T22:00:00-03:00", "day", "2026-12-01", id="offset-west-next-day"),
        pytest.param("2028-02-29T10:00:00Z", "day", "2028-02-29", id="leap-day"),
        pytest.param("1970-01-01T00:00:00Z", "month", "1970-01", id="epoch"),
    ],
)
def test_period_key(moment: str, period: PeriodKind, expected: str) -> None:
    assert period_key(ts(moment), period) == expected


@pytest.mark.parametrize(
    ("key", "kind", "start", "end"),
    [
        pytest.param("2026-11", "month", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", id="november"),
        pytest.param("2026-12", "month", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", id="december-wraps"),
        pytest.param("2028-02", "month", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", id="leap-february"),
        pytest.param("2026-11-30", "day", "2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z", id="day-month-end"),
        pytest.param("2026-12-31", "day", "2026-12-31T00:00:00Z", "2027-01-01T00:00:00Z", id="day-year-end"),
        pytest.param("2028-02-29", "day", "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z", id="leap-day"),
    ],
)
def test_period_bounds(key: str, kind: PeriodKind, start: str, end: str) -> None:
    assert period_kind(key) == kind
    assert period_start(key) == ts(start)
    assert period_end(key) == ts(end)
    assert period_start(key).tzinfo is UTC


@pytest.mark.parametrize(
    ("key", "moment", "inside"),
    [
        pytest.param("2026-11", "2026-11-01T00:00:00Z", True, id="start-inclusive"),
        pytest.param("2026-11", "2026-12-01T00:00:00Z", False, id="end-exclusive"),
        pytest.param("2026-11", "2026-12-01T00:30:00+01:00", True, id="offset-converted"),
        pytest.param("2026-11-10", "2026-11-10T23:59:59Z", True, id="day-last-second"),
        pytest.param("2026-11-10", "2026-11-09T23:59:59Z", False, id="day-before"),
    ],
)
def test_in_period(key: str, moment: str, inside: bool) -> None:
    assert in_period(key, ts(moment)) is inside


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("2026-13", id="month-13"),
        pytest.param("2026-02-30", id="february-30"),
        pytest.param("2026-1", id="unpadded"),
        pytest.param("2026/11", id="slash"),
        pytest.param("2026-11-10T00", id="with-time"),
        pytest.param("", id="empty"),
    ],
)
def test_bad_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        period_start(key)


def test_naive_moment_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        period_key(datetime(2026, 11, 10), "month")


def test_unknown_period_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        period_key(ts("2026-11-10T00:00:00Z"), "week")  # type: ignore[arg-type]
