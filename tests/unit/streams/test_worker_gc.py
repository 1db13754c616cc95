"""The worker's garbage-collector pacing (streams.app.tune_gc)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streams.app import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    if enabled:
        gc.enable()


@pytest.mark.usefixtures("restored_gc")
def test_start_up_objects_are_frozen_and_young_collections_are_paced() -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    survivor = [object()]  # a container alive before tuning: frozen with the start-up heap
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert not any(obj is survivor for obj in gc.get_objects())  # no longer traversed
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, old)


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: refcounting never frees it, only the collector


@pytest.mark.usefixtures("restored_gc")
def test_cycles_made_after_tuning_are_collected_without_being_asked() -> None:
    """The worker never calls gc.collect(): the tuned pacing must still collect on its own."""
    tune_gc()
    probe = weakref.ref(Node())
    assert probe() is not None
    kept: list[list[None]] = []
    for _ in range(3 * GC_YOUNG_THRESHOLD):  # tracked containers that stay alive: they count
        kept.append([])
        if probe() is None:
            break
    assert probe() is None, "no automatic collection ran after three young thresholds of allocations"
