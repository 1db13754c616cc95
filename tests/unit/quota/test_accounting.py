"""Quota accounting (contract 4, amended): crossings, periods, reloads, replays, ids, state.

Expected values are worked out by hand from the inputs: a sample of quantity q over 3600 s
is q gpu-hours; spend is the sum of the list costs given.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core.models import QuotaEvent, QuotaMetric, RatedUsage
from gpumeter.core.tenants import TenantPolicy
from quota.accounting import (
    RECENT_EVENT_IDS,
    PodWindow,
    TenantLedger,
    Usage,
    apply,
    blocked,
    format_value,
    held_gpus,
    reevaluate,
    status,
)
from tests.unit.quota.builders import TENANT, policy, ts, usage


@dataclass(frozen=True)
class Reload:
    """A tenants-file reload: the new policy (None: tenant removed), then a reevaluate."""

    policy: TenantPolicy | None


TICK = "tick"  # a timer reevaluate under the current policy
Step = tuple[Usage | Reload | str, str, list[str]]  # action, now, expected events (brief form)


def brief(event: QuotaEvent) -> str:
    return f"{event.metric} {event.level} {event.threshold} {event.used}/{event.limit} {event.period}"


def run(start: TenantPolicy | None, steps: list[Step]) -> tuple[TenantLedger, list[list[QuotaEvent]]]:
    ledger, current, emitted = TenantLedger(tenant=TENANT), start, []
    for action, now, _ in steps:
        if isinstance(action, Usage):
            ledger, events = apply(ledger, action, current, ts(now))
        else:
            if isinstance(action, Reload):
                current = action.policy
            ledger, events = reevaluate(ledger, current, ts(now))
        emitted.append(events)
    return ledger, emitted


def gpu(event_id: str, start: str, quantity: str = "1", **extra: Any) -> Usage:
    return usage(event_id, start, quantity=quantity, **extra)


CASES = [
    pytest.param(
        policy(gpu_hours="10", warn_at=["0.5", "0.8"]),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "4"), "2026-11-10T01:00:00Z", []),
            (gpu("e2", "2026-11-10T01:00:00Z"), "2026-11-10T02:00:00Z",
             ["gpu_hours warning 0.5 5.000000/10.000000 2026-11"]),
            (gpu("e3", "2026-11-10T02:00:00Z", "3"), "2026-11-10T03:00:00Z",
             ["gpu_hours warning 0.8 8.000000/10.000000 2026-11"]),
            (gpu("e4", "2026-11-10T03:00:00Z", seconds=1800), "2026-11-10T03:30:00Z", []),
            (gpu("e5", "2026-11-10T04:00:00Z", "3", seconds=1800), "2026-11-10T04:30:00Z",
             ["gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
            (gpu("e6", "2026-11-10T05:00:00Z"), "2026-11-10T06:00:00Z", []),
        ],
        id="gpu_hours-month-each-threshold-once",
    ),
    pytest.param(
        policy(period="day", gpu_hours="2", warn_at=["0.5"]),
        [
            # Yesterday's window counts for yesterday, not for today's quota.
            (gpu("e1", "2026-11-09T23:00:00Z"), "2026-11-10T00:00:00Z", []),
            (gpu("e2", "2026-11-10T00:00:00Z"), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.5 1.000000/2.000000 2026-11-10"]),
            (gpu("e3", "2026-11-10T01:00:00Z"), "2026-11-10T02:00:00Z",
             ["gpu_hours exceeded 1 2.000000/2.000000 2026-11-10"]),
            (TICK, "2026-11-10T23:59:59Z", []),
            (TICK, "2026-11-11T00:00:00Z", ["gpu_hours recovered 1 2.000000/2.000000 2026-11-10"]),
            (gpu("e4", "2026-11-11T00:00:00Z", "2"), "2026-11-11T01:00:00Z",
             ["gpu_hours warning 0.5 2.000000/2.000000 2026-11-11",
              "gpu_hours exceeded 1 2.000000/2.000000 2026-11-11"]),
        ],
        id="gpu_hours-day-rollover",
    ),
    pytest.param(
        policy(spend="100.00", warn_at=["0.9"]),
        [
            (usage("e1", "2026-11-10T00:00:00Z", kind="cpu", quantity="8", cost="89.995"),
             "2026-11-10T01:00:00Z", []),
            (usage("e2", "2026-11-10T00:00:00Z", kind="memory", quantity="64", cost="0.005"),
             "2026-11-10T01:00:00Z", ["spend warning 0.9 90.00/100.00 2026-11"]),
            # 99.999 shows as 100.00 but has not reached the limit: decisions use exact values.
            (usage("e3", "2026-11-10T00:00:00Z", cost="9.999"), "2026-11-10T01:00:00Z", []),
            (usage("e4", "2026-11-10T00:00:00Z", kind="storage", quantity="100", cost="0.001"),
             "2026-11-10T01:00:00Z", ["spend exceeded 1 100.00/100.00 2026-11"]),
        ],
        id="spend-month-every-kind",
    ),
    pytest.param(
        policy(period="day", spend="50.00"),
        [
            (usage("e1", "2026-11-10T10:00:00Z", cost="30"), "2026-11-10T11:00:00Z", []),
            (usage("e2", "2026-11-10T11:00:00Z", kind="cpu", cost="20"), "2026-11-10T12:00:00Z",
             ["spend exceeded 1 50.00/50.00 2026-11-10"]),
            (usage("e3", "2026-11-11T00:00:00Z", kind="cpu", cost="20"), "2026-11-11T01:00:00Z",
             ["spend recovered 1 50.00/50.00 2026-11-10"]),
        ],
        id="spend-day-rollover-on-first-sample",
    ),
    pytest.param(
        policy(max_gpus="4", warn_at=["0.5"]),
        [
            (gpu("e1", "2026-11-10T10:00:00Z", seconds=60, pod_uid="a"), "2026-11-10T10:01:00Z", []),
            # A second device of pod a in the same window: the pod holds 2.
            (gpu("e2", "2026-11-10T10:00:00Z", seconds=60, pod_uid="a"), "2026-11-10T10:01:00Z",
             ["max_gpus warning 0.5 2/4 2026-11"]),
            (gpu("e3", "2026-11-10T10:00:00Z", "2", seconds=60, pod_uid="b"), "2026-11-10T10:01:00Z",
             ["max_gpus exceeded 1 4/4 2026-11"]),
            # Pod a's next window has one device so far: it replaces the 2 of the last one.
            (gpu("e4", "2026-11-10T10:01:00Z", seconds=60, pod_uid="a"), "2026-11-10T10:02:00Z",
             ["max_gpus recovered 1 3/4 2026-11"]),
            (gpu("e5", "2026-11-10T10:01:00Z", seconds=60, pod_uid="a"), "2026-11-10T10:02:00Z",
             ["max_gpus exceeded 1 4/4 2026-11"]),
        ],
        id="max_gpus-devices-sum-newer-window-replaces",
    ),
    pytest.param(
        policy(max_gpus="2"),
        [
            (gpu("e1", "2026-11-10T10:01:00Z", "1", seconds=60, pod_uid="a"), "2026-11-10T10:02:00Z", []),
            # An older window of the same pod does not change what it holds now.
            (gpu("e2", "2026-11-10T10:00:00Z", "5", seconds=60, pod_uid="a"), "2026-11-10T10:02:00Z", []),
            (gpu("e3", "2026-11-10T10:01:00Z", "1", seconds=60, pod_uid="b"), "2026-11-10T10:02:00Z",
             ["max_gpus exceeded 1 2/2 2026-11"]),
        ],
        id="max_gpus-older-window-ignored",
    ),
    pytest.param(
        policy(max_gpus="2"),
        [
            (gpu("e1", "2026-11-10T10:00:00Z", "2", seconds=60), "2026-11-10T10:01:00Z",
             ["max_gpus exceeded 1 2/2 2026-11"]),
            (TICK, "2026-11-10T10:03:00Z", []),  # silent for exactly 120 s: still holding
            (TICK, "2026-11-10T10:03:01Z", ["max_gpus recovered 1 0/2 2026-11"]),
            (TICK, "2026-11-10T10:04:00Z", []),
        ],
        id="max_gpus-stale-pod-recovers",
    ),
    pytest.param(
        policy(period="day", max_gpus="1"),
        [
            (gpu("e1", "2026-11-10T10:00:00Z", seconds=60), "2026-11-10T10:01:00Z",
             ["max_gpus exceeded 1 1/1 2026-11-10"]),
            # Holding GPUs does not reset at midnight: no recovered, no second exceeded.
            (gpu("e2", "2026-11-10T23:59:30Z", seconds=60), "2026-11-11T00:00:30Z", []),
            (gpu("e3", "2026-11-11T00:00:30Z", seconds=60), "2026-11-11T00:01:30Z", []),
        ],
        id="max_gpus-day-period-no-reset-at-midnight",
    ),
    pytest.param(
        policy(max_gpus="1", warn_at=["0.9"]),
        [
            *[(gpu(f"mig{i}", "2026-11-10T10:00:00Z", "0.142857142857", seconds=60),
               "2026-11-10T10:01:00Z", []) for i in range(6)],
            # 7 x 0.142857142857 = 0.999999999999: at warning, never "exceeded" by rounding.
            (gpu("mig6", "2026-11-10T10:00:00Z", "0.142857142857", seconds=60), "2026-11-10T10:01:00Z",
             ["max_gpus warning 0.9 0.999999999999/1 2026-11"]),
        ],
        id="max_gpus-mig-fractions-exact",
    ),
    pytest.param(
        policy(gpu_hours="10", warn_at=["0.5", "0.8", "0.9"]),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "12"), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.5 12.000000/10.000000 2026-11",
              "gpu_hours warning 0.8 12.000000/10.000000 2026-11",
              "gpu_hours warning 0.9 12.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 12.000000/10.000000 2026-11"]),
            (gpu("e2", "2026-11-10T01:00:00Z", "12"), "2026-11-10T02:00:00Z", []),
        ],
        id="one-sample-jumps-every-threshold-ascending",
    ),
    pytest.param(
        policy(gpu_hours="1", spend="2.00", max_gpus="1"),
        [
            (usage("e1", "2026-11-10T00:00:00Z", cost="2.50"), "2026-11-10T01:00:00Z",
             ["gpu_hours exceeded 1 1.000000/1.000000 2026-11",
              "spend exceeded 1 2.50/2.00 2026-11",
              "max_gpus exceeded 1 1/1 2026-11"]),
        ],
        id="one-sample-crosses-every-metric",
    ),
    pytest.param(
        policy(gpu_hours="10", warn_at=["0.5"]),
        [
            (gpu("e1", "2026-11-30T22:00:00Z", "10"), "2026-11-30T23:00:00Z",
             ["gpu_hours warning 0.5 10.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
            (TICK, "2026-12-01T00:00:00Z", ["gpu_hours recovered 1 10.000000/10.000000 2026-11"]),
            (TICK, "2026-12-01T00:01:00Z", []),
            (gpu("e2", "2026-12-01T00:00:00Z", "5"), "2026-12-01T01:00:00Z",
             ["gpu_hours warning 0.5 5.000000/10.000000 2026-12"]),
            # A late November window lands in November: December's count does not move.
            (gpu("e3", "2026-11-30T23:00:00Z", "5"), "2026-12-01T02:00:00Z", []),
            (gpu("e4", "2026-12-01T01:00:00Z", "4"), "2026-12-01T02:00:00Z", []),
            (gpu("e5", "2026-12-01T02:00:00Z", "1"), "2026-12-01T03:00:00Z",
             ["gpu_hours exceeded 1 10.000000/10.000000 2026-12"]),
        ],
        id="month-rollover-fresh-accounting",
    ),
    pytest.param(
        policy(gpu_hours="10"),
        [
            (gpu("e1", "2026-11-30T23:00:00Z", "10"), "2026-11-30T23:30:00Z",
             ["gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
            (gpu("e2", "2026-12-01T00:00:00Z", "10"), "2026-12-01T01:00:00Z",
             ["gpu_hours recovered 1 10.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 10.000000/10.000000 2026-12"]),
        ],
        id="month-rollover-and-new-crossing-in-one-sample",
    ),
    pytest.param(
        policy(gpu_hours="10", warn_at=["0.8"]),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "10"), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.8 10.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
            (Reload(policy(gpu_hours="20", warn_at=["0.8"])), "2026-11-10T01:00:00Z",
             ["gpu_hours recovered 1 10.000000/20.000000 2026-11"]),
            (TICK, "2026-11-10T01:00:00Z", []),
            # 0.8 of the new limit is 16: announced again, for the new limit.
            (gpu("e2", "2026-11-10T01:00:00Z", "6"), "2026-11-10T02:00:00Z",
             ["gpu_hours warning 0.8 16.000000/20.000000 2026-11"]),
            (gpu("e3", "2026-11-10T02:00:00Z", "4"), "2026-11-10T03:00:00Z",
             ["gpu_hours exceeded 1 20.000000/20.000000 2026-11"]),
        ],
        id="limit-raised-recovers-then-rearms",
    ),
    pytest.param(
        policy(gpu_hours="10", warn_at=["0.8"]),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "10"), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.8 10.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
            # 10 of 12 is past 0.8 already announced: only recovered.
            (Reload(policy(gpu_hours="12", warn_at=["0.8"])), "2026-11-10T01:00:00Z",
             ["gpu_hours recovered 1 10.000000/12.000000 2026-11"]),
            (gpu("e2", "2026-11-10T01:00:00Z", "2"), "2026-11-10T02:00:00Z",
             ["gpu_hours exceeded 1 12.000000/12.000000 2026-11"]),
        ],
        id="limit-raised-into-warning-band",
    ),
    pytest.param(
        policy(gpu_hours="20", warn_at=["0.8"]),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "6"), "2026-11-10T01:00:00Z", []),
            (Reload(policy(gpu_hours="7", warn_at=["0.8"])), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.8 6.000000/7.000000 2026-11"]),
            (Reload(policy(gpu_hours="6", warn_at=["0.8"])), "2026-11-10T01:00:00Z",
             ["gpu_hours exceeded 1 6.000000/6.000000 2026-11"]),
            (Reload(policy(gpu_hours="5", warn_at=["0.8"])), "2026-11-10T01:00:00Z", []),
        ],
        id="limit-lowered-warns-then-exceeds",
    ),
    pytest.param(
        policy(spend="200.00", warn_at=["0.5", "0.8"]),
        [
            (usage("e1", "2026-11-10T00:00:00Z", cost="110"), "2026-11-10T01:00:00Z",
             ["spend warning 0.5 110.00/200.00 2026-11"]),
            (Reload(policy(spend="100.00", warn_at=["0.5", "0.8"])), "2026-11-10T01:00:00Z",
             ["spend warning 0.8 110.00/100.00 2026-11", "spend exceeded 1 110.00/100.00 2026-11"]),
        ],
        id="limit-lowered-jumps-two-thresholds",
    ),
    pytest.param(
        policy(max_gpus="2"),
        [
            (gpu("e1", "2026-11-10T10:00:00Z", "2", seconds=60), "2026-11-10T10:01:00Z",
             ["max_gpus exceeded 1 2/2 2026-11"]),
            (Reload(policy()), "2026-11-10T10:01:00Z", ["max_gpus recovered 1 2/2 2026-11"]),
            (TICK, "2026-11-10T10:01:00Z", []),
            (Reload(policy(max_gpus="2")), "2026-11-10T10:01:00Z", ["max_gpus exceeded 1 2/2 2026-11"]),
            (Reload(None), "2026-11-10T10:01:00Z", ["max_gpus recovered 1 2/2 2026-11"]),
        ],
        id="limit-or-tenant-removed-recovers",
    ),
    pytest.param(
        None,
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "10"), "2026-11-10T01:00:00Z", []),
            (Reload(policy(gpu_hours="10", warn_at=["0.5"])), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.5 10.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
        ],
        id="no-policy-still-counts-for-a-later-policy",
    ),
    pytest.param(
        policy(gpu_hours="10"),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "6"), "2026-11-10T01:00:00Z", []),
            (Reload(policy(gpu_hours="10", warn_at=["0.5"])), "2026-11-10T01:00:00Z",
             ["gpu_hours warning 0.5 6.000000/10.000000 2026-11"]),
        ],
        id="warn_at-added-on-reload",
    ),
    pytest.param(
        policy(gpu_hours="10"),
        [
            (gpu("e1", "2026-11-10T00:00:00Z", "10"), "2026-11-10T12:00:00Z",
             ["gpu_hours exceeded 1 10.000000/10.000000 2026-11"]),
            # Both granularities are counted, so the day quota sees today's 10 hours at once.
            (Reload(policy(period="day", gpu_hours="10")), "2026-11-10T12:00:00Z",
             ["gpu_hours recovered 1 10.000000/10.000000 2026-11",
              "gpu_hours exceeded 1 10.000000/10.000000 2026-11-10"]),
        ],
        id="period-switched-month-to-day",
    ),
    pytest.param(
        policy(gpu_hours="1"),
        [
            # 01:30 at +02:00 is 23:30 UTC on 30 November: it counts for November.
            (usage("e1", "2026-12-01T01:30:00+02:00", seconds=1800, quantity="2"), "2026-11-30T23:59:00Z",
             ["gpu_hours exceeded 1 1.000000/1.000000 2026-11"]),
        ],
        id="window-start-attributed-in-utc",
    ),
    pytest.param(
        policy(gpu_hours="0"),
        [
            (usage("e1", "2026-11-10T00:00:00Z", kind="cpu"), "2026-11-10T01:00:00Z",
             ["gpu_hours exceeded 1 0.000000/0.000000 2026-11"]),
        ],
        id="zero-limit-is-reached-at-once",
    ),
]


@pytest.mark.parametrize(("start", "steps"), CASES)
def test_crossings(start: TenantPolicy | None, steps: list[Step]) -> None:
    _, emitted = run(start, steps)
    assert [[brief(e) for e in events] for events in emitted] == [expected for _, _, expected in steps]


@pytest.mark.parametrize(("start", "steps"), CASES)
def test_event_ids_unique_and_fields_consistent(start: TenantPolicy | None, steps: list[Step]) -> None:
    _, emitted = run(start, steps)
    events = [event for batch in emitted for event in batch]
    assert len({event.event_id for event in events}) == len(events)
    for batch, (_, now, _) in zip(emitted, steps, strict=True):
        for event in batch:
            assert event.tenant == TENANT
            assert event.at == ts(now) and event.at.tzinfo is not None
            assert event.at.utcoffset() == timedelta(0)


def _same_sequence() -> list[Step]:
    return [
        (gpu("e1", "2026-11-10T10:00:00Z", "2", seconds=60), "2026-11-10T10:01:00Z", []),
        (TICK, "2026-11-10T10:05:00Z", []),
        (gpu("e2", "2026-11-10T10:05:00Z", "2", seconds=60), "2026-11-10T10:06:00Z", []),
    ]


def test_event_ids_deterministic_across_runs_and_generations() -> None:
    start = policy(max_gpus="2")
    _, first = run(start, _same_sequence())
    _, second = run(start, _same_sequence())
    def ids(emitted: list[list[QuotaEvent]]) -> list[list[str]]:
        return [[event.event_id for event in batch] for batch in emitted]

    assert ids(first) == ids(second)
    exceeded_0, recovered_0, exceeded_1 = first[0][0], first[1][0], first[2][0]
    assert (exceeded_0.level, recovered_0.level, exceeded_1.level) == ("exceeded", "recovered", "exceeded")
    # Same level and threshold, later generation: a different crossing, a different id.
    assert exceeded_0.event_id != exceeded_1.event_id

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    assert exceeded_0.event_id == digest("team-a|max_gpus|held|exceeded|1|0")
    assert recovered_0.event_id == digest("team-a|max_gpus|held|recovered|1|0")
    assert exceeded_1.event_id == digest("team-a|max_gpus|held|exceeded|1|1")


def test_crash_replay_recomputes_the_same_event_id() -> None:
    rules = policy(gpu_hours="10", warn_at=["0.5"])
    ledger = TenantLedger(tenant=TENANT)
    ledger, _ = apply(ledger, gpu("e1", "2026-11-10T00:00:00Z", "4"), rules, ts("2026-11-10T01:00:00Z"))
    checkpoint = TenantLedger.model_validate_json(ledger.model_dump_json())
    crossing = gpu("e2", "2026-11-10T01:00:00Z", "6")
    _, published = apply(ledger, crossing, rules, ts("2026-11-10T02:00:00Z"))
    # The process died after publishing but before storing the ledger: replay from the checkpoint.
    _, replayed = apply(checkpoint, crossing, rules, ts("2026-11-10T02:00:03Z"))
    assert [e.event_id for e in replayed] == [e.event_id for e in published]
    assert [brief(e) for e in published] == [
        "gpu_hours warning 0.5 10.000000/10.000000 2026-11",
        "gpu_hours exceeded 1 10.000000/10.000000 2026-11",
    ]


def test_replayed_event_id_is_counted_once() -> None:
    rules = policy(gpu_hours="2", max_gpus="2")
    sample = gpu("e1", "2026-11-10T00:00:00Z", "1")
    ledger = TenantLedger(tenant=TENANT)
    ledger, first = apply(ledger, sample, rules, ts("2026-11-10T01:00:00Z"))
    ledger, again = apply(ledger, sample, rules, ts("2026-11-10T01:00:00Z"))
    assert first == [] and again == []
    used = {s.metric: s.used for s in status(ledger, rules, ts("2026-11-10T01:00:00Z"))}
    assert used == {"gpu_hours": Decimal(1), "spend": Decimal(0), "max_gpus": Decimal(1)}
    assert ledger.recent_event_ids == ("e1",)


def test_recent_event_ids_are_bounded_fifo() -> None:
    rules = policy()
    ledger = TenantLedger(tenant=TENANT)
    now = ts("2026-11-10T01:00:00Z")
    for index in range(RECENT_EVENT_IDS + 1):
        record = usage(f"id-{index}", "2026-11-10T00:00:00Z", kind="cpu", cost="1")
        ledger, _ = apply(ledger, record, rules, now)
    assert len(ledger.recent_event_ids) == RECENT_EVENT_IDS
    assert ledger.recent_event_ids[0] == "id-1" and ledger.recent_event_ids[-1] == f"id-{RECENT_EVENT_IDS}"
    spend_before = ledger.periods["2026-11"].list_spend
    # The newest id is remembered; the oldest has been forgotten and would count again.
    remembered, _ = apply(ledger, usage(f"id-{RECENT_EVENT_IDS}", "2026-11-10T00:00:00Z", kind="cpu",
                                        cost="1"), rules, now)
    forgotten, _ = apply(ledger, usage("id-0", "2026-11-10T00:00:00Z", kind="cpu", cost="1"), rules, now)
    assert spend_before == Decimal(RECENT_EVENT_IDS + 1)
    assert remembered.periods["2026-11"].list_spend == spend_before
    assert forgotten.periods["2026-11"].list_spend == spend_before + 1


def test_apply_does_not_change_its_input() -> None:
    rules = policy(max_gpus="1")
    ledger = TenantLedger(tenant=TENANT)
    snapshot = ledger.model_dump_json()
    apply(ledger, gpu("e1", "2026-11-10T00:00:00Z"), rules, ts("2026-11-10T01:00:00Z"))
    assert ledger.model_dump_json() == snapshot


@pytest.mark.parametrize(
    ("on_exceed", "expected"),
    [
        pytest.param("block", ["gpu_hours", "max_gpus"], id="block"),
        pytest.param("preempt", ["gpu_hours", "max_gpus"], id="preempt"),
        pytest.param("notify", [], id="notify"),
    ],
)
def test_blocked_only_for_block_and_preempt(on_exceed: str, expected: list[QuotaMetric]) -> None:
    rules = policy(gpu_hours="1", spend="100.00", max_gpus="1", on_exceed=on_exceed)
    ledger, _ = apply(TenantLedger(tenant=TENANT), gpu("e1", "2026-11-10T00:00:00Z", cost="1"), rules,
                      ts("2026-11-10T01:00:00Z"))
    assert blocked(ledger, rules) == expected


def test_blocked_ends_with_recovery_and_without_limit() -> None:
    rules = policy(max_gpus="1", on_exceed="preempt")
    ledger, _ = apply(TenantLedger(tenant=TENANT), gpu("e1", "2026-11-10T10:00:00Z", seconds=60), rules,
                      ts("2026-11-10T10:01:00Z"))
    assert blocked(ledger, rules) == ["max_gpus"]
    assert blocked(ledger, None) == []
    # A reload that removes the limit unblocks at once, before any reevaluate.
    assert blocked(ledger, policy(on_exceed="preempt")) == []
    recovered, events = reevaluate(ledger, rules, ts("2026-11-10T10:05:00Z"))
    assert [e.level for e in events] == ["recovered"]
    assert blocked(recovered, rules) == []


@pytest.mark.parametrize(
    ("rules", "hours", "expected"),
    [
        pytest.param(policy(gpu_hours="10", warn_at=["0.8"]), "7", ("ok", "0.700000"), id="ok"),
        pytest.param(policy(gpu_hours="10", warn_at=["0.8"]), "8", ("warning", "0.800000"),
                     id="warning-at-edge"),
        pytest.param(policy(gpu_hours="10", warn_at=["0.5", "0.8"]), "6", ("warning", "0.600000"),
                     id="warning-lowest-fraction"),
        pytest.param(policy(gpu_hours="10"), "9.9", ("ok", "0.990000"), id="no-warn_at-ok"),
        pytest.param(policy(gpu_hours="10"), "10", ("exceeded", "1.000000"), id="exceeded-at-limit"),
        pytest.param(policy(gpu_hours="3"), "1", ("ok", "0.333333"), id="fraction-rounded-for-display"),
        pytest.param(policy(), "100", ("ok", None), id="no-limit"),
        pytest.param(None, "100", ("ok", None), id="no-policy"),
        pytest.param(policy(gpu_hours="0"), "0", ("exceeded", None), id="zero-limit"),
    ],
)
def test_status_of_gpu_hours(
    rules: TenantPolicy | None, hours: str, expected: tuple[str, str | None]
) -> None:
    ledger, _ = apply(TenantLedger(tenant=TENANT), gpu("e1", "2026-11-10T00:00:00Z", hours), rules,
                      ts("2026-11-10T01:00:00Z"))
    gpu_hours = status(ledger, rules, ts("2026-11-10T01:00:00Z"))[0]
    assert gpu_hours.metric == "gpu_hours" and gpu_hours.period == "2026-11"
    assert gpu_hours.used == Decimal(hours)
    fraction = None if gpu_hours.fraction is None else str(gpu_hours.fraction)
    assert (gpu_hours.state, fraction) == expected


def test_status_lists_every_metric_in_its_unit() -> None:
    rules = policy(period="day", gpu_hours="4", spend="10.00", max_gpus="8")
    ledger = TenantLedger(tenant=TENANT)
    now = ts("2026-11-10T10:01:00Z")
    # 3 GPUs for 20 minutes = 1 gpu-hour; a cpu record adds spend only.
    for sample in (gpu("g", "2026-11-10T09:41:00Z", "3", seconds=1200, cost="2.50"),
                   usage("c", "2026-11-10T09:00:00Z", kind="cpu", quantity="4", cost="0.16")):
        ledger, _ = apply(ledger, sample, rules, now)
    rows = {row.metric: (row.period, row.used, row.limit, row.state) for row in status(ledger, rules, now)}
    assert rows == {
        "gpu_hours": ("2026-11-10", Decimal(1), Decimal(4), "ok"),
        "spend": ("2026-11-10", Decimal("2.66"), Decimal(10), "ok"),
        "max_gpus": ("2026-11-10", Decimal(3), Decimal(8), "ok"),
    }
    later = ts("2026-11-10T10:03:01Z")
    assert held_gpus(ledger, later) == 0
    assert held_gpus(ledger, later, stale_seconds=600) == 3


def test_ledger_json_round_trip_keeps_decimals_exact() -> None:
    rules = policy(gpu_hours="5000", spend="20000.00", max_gpus="64", warn_at=["0.8", "0.9"])
    ledger = TenantLedger(tenant=TENANT)
    now = ts("2026-11-10T10:01:00Z")
    samples = [
        usage("a", "2026-11-10T10:00:00Z", quantity="0.142857142857", seconds=60,
              cost="0.000000000000000001"),
        usage("b", "2026-11-10T10:00:00Z", quantity="70", seconds=60, cost="15999.990000000000000001"),
    ]
    for sample in samples:
        ledger, _ = apply(ledger, sample, rules, now)
    text = ledger.model_dump_json()
    restored = TenantLedger.model_validate_json(text)
    assert restored == ledger
    assert restored.model_dump_json() == text
    totals = restored.periods["2026-11"]
    assert str(totals.list_spend) == "15999.990000000000000002"
    # 0.142857142857 x 60 + 70 x 60, at the 12 places of the quantity
    assert str(totals.gpu_unit_seconds) == "4208.571428571420"
    assert str(restored.pods["uid-1"].quantity) == "70.142857142857"
    assert '"15999.990000000000000002"' in text  # a string, never a JSON float
    # The restored ledger behaves exactly like the original.
    assert reevaluate(restored, rules, now) == reevaluate(ledger, rules, now)


def test_usage_from_rated() -> None:
    rated = RatedUsage.model_validate({
        "event_id": "ev-9", "kind": "gpu", "cluster": "c1", "node": "n1", "tenant": TENANT,
        "namespace": "ml", "pod": "train-0", "pod_uid": "u-9",
        "window_start": "2026-11-10T00:00:00+01:00", "window_end": "2026-11-10T00:01:00+01:00",
        "period": "2026-11", "quantity": "2", "unit_seconds": "120", "gpu_model": "H100-SXM-80GB",
        "mig_profile": None, "capacity_type": "spot", "priority": -5, "rate_card": "2026-11",
        "currency": "USD", "unit_price": "2.50", "capacity_multiplier": "0.35",
        "list_cost": "0.058333333333333333",
    })
    assert Usage.from_rated(rated) == Usage(
        event_id="ev-9", tenant=TENANT, kind="gpu", namespace="ml", pod="train-0", pod_uid="u-9",
        window_start=datetime(2026, 11, 9, 23, 0, tzinfo=UTC),
        window_end=datetime(2026, 11, 9, 23, 1, tzinfo=UTC),
        quantity=Decimal(2), unit_seconds=Decimal(120), list_cost=Decimal("0.058333333333333333"),
        capacity_type="spot", priority=-5, gpu_model="H100-SXM-80GB",
    )


@pytest.mark.parametrize(
    ("metric", "value", "text"),
    [
        pytest.param("spend", "1234.5", "1234.50", id="spend-pads"),
        pytest.param("spend", "0.005", "0.01", id="spend-half-up"),
        pytest.param("spend", "0.004999", "0.00", id="spend-down"),
        pytest.param("gpu_hours", "1", "1.000000", id="hours-pads"),
        pytest.param("gpu_hours", "0.0000005", "0.000001", id="hours-half-up"),
        pytest.param("max_gpus", "64.000", "64", id="gpus-trailing-zeros"),
        pytest.param("max_gpus", "1E+2", "100", id="gpus-no-exponent"),
        pytest.param("max_gpus", "0.999999999999", "0.999999999999", id="gpus-exact"),
        pytest.param("max_gpus", "0", "0", id="gpus-zero"),
    ],
)
def test_format_value(metric: QuotaMetric, value: str, text: str) -> None:
    assert format_value(metric, Decimal(value)) == text


def _one_pod() -> TenantLedger:
    window = PodWindow(window_start=ts("2026-11-10T00:00:00Z"), window_end=ts("2026-11-10T00:01:00Z"),
                       quantity=Decimal(1))
    return TenantLedger(tenant=TENANT, pods={"u": window})


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: apply(TenantLedger(tenant="team-b"), gpu("e", "2026-11-10T00:00:00Z"), None,
                                   ts("2026-11-10T01:00:00Z")), id="usage-of-another-tenant"),
        pytest.param(lambda: reevaluate(TenantLedger(tenant=TENANT), policy(tenant="team-b"),
                                        ts("2026-11-10T01:00:00Z")), id="policy-of-another-tenant"),
        pytest.param(lambda: reevaluate(TenantLedger(tenant=TENANT), None, datetime(2026, 11, 10)),
                     id="naive-now"),
        pytest.param(lambda: usage("e", "2026-11-10T00:00:00Z", seconds=0), id="empty-window"),
        pytest.param(lambda: Usage("e", TENANT, "gpu", "ns", "p", "u", datetime(2026, 11, 10),
                                   datetime(2026, 11, 10, 1), Decimal(1), Decimal(3600), Decimal(0)),
                     id="naive-window"),
        pytest.param(lambda: held_gpus(_one_pod(), ts("2026-11-10T01:00:00Z"), stale_seconds=-1),
                     id="negative-stale-seconds"),
        pytest.param(lambda: reevaluate(TenantLedger(tenant=TENANT), None, ts("2026-11-10T01:00:00Z"),
                                        stale_seconds=-1), id="negative-stale-seconds-empty-ledger"),
    ],
)
def test_bad_input_is_refused(call: Any) -> None:
    with pytest.raises(ValueError):
        call()


def test_float_quantities_are_refused() -> None:
    with pytest.raises(TypeError):
        Usage("e", TENANT, "gpu", "ns", "p", "u", ts("2026-11-10T00:00:00Z"), ts("2026-11-10T01:00:00Z"),
              1.0, Decimal(3600), Decimal(0))  # type: ignore[arg-type]


def test_trusted_usage_is_the_checked_usage() -> None:
    """Usage.trusted (for callers that already checked, streams/quota_decode.py) builds the very
    object the checked constructor builds: equal, same repr and hash, as frozen, and a copy
    made with dataclasses.replace goes through the checks again."""
    args: tuple[Any, ...] = (
        "ev-1", TENANT, "gpu", "ml", "train-0", "u-1", ts("2026-11-10T00:00:00Z"), ts("2026-11-10T00:01:00Z"),
        Decimal("2.50"), Decimal("150.00"), Decimal("0.104166666666666667"), "spot", 7, "H100-SXM-80GB",
    )
    checked, trusted = Usage(*args), Usage.trusted(*args)
    assert type(trusted) is Usage
    assert trusted == checked and repr(trusted) == repr(checked) and hash(trusted) == hash(checked)
    assert dataclasses.astuple(trusted) == args
    assert list(vars(trusted)) == [field.name for field in dataclasses.fields(Usage)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        trusted.quantity = Decimal(1)  # type: ignore[misc]
    with pytest.raises(ValueError):
        dataclasses.replace(trusted, window_end=trusted.window_start)
    # Counted like the checked one: the same ledger after applying either.
    now = ts("2026-11-10T01:00:00Z")
    assert apply(TenantLedger(tenant=TENANT), trusted, None, now) == apply(
        TenantLedger(tenant=TENANT), checked, None, now)
