"""Holt-Winters (additive damped trend, additive season) for many daily series at once.

The same model, initialisation and simulation as statsmodels' ``ExponentialSmoothing(trend="add",
damped_trend=True, seasonal="add", initialization_method="heuristic")`` fitted with fixed
weights and ``simulate(error="add", random_errors="bootstrap", anchor="end")``, which the
forecasts used one series at a time (~20 ms per fit and simulation, eight backtest folds per
series). Here every array has the series as its first axis and the recursions loop over days
only, so a thousand tenants cost about what one did. tests/unit/insights/test_holt_winters.py
checks it against statsmodels and against series whose future is known.

Conventions kept from statsmodels (so that backtests and intervals are what they were):
- initial states: the seasons are the mean deviation of the first cycles (up to five) from
  their centred 7-day moving average, normalised to sum to zero; level and trend are the
  intercept and slope of a line through the first ten values of that moving average;
- the point forecast's season for the m-th day ahead (and every m days after it) is the season
  of the last observed day's weekday before that day's update (statsmodels' forecast), while
  simulated paths use the updated one;
- simulated errors are drawn with replacement from the in-sample one-step residuals; the
  trend moves by ``beta x error`` in a simulated step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Weights:
    alpha: float  # level
    beta: float  # trend
    gamma: float  # season
    phi: float  # damping


@dataclass(frozen=True)
class Fitted:
    """The states after the last observed day, per series (first axis)."""

    weights: Weights
    period: int
    level: Array  # (N,)
    trend: Array  # (N,) undamped
    seasons: Array  # (N, m): the seasons of the next m days, as simulation uses them
    point_seasons: Array  # (N, m): the same as the point forecast uses them
    residuals: Array  # (N, T) one-step in-sample errors


def initial_states(days: Array, period: int) -> tuple[Array, Array, Array]:
    """Heuristic initial level, trend (N,) and seasons (N, m) (Hyndman & Athanasopoulos 2.6)."""
    count, length = days.shape
    least = 10 + 2 * (period // 2)
    if length < 2 * period or length < least:
        raise ValueError(f"the heuristic initialisation needs {max(2 * period, least)} days, got {length}")
    cycles = max(min(5, length // period), math.ceil(least / period))
    used = min(cycles * period, length)
    series = days[:, :used]
    half = period // 2
    if period % 2:
        kernel = np.full(period, 1.0 / period)
    else:  # a 2 x m moving average for an even period
        kernel = np.convolve(np.full(period, 1.0 / period), [0.5, 0.5])
        half = len(kernel) // 2
    moving = np.array([np.convolve(row, kernel, mode="valid") for row in series])  # (N, used - 2 half)
    detrended = np.full((count, cycles * period), np.nan)
    detrended[:, half:half + moving.shape[1]] = series[:, half:half + moving.shape[1]] - moving
    seasons = np.nanmean(detrended.reshape(count, cycles, period), axis=1)
    seasons -= seasons.mean(axis=1, keepdims=True)
    if moving.shape[1] < 10:
        raise ValueError(f"the heuristic initialisation needs {least} days, got {length}")
    design = np.c_[np.ones(10), np.arange(10) + 1.0]
    line = np.linalg.pinv(design) @ moving[:, :10].T  # (2, N)
    return line[0], line[1], seasons


def fit(days: Array, weights: Weights, period: int) -> Fitted:
    """Run the smoothing recursions over ``days`` (N, T) from the heuristic initial states."""
    days = np.asarray(days, dtype=np.float64)
    count, length = days.shape
    alpha, beta, gamma, phi = weights.alpha, weights.beta, weights.gamma, weights.phi
    level, trend, initial = initial_states(days, period)
    # season[:, i] is the season of day i; day i's update sets the season of day i + m.
    season = np.empty((count, length + period))
    season[:, :period] = initial
    fitted = np.empty((count, length))
    for i in range(length):
        damped = phi * trend
        fitted[:, i] = level + damped + season[:, i]
        previous = level
        level = alpha * (days[:, i] - season[:, i]) + (1 - alpha) * (previous + damped)
        trend = beta * (level - previous) + (1 - beta) * damped
        season[:, i + period] = gamma * (days[:, i] - previous - damped) + (1 - gamma) * season[:, i]
    ahead = season[:, length:length + period]
    # statsmodels' forecast takes the m-th day's season from before the last day's update.
    point_seasons = np.concatenate([ahead[:, :period - 1], season[:, length - 1:length]], axis=1)
    return Fitted(weights, period, level, trend, ahead.copy(), point_seasons, days - fitted)


def point(model: Fitted, horizon: int) -> Array:
    """Point forecasts (N, horizon)."""
    phi = model.weights.phi
    reach = np.cumsum(phi ** np.arange(1, horizon + 1))
    season = model.point_seasons[:, np.arange(horizon) % model.period]
    return model.level[:, None] + model.trend[:, None] * reach[None, :] + season


def simulate(model: Fitted, horizon: int, simulations: int, seed: int) -> Array:
    """Simulated futures (N, horizon, simulations) with bootstrapped residuals.

    One draw of residual positions (from ``seed``) serves every series, so a series' paths do
    not depend on which other series share the batch.
    """
    # The positions statsmodels drew (``RandomState(seed).choice`` of the residuals), so that
    # intervals and their backtest coverage are the ones the forecasts had before.
    positions = np.random.RandomState(seed).randint(0, model.residuals.shape[1], size=(horizon, simulations))
    return paths(model, np.take(model.residuals, positions, axis=1))


def paths(model: Fitted, errors: Array) -> Array:
    """Futures (N, H, S) from the fitted states driven by ``errors`` (N, H, S).

    The model is linear in its errors with coefficients that do not depend on the series: a
    path is the path without errors plus the errors convolved with the impulse response (one
    matrix product for every series and simulation, instead of a recursion over days).
    """
    horizon = errors.shape[1]
    response = impulse_response(model.weights, model.period, horizon)
    steps = np.arange(horizon)
    lags = steps[:, None] - steps[None, :]
    mixing = np.where(lags >= 0, response[np.clip(lags, 0, None)], 0.0)  # (H, H) lower triangular
    return without_errors(model, horizon)[:, :, None] + np.matmul(mixing, errors)


def impulse_response(weights: Weights, period: int, horizon: int) -> Array:
    """How a unit error on day 0 moves days 0, 1, ... (1 on day 0)."""
    level = trend = 0.0
    seasons = np.zeros(period)
    response = np.empty(horizon)
    for t in range(horizon):
        error = 1.0 if t == 0 else 0.0
        damped = weights.phi * trend
        base = level + damped
        season = seasons[t % period]
        response[t] = base + season + error
        level = base + weights.alpha * error
        trend = damped + weights.beta * error
        seasons[t % period] = season + weights.gamma * error
    return response


def without_errors(model: Fitted, horizon: int) -> Array:
    """The simulation's path with every error zero (N, H): its seasons, not the point forecast's."""
    phi = model.weights.phi
    reach = np.cumsum(phi ** np.arange(1, horizon + 1))
    return model.level[:, None] + model.trend[:, None] * reach[None, :] + \
        model.seasons[:, np.arange(horizon) % model.period]
