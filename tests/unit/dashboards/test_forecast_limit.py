"""The insights job forecasts against the effective limit (base + grants), the carry of a
rollover grant taken from the history's previous period (values worked out by hand)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from dashboards.insights_job import quota_for
from gpumeter.core.grants import Grant
from gpumeter.core.tenants import TenantsFile
from insights.forecast import History, QuotaLimit

POLICIES = TenantsFile.model_validate({"tenants": [{
    "tenant": "team-a", "gpu_hours": "40", "spend": "100.00",
    "grants": [{"id": "q4", "metric": "gpu_hours", "amount": "20", "effective_at": "2026-10-05T00:00:00Z",
                "rollover": True}]}]})
ORIGIN = datetime(2026, 11, 1, 10, tzinfo=UTC)
# Oct 20 00:00 onward: 55 hours of 1 GPU-hour, then nothing up to the origin.
START = datetime(2026, 10, 20, tzinfo=UTC)
HOURS = 12 * 24 + 10
HISTORY = History("team-a", "gpu_hours", START,
                  tuple(Decimal(1) if i < 55 else Decimal(0) for i in range(HOURS)))


def test_the_forecast_limit_is_base_plus_grants_and_carry() -> None:
    table = {"team-a": [Grant.model_validate({"key": "#1", "metric": "gpu_hours", "amount": "10",
                                              "effective_at": "2026-11-01T00:00:00Z"})]}
    # October used 55 of base 40 + q4 20: carry min(20, max(0, 60 - 55)) = 5; 40 + 5 + #1 10 = 55.
    assert quota_for(POLICIES, HISTORY, ORIGIN, table) == QuotaLimit("month", Decimal(55))
    # Without table grants: 40 + 5
    assert quota_for(POLICIES, HISTORY, ORIGIN) == QuotaLimit("month", Decimal(45))
    # A tenant not in the file, or a metric without a limit: none.
    assert quota_for(POLICIES, History("other", "gpu_hours", START, HISTORY.values), ORIGIN) is None
    spend = History("team-a", "spend", START, HISTORY.values)
    assert quota_for(POLICIES, spend, ORIGIN) == QuotaLimit("month", Decimal("100.00"))
