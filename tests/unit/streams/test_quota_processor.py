"""Quota accounting in the stream (streams/quota.py) without Kafka: records, ticks, reloads.

Every expected event is worked out by hand from the records of its case (a sample of
quantity q over s seconds is q x s / 3600 GPU-hours); none is read back from the code.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import streams.quota as quota_module
import streams.quota_decode as quota_decode
from gpumeter.core.models import Kind, QuotaEvent, RatedUsage
from gpumeter.core.records import join
from gpumeter.core.tenants import TenantsFile
from quota.accounting import TenantLedger, Usage, count
from streams.quota import (
    BadRatedRecord,
    LedgerState,
    LedgerStore,
    MemoryLedgerStore,
    QuotaProcessor,
    TenantsWatcher,
    decode_state,
    encode_event,
    encode_state,
    tenant_status,
)

Summary = tuple[str, str, str, str, str, str, str]


class FakeMonotonic:
    """Stands in for time.monotonic: a float that only moves when the test advances it."""

    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "monotonic time never runs back"
        self.value += seconds


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def rated(
    event_id: str,
    start: str,
    *,
    tenant: str = "alpha",
    kind: Kind = "gpu",
    quantity: str = "1",
    seconds: int = 3600,
    cost: str = "0",
    pod_uid: str | None = None,
) -> RatedUsage:
    """One rated sample; unit_seconds = quantity x seconds, as rating computes it."""
    window_start = ts(start)
    return RatedUsage(
        event_id=event_id, kind=kind, cluster="c1", node="n1", tenant=tenant, namespace=tenant,
        pod=f"pod-{pod_uid or event_id}", pod_uid=pod_uid or f"uid-{event_id}", window_start=window_start,
        window_end=window_start + timedelta(seconds=seconds), period=start[:7], quantity=Decimal(quantity),
        unit_seconds=Decimal(quantity) * seconds, gpu_model="H100-SXM-80GB" if kind == "gpu" else None,
        mig_profile=None, capacity_type="on-demand", priority=0, rate_card="2026-11", currency="USD",
        unit_price=Decimal("2.50"), capacity_multiplier=Decimal(1), list_cost=Decimal(cost),
    )


def gpus(prefix: str, count: int, start: str, **fields: Any) -> list[RatedUsage]:
    """``count`` one-GPU samples of ``start``'s window, one pod each unless pod_uid is given."""
    return [rated(f"{prefix}-{index}", start, **fields) for index in range(count)]


def tenants(*policies: dict[str, Any]) -> TenantsFile:
    return TenantsFile.model_validate({"tenants": [{"tenant": "alpha", **policy} for policy in policies]})


def summary(event: QuotaEvent) -> Summary:
    return (event.tenant, event.metric, event.level, str(event.threshold), event.period, str(event.used),
            str(event.limit))


def processor_for(policies: TenantsFile, store: LedgerStore | None = None,
                  clock: FakeMonotonic | None = None) -> QuotaProcessor:
    return QuotaProcessor(store or MemoryLedgerStore(), policies, stale_seconds=120,
                          monotonic=clock or FakeMonotonic())


# --- crossings, one record at a time -------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    policy: dict[str, Any]
    # Each entry is one samples record (source partition 0, offset = its index) and the
    # events expected right after it.
    steps: list[tuple[list[RatedUsage], list[Summary]]] = field(default_factory=list)


CASES: dict[str, Case] = {
    "one record jumps over two warnings, one event per threshold": Case(
        {"gpu_hours": 10, "warn_at": ["0.5", "0.8"]},
        [
            (gpus("r0", 4, "2026-11-10T00:00:00Z"), []),  # 4 of 10
            (gpus("r1", 5, "2026-11-10T01:00:00Z"), [  # 9 of 10: over 0.5 and 0.8 at once
                ("alpha", "gpu_hours", "warning", "0.5", "2026-11", "9.000000", "10.000000"),
                ("alpha", "gpu_hours", "warning", "0.8", "2026-11", "9.000000", "10.000000"),
            ]),
            (gpus("r2", 2, "2026-11-10T02:00:00Z"), [  # 11 of 10
                ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "11.000000", "10.000000"),
            ]),
            (gpus("r3", 1, "2026-11-10T03:00:00Z"), []),  # 12: exceeded is announced once
        ],
    ),
    "one record over every threshold and the limit": Case(
        {"gpu_hours": 2, "warn_at": ["0.5", "0.75"]},
        [
            (gpus("r0", 3, "2026-11-10T00:00:00Z"), [  # 3 of 2
                ("alpha", "gpu_hours", "warning", "0.5", "2026-11", "3.000000", "2.000000"),
                ("alpha", "gpu_hours", "warning", "0.75", "2026-11", "3.000000", "2.000000"),
                ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "3.000000", "2.000000"),
            ]),
        ],
    ),
    "spend counts every kind, gpu_hours only gpus": Case(
        {"gpu_hours": 3, "spend": "5.00", "warn_at": ["0.8"]},
        [
            # 2 GPU-hours (0.67 of 3); spend 2.00 + 2.00 + 1.00 (cpu) = 5.00 of 5.00.
            ([*gpus("r0", 2, "2026-11-10T00:00:00Z", cost="2.00"),
              rated("r0-cpu", "2026-11-10T00:00:00Z", kind="cpu", quantity="4", cost="1.00")], [
                ("alpha", "spend", "warning", "0.8", "2026-11", "5.00", "5.00"),
                ("alpha", "spend", "exceeded", "1", "2026-11", "5.00", "5.00"),
            ]),
            (gpus("r1", 1, "2026-11-10T01:00:00Z", cost="2.00"), [  # 3 of 3 GPU-hours; spend 7.00
                ("alpha", "gpu_hours", "warning", "0.8", "2026-11", "3.000000", "3.000000"),
                ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "3.000000", "3.000000"),
            ]),
        ],
    ),
    "an 8-GPU pod reporting per device does not flap max_gpus": Case(
        {"max_gpus": 8},
        [
            (gpus("w0", 8, "2026-11-10T00:00:00Z", seconds=60, pod_uid="big"), [
                ("alpha", "max_gpus", "exceeded", "1", "2026-11", "8", "8"),
            ]),
            # The next window of the same 8 devices: still 8 held, nothing to announce (an
            # evaluation after each device would have seen 1 held: recovered, then exceeded).
            (gpus("w1", 8, "2026-11-10T00:01:00Z", seconds=60, pod_uid="big"), []),
            (gpus("w2", 4, "2026-11-10T00:02:00Z", seconds=60, pod_uid="big"), [
                ("alpha", "max_gpus", "recovered", "1", "2026-11", "4", "8"),
            ]),
        ],
    ),
    "a new month recovers last month's exceeded quota": Case(
        {"gpu_hours": 2},
        [
            (gpus("r0", 3, "2026-11-30T23:00:00Z", seconds=1800, quantity="2"), [  # 3 GPU-hours
                ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "3.000000", "2.000000"),
            ]),
            (gpus("r1", 1, "2026-12-01T00:00:00Z"), [  # 1 of 2 in December: nothing new
                ("alpha", "gpu_hours", "recovered", "1", "2026-11", "3.000000", "2.000000"),
            ]),
        ],
    ),
    "a daily quota rolls over at UTC midnight": Case(
        {"period": "day", "gpu_hours": 2},
        [
            (gpus("r0", 2, "2026-11-10T22:00:00Z"), [
                ("alpha", "gpu_hours", "exceeded", "1", "2026-11-10", "2.000000", "2.000000"),
            ]),
            (gpus("r1", 1, "2026-11-11T00:00:00Z"), [
                ("alpha", "gpu_hours", "recovered", "1", "2026-11-10", "2.000000", "2.000000"),
            ]),
        ],
    ),
    "a tenant without a policy is counted but never crosses": Case(
        {"gpu_hours": 1},
        [(gpus("g0", 5, "2026-11-10T00:00:00Z", tenant="gamma"), [])],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_event_per_crossing(name: str) -> None:
    case = CASES[name]
    processor = processor_for(tenants(case.policy))
    for offset, (usages, expected) in enumerate(case.steps):
        events = processor.process(usages, 0, offset)
        assert [summary(e) for e in events] == expected, f"record {offset}"


def test_a_record_of_several_tenants_counts_each_in_its_own_ledger() -> None:
    policies = TenantsFile.model_validate({"tenants": [{"tenant": "alpha", "gpu_hours": 2},
                                                       {"tenant": "beta", "gpu_hours": 2}]})
    processor = processor_for(policies)
    record = [*gpus("a", 2, "2026-11-10T00:00:00Z"), *gpus("b", 1, "2026-11-10T00:00:00Z", tenant="beta")]
    events = processor.process_record(join([usage.model_copy(update={"source_partition": 3,
                                                                        "source_offset": 7}).model_dump_json()
                                            .encode() for usage in record]))
    assert [summary(e) for e in events] == [
        ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "2.000000", "2.000000"),
    ]
    beta = processor.store.get("beta")
    assert beta is not None and beta.source_offsets == {3: 7}
    assert beta.ledger.periods["2026-11"].gpu_unit_seconds == 3600


@pytest.mark.parametrize(("change", "reason"), [
    pytest.param({"quantity": "-1"}, "quantity", id="negative quantity"),
    pytest.param(
        {"window_end": "2026-11-09T00:00:00Z"}, "window_end must be after window_start",
        id="end before start",
    ),
    # no offset
    pytest.param({"window_start": "2026-11-10T00:00:00"}, "window_start", id="start without offset"),
    pytest.param({"tenant": "Not A Tenant"}, "tenant", id="bad tenant"),
    pytest.param({"kind": "tpu"}, "kind", id="unknown kind"),
])
def test_an_unreadable_rated_record_is_refused_with_a_reason(change: dict[str, str], reason: str) -> None:
    processor = processor_for(tenants({"gpu_hours": 2}))
    good = rated("ok", "2026-11-10T00:00:00Z").model_dump(mode="json")
    bad = json.dumps({**good, **change}).encode()
    with pytest.raises(BadRatedRecord, match="unreadable rated record") as refused:
        processor.process_record(join([json.dumps(good).encode(), bad]))
    assert reason in str(refused.value)
    assert processor.store.get("alpha") is None  # nothing of the record was counted
    with pytest.raises(BadRatedRecord):
        processor.process_record(b"not json")


def test_a_record_counted_at_once_equals_its_samples_counted_one_by_one() -> None:
    """quota.accounting.count on a whole record (what the processor does) against one at a time."""
    record = [
        *gpus("w1", 3, "2026-11-30T23:59:00Z", seconds=60, pod_uid="p1"),  # one window of 3 devices
        rated("w0", "2026-11-30T23:58:00Z", seconds=60, pod_uid="p1", quantity="5"),  # older: billed only
        rated("w1-0", "2026-11-30T23:59:00Z", seconds=60, pod_uid="p1"),  # a duplicate inside the record
        rated("dec", "2026-12-01T00:00:00Z", seconds=60, pod_uid="p2", quantity="0.5", cost="0.25"),
        rated("cpu", "2026-12-01T00:00:00Z", kind="cpu", quantity="8", cost="0.32"),
    ]
    usages = [Usage.from_rated(usage) for usage in record]
    earlier = rated("old", "2026-11-30T23:57:00Z", seconds=60, pod_uid="p1")
    start = count(TenantLedger(tenant="alpha"), Usage.from_rated(earlier))
    at_once = count(start, usages)
    one_by_one = start
    for usage in usages:
        one_by_one = count(one_by_one, usage)
    assert at_once == one_by_one
    assert at_once.pods["p1"].quantity == 3 and at_once.pods["p2"].quantity == Decimal("0.5")
    assert at_once.periods["2026-11"].gpu_unit_seconds == 60 + 3 * 60 + 5 * 60
    assert at_once.periods["2026-12"].list_spend == Decimal("0.57")
    assert at_once.recent_event_ids[-6:] == ("w1-0", "w1-1", "w1-2", "w0", "dec", "cpu")


# --- replays -------------------------------------------------------------------------------------


def test_a_replayed_record_is_not_counted_twice() -> None:
    processor = processor_for(tenants({"gpu_hours": 4, "warn_at": ["0.5"]}))
    first = gpus("r3", 2, "2026-11-10T00:00:00Z")
    steps: list[tuple[str, list[RatedUsage], int, int, list[Summary]]] = [
        ("partition 0, offset 3: 2 of 4", first, 0, 3, [
            ("alpha", "gpu_hours", "warning", "0.5", "2026-11", "2.000000", "4.000000")]),
        ("the same record again", first, 0, 3, []),
        # Rated again after the rating agent crashed: new records, same source position.
        ("re-rated, same position, other ids", gpus("again", 3, "2026-11-10T01:00:00Z"), 0, 3, []),
        ("an older offset of partition 0", gpus("r2", 3, "2026-11-10T01:00:00Z"), 0, 2, []),
        ("the same event ids at a new offset", first, 0, 5, []),  # counted once by event_id
        ("partition 1 has its own offsets: 3 of 4", gpus("p1", 1, "2026-11-10T01:00:00Z"), 1, 0, []),
        ("partition 0, offset 6: 4 of 4", gpus("r6", 1, "2026-11-10T02:00:00Z"), 0, 6, [
            ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "4.000000", "4.000000")]),
    ]
    for name, usages, partition, offset, expected in steps:
        assert [summary(e) for e in processor.process(usages, partition, offset)] == expected, name
    state = processor.store.get("alpha")
    assert state is not None
    assert state.ledger.periods["2026-11"].gpu_unit_seconds == 4 * 3600
    assert state.source_offsets == {0: 6, 1: 0}
    assert processor.counters.replayed == 3


def test_a_replay_from_an_older_stored_state_republishes_the_same_event_ids() -> None:
    """A crash after the events were published and before the ledger was stored."""
    policies = tenants({"gpu_hours": 3, "warn_at": ["0.5"]})
    store = MemoryLedgerStore()
    before = processor_for(policies, store)
    before.process(gpus("r0", 1, "2026-11-10T00:00:00Z"), 0, 0)
    stored = dict(store.states)  # what the changelog held when the worker died
    published = before.process(gpus("r1", 3, "2026-11-10T01:00:00Z"), 0, 1)
    assert [e.level for e in published] == ["warning", "exceeded"]

    restored = MemoryLedgerStore()
    restored.states.update(stored)
    after = processor_for(policies, restored)
    replayed = after.process(gpus("r1", 3, "2026-11-10T01:00:00Z"), 0, 1)
    assert [e.event_id for e in replayed] == [e.event_id for e in published]
    assert restored.states["alpha"].ledger == store.states["alpha"].ledger
    assert restored.states["alpha"].source_offsets == store.states["alpha"].source_offsets == {0: 1}


def test_the_stored_state_round_trips_exactly_through_json() -> None:
    processor = processor_for(tenants({"spend": "1.00", "max_gpus": 2}))
    processor.process([rated("x", "2026-11-10T00:00:00Z", quantity="0.142857142857", seconds=61,
                             cost="0.123456789012345678")], 4, 9)
    state = processor.store.get("alpha")
    assert state is not None
    assert decode_state(encode_state(state)) == state


# --- the quota clock: ticks ----------------------------------------------------------------------


def test_a_tick_rolls_the_period_over_without_new_usage() -> None:
    clock = FakeMonotonic()
    processor = processor_for(tenants({"gpu_hours": 2}), clock=clock)
    # 6 GPUs for 30 minutes = 3 GPU-hours, ending at 23:30 on the last day of November.
    assert [e.level for e in processor.process(gpus("r0", 1, "2026-11-30T23:00:00Z", quantity="6",
                                                         seconds=1800), 0, 0)] == ["exceeded"]
    ticks: list[tuple[float, list[Summary]]] = [
        (0, []),
        (1799, []),  # 23:59:59
        (1, [("alpha", "gpu_hours", "recovered", "1", "2026-11", "3.000000", "2.000000")]),  # 00:00:00
        (3600, []),
    ]
    for seconds, expected in ticks:
        clock.advance(seconds)
        assert [summary(e) for e in processor.tick()] == expected, seconds
    assert processor.clock("alpha") == ts("2026-12-01T01:00:00Z")


def test_a_tick_frees_the_gpus_of_a_pod_that_stopped_reporting() -> None:
    clock = FakeMonotonic()
    processor = processor_for(tenants({"max_gpus": 4}), clock=clock)
    processor.process(gpus("r0", 1, "2026-11-10T00:00:00Z", quantity="4", seconds=60), 0, 0)
    ticks: list[tuple[float, list[Summary]]] = [
        (120, []),  # silent for exactly stale_seconds: still holds its 4 GPUs
        (0.5, [("alpha", "max_gpus", "recovered", "1", "2026-11", "0", "4")]),
        (600, []),
    ]
    for seconds, expected in ticks:
        clock.advance(seconds)
        assert [summary(e) for e in processor.tick()] == expected, seconds


def test_the_clock_follows_event_time_and_never_runs_back() -> None:
    clock = FakeMonotonic()
    processor = processor_for(tenants({"gpu_hours": 100}), clock=clock)
    assert processor.clock("alpha") is None and processor.tick() == []
    processor.process(gpus("r0", 1, "2026-11-10T05:00:00Z"), 0, 0)
    assert processor.clock("alpha") == ts("2026-11-10T06:00:00Z")
    clock.advance(30)
    processor.process(gpus("late", 1, "2026-11-10T01:00:00Z"), 0, 1)  # a late record
    assert processor.clock("alpha") == ts("2026-11-10T06:00:30Z")
    # A backlog read fast: event time moves ahead of monotonic time.
    processor.process(gpus("r2", 1, "2026-11-10T09:00:00Z"), 0, 2)
    assert processor.clock("alpha") == ts("2026-11-10T10:00:00Z")
    # A restarted worker resumes from the stored clock.
    resumed = processor_for(tenants({"gpu_hours": 100}), processor.store)
    assert resumed.clock("alpha") == ts("2026-11-10T10:00:00Z")


# --- reloads of the tenants file -----------------------------------------------------------------


def test_a_raised_limit_recovers_and_a_lowered_one_exceeds() -> None:
    processor = processor_for(tenants({"gpu_hours": 10, "warn_at": ["0.5"], "on_exceed": "block"}))
    events = processor.process(gpus("r0", 11, "2026-11-10T00:00:00Z"), 0, 0)
    assert [e.level for e in events] == ["warning", "exceeded"]
    assert _state(processor) == "blocked"

    raised = processor.reload(tenants({"gpu_hours": 20, "warn_at": ["0.5"], "on_exceed": "block"}))
    # 11 of 20 is over 0.5 again, already announced under the old limit: only the recovery.
    assert [summary(e) for e in raised] == [
        ("alpha", "gpu_hours", "recovered", "1", "2026-11", "11.000000", "20.000000")]
    assert _state(processor) == "warning"
    assert processor.reload(tenants({"gpu_hours": 20, "warn_at": ["0.5"], "on_exceed": "block"})) == []

    lowered = processor.reload(tenants({"gpu_hours": 5, "on_exceed": "block"}))
    assert [summary(e) for e in lowered] == [
        ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "11.000000", "5.000000")]
    assert _state(processor) == "blocked"

    removed = processor.reload(TenantsFile())
    assert [summary(e) for e in removed] == [
        ("alpha", "gpu_hours", "recovered", "1", "2026-11", "11.000000", "5.000000")]
    assert _state(processor) == "ok"


def _state(processor: QuotaProcessor) -> str:
    state = processor.store.get("alpha")
    clock = processor.clock("alpha")
    assert clock is not None
    return tenant_status("alpha", state, processor.policy("alpha"), clock).state


@pytest.mark.parametrize(("on_exceed", "used", "expected"), [
    pytest.param("block", 5, "ok", id="block-below-the-warning"),
    pytest.param("block", 8, "warning", id="block-at-the-warning"),
    pytest.param("block", 10, "blocked", id="block-at-the-limit"),
    pytest.param("preempt", 12, "blocked", id="preempt-over-the-limit"),
    pytest.param("notify", 10, "exceeded", id="notify-at-the-limit"),
])
def test_tenant_state(on_exceed: str, used: int, expected: str) -> None:
    processor = processor_for(tenants({"gpu_hours": 10, "warn_at": ["0.8"], "on_exceed": on_exceed}))
    processor.process(gpus("r0", used, "2026-11-10T00:00:00Z"), 0, 0)
    assert _state(processor) == expected


GOOD = "tenants:\n  - tenant: alpha\n    gpu_hours: 10\n"
BAD_FILES = {
    "a field of the wrong type": ("tenants:\n  - tenant: alpha\n    gpu_hours: lots\n", "gpu_hours"),
    "an unknown field": ("tenants:\n  - tenant: alpha\n    gpu_hour: 5\n", "gpu_hour"),
    "warn_at out of range": ("tenants:\n  - tenant: alpha\n    warn_at: [1.5]\n", "warn_at"),
    "not YAML at all": ("tenants: [\n  - tenant: alpha\n", "not valid YAML"),
    "a tenant listed twice": ("tenants:\n  - tenant: alpha\n  - tenant: alpha\n", "more than once"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_tenants_file_is_refused_in_one_line_and_the_last_good_one_stays(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    content, field_named = BAD_FILES[name]
    path = tmp_path / "tenants.yaml"
    path.write_text(GOOD)
    watcher = TenantsWatcher(path)
    processor = processor_for(watcher.current)
    assert watcher.poll() is None  # unchanged

    path.write_text(content)
    with caplog.at_level(logging.ERROR, logger="gpumeter.quota"):
        assert watcher.poll() is None
        assert watcher.poll() is None  # the same bad content is not reported again
    refusals = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(refusals) == 1
    assert "\n" not in refusals[0] and str(path) in refusals[0] and field_named in refusals[0]
    # Still the last good limit of 10: 10 GPU-hours exceed it.
    events = processor.process(gpus("r0", 10, "2026-11-10T00:00:00Z"), 0, 0)
    assert [summary(e) for e in events] == [
        ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "10.000000", "10.000000")]

    path.write_text(GOOD.replace("10", "20"))
    fixed = watcher.poll()
    assert fixed is not None and fixed.policy("alpha") is not None
    assert [summary(e) for e in processor.reload(fixed)] == [
        ("alpha", "gpu_hours", "recovered", "1", "2026-11", "10.000000", "20.000000")]


def test_a_deleted_tenants_file_keeps_the_last_good_one_until_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(GOOD)
    watcher = TenantsWatcher(path)
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="gpumeter.quota"):
        assert watcher.poll() is None
        assert watcher.poll() is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"tenants file refused, the last good one stays in force: {path}: file not found"]
    assert watcher.current.policy("alpha") is not None
    path.write_text(GOOD)
    assert watcher.poll() is not None


def test_a_state_written_by_this_module_is_what_the_status_reads() -> None:
    """tenant_status reads a LedgerState as the CLI gets it from the changelog: bytes."""
    processor = processor_for(tenants({"gpu_hours": 4, "spend": "10.00", "on_exceed": "preempt"}))
    processor.process(gpus("r0", 5, "2026-11-10T00:00:00Z", cost="1.50"), 0, 0)
    state = processor.store.get("alpha")
    assert state is not None
    read_back: LedgerState = decode_state(encode_state(state))
    status = tenant_status("alpha", read_back, processor.policy("alpha"), ts("2026-11-20T00:00:00Z"))
    assert status.state == "blocked" and status.blocked == ["gpu_hours"]
    assert [(m.metric, m.used, m.limit, m.state) for m in status.metrics] == [
        ("gpu_hours", Decimal(5), Decimal(4), "exceeded"),
        ("spend", Decimal("7.50"), Decimal("10.00"), "ok"),
        ("max_gpus", Decimal(0), None, "ok"),  # 20 Nov: the pods' windows are long stale
    ]


def located(usages: list[RatedUsage], offset: int) -> bytes:
    """A rated record of ``usages`` as the rating agent writes it, from samples offset ``offset``."""
    return join([usage.model_copy(update={"source_partition": 0, "source_offset": offset}).model_dump_json()
                 .encode() for usage in usages])


def test_per_model_limits_read_the_model_of_each_rated_line() -> None:
    processor = processor_for(tenants({"gpu_hours": 100, "gpu_hours_by_model": {"H100-": 2}}))
    record = gpus("a", 2, "2026-11-10T00:00:00Z")  # 2 H100-hours: 2 of 2
    events = processor.process_record(located(record, 1))
    assert [(e.level, e.gpu_model, str(e.used)) for e in events] == [("exceeded", "H100-", "2.000000")]
    # A tenant-wide event's JSON has no gpu_model key; a per-model one does.
    assert "gpu_model" not in json.loads(encode_event(events[0].model_copy(update={"gpu_model": None})))
    assert json.loads(encode_event(events[0]))["gpu_model"] == "H100-"


def per_model_records() -> list[bytes]:
    """Two samples records: 2 H100-hours and 1 A100-hour, then 3 A100-hours and a CPU line."""
    a100 = {"gpu_model": "A100-SXM-40GB"}
    first = gpus("h", 2, "2026-11-10T00:00:00Z") + [
        usage.model_copy(update=a100) for usage in gpus("a", 1, "2026-11-10T00:00:00Z")]
    second = [usage.model_copy(update=a100) for usage in gpus("b", 3, "2026-11-10T01:00:00Z")]
    second.append(rated("c-0", "2026-11-10T01:00:00Z", kind="cpu", quantity="4"))
    return [located(first, 1), located(second, 2)]


def test_per_model_limits_keep_the_fast_reader_and_count_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """With per-model limits in force the rating agent's records are still read by the native
    reader (RatedLine is never asked), and each model's hours are what RatedLine gives."""
    assert quota_decode._NATIVE is not None, "gpumeter_native is not built: `make install` builds it"
    policy = tenants({"gpu_hours": 100, "gpu_hours_by_model": {"H100-": 2, "A100-": 4}})
    records = per_model_records()

    slow = processor_for(policy)
    with monkeypatch.context() as patch:
        patch.setattr(quota_module, "read_usages", lambda record: None)  # every record to RatedLine
        slow_events = [slow.process_record(record) for record in records]

    def no_rated_line(record: bytes) -> list[Any]:
        raise AssertionError("a rating agent's record was left to RatedLine")

    fast = processor_for(policy)
    monkeypatch.setattr(quota_module, "decode_rated", no_rated_line)
    fast_events = [fast.process_record(record) for record in records]

    # By hand: H100 2 x 1 h = 7200 unit-seconds; A100 1 x 1 h + 3 x 1 h = 14400; the CPU line none.
    expected = {"H100-SXM-80GB": Decimal(7200), "A100-SXM-40GB": Decimal(14400)}
    for processor in (slow, fast):
        state = processor.store.get("alpha")
        assert state is not None
        assert state.ledger.periods["2026-11"].gpu_unit_seconds_by_model == expected
        assert state.ledger.periods["2026-11"].gpu_unit_seconds == Decimal(21600)
    assert fast_events == slow_events
    # H100 reaches 2 of 2 with the first record; A100 1 of 4, then 4 of 4 with the second.
    assert [[(e.level, e.gpu_model, str(e.used)) for e in events] for events in fast_events] == [
        [("exceeded", "H100-", "2.000000")], [("exceeded", "A100-", "4.000000")]]
