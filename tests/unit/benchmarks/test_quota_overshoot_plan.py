"""benchmarks/quota_overshoot.py's plan: limits each tenant's use reaches inside a chosen window,
worked by hand from per-window unit-seconds."""

from __future__ import annotations

from decimal import Decimal

import pytest

from benchmarks.quota_overshoot import Planned, plan


def _seconds(*values: int) -> list[Decimal]:
    return [Decimal(v) for v in values]


def test_limits_fall_inside_staggered_windows_and_idle_tenants_are_skipped() -> None:
    usage = {"a": _seconds(3600, 3600, 7200), "b": _seconds(0, 0, 0), "c": _seconds(0, 1800, 3600)}
    # a: window 1, 10 % into it: (3600 + 360) / 3600 = 1.1 h, grace 0.
    # b: no use from window 1 on: skipped.
    # c: window 2 (one crossing a window), 80 % into it: (1800 + 2880) / 3600 = 1.3 h, grace 1.
    assert plan(usage, crossings=2, first_window=1, per_window=1, max_grace=5) == [
        Planned("a", 1, Decimal("1.1"), 0), Planned("c", 2, Decimal("1.3"), 1)]


def test_a_window_without_use_moves_the_crossing_to_the_next_with_use() -> None:
    usage = {"a": _seconds(3600, 0, 360)}
    # Window 1 holds nothing: window 2, 10 % in: (3600 + 36) / 3600 = 1.01 h.
    assert plan(usage, crossings=1, first_window=1, per_window=1, max_grace=0) == [
        Planned("a", 2, Decimal("1.01"), 0)]


def test_too_few_tenants_with_use_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="only 1 tenants"):
        plan({"a": _seconds(0, 3600), "b": _seconds(0, 0)}, crossings=2, first_window=1, per_window=1,
             max_grace=0)
