"""quota.grants: the limit of a period with grants. Expected values worked out by hand in the
comments (hours unless the metric is spend)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpumeter.core.grants import FileGrant, Grant, GrantRecord
from gpumeter.core.models import QuotaEvent
from quota.accounting import TenantLedger, apply, reevaluate
from quota.grants import GrantError, LimitBounds, bounds, carries, fold, limit_at, of_file, previous_period
from quota.trust import distrust
from tests.unit.quota.builders import policy, ts, usage

D = Decimal


def grant(key: str, amount: str, effective: str, expires: str | None = None, rollover: bool = False,
          metric: str = "gpu_hours") -> Grant:
    return Grant.model_validate({"key": key, "metric": metric, "amount": amount, "effective_at": effective,
                                 "expires_at": expires, "rollover": rollover})


def record(number: int, amount: str, corrects: int | None = None, tenant: str = "team-a",
           rollover: bool = False) -> GrantRecord:
    return GrantRecord.model_validate({
        "number": number, "tenant": tenant, "metric": "gpu_hours", "amount": amount,
        "effective_at": "2026-11-10T00:00:00Z", "rollover": rollover, "corrects": corrects,
        "granted_at": "2026-11-10T00:00:00Z"})


def test_previous_period_of_months_and_days() -> None:
    assert previous_period("2026-01") == "2025-12"
    assert previous_period("2026-03-01") == "2026-02-28"


def test_a_grant_of_this_period_in_force_adds_its_amount() -> None:
    grants = [grant("#1", "50", "2026-11-10T00:00:00Z")]
    # before it is effective: 100; from Nov 10: 100 + 50 = 150
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-11-09T23:59:59Z"), D(0)) == D(100)
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-11-10T00:00:00Z"), D(0)) == D(150)


def test_an_expired_grant_counts_no_more() -> None:
    grants = [grant("#1", "50", "2026-11-10T00:00:00Z", "2026-11-20T00:00:00Z")]
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-11-19T23:00:00Z"), D(0)) == D(150)
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-11-20T00:00:00Z"), D(0)) == D(100)


def test_without_rollover_a_grant_ends_with_its_period() -> None:
    grants = [grant("#1", "50", "2026-11-10T00:00:00Z")]
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-12-01T00:00:00Z"), D(0)) == D(100)


def test_rollover_carries_the_unused_part_once() -> None:
    # Nov: base 100, grant 50 (rollover). Used 130: base takes 100, the grant 30, 20 unused.
    grants = [grant("#1", "50", "2026-11-10T00:00:00Z", rollover=True)]
    assert carries(D(100), grants, "gpu_hours", "month", "2026-11", D(130)) == {"#1": D(20)}
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-12-05T00:00:00Z"), D(130)) == D(120)
    # In January the carried part is gone: a carry is not carried again.
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2027-01-05T00:00:00Z"), D(0)) == D(100)


def test_rollover_carry_is_between_nothing_and_the_grant() -> None:
    grants = [grant("#1", "50", "2026-11-10T00:00:00Z", rollover=True)]
    # Used 90 < base 100: the whole 50 carries. Used 170 > 150: nothing carries.
    assert carries(D(100), grants, "gpu_hours", "month", "2026-11", D(90)) == {"#1": D(50)}
    assert carries(D(100), grants, "gpu_hours", "month", "2026-11", D(170)) == {"#1": D(0)}


def test_usage_goes_to_grants_without_rollover_first_then_by_expiry() -> None:
    # base 100; A 40 (no rollover); B 30 rollover expiring Jan 15; C 20 rollover, no expiry.
    # Used 160: base 100, A 40, B 20 (of 30) -> B carries 10, C carries all 20.
    grants = [grant("A", "40", "2026-11-02T00:00:00Z"),
              grant("C", "20", "2026-11-03T00:00:00Z", rollover=True),
              grant("B", "30", "2026-11-04T00:00:00Z", "2027-01-15T00:00:00Z", rollover=True)]
    assert carries(D(100), grants, "gpu_hours", "month", "2026-11", D(160)) == {"B": D(10), "C": D(20)}
    # December limit: 100 + 10 + 20 = 130
    assert limit_at(D(100), grants, "gpu_hours", "month", ts("2026-12-01T00:00:00Z"), D(160)) == D(130)


def test_day_periods_and_spend() -> None:
    grants = [grant("#1", "25.50", "2026-11-10T08:00:00Z", rollover=True, metric="spend")]
    # Nov 10: 200 + 25.50; used 210.25 -> base 200, grant 10.25, 15.25 unused; Nov 11: 215.25
    assert limit_at(D("200.00"), grants, "spend", "day", ts("2026-11-10T09:00:00Z"), D(0)) == D("225.50")
    next_day = ts("2026-11-11T09:00:00Z")
    assert limit_at(D("200.00"), grants, "spend", "day", next_day, D("210.25")) == D("215.25")
    # gpu_hours is another metric: unchanged
    assert limit_at(D(8), grants, "gpu_hours", "day", ts("2026-11-10T09:00:00Z"), D(0)) == D(8)


def test_no_base_limit_means_no_limit() -> None:
    assert limit_at(None, [grant("#1", "50", "2026-11-10T00:00:00Z")], "gpu_hours", "month",
                    ts("2026-11-11T00:00:00Z"), D(0)) is None


def test_bounds_without_usage() -> None:
    grants = [grant("#1", "50", "2026-11-10T00:00:00Z", rollover=True),
              grant("#2", "5", "2026-12-02T00:00:00Z")]
    # December: base 100 + #2 5 = 105, plus a carry of #1 between 0 and 50.
    assert bounds(D(100), grants, "gpu_hours", "month", "2026-12", ts("2026-12-03T00:00:00Z")) == LimitBounds(
        D(105), D(155))
    # November, asked in December: its limit at its last instant, 150.
    assert bounds(D(100), grants, "gpu_hours", "month", "2026-11", ts("2026-12-03T00:00:00Z")) == LimitBounds(
        D(150), D(150))


def test_fold_applies_corrections_and_counts_a_number_once() -> None:
    rows = [record(1, "50"), record(1, "50"), record(2, "-20", corrects=1), record(3, "7")]
    folded = fold(rows)["team-a"]
    # #1: 50 - 20 = 30 (the duplicate row of #1 counts once); #3: 7
    assert [(g.key, g.amount) for g in folded] == [("#1", D(30)), ("#3", D(7))]


def test_fold_refuses_a_negative_balance_and_a_stray_correction() -> None:
    with pytest.raises(GrantError, match="#1"):
        fold([record(1, "50"), record(2, "-60", corrects=1)])
    with pytest.raises(GrantError, match="#9"):
        fold([record(2, "-5", corrects=9)])
    with pytest.raises(GrantError, match="not a grant of tenant"):
        fold([record(1, "50"), record(2, "-5", corrects=1, tenant="team-b")])


def test_file_grants_are_keyed_by_id() -> None:
    grants = of_file([FileGrant.model_validate({"id": "q4-boost", "metric": "spend", "amount": "100.00",
                                                "effective_at": "2026-11-01T00:00:00Z"})])
    assert [(g.key, g.amount) for g in grants] == [("file:q4-boost", D(100))]


@pytest.mark.parametrize(("fields", "message"), [
    ({"amount": "-1"}, "positive"),
    ({"expires_at": "2026-11-01T00:00:00Z"}, "empty effective range"),
    ({"metric": "max_gpus"}, "metric"),
    ({"amount": "1.234"}, "decimal places"),
])
def test_bad_file_grants_name_the_field(fields: dict[str, str], message: str) -> None:
    document = {"id": "g", "metric": "spend", "amount": "10", "effective_at": "2026-11-01T00:00:00Z",
                **fields}
    with pytest.raises(ValueError, match=message):
        FileGrant.model_validate(document)


# -- the ledger and the trust check with grants ------------------------------------------------


def test_a_grant_lifting_the_limit_above_use_recovers_once_with_a_replayable_id() -> None:
    rules = policy(gpu_hours="10")
    ledger = TenantLedger(tenant="team-a")
    # 12 GPU-hours on Nov 5: over the limit of 10.
    ledger, events = apply(ledger, usage("u1", "2026-11-05T00:00:00Z", quantity="12"), rules,
                           ts("2026-11-05T01:00:00Z"))
    assert [(e.level, e.limit) for e in events] == [("exceeded", D("10.000000"))]
    top_up = [grant("#1", "5", "2026-11-05T02:00:00Z")]
    at = ts("2026-11-05T02:00:00Z")
    after, recovered = reevaluate(ledger, rules, at, grants=top_up)
    # 12 < 10 + 5 = 15: recovered, showing the new limit.
    assert [(e.level, e.used, e.limit) for e in recovered] == [("recovered", D("12.000000"), D("15.000000"))]
    # The same ledger re-evaluated (a replay after kill -9) gives the same event id ...
    _, again = reevaluate(ledger, rules, at, grants=top_up)
    assert [e.event_id for e in again] == [e.event_id for e in recovered]
    # ... and the evaluated ledger announces nothing twice.
    assert reevaluate(after, rules, at, grants=top_up)[1] == []
    # 4 more hours: 16 >= 15, exceeded again under a new id.
    _, more = apply(after, usage("u2", "2026-11-05T03:00:00Z", quantity="4"), rules,
                    ts("2026-11-05T04:00:00Z"), grants=top_up)
    assert [(e.level, e.limit) for e in more] == [("exceeded", D("15.000000"))]
    assert more[0].event_id != events[0].event_id


def test_the_file_grants_count_too() -> None:
    rules = policy(gpu_hours="10", grants=[{"id": "boost", "metric": "gpu_hours", "amount": "2",
                                           "effective_at": "2026-11-01T00:00:00Z"}])
    ledger, events = apply(TenantLedger(tenant="team-a"), usage("u1", "2026-11-05T00:00:00Z", quantity="11"),
                           rules, ts("2026-11-05T01:00:00Z"))
    assert events == []  # 11 < 12
    ledger, events = apply(ledger, usage("u2", "2026-11-05T01:00:00Z", quantity="1"), rules,
                           ts("2026-11-05T02:00:00Z"))
    assert [(e.level, e.limit) for e in events] == [("exceeded", D("12.000000"))]


def test_rollover_in_the_ledger_uses_last_months_usage() -> None:
    rules = policy(gpu_hours="10")
    top_up = [grant("#1", "6", "2026-11-20T00:00:00Z", rollover=True)]
    ledger, _ = apply(TenantLedger(tenant="team-a"), usage("u1", "2026-11-21T00:00:00Z", quantity="13"),
                      rules, ts("2026-11-21T01:00:00Z"), grants=top_up)
    # Nov used 13 of 16: 3 of the grant unused -> December's limit 10 + 3 = 13; 13 used -> exceeded.
    _, events = apply(ledger, usage("u2", "2026-12-01T00:00:00Z", quantity="13"), rules,
                      ts("2026-12-01T01:00:00Z"), grants=top_up)
    assert [(e.level, e.period, e.limit) for e in events] == [("exceeded", "2026-12", D("13.000000"))]


def event(level: str, limit: str, used: str = "12", period: str = "2026-11") -> QuotaEvent:
    return QuotaEvent(event_id="x", tenant="team-a", metric="gpu_hours", level=level, threshold="1",
                      used=used, limit=limit, period=period, at=ts("2026-11-05T00:00:00Z"))


def test_trust_takes_the_grants_into_the_limit() -> None:
    rules = policy(gpu_hours="10")
    now = ts("2026-11-06T00:00:00Z")
    top_up = [grant("#1", "5", "2026-11-05T02:00:00Z")]
    assert distrust(event("recovered", "15"), rules, now, top_up) is None
    # Without the grant (an extender that has not read it yet) the file alone disagrees.
    assert distrust(event("recovered", "15"), rules, now) == "limit_mismatch"
    assert distrust(event("exceeded", "10"), rules, now, top_up) == "limit_mismatch"
    assert distrust(event("recovered", "15", used="15"), rules, now, top_up) == "still_over"


def test_trust_admits_a_carry_between_nothing_and_the_whole_grant() -> None:
    rules = policy(gpu_hours="10")
    now = ts("2026-12-06T00:00:00Z")
    top_up = [grant("#1", "6", "2026-11-20T00:00:00Z", rollover=True)]
    for limit, verdict in (("10", None), ("13", None), ("16", None), ("16.000001", "limit_mismatch"),
                           ("9.999999", "limit_mismatch")):
        assert distrust(event("exceeded", limit, period="2026-12"), rules, now, top_up) == verdict, limit
