"""The vectorised Holt-Winters (insights/holt_winters.py) on series whose future is known, against
statsmodels (an independent implementation of the same model, which the forecasts used before),
and forecasts made in a batch against the same forecasts made one series at a time. The figures
of the tests on known series are worked out in their comments, not taken from the code."""

from __future__ import annotations

import warnings
from decimal import Decimal

import numpy as np
import pytest

from insights import holt_winters as hw
from insights.forecast import HOUR, WEIGHTS, History, Wanted, forecast_many, forecast_tenant
from testkit.usage_history import fleet_histories

WEEK = np.array([10.0, 12.0, 15.0, 14.0, 11.0, -30.0, -32.0])  # sums to zero: a pure weekly season


def test_a_weekly_season_around_a_level_is_recovered_and_continued_exactly() -> None:
    # 60, 80 and 5 plus the same weekday shape, 5 weeks each: a centred 7-day mean is the level
    # itself, so the initial states are exact, every one-step error is zero and nothing moves.
    levels = np.array([60.0, 80.0, 5.0])
    days = levels[:, None] + np.tile(WEEK, 5)[None, :]
    model = hw.fit(days, WEIGHTS, 7)
    assert np.allclose(model.residuals, 0, atol=1e-9)
    ahead = hw.point(model, 17)
    expected = levels[:, None] + WEEK[(35 + np.arange(17)) % 7][None, :]  # day 35 is weekday 0 again
    assert np.allclose(ahead, expected, atol=1e-9)
    # Without errors to draw every simulated path is that forecast.
    assert np.allclose(hw.simulate(model, 17, 5, seed=3), expected[:, :, None], atol=1e-9)


def test_a_straight_line_is_forecast_exactly_by_holts_method_with_full_weights() -> None:
    # alpha = beta = 1, no damping, no season: the level is the last value, the trend the last step.
    days = 3.0 + 2.5 * np.arange(30, dtype=np.float64)[None, :]
    model = hw.fit(days, hw.Weights(alpha=1.0, beta=1.0, gamma=0.0, phi=1.0), 7)
    assert np.allclose(hw.point(model, 10), 3.0 + 2.5 * np.arange(30, 40), atol=1e-9)


def test_too_short_a_history_is_refused() -> None:
    with pytest.raises(ValueError, match="16 days"):
        hw.fit(np.ones((1, 15)), WEIGHTS, 7)


def _statsmodels(series: np.ndarray, horizon: int, errors: np.ndarray) -> tuple[np.ndarray, ...]:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = ExponentialSmoothing(series, trend="add", damped_trend=True, seasonal="add",
                                      seasonal_periods=7, initialization_method="heuristic").fit(
            smoothing_level=WEIGHTS.alpha, smoothing_trend=WEIGHTS.beta, smoothing_seasonal=WEIGHTS.gamma,
            damping_trend=WEIGHTS.phi, optimized=False)
        paths = fitted.simulate(horizon, repetitions=errors.shape[1], error="add", random_errors=errors,
                                anchor="end")
        drawn = fitted.simulate(horizon, repetitions=7, error="add", random_errors="bootstrap",
                                random_state=5, anchor="end")
    return (np.asarray(fitted.resid), np.asarray(fitted.forecast(horizon)), np.asarray(paths),
            np.asarray(drawn).reshape(horizon, 7))


@pytest.mark.parametrize("length", [16, 19, 30, 77])
def test_fits_forecasts_and_simulations_are_statsmodels(length: int) -> None:
    rng = np.random.default_rng(length)
    t = np.arange(length)
    days = 200 + 1.5 * t + 25 * np.sin(2 * np.pi * t / 7) + rng.normal(0, 8, (4, length))
    errors = rng.normal(0, 6, (4, 24, 3))
    model = hw.fit(days, WEIGHTS, 7)
    ahead = hw.point(model, 24)
    paths = hw.paths(model, errors)
    bootstrapped = hw.simulate(model, 24, 7, seed=5)
    for n in range(4):
        residuals, forecast, simulated, drawn = _statsmodels(days[n], 24, errors[n])
        assert np.allclose(model.residuals[n], residuals, rtol=0, atol=1e-9)
        assert np.allclose(ahead[n], forecast, rtol=0, atol=1e-9)
        assert np.allclose(paths[n], simulated, rtol=0, atol=1e-9)
        # The same residuals drawn: statsmodels' seeded bootstrap, position for position.
        assert np.allclose(bootstrapped[n], drawn, rtol=0, atol=1e-9)


def test_simulated_errors_are_the_series_own_residuals_drawn_alike_for_every_series() -> None:
    rng = np.random.default_rng(9)
    days = 50 + rng.normal(0, 5, (3, 40))
    model = hw.fit(days, WEIGHTS, 7)
    together = hw.simulate(model, 12, 50, seed=0)
    alone = hw.simulate(hw.fit(days[1:2], WEIGHTS, 7), 12, 50, seed=0)
    assert np.allclose(together[1], alone[0], rtol=0, atol=1e-9)
    # Day 0's spread is exactly the residuals' (nothing else is random on the first day).
    first = together[:, 0, :] - hw.point(model, 1)
    assert all(set(np.round(first[n], 9)) <= set(np.round(model.residuals[n], 9)) for n in range(3))


def test_a_forecast_made_in_a_batch_is_the_forecast_made_alone() -> None:
    fleet = fleet_histories(16, 5)
    origin = fleet[0].end
    hours = 24 * 50 + 7  # another start and length, ending at the origin too: a group of its own
    shifted = History("late", "spend", origin - hours * HOUR,
                      tuple(Decimal(3 + (n % 24 > 8)) for n in range(hours)))
    batch = forecast_many([Wanted(h) for h in [*fleet, shifted]], origin)
    for history, together in zip([*fleet, shifted], batch, strict=True):
        alone = forecast_tenant(history, origin)
        assert together == alone  # every published figure (quantized Decimals, the model, the reason)
        # Backtest scores agree up to the order of floating-point sums (BLAS on other shapes).
        assert together.backtest is not None and alone.backtest is not None
        for name in ("wape_model", "wape_run_rate", "wape_seasonal_naive", "coverage"):
            assert getattr(together.backtest, name) == pytest.approx(getattr(alone.backtest, name), rel=1e-12)
