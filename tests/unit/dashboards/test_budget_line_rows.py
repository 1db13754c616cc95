"""The insights job's ``budget_lines`` rows: one per budget line, model_key '' tenant-wide,
amounts rounded half-up to the column's 12 places (the ClickHouse client would truncate)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from dashboards.insights_job import budget_line_rows
from insights.tables import BUDGET_LINES
from quota.budget import BudgetLine, CountedGrant, Runway

AT = datetime(2026, 11, 2, 23, tzinfo=UTC)


def test_rows_round_half_up_to_twelve_places_and_name_the_tenant_wide_line_by_an_empty_key() -> None:
    carry = CountedGrant(key="file:oct", amount=Decimal(9), granted=Decimal(10), carried=True, rollover=True,
                         effective_at=datetime(2026, 10, 5, tzinfo=UTC), expires_at=None)
    third = Decimal(89) / Decimal(3)  # 29.666... h: 106800 s of GPU time
    lines = [
        BudgetLine("team-b", "gpu_hours", None, "2026-11-02", AT, Decimal(400), (), Decimal(400), third,
                   Decimal(400) - third, Runway("run-rate", False, None, None)),
        BudgetLine("team-a", "gpu_hours", "A100-", "2026-11", AT, Decimal(3), (carry,), Decimal(12),
                   Decimal("0.0000000000005"), Decimal("11.9999999999995"),
                   Runway("forecast", True, Decimal(0), AT)),
    ]
    rows = [BUDGET_LINES.as_mapping(row) for row in budget_line_rows(lines)]
    assert rows[0] == {
        "tenant": "team-b", "period": "2026-11-02", "metric": "gpu_hours", "model_key": "",
        "base_limit": Decimal(400), "granted": Decimal(0), "limit": Decimal(400),
        "used": Decimal("29.666666666667"), "remaining": Decimal("370.333333333333"),
        "runway_hours": None, "runway_until": None, "runway_source": "run-rate", "computed_at": AT}
    # 0.0000000000005 rounds up to 1e-12; 11.9999999999995 up to 12.
    assert (rows[1]["model_key"], rows[1]["granted"], rows[1]["used"], rows[1]["remaining"]) == (
        "A100-", Decimal(9), Decimal("1E-12"), Decimal(12))
    assert (rows[1]["runway_hours"], rows[1]["runway_until"], rows[1]["runway_source"]) == (
        Decimal(0), AT, "forecast")
