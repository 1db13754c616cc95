"""quota/overshoot.py: the GPU-hours a preempt tenant can use past its limit, worked by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gpumeter.app.cli.quota import _document
from quota.accounting import MetricStatus
from quota.overshoot import EnforcementDelays, WindowUsage, measured_overshoot, overshoot_bound
from streams.quota import TenantStatus

PICO = Decimal("1e-12")
DELAYS = EnforcementDelays(window_seconds=Decimal(15), lag_seconds=Decimal("1.5"))


def test_the_bound_is_gpus_held_times_window_lag_and_grace() -> None:
    # 8 GPUs x (15 + 1.5 + 30) s = 372 GPU-seconds = 0.103333... h, rounded up.
    assert overshoot_bound("gpu_hours", "preempt", Decimal(8), 30, DELAYS) == Decimal("0.103334")
    # 0.5 GPU (MIG) x 3600 s of grace + 16.5 s: (0.5 x 3616.5) / 3600 = 0.50229166... h
    assert overshoot_bound("gpu_hours", "preempt", Decimal("0.5"), 3600, DELAYS) == Decimal("0.502292")
    assert overshoot_bound("gpu_hours", "preempt", Decimal(0), 30, DELAYS) == Decimal("0.000000")


@pytest.mark.parametrize(("metric", "on_exceed"), [
    ("gpu_hours", "block"), ("gpu_hours", "notify"), ("gpu_hours", None), ("spend", "preempt"),
    ("max_gpus", "preempt"),
], ids=["block-lets-running-pods-finish", "notify-acts-on-nothing", "no-policy",
        "spend-accrues-from-every-kind", "max-gpus-is-enforced-at-admission"])
def test_no_bound_is_stated_where_nothing_ends_the_usage(metric: str, on_exceed: str | None) -> None:
    assert overshoot_bound(metric, on_exceed, Decimal(8), 30, DELAYS) is None


def test_negative_gpus_held_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        overshoot_bound("gpu_hours", "preempt", Decimal(-1), 30, DELAYS)


def test_quota_status_states_the_bound_of_each_gpu_hours_quota_from_the_gpus_held_now() -> None:
    at = datetime(2026, 11, 20, tzinfo=UTC)
    metrics = [
        MetricStatus(metric="gpu_hours", period="2026-11", used=Decimal(90), limit=Decimal(100),
                     fraction=Decimal("0.9"), state="warning"),
        MetricStatus(metric="max_gpus", period="2026-11", used=Decimal(12), limit=None, fraction=None,
                     state="ok"),
        MetricStatus(metric="gpu_hours", period="2026-11", used=Decimal(5), limit=Decimal(10),
                     fraction=Decimal("0.5"), state="ok", gpu_model="H100-"),
    ]
    entry = TenantStatus(tenant="team-a", state="warning", on_exceed="preempt", blocked=[], at=at,
                         metrics=metrics)
    document = _document(entry, DELAYS, grace_seconds=60)
    # 12 GPUs x (15 + 1.5 + 60) s = 918 GPU-seconds = 0.255 h, for the tenant-wide quota and the
    # per-model one alike (the GPUs of every model bound those of one).
    assert [metric["overshoot_bound"] for metric in document["metrics"]] == ["0.255000", None, "0.255000"]


# -- the overshoot measured from stored windows --------------------------------------------------


def _window(minute: int, unit_seconds: str, gpus: str) -> WindowUsage:
    return WindowUsage(datetime(2026, 12, 6, 10, minute, tzinfo=UTC), Decimal(unit_seconds), Decimal(gpus))


def test_the_measured_overshoot_is_the_use_past_the_limit_up_to_the_last_victims_window() -> None:
    # 8 GPUs for 60 s windows = 480 GPU-seconds each. Limit 0.25 h = 900 s: 480 + 480 = 960 s reach
    # it in the second window (10:01). The last victim ended in 10:02, which held 2 GPUs for 30 s
    # (60 GPU-seconds); 10:03 (a pod left running) comes after and is not counted.
    windows = [_window(3, "60", "1"), _window(1, "480", "8"), _window(0, "480", "8"), _window(2, "60", "2")]
    measured = measured_overshoot(windows, Decimal("0.25"), datetime(2026, 12, 6, 10, 2, tzinfo=UTC))
    assert measured is not None
    assert measured.crossing_window == datetime(2026, 12, 6, 10, 1, tzinfo=UTC)
    assert measured.gpus_held == Decimal(8)
    # (480 + 480 + 60) / 3600 = 1020 / 3600 = 0.28333... h; past 0.25 h by 120 / 3600 h.
    assert measured.used.quantize(PICO) == Decimal("0.283333333333")
    assert measured.overshoot.quantize(PICO) == Decimal("0.033333333333")


def test_a_limit_reached_exactly_crosses_in_that_window() -> None:
    windows = [_window(0, "1800", "1"), _window(1, "1800", "1")]
    measured = measured_overshoot(windows, Decimal("0.5"), datetime(2026, 12, 6, 10, 1, tzinfo=UTC))
    assert measured is not None
    assert measured.crossing_window == datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
    assert measured.overshoot == Decimal("0.5")


def test_no_crossing_by_the_cut_off_is_none() -> None:
    windows = [_window(0, "1800", "1"), _window(1, "1800", "1")]
    assert measured_overshoot(windows, Decimal("0.75"), datetime(2026, 12, 6, 10, 0, tzinfo=UTC)) is None
    assert measured_overshoot([], Decimal("0.1"), datetime(2026, 12, 6, 10, 0, tzinfo=UTC)) is None
