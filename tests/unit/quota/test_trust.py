"""Whether the tenants file agrees with a quota event (contract 4, amendment "trust").

Forged and stale events are written by hand against a policy; every event the accounting
itself emits (the crossings table of test_accounting) must agree with the policy in force
when it was emitted, or the actuator would ignore real crossings.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from gpumeter.core.models import QuotaEvent
from gpumeter.core.tenants import TenantPolicy
from quota.accounting import TenantLedger, apply, reevaluate
from quota.trust import distrust
from tests.unit.quota.builders import TENANT, policy, ts
from tests.unit.quota.test_accounting import CASES, Reload, Step

pytestmark = pytest.mark.security

NOW = ts("2026-11-20T12:00:00Z")


def event(level: str = "exceeded", *, metric: str = "gpu_hours", limit: str = "10.000000",
          used: str = "10.500000", period: str = "2026-11", tenant: str = TENANT) -> QuotaEvent:
    return QuotaEvent(event_id="e" * 64, tenant=tenant, metric=metric, level=level, threshold="1", used=used,
                      limit=limit, period=period, at=NOW)


LIMITS: dict[str, Any] = {"gpu_hours": "10", "spend": "250.00", "max_gpus": "4"}
NOT_CURRENT = "period_not_current"

TABLE = [
    # exceeded
    pytest.param(event(), policy(**LIMITS), None, id="exceeded-agrees"),
    pytest.param(event(limit="10"), policy(**LIMITS), None, id="limit-compared-as-decimal"),
    pytest.param(event(metric="spend", limit="250.00", used="251.00"), policy(**LIMITS), None,
                 id="spend-agrees"),
    pytest.param(event(metric="max_gpus", limit="4", used="6"), policy(**LIMITS), None, id="max-gpus-agrees"),
    pytest.param(event(), None, "unknown_tenant", id="tenant-not-in-file"),
    pytest.param(event(), policy(spend="250.00"), "no_limit", id="metric-without-limit"),
    pytest.param(event(limit="5.000000"), policy(**LIMITS), "limit_mismatch", id="limit-not-the-policys"),
    pytest.param(event(metric="max_gpus", limit="1", used="2"), policy(**LIMITS), "limit_mismatch",
                 id="max-gpus-limit-not-the-policys"),
    pytest.param(event(limit="10.0000001"), policy(**LIMITS), "limit_mismatch", id="limit-off-by-a-hair"),
    pytest.param(event(period="2026-10"), policy(**LIMITS), NOT_CURRENT, id="last-month"),
    pytest.param(event(period="2026-12"), policy(**LIMITS), NOT_CURRENT, id="next-month"),
    pytest.param(event(period="2026-11-20"), policy(**LIMITS), NOT_CURRENT,
                 id="a-day-where-the-policy-counts-months"),
    pytest.param(event(period="2026-11-20"), policy(period="day", **LIMITS), None, id="day-period-agrees"),
    pytest.param(event(period="2026-11-19"), policy(period="day", **LIMITS), NOT_CURRENT, id="yesterday"),
    pytest.param(event(period="soon"), policy(**LIMITS), "bad_period", id="not-a-period"),
    # recovered
    pytest.param(event("recovered", used="9.000000"), policy(**LIMITS), None, id="recovered-under-the-limit"),
    pytest.param(event("recovered", used="10.500000", period="2026-10"), policy(**LIMITS), None,
                 id="recovered-by-a-new-period"),
    pytest.param(event("recovered", used="10.500000"), policy(spend="250.00"), None,
                 id="recovered-limit-removed"),
    pytest.param(event("recovered", used="10.500000"), policy(**LIMITS), "still_over",
                 id="recovered-claiming-usage-over-the-limit"),
    pytest.param(event("recovered", used="9.000000", limit="20.000000"), policy(**LIMITS), "limit_mismatch",
                 id="recovered-under-a-limit-not-the-policys"),
    pytest.param(event("recovered", used="1.000000", period="2026-12"), policy(**LIMITS), NOT_CURRENT,
                 id="recovered-of-next-month"),
    pytest.param(event("recovered", used="10.500000", period="2026-11"), policy(period="day", **LIMITS), None,
                 id="recovered-of-the-month-after-switching-to-days"),
    pytest.param(event("recovered", used="10.500000", period="2026-11-21"), policy(period="day", **LIMITS),
                 NOT_CURRENT, id="recovered-of-tomorrow"),
    pytest.param(event("recovered", used="1.000000"), None, "unknown_tenant",
                 id="recovered-tenant-not-in-file"),
    # warnings change nothing
    pytest.param(event("warning", limit="1"), None, None, id="warning"),
]


@pytest.mark.parametrize(("quota_event", "tenant_policy", "reason"), TABLE)
def test_distrust(quota_event: QuotaEvent, tenant_policy: TenantPolicy | None, reason: str | None) -> None:
    assert distrust(quota_event, tenant_policy, NOW) == reason


@pytest.mark.parametrize(("start", "steps"), CASES)
def test_every_event_the_accounting_emits_agrees_with_its_policy(
    start: TenantPolicy | None, steps: list[Step]
) -> None:
    ledger, current = TenantLedger(tenant=TENANT), start
    checked = 0
    for action, now, _expected in steps:
        moment: datetime = ts(now)
        if isinstance(action, str | Reload):
            if isinstance(action, Reload):
                current = action.policy
            ledger, events = reevaluate(ledger, current, moment)
        else:
            ledger, events = apply(ledger, action, current, moment)
        for emitted in events:
            if emitted.level == "recovered" and current is None:
                continue  # the tenant left the file: nothing of it is enforced any more
            assert distrust(emitted, current, moment) is None, emitted
            checked += 1
    assert checked or not any(expected for *_rest, expected in steps)
