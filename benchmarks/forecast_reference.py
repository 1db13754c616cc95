"""The forecasts as they were before issue 34, for comparison in the same run: statsmodels'
``ExponentialSmoothing`` fitted and simulated once per series and backtest fold, the backtest
summed hour by hour. Same rules (folds, choice, intervals) as insights/forecast.py, which now
fits every aligned series at once (insights/holt_winters.py)."""

from __future__ import annotations

import math
import warnings
from datetime import datetime

import numpy as np
from numpy.typing import NDArray

from insights.forecast import (
    ALPHA,
    BETA,
    DAY,
    FOLDS,
    GAMMA,
    HOUR,
    LEVEL,
    MIN_HISTORY_DAYS,
    PHI,
    SEASON_DAYS,
    SIMULATIONS,
    SPREAD,
    Backtest,
    Daily,
    Forecast,
    History,
    _daily_totals,
    _seasonal_naive,
    choose,
    day_start,
    fold_origins,
    forecast,
    futures,
    month_end,
    month_start,
)


def statsmodels_days(days: NDArray[np.float64], horizon: int, simulations: int,
                     seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Point forecast (horizon,) and simulated futures (horizon, simulations) of daily totals."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels notes about fixed parameters
        fitted = ExponentialSmoothing(
            days, trend="add", damped_trend=True, seasonal="add", seasonal_periods=SEASON_DAYS,
            initialization_method="heuristic",
        ).fit(smoothing_level=ALPHA, smoothing_trend=BETA, smoothing_seasonal=GAMMA, damping_trend=PHI,
              optimized=False)
        point = np.asarray(fitted.forecast(horizon), dtype=np.float64)
        paths = np.asarray(fitted.simulate(horizon, repetitions=simulations, error="add",
                                           random_errors="bootstrap", random_state=seed, anchor="end"),
                           dtype=np.float64).reshape(horizon, simulations)
    paths = point[:, None] + SPREAD * (paths - point[:, None])
    return np.clip(point, 0, None), np.clip(paths, 0, None)


def statsmodels_daily(history: History, origin: datetime, until: datetime, simulations: int,
                      seed: int = 0) -> Daily:
    days = _daily_totals(history.floats(origin), history.start.hour)
    if len(days) < MIN_HISTORY_DAYS:
        raise ValueError(f"Holt-Winters needs {MIN_HISTORY_DAYS} complete days, got {len(days)}")
    return statsmodels_days(days, max(1, math.ceil((until - day_start(origin)) / DAY)), simulations, seed)


def backtest(history: History, latest: datetime, folds: int = FOLDS, level: float = LEVEL,
             simulations: int = 200) -> Backtest:
    errors = {"model": 0.0, "run-rate": 0.0, "naive": 0.0}
    scale = 0.0
    covered = 0
    origins = fold_origins(history, latest, folds)
    for origin in origins:
        end = month_end(origin)
        hours = math.ceil((end - origin) / HOUR)
        mtd = float(history.total(month_start(origin), origin))
        truth = float(history.total(origin, end))
        hourly = history.floats(origin)
        model = futures(history, origin, end, "holt-winters",
                        daily=statsmodels_daily(history, origin, end, simulations))
        run_rate = futures(history, origin, end, "run-rate", 2)
        errors["model"] += abs(float(model.point.sum()) - truth)
        errors["run-rate"] += abs(float(run_rate.point.sum()) - truth)
        errors["naive"] += abs(_seasonal_naive(hourly, hours) - truth)
        scale += mtd + truth
        low, high = np.quantile(model.paths.sum(axis=0), [(1 - level) / 2, 1 - (1 - level) / 2])
        covered += int(low <= truth <= high)
    if not origins or scale <= 0:
        return Backtest(history.tenant, history.metric, len(origins), None, None, None, None)
    return Backtest(history.tenant, history.metric, len(origins), errors["model"] / scale,
                    errors["run-rate"] / scale, errors["naive"] / scale, covered / len(origins))


def forecast_tenant(history: History, origin: datetime) -> Forecast:
    result = backtest(history, origin) if (origin - history.start) / DAY > MIN_HISTORY_DAYS else None
    method, reason = choose(history, origin, result)
    daily = None
    if method == "holt-winters":
        daily = statsmodels_daily(history, origin, month_end(origin), SIMULATIONS)
    return forecast(history, origin, method, reason, backtest=result, daily=daily)
