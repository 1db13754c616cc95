"""The simulated fleet's usage rhythm: how job arrivals swing over the day and the week and grow.

Real GPU clusters are busiest in working hours, quieter at night and at weekends, and grow week
over week; the forecasts (insights/forecast.py) need that shape to have something to learn. The
fleet multiplies every tenant's Poisson arrival rate by :func:`arrival_factor`. Jobs run for
minutes to hours, so GPU-hours follow the arrivals with a lag and smoothed.

The factors average 1 over a week at the fleet's start, so a fleet's mean load stays what its
tenants' ``arrivals_per_hour`` say; growth compounds from the fleet's start.
"""

from __future__ import annotations

import math
from datetime import datetime

# Peak-to-trough of the daily swing around the mean, peak at 15:00 UTC, trough at 03:00.
DAILY_AMPLITUDE = 0.35
DAILY_PEAK_HOUR = 15.0
# Monday .. Sunday: busy mid-week, quiet weekend; mean exactly 1.
WEEKDAY_FACTORS: tuple[float, ...] = (1.1, 1.15, 1.15, 1.1, 1.05, 0.75, 0.7)
# Compound growth of demand per week (about +3 % a week, +13 % a month).
WEEKLY_GROWTH = 0.03
_WEEK_SECONDS = 7 * 24 * 3600.0


def daily_factor(moment: datetime) -> float:
    hour = moment.hour + moment.minute / 60.0
    return 1.0 + DAILY_AMPLITUDE * math.cos(2.0 * math.pi * (hour - DAILY_PEAK_HOUR) / 24.0)


def weekly_factor(moment: datetime) -> float:
    return WEEKDAY_FACTORS[moment.weekday()]


def growth_factor(moment: datetime, origin: datetime) -> float:
    weeks = max(0.0, (moment - origin).total_seconds() / _WEEK_SECONDS)
    return (1.0 + WEEKLY_GROWTH) ** weeks


def arrival_factor(moment: datetime, origin: datetime) -> float:
    """Multiplier of the arrival rate at ``moment`` for a fleet that started at ``origin`` (both UTC)."""
    return daily_factor(moment) * weekly_factor(moment) * growth_factor(moment, origin)
