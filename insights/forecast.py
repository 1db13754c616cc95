"""Forecasts per tenant: spend and GPU-hours to the end of the month, and when each quota limit will
be reached, with an interval. Pure: hourly history in, forecast values out.

Model
-----
Holt-Winters exponential smoothing (insights/holt_winters.py: statsmodels' ``ExponentialSmoothing``
recursions and simulation, vectorised over series): additive damped trend and additive
**weekly** seasonality on **daily** totals; the **daily** seasonality is the
hour-of-day profile of the last four weeks, which spreads each forecast day over its hours (for
the rest of today and for the hour a quota runs out). Month-end totals depend on daily totals,
which are far less noisy than hours; fitting hourly with a 168-hour season was slower and worse
on the backtests (benchmarks/insights_benchmark.py).

The smoothing weights are fixed (level 0.1, trend 0.02, season 0.05, damping 0.98) and the
initial states come from the first two weeks (statsmodels' heuristic initialisation). Fitting
the weights by least squares on a few weeks of noisy daily totals overfitted: it lost to the
run-rate baseline on the simulated fleet's backtests, where the fixed weights beat it.

Intervals come from 400 simulated futures (bootstrapped one-step residuals); a month-end
interval is the quantiles of the simulated month totals, an exhaustion interval the quantiles of
the simulated crossing times.

Baseline and the shipping rule
------------------------------
The run rate: the mean hourly rate of the last seven days times the hours left. Each tenant and
metric is backtested on weekly folds (origins 7 days 5 hours apart, so they visit every hour and
weekday; each fold forecasts from its origin to its month end and is scored by month-end WAPE).
The Holt-Winters forecast is used only where it has at least ``MIN_FOLDS`` folds and a lower WAPE
than the run rate; everywhere else the forecast is the run rate (with an interval from
resampled recent days), and the reason says why.

Many tenants at once
--------------------
``forecast_many`` backtests and forecasts a batch: series with the same start and length
(the insights job's, which all end at its origin) share their fold origins, so each fold is one
fit of every such series together (arrays with the series as first axis), and month totals are
taken per day with the hour-of-day shares as weights instead of hour by hour. A series' result
does not depend on its batch: the simulated errors are drawn by position from one seeded draw
that every series shares, as each statsmodels call used to reseed the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import cached_property
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from insights import holt_winters

Metric = Literal["spend", "gpu_hours"]
Method = Literal["holt-winters", "run-rate"]
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)

ALPHA, BETA, GAMMA, PHI = 0.1, 0.02, 0.05, 0.98
WEIGHTS = holt_winters.Weights(ALPHA, BETA, GAMMA, PHI)
SEASON_DAYS = 7
MIN_HISTORY_DAYS = 2 * SEASON_DAYS  # the heuristic initialisation needs two full weeks
PROFILE_DAYS = 28
RUN_RATE_HOURS = 168
FOLD_STEP = timedelta(days=7, hours=5)
# A fold's origin has at least four weeks behind it: with two or three weeks the initial states
# are barely estimated and the backtest would judge the start-up, not the model.
FOLD_HISTORY_DAYS = 28
FOLDS = 8
MIN_FOLDS = 4
SIMULATIONS = 400
# Residual bootstrap alone gave 80 % intervals that covered ~70-77 % of backtest folds (it ignores
# the uncertainty of the smoothed level and trend, and jobs span days); widening the simulated
# spread by this factor was chosen on fleets of seeds 11, 23, 37, 41 and checked on seeds 5, 7.
SPREAD = 1.2
LEVEL = 0.8
QUANTUM = {"spend": Decimal("0.01"), "gpu_hours": Decimal("0.000001")}
# Series fitted together at most (their simulated paths: series x days x simulations floats).
CHUNK = 256


@dataclass(frozen=True)
class History:
    """One tenant's metric per UTC hour: ``values[i]`` covers ``start + i hours``."""

    tenant: str
    metric: Metric
    start: datetime
    values: tuple[Decimal, ...]

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.start != floor_hour(self.start):
            raise ValueError("history must start on a UTC hour")

    @property
    def end(self) -> datetime:
        return self.start + len(self.values) * HOUR

    def index(self, moment: datetime) -> int:
        """Hours from the start to ``moment`` (clamped to the history)."""
        hours = math.floor((moment - self.start) / HOUR)
        return max(0, min(len(self.values), hours))

    def total(self, since: datetime, until: datetime) -> Decimal:
        return sum(self.values[self.index(since):self.index(until)], Decimal(0))

    @cached_property
    def _floats(self) -> NDArray[np.float64]:
        # The models work in floats; converted once per history, not once per backtest fold.
        return np.fromiter(map(float, self.values), dtype=np.float64, count=len(self.values))

    def floats(self, until: datetime) -> NDArray[np.float64]:
        return self._floats[:self.index(until)]


@dataclass(frozen=True)
class QuotaLimit:
    period: Literal["month", "day"]
    limit: Decimal


@dataclass(frozen=True)
class Backtest:
    tenant: str
    metric: Metric
    folds: int
    wape_model: float | None
    wape_run_rate: float | None
    wape_seasonal_naive: float | None
    coverage: float | None  # share of folds whose truth fell inside the model's interval

    @property
    def model_wins(self) -> bool:
        return (self.folds >= MIN_FOLDS and self.wape_model is not None and self.wape_run_rate is not None
                and self.wape_model < self.wape_run_rate)


@dataclass(frozen=True)
class Forecast:
    tenant: str
    metric: Metric
    period: str
    computed_at: datetime
    model: Method
    reason: str
    month_to_date: Decimal
    month_end: Decimal
    month_end_low: Decimal
    month_end_high: Decimal
    level: Decimal
    quota_period: str = ""
    quota_limit: Decimal | None = None
    quota_used: Decimal | None = None
    exhaust_at: datetime | None = None
    exhaust_early: datetime | None = None
    exhaust_late: datetime | None = None
    exhaust_probability: Decimal = Decimal(0)
    commitment: Decimal | None = None
    backtest: Backtest | None = field(default=None, compare=False)


# ---------------------------------------------------------------------------- calendar helpers


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def month_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_end(moment: datetime) -> datetime:
    start = month_start(moment)
    return (start + timedelta(days=32)).replace(day=1)


def day_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def period_bounds(period: Literal["month", "day"], moment: datetime) -> tuple[datetime, datetime]:
    if period == "day":
        start = day_start(moment)
        return start, start + DAY
    return month_start(moment), month_end(moment)


# ---------------------------------------------------------------------------- simulated futures


def hour_profile(hourly: NDArray[np.float64], first_hour: int) -> NDArray[np.float64]:
    """Share of a day's total in each UTC hour, from the last four complete days' worth of weeks.

    Complete days only: a partial day would weigh its hours twice as often as the others.
    Flat when there is no complete day or no usage.
    """
    return hour_profiles(hourly[None, :], first_hour)[0]


def hour_profiles(hourly: NDArray[np.float64], first_hour: int) -> NDArray[np.float64]:
    """``hour_profile`` of each row of ``hourly`` (N, hours)."""
    skip = (24 - first_hour) % 24
    whole = (hourly.shape[1] - skip) // 24
    if whole <= 0:
        return np.full((hourly.shape[0], 24), 1 / 24)
    days = hourly[:, skip:skip + whole * 24].reshape(hourly.shape[0], whole, 24)[:, -PROFILE_DAYS:]
    sums = days.sum(axis=1)
    total = sums.sum(axis=1, keepdims=True)
    return np.where(total > 0, sums / np.where(total > 0, total, 1.0), 1 / 24)


def _daily_totals(hourly: NDArray[np.float64], first_hour: int) -> NDArray[np.float64]:
    """Complete UTC days of ``hourly`` (which ends at a day boundary or inside the last day)."""
    return _daily_totals_many(hourly[None, :], first_hour)[0]


def _daily_totals_many(hourly: NDArray[np.float64], first_hour: int) -> NDArray[np.float64]:
    skip = (24 - first_hour) % 24
    whole = max(0, (hourly.shape[1] - skip) // 24)
    return hourly[:, skip:skip + whole * 24].reshape(hourly.shape[0], whole, 24).sum(axis=2)


def _holt_winters_days(days: NDArray[np.float64], horizon: int, simulations: int,
                       seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Point forecasts (N, horizon) and simulated futures (N, horizon, simulations) of daily
    totals, for daily series (N, T) fitted together."""
    model = holt_winters.fit(days, WEIGHTS, SEASON_DAYS)
    point = holt_winters.point(model, horizon)
    paths = holt_winters.simulate(model, horizon, simulations, seed)
    # Widen the simulated spread around the point forecast (see SPREAD).
    paths = point[:, :, None] + SPREAD * (paths - point[:, :, None])
    return np.clip(point, 0, None), np.clip(paths, 0, None)


def _run_rate_days(hourly: NDArray[np.float64], first_hour: int, horizon: int, simulations: int,
                   seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The run rate as daily totals, with futures from resampled recent days scaled to that rate."""
    rate = float(hourly[-RUN_RATE_HOURS:].mean()) if len(hourly) else 0.0
    point = np.full(horizon, rate * 24)
    days = _daily_totals(hourly, first_hour)[-PROFILE_DAYS:]
    if len(days) < 3 or days.mean() <= 0:
        return point, np.repeat(point[:, None], simulations, axis=1)
    rng = np.random.default_rng(seed)
    draws = rng.choice(days, size=(horizon, simulations), replace=True)
    return point, draws * (rate * 24 / days.mean())


@dataclass(frozen=True)
class Futures:
    """Hourly forecasts from ``origin``: point (H,) and simulated paths (H, simulations)."""

    origin: datetime
    point: NDArray[np.float64]
    paths: NDArray[np.float64]


Daily = tuple[NDArray[np.float64], NDArray[np.float64]]  # point (D,), paths (D, simulations)


def daily_futures(history: History, origin: datetime, until: datetime, method: Method,
                  simulations: int = SIMULATIONS, seed: int = 0) -> Daily:
    """Daily totals from the day of ``origin`` to the day of ``until``: point and simulated."""
    hourly = history.floats(origin)
    day_count = max(1, math.ceil((until - day_start(origin)) / DAY))
    if method == "run-rate":
        return _run_rate_days(hourly, history.start.hour, day_count, simulations, seed)
    days = _daily_totals(hourly, history.start.hour)
    if len(days) < MIN_HISTORY_DAYS:
        raise ValueError(f"Holt-Winters needs {MIN_HISTORY_DAYS} complete days of history, got {len(days)}")
    # The model sees complete days before today; today's own hours are in the history.
    point, paths = _holt_winters_days(days[None, :], day_count, simulations, seed)
    return point[0], paths[0]


def _hours_ahead(origin: datetime, until: datetime) -> NDArray[np.int64]:
    """Hours from ``origin`` to ``until`` as hour-of-day offsets from the start of origin's day."""
    return (origin - day_start(origin)) // HOUR + np.arange(max(0, math.ceil((until - origin) / HOUR)))


def day_weights(profile: NDArray[np.float64], offsets: NDArray[np.int64], days: int) -> NDArray[np.float64]:
    """Per series (rows of ``profile``) and day: the share of that day's total falling in the
    hours ``offsets``. A sum over those hours of daily totals x hour shares is then one product."""
    weights = np.zeros((profile.shape[0], days))
    if len(offsets):
        share = profile[:, offsets % 24]
        day_of = offsets // 24
        starts = np.flatnonzero(np.r_[True, day_of[1:] != day_of[:-1]])
        weights[:, day_of[starts]] = np.add.reduceat(share, starts, axis=1)
    return weights


def futures(history: History, origin: datetime, until: datetime, method: Method,
            simulations: int = SIMULATIONS, seed: int = 0, daily: Daily | None = None) -> Futures:
    """Hour-by-hour futures from ``origin`` (a UTC hour) to ``until`` from the history before it
    (``daily``: its daily futures, when they were computed with other series')."""
    hourly = history.floats(origin)
    point_days, path_days = daily if daily is not None else daily_futures(history, origin, until, method,
                                                                          simulations, seed)
    profile = hour_profile(hourly, history.start.hour) if len(hourly) else np.full(24, 1 / 24)
    offsets = _hours_ahead(origin, until)
    day_of = offsets // 24
    share = profile[offsets % 24]
    return Futures(origin, point_days[day_of] * share, path_days[day_of, :] * share[:, None])


# ---------------------------------------------------------------------------- forecasts


def _quantize(value: float | Decimal, metric: Metric) -> Decimal:
    return Decimal(str(value)).quantize(QUANTUM[metric], rounding=ROUND_HALF_UP)


def _crossing_hours(cumulative: NDArray[np.float64], need: float) -> NDArray[np.float64]:
    """Per path: hours from the origin until ``cumulative`` first reaches ``need`` (inf: never)."""
    reached = cumulative >= need
    first = np.where(reached.any(axis=0), reached.argmax(axis=0), -1)
    result = np.full(cumulative.shape[1], np.inf)
    for path in np.nonzero(first >= 0)[0]:
        hour = first[path]
        before = cumulative[hour - 1, path] if hour > 0 else 0.0
        step = cumulative[hour, path] - before
        fraction = (need - before) / step if step > 0 else 1.0
        result[path] = hour + fraction
    return result


def _when_reached(history: History, since: datetime, origin: datetime, limit: Decimal) -> datetime | None:
    """The hour in which the history's running total since ``since`` reached ``limit``."""
    total = Decimal(0)
    for index in range(history.index(since), history.index(origin)):
        total += history.values[index]
        if total >= limit:
            return history.start + (index + 1) * HOUR
    return None


def forecast(history: History, origin: datetime, method: Method, reason: str, *,
             quota: QuotaLimit | None = None, commitment: Decimal | None = None, level: float = LEVEL,
             simulations: int = SIMULATIONS, seed: int = 0, backtest: Backtest | None = None,
             daily: Daily | None = None) -> Forecast:
    """Month-end total and quota exhaustion for ``history`` as seen at ``origin`` (a UTC hour).

    ``daily``: the daily futures from origin's day to the end of the month and of the quota's
    period, when they were computed with other series' (forecast_many)."""
    origin = floor_hour(origin)
    start, end = month_start(origin), month_end(origin)
    mtd = history.total(start, origin)
    quota_start, quota_end = period_bounds(quota.period, origin) if quota else (start, end)
    horizon_end = max(end, quota_end)
    if daily is None:
        daily = daily_futures(history, origin, horizon_end, method, simulations, seed)
    hourly = history.floats(origin)
    profile = hour_profile(hourly, history.start.hour) if len(hourly) else np.full(24, 1 / 24)
    # The month's rest as daily totals weighted by the hours of each day it covers.
    weights = day_weights(profile[None, :], _hours_ahead(origin, end), len(daily[0]))[0]
    low_q, high_q = (1 - level) / 2, 1 - (1 - level) / 2
    totals = weights @ daily[1] + float(mtd)
    low, high = np.quantile(totals, [low_q, high_q]) if len(totals) else (float(mtd), float(mtd))
    point = float(mtd) + float(weights @ daily[0])
    result = Forecast(
        tenant=history.tenant, metric=history.metric, period=f"{origin:%Y-%m}", computed_at=origin,
        model=method, reason=reason, month_to_date=_quantize(mtd, history.metric),
        month_end=_quantize(point, history.metric), month_end_low=_quantize(min(low, point), history.metric),
        month_end_high=_quantize(max(high, point), history.metric), level=Decimal(str(level)),
        commitment=commitment, backtest=backtest,
    )
    if quota is None:
        return result
    used = history.total(quota_start, origin)
    fields: dict[str, object] = {"quota_period": quota.period, "quota_limit": quota.limit,
                                 "quota_used": _quantize(used, history.metric)}
    if used >= quota.limit:
        reached = _when_reached(history, quota_start, origin, quota.limit) or origin
        fields.update(exhaust_at=reached, exhaust_early=reached, exhaust_late=reached,
                      exhaust_probability=Decimal(1))
    else:
        period_hours = math.ceil((quota_end - origin) / HOUR)
        future = futures(history, origin, horizon_end, method, daily=daily)
        cumulative = np.cumsum(future.paths[:period_hours], axis=0)
        need = float(quota.limit - used)
        crossing = _crossing_hours(cumulative, need) if period_hours else np.array([np.inf])
        probability = float(np.isfinite(crossing).mean())
        # No interpolation: a quantile between a crossing and "never" (inf) is not a time.
        early, middle, late = np.quantile(crossing, [low_q, 0.5, high_q], method="inverted_cdf")

        def moment(hours: float) -> datetime | None:
            return origin + timedelta(hours=float(hours)) if math.isfinite(hours) else None

        fields.update(exhaust_at=moment(middle), exhaust_early=moment(early), exhaust_late=moment(late),
                      exhaust_probability=Decimal(str(round(probability, 4))))
    return replace(result, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- backtests


def fold_origins(history: History, latest: datetime, folds: int = FOLDS) -> list[datetime]:
    """Up to ``folds`` origins, newest first, each with four weeks of history and its month complete."""
    origins: list[datetime] = []
    origin = floor_hour(latest) - FOLD_STEP
    earliest = history.start + FOLD_HISTORY_DAYS * DAY
    while origin >= earliest and len(origins) < folds:
        if month_end(origin) <= min(latest, history.end):
            origins.append(origin)
        origin -= FOLD_STEP
    return origins


def _seasonal_naive(hourly: NDArray[np.float64], hours: int) -> float:
    """Last week's hours repeated."""
    week = hourly[-RUN_RATE_HOURS:]
    if not len(week):
        return 0.0
    return float(np.resize(week, hours).sum())


def backtest(history: History, latest: datetime, folds: int = FOLDS, level: float = LEVEL,
             simulations: int = 200) -> Backtest:
    """Month-end WAPE of Holt-Winters, the run rate and seasonal naive over weekly folds."""
    return backtest_many([history], latest, folds, level, simulations)[0]


def backtest_many(histories: Sequence[History], latest: datetime, folds: int = FOLDS, level: float = LEVEL,
                  simulations: int = 200) -> list[Backtest]:
    """``backtest`` of every history; those with the same start and length fitted together."""
    results: list[Backtest | None] = [None] * len(histories)
    for members in _aligned(histories):
        for first in range(0, len(members), CHUNK):
            part = members[first:first + CHUNK]
            found = _backtest_aligned([histories[i] for i in part], latest, folds, level, simulations)
            for index, result in zip(part, found, strict=True):
                results[index] = result
    return [result for result in results if result is not None]


def _aligned(histories: Sequence[History]) -> list[list[int]]:
    groups: dict[tuple[datetime, int], list[int]] = {}
    for index, history in enumerate(histories):
        groups.setdefault((history.start, len(history.values)), []).append(index)
    return list(groups.values())


def _backtest_aligned(histories: Sequence[History], latest: datetime, folds: int, level: float,
                      simulations: int) -> list[Backtest]:
    """Backtests of histories sharing start and length, hence fold origins: one fit per fold."""
    first = histories[0]
    origins = fold_origins(first, latest, folds)
    count = len(histories)
    values = np.stack([history.floats(history.end) for history in histories])
    running = np.concatenate([np.zeros((count, 1)), np.cumsum(values, axis=1)], axis=1)
    model_error, run_rate_error, naive_error = np.zeros(count), np.zeros(count), np.zeros(count)
    scale, covered = np.zeros(count), np.zeros(count)
    for origin in origins:
        end = month_end(origin)
        at = first.index(origin)
        hourly = values[:, :at]
        mtd = running[:, at] - running[:, first.index(month_start(origin))]
        truth = running[:, first.index(end)] - running[:, at]
        offsets = _hours_ahead(origin, end)
        day_count = max(1, math.ceil((end - day_start(origin)) / DAY))
        days = _daily_totals_many(hourly, first.start.hour)
        point, paths = _holt_winters_days(days, day_count, simulations, 0)
        weights = day_weights(hour_profiles(hourly, first.start.hour), offsets, day_count)
        week = hourly[:, -RUN_RATE_HOURS:]
        run_rate = week.mean(axis=1) * 24 * weights.sum(axis=1)
        # Last week's hours repeated (np.resize of the week to the hours left).
        cycles, rest = divmod(len(offsets), week.shape[1])
        naive = cycles * week.sum(axis=1) + week[:, :rest].sum(axis=1)
        model_error += np.abs((weights * point).sum(axis=1) - truth)
        run_rate_error += np.abs(run_rate - truth)
        naive_error += np.abs(naive - truth)
        scale += mtd + truth
        totals = np.einsum("nd,nds->ns", weights, paths)
        low, high = np.quantile(totals, [(1 - level) / 2, 1 - (1 - level) / 2], axis=1)
        covered += (low <= truth) & (truth <= high)
    results = []
    for n, history in enumerate(histories):
        if not origins or scale[n] <= 0:
            results.append(Backtest(history.tenant, history.metric, len(origins), None, None, None, None))
        else:
            results.append(Backtest(
                history.tenant, history.metric, len(origins), float(model_error[n] / scale[n]),
                float(run_rate_error[n] / scale[n]), float(naive_error[n] / scale[n]),
                float(covered[n] / len(origins))))
    return results


def choose(history: History, origin: datetime, result: Backtest | None) -> tuple[Method, str]:
    """Holt-Winters where it beat the run rate on backtests; the run rate otherwise, and why."""
    days = (floor_hour(origin) - history.start) / DAY
    if days < MIN_HISTORY_DAYS + 1:
        return "run-rate", f"{days:.1f} days of history (Holt-Winters needs {MIN_HISTORY_DAYS + 1})"
    if result is None or result.folds < MIN_FOLDS:
        folds = 0 if result is None else result.folds
        return "run-rate", f"{folds} backtest folds (needs {MIN_FOLDS})"
    if not result.model_wins:
        return "run-rate", (f"Holt-Winters lost the backtest (WAPE {result.wape_model:.3f} vs run rate "
                            f"{result.wape_run_rate:.3f})")
    return "holt-winters", (f"beat the run rate on {result.folds} folds (WAPE {result.wape_model:.3f} vs "
                            f"{result.wape_run_rate:.3f})")


@dataclass(frozen=True)
class Wanted:
    """A forecast to make: a history, and the quota and commitment it is measured against."""

    history: History
    quota: QuotaLimit | None = None
    commitment: Decimal | None = None


def forecast_tenant(history: History, origin: datetime, *, quota: QuotaLimit | None = None,
                    commitment: Decimal | None = None, folds: int = FOLDS) -> Forecast:
    """Backtest, choose the model, forecast."""
    return forecast_many([Wanted(history, quota, commitment)], origin, folds)[0]


def forecast_many(wanted: Sequence[Wanted], origin: datetime, folds: int = FOLDS) -> list[Forecast]:
    """``forecast_tenant`` of every wanted forecast, in order: backtests and Holt-Winters fits of
    histories with the same start and length made together."""
    eligible = [n for n, w in enumerate(wanted) if (origin - w.history.start) / DAY > MIN_HISTORY_DAYS]
    tests: list[Backtest | None] = [None] * len(wanted)
    for n, result in zip(eligible, backtest_many([wanted[n].history for n in eligible], origin, folds),
                         strict=True):
        tests[n] = result
    chosen = [choose(w.history, origin, tests[n]) for n, w in enumerate(wanted)]
    modelled = [n for n, (method, _) in enumerate(chosen) if method == "holt-winters"]
    daily = _holt_winters_many([wanted[n] for n in modelled], origin)
    by_index = dict(zip(modelled, daily, strict=True))
    return [forecast(w.history, origin, chosen[n][0], chosen[n][1], quota=w.quota, commitment=w.commitment,
                     backtest=tests[n], daily=by_index.get(n)) for n, w in enumerate(wanted)]


def _holt_winters_many(wanted: Sequence[Wanted], origin: datetime) -> list[Daily]:
    """Daily Holt-Winters futures of each wanted forecast (as daily_futures computes them)."""
    moment = floor_hour(origin)
    ends = []
    for w in wanted:
        start, end = period_bounds(w.quota.period, moment) if w.quota else (moment, month_end(moment))
        ends.append(max(month_end(moment), end))
    groups: dict[tuple[datetime, int, datetime], list[int]] = {}
    for n, w in enumerate(wanted):
        groups.setdefault((w.history.start, len(w.history.values), ends[n]), []).append(n)
    results: list[Daily | None] = [None] * len(wanted)
    for (start, _, until), members in groups.items():
        day_count = max(1, math.ceil((until - day_start(moment)) / DAY))
        for first in range(0, len(members), CHUNK):
            part = members[first:first + CHUNK]
            days = _daily_totals_many(np.stack([wanted[n].history.floats(moment) for n in part]), start.hour)
            if days.shape[1] < MIN_HISTORY_DAYS:
                raise ValueError(f"Holt-Winters needs {MIN_HISTORY_DAYS} complete days of history, "
                                 f"got {days.shape[1]}")
            point, paths = _holt_winters_days(days, day_count, SIMULATIONS, 0)
            for k, n in enumerate(part):
                results[n] = (point[k], paths[k])
    return [result for result in results if result is not None]


def summarize(backtests: Sequence[Backtest]) -> dict[str, float | int | None]:
    """Pooled comparison over tenants (folds-weighted means of WAPE and coverage)."""
    scored = [b for b in backtests if b.wape_model is not None and b.folds]
    if not scored:
        return {"series": 0, "folds": 0, "wape_model": None, "wape_run_rate": None,
                "wape_seasonal_naive": None, "coverage": None, "model_used": 0}
    weight = sum(b.folds for b in scored)

    def mean(values: Sequence[float | None]) -> float:
        return sum((v or 0.0) * b.folds for v, b in zip(values, scored, strict=True)) / weight

    return {
        "series": len(scored), "folds": weight,
        "wape_model": mean([b.wape_model for b in scored]),
        "wape_run_rate": mean([b.wape_run_rate for b in scored]),
        "wape_seasonal_naive": mean([b.wape_seasonal_naive for b in scored]),
        "coverage": mean([b.coverage for b in scored]),
        "model_used": sum(1 for b in scored if b.model_wins),
    }
