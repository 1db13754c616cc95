"""Forecasts: exact answers on series whose future is certain, and backtests on the simulated fleet
(seeds not used to choose the model's weights): over >= 8 weekly folds per series, Holt-Winters'
month-end WAPE is below the run rate's, and its 80 % intervals cover the truth about 80 % of the
time."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from insights.forecast import (
    FOLD_STEP,
    MIN_FOLDS,
    Backtest,
    History,
    Method,
    Metric,
    QuotaLimit,
    backtest,
    choose,
    fold_origins,
    forecast,
    forecast_tenant,
    summarize,
)
from testkit.usage_history import fleet_histories

NOV = datetime(2026, 11, 1, tzinfo=UTC)


def flat(per_hour: str, days: int, start: datetime = NOV, metric: Metric = "spend") -> History:
    return History("team-a", metric, start, (Decimal(per_hour),) * (days * 24))


def test_a_steady_tenant_lands_where_its_rate_says_with_no_doubt() -> None:
    history = flat("2", days=21)
    origin = NOV + timedelta(days=21)
    methods: tuple[Method, ...] = ("run-rate", "holt-winters")
    for method in methods:
        result = forecast(history, origin, method, "test")
        assert result.period == "2026-11" and result.month_to_date == Decimal("1008.00")  # 504 h x 2
        # 1008 so far + 216 hours left x 2
        assert result.month_end == Decimal("1440.00"), method
        assert result.month_end_low == result.month_end_high == Decimal("1440.00"), method
    with pytest.raises(ValueError, match="14 complete days"):
        forecast(flat("2", days=10), NOV + timedelta(days=10), "holt-winters", "test")


def test_quota_exhaustion_time_on_a_steady_tenant() -> None:
    history = flat("2", days=10)
    origin = NOV + timedelta(days=10)
    ahead = forecast(history, origin, "run-rate", "t", quota=QuotaLimit("month", Decimal(1000)))
    # 480 used, 520 to go at 2 per hour: 260 hours after the origin, on every simulated path
    assert ahead.quota_used == Decimal("480.00") and ahead.exhaust_probability == 1
    assert ahead.exhaust_at == ahead.exhaust_early == ahead.exhaust_late == origin + timedelta(hours=260)
    reached = forecast(history, origin, "run-rate", "t", quota=QuotaLimit("month", Decimal(400)))
    # already over: the hour the running total reached 400 (the 200th hour of the month)
    assert reached.exhaust_at == NOV + timedelta(hours=200) and reached.exhaust_probability == 1
    never = forecast(history, origin, "run-rate", "t", quota=QuotaLimit("month", Decimal(10**6)))
    assert never.exhaust_at is None and never.exhaust_late is None and never.exhaust_probability == 0


def test_daily_quotas_count_today_only() -> None:
    history = flat("2", days=10, metric="gpu_hours")
    origin = NOV + timedelta(days=9, hours=10)  # 20 GPU-hours used today
    result = forecast(history, origin, "run-rate", "t", quota=QuotaLimit("day", Decimal(30)))
    assert result.quota_used == Decimal("20.000000") and result.quota_period == "day"
    assert result.exhaust_at == origin + timedelta(hours=5)
    tomorrow_only = forecast(history, origin, "run-rate", "t", quota=QuotaLimit("day", Decimal(100)))
    assert tomorrow_only.exhaust_at is None  # 48 a day never reaches 100 within a day


def test_the_hour_of_day_profile_places_the_rest_of_today() -> None:
    # 3 per hour from 08:00 to 19:59, nothing at night: 36 a day. Origin 12:00 on day 8.
    day = [Decimal(3) if 8 <= hour < 20 else Decimal(0) for hour in range(24)]
    history = History("team-a", "spend", NOV, tuple(day * 8 + day[:12]))
    origin = NOV + timedelta(days=8, hours=12)
    result = forecast(history, origin, "run-rate", "t", quota=QuotaLimit("month", Decimal(8 * 36 + 12 + 15)))
    # today so far 12, 15 more is 5 working hours: 17:00, not (as a flat rate would say) at 22:00
    assert result.exhaust_at == origin + timedelta(hours=5)
    assert result.month_end == Decimal(30 * 36)


def test_history_must_start_on_an_hour() -> None:
    with pytest.raises(ValueError):
        History("t", "spend", NOV + timedelta(minutes=5), ())


def test_folds_are_a_week_and_five_hours_apart_with_four_weeks_behind_and_their_month_complete() -> None:
    history = flat("1", days=120)
    latest = history.end
    origins = fold_origins(history, latest)
    assert len(origins) == 8
    assert all(a - b == FOLD_STEP for a, b in itertools.pairwise(origins))
    assert all(origin - NOV >= timedelta(days=28) for origin in origins)
    next_month = [(origin.replace(day=1) + timedelta(days=32)).replace(day=1, hour=0) for origin in origins]
    assert all(month <= latest for month in next_month)


def test_the_model_is_shipped_only_where_it_won() -> None:
    history = flat("1", days=120)
    origin = history.end
    won = Backtest("t", "spend", 8, 0.04, 0.05, 0.06, 0.8)
    lost = Backtest("t", "spend", 8, 0.06, 0.05, 0.06, 0.8)
    few = Backtest("t", "spend", MIN_FOLDS - 1, 0.01, 0.05, 0.06, 0.8)
    assert choose(history, origin, won)[0] == "holt-winters"
    assert choose(history, origin, lost) == (
        "run-rate", "Holt-Winters lost the backtest (WAPE 0.060 vs run rate 0.050)")
    assert choose(history, origin, few)[0] == "run-rate"
    assert choose(flat("1", days=5), NOV + timedelta(days=5), won)[0] == "run-rate"


@pytest.fixture(scope="module")
def fleet() -> list[History]:
    # 16 simulated weeks of two fleets whose seeds played no part in choosing the weights.
    return [history for seed in (5, 7) for history in fleet_histories(16, seed)]


@pytest.fixture(scope="module")
def backtests(fleet: list[History]) -> list[Backtest]:
    return [backtest(history, history.end) for history in fleet]


@pytest.mark.parametrize("metric", ["spend", "gpu_hours"])
def test_holt_winters_beats_the_run_rate_on_the_fleet_backtests(backtests: list[Backtest],
                                                                metric: str) -> None:
    scored = [b for b in backtests if b.metric == metric]
    assert all(b.folds >= 8 for b in scored)
    pooled = summarize(scored)
    assert pooled["wape_model"] is not None and pooled["wape_run_rate"] is not None
    assert pooled["wape_model"] < pooled["wape_run_rate"]
    assert pooled["wape_seasonal_naive"] is not None and pooled["wape_model"] < pooled["wape_seasonal_naive"]


def test_intervals_cover_the_truth_at_about_their_nominal_rate(backtests: list[Backtest]) -> None:
    pooled = summarize(backtests)
    # 160 folds at a true 80 %: 2.5 standard errors is +-0.08
    assert pooled["folds"] == 160
    assert pooled["coverage"] is not None and 0.70 <= pooled["coverage"] <= 0.90


def test_forecast_tenant_uses_holt_winters_exactly_where_it_won(fleet: list[History],
                                                                 backtests: list[Backtest]) -> None:
    for history, expected in list(zip(fleet, backtests, strict=True))[:4]:
        result = forecast_tenant(history, history.end)
        assert result.backtest == expected
        assert (result.model == "holt-winters") == expected.model_wins, result.reason
        assert result.month_end_low <= result.month_end <= result.month_end_high
        assert result.computed_at == history.end
