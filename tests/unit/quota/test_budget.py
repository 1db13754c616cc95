"""quota.budget: a tenant's budget lines (limit, grants, used, remaining, runway). Every expected
value is worked out by hand in the comments (hours unless the metric is spend)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from gpumeter.core.grants import Grant
from gpumeter.core.tenants import TenantPolicy
from quota.budget import ExhaustionForecast, budget_view, hours_by_key
from tests.unit.quota.builders import policy, ts

D = Decimal
AT = ts("2026-11-16T00:00:00Z")  # 15 days = 360 h into November, 360 h left


def table_grant(key: str, amount: str, effective: str, rollover: bool = False) -> Grant:
    return Grant.model_validate({"key": key, "metric": "gpu_hours", "amount": amount,
                                 "effective_at": effective, "rollover": rollover})


def with_grants(**fields: object) -> TenantPolicy:
    return policy(gpu_hours="100", grants=[
        # October's rollover grant: October used 110 of base 100, so 10 of its 20 are unused.
        {"id": "q4", "metric": "gpu_hours", "amount": "20", "effective_at": "2026-10-05T00:00:00Z",
         "rollover": True}], **fields)


def test_limit_is_base_plus_grants_and_carries_with_a_run_rate_runway() -> None:
    tenant = with_grants()
    grants = [table_grant("#1", "50", "2026-11-10T00:00:00Z"),
              table_grant("#2", "70", "2026-09-01T00:00:00Z")]  # September's: counts nothing now
    [line] = budget_view(tenant, grants, AT, {"gpu_hours": D(90)}, {"gpu_hours": D(110)})
    # carry(q4) = min(20, max(0, 100 + 20 - 110)) = 10; limit = 100 + 50 + 10 = 160
    assert (line.metric, line.gpu_model, line.period) == ("gpu_hours", None, "2026-11")
    assert line.base_limit == D(100) and line.limit == D(160) and line.granted == D(60)
    assert [(g.key, g.amount, g.granted, g.carried) for g in line.grants] == [
        ("file:q4", D(10), D(20), True), ("#1", D(50), D(50), False)]
    assert line.used == D(90) and line.remaining == D(70)
    # 90 h in 360 h: 0.25 h an hour; 70 / 0.25 = 280 h < 360 h left -> Nov 27 16:00
    assert line.runway.source == "run-rate" and not line.runway.exhausted
    assert line.runway.hours == D("280.0") and line.runway.until == ts("2026-11-27T16:00:00Z")
    assert line.runway.text() == "280.0 h (at the current rate)"


def test_a_forecast_that_beat_the_run_rate_against_the_effective_limit_gives_the_runway() -> None:
    tenant = with_grants()
    grants = [table_grant("#1", "50", "2026-11-10T00:00:00Z")]
    forecast = ExhaustionForecast(True, "holt-winters", "2026-11", D(160), ts("2026-11-20T12:00:00Z"))
    [line] = budget_view(tenant, grants, AT, {"gpu_hours": D(90)}, {"gpu_hours": D(110)},
                         forecasts={"gpu_hours": forecast})
    # Nov 16 00:00 -> Nov 20 12:00 = 4.5 days = 108 h
    assert line.runway.source == "forecast" and line.runway.hours == D("108.0")
    assert line.runway.until == ts("2026-11-20T12:00:00Z")
    # Not reached in the period, by the forecast:
    never = ExhaustionForecast(True, "holt-winters", "2026-11", D(160), None)
    [line] = budget_view(tenant, grants, AT, {"gpu_hours": D(90)}, {"gpu_hours": D(110)},
                         forecasts={"gpu_hours": never})
    assert line.runway.hours is None and line.runway.text() == "beyond the period (forecast)"


def test_a_forecast_against_another_limit_or_that_lost_to_the_run_rate_is_not_used() -> None:
    tenant = with_grants()
    grants = [table_grant("#1", "50", "2026-11-10T00:00:00Z")]
    stale = ExhaustionForecast(True, "holt-winters", "2026-11", D(100), ts("2026-11-17T00:00:00Z"))
    lost = ExhaustionForecast(False, "run-rate", "2026-11", D(160), ts("2026-11-17T00:00:00Z"))
    october = ExhaustionForecast(True, "holt-winters", "2026-10", D(160), ts("2026-11-17T00:00:00Z"))
    for forecast in (stale, lost, october):
        [line] = budget_view(tenant, grants, AT, {"gpu_hours": D(90)}, {"gpu_hours": D(110)},
                             forecasts={"gpu_hours": forecast})
        assert line.runway.source == "run-rate" and line.runway.hours == D("280.0"), forecast


def test_exhausted_no_use_and_beyond_the_period() -> None:
    tenant = with_grants()
    [spent] = budget_view(tenant, [], AT, {"gpu_hours": D(110)}, {"gpu_hours": D(110)})
    # limit 100 + carry 10 = 110, used 110: nothing remains
    assert spent.remaining == D(0) and spent.runway.exhausted and spent.runway.text() == "exhausted"
    [idle] = budget_view(tenant, [], AT, {}, {"gpu_hours": D(110)})
    assert idle.used == D(0) and idle.runway.hours is None
    # 10 h in 360 h; 100 left lasts 100 x 36 = 3600 h, past the 360 h left
    [slow] = budget_view(tenant, [], AT, {"gpu_hours": D(10)}, {"gpu_hours": D(110)})
    assert slow.runway.hours is None and slow.runway.text() == "beyond the period (at the current rate)"


def test_spend_is_money_and_each_metric_has_its_line() -> None:
    tenant = policy(gpu_hours="100", spend="1000.00")
    lines = budget_view(tenant, [], AT, {"gpu_hours": D(0), "spend": D("800.00")}, {})
    assert [line.metric for line in lines] == ["gpu_hours", "spend"]
    spend = lines[1]
    # 800.00 in 360 h; 200.00 left: 200 x 360 / 800 = 90 h
    assert spend.limit == D("1000.00") and spend.remaining == D("200.00")
    assert spend.runway.hours == D("90.0") and spend.runway.until == AT + timedelta(hours=90)


def test_per_model_keys_have_their_own_lines_without_grants() -> None:
    tenant = policy(gpu_hours="100", gpu_hours_by_model={"H100-SXM-80GB": "40", "A100-": "7"})
    by_key = hours_by_key(tenant, {"H100-SXM-80GB": D(12), "A100-SXM-40GB": D(5), "A100-PCIE-40GB": D("1.5"),
                                   "L40S-48GB": D(7)})
    # L40S matches no key (it counts tenant-wide only)
    assert by_key == {"H100-SXM-80GB": D(12), "A100-": D("6.5")}
    grants = [table_grant("#1", "50", "2026-11-10T00:00:00Z")]
    lines = budget_view(tenant, grants, AT, {"gpu_hours": D("25.5")}, {}, used_by_model=by_key)
    assert [(line.gpu_model, line.limit, line.granted) for line in lines] == [
        (None, D(150), D(50)), ("A100-", D(7), D(0)), ("H100-SXM-80GB", D(40), D(0))]
    a100 = lines[1]
    # 6.5 h in 360 h, 0.5 left: 0.5 x 360 / 6.5 = 27.69... -> 27.7 h
    assert a100.remaining == D("0.5") and a100.runway.hours == D("27.7")
    # H100: 28 left x 360 / 12 = 840 h, past the period
    assert lines[2].runway.hours is None


def test_a_daily_period_runs_out_within_its_day() -> None:
    tenant = policy(period="day", gpu_hours="24")
    at = ts("2026-11-16T06:00:00Z")
    [line] = budget_view(tenant, [], at, {"gpu_hours": D(12)}, {})
    # 12 h in 6 h: 2 an hour; 12 left -> 6 h, before the day ends (18 h left)
    assert line.period == "2026-11-16" and line.runway.hours == D("6.0")
    assert line.runway.until == ts("2026-11-16T12:00:00Z")
