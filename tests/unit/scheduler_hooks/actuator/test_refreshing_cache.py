"""The actuator's RefreshingCache (namespaces and node labels): an aged value is served at once
while one background read replaces it; only the first read and ``fresh`` reads are waited for.

No timing: a fake monotonic clock that moves only when the test moves it, reads held open by
an asyncio.Event, and "did not wait" checked by event-loop turns (a get() that waited for a
held read would still be pending after them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from scheduler_hooks.actuator.refreshing_cache import RefreshingCache

MAX_AGE = 5.0


class FakeMonotonic:
    def __init__(self) -> None:
        self.value = 100.0

    def __call__(self) -> float:
        return self.value


class Source:
    """What the API server would answer: "v1", "v2", ... per read, or an error when told;
    a read can be held open until the test releases it."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail_next = False
        self.gate = asyncio.Event()
        self.gate.set()

    async def read(self) -> str:
        self.reads += 1
        number = self.reads
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("API server away")
        return f"v{number}"


class Harness:
    def __init__(self) -> None:
        self.clock = FakeMonotonic()
        self.source = Source()
        self.spawned: list[asyncio.Future[Any]] = []
        self.cache = RefreshingCache(self.source.read, MAX_AGE, self.spawn, monotonic=self.clock)

    def spawn(self, work: Awaitable[Any]) -> None:
        self.spawned.append(asyncio.ensure_future(work))

    async def settle(self) -> None:
        await asyncio.gather(*self.spawned)


async def turns(count: int = 10) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_the_first_get_waits_for_a_read_then_a_young_value_is_served_without_reading() -> None:
    async def run() -> None:
        h = Harness()
        assert await h.cache.get() == "v1"
        h.clock.value += MAX_AGE  # exactly max_age old: not aged yet
        assert await h.cache.get() == "v1"
        assert h.source.reads == 1
        assert h.spawned == []

    asyncio.run(run())


def test_an_aged_value_is_served_at_once_while_one_background_read_replaces_it() -> None:
    async def run() -> None:
        h = Harness()
        await h.cache.get()
        h.clock.value += MAX_AGE + 1
        h.source.gate.clear()  # the background read stays open until released
        first = asyncio.ensure_future(h.cache.get())
        second = asyncio.ensure_future(h.cache.get())
        await turns()
        assert first.done() and second.done(), "a get() waited for the background read"
        assert (first.result(), second.result()) == ("v1", "v1")
        assert len(h.spawned) == 1, "one background read, not one per caller"
        h.source.gate.set()
        await h.settle()
        assert await h.cache.get() == "v2"
        assert h.source.reads == 2

    asyncio.run(run())


def test_a_failed_background_read_keeps_the_old_value_and_the_next_aged_get_tries_again() -> None:
    async def run() -> None:
        h = Harness()
        await h.cache.get()
        h.clock.value += MAX_AGE + 1
        h.source.fail_next = True
        assert await h.cache.get() == "v1"
        await h.settle()  # the read failed; its error is logged, not raised
        assert await h.cache.get() == "v1"  # still aged: a second background read goes out
        assert len(h.spawned) == 2
        await h.settle()
        assert await h.cache.get() == "v3"

    asyncio.run(run())


def test_a_fresh_get_waits_for_a_read_that_started_after_it_asked_and_shares_one() -> None:
    async def run() -> None:
        h = Harness()
        await h.cache.get()
        h.source.gate.clear()
        early = asyncio.ensure_future(h.cache.get(fresh=True))
        await turns()  # early's read (the 2nd) has started and is held open
        later = [asyncio.ensure_future(h.cache.get(fresh=True)) for _ in range(2)]
        await turns()
        assert not early.done() and not any(task.done() for task in later)
        h.source.gate.set()
        # Read 2 started before the later two asked: too old for them. They share read 3, which
        # started after both had asked.
        assert await asyncio.gather(early, *later) == ["v2", "v3", "v3"]
        assert h.source.reads == 3
        assert h.spawned == []

    asyncio.run(run())


def test_a_first_read_that_fails_raises_to_the_caller() -> None:
    async def run() -> None:
        h = Harness()
        h.source.fail_next = True
        with pytest.raises(ConnectionError):
            await h.cache.get()
        assert await h.cache.get() == "v2"

    asyncio.run(run())
