"""A value the actuator reads from the API server (every namespace, every node), kept in memory."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("gpumeter.actuator")
T = TypeVar("T")


class RefreshingCache(Generic[T]):
    """A value read from the API server (every namespace, every node), kept in memory.

    ``get()`` waits for a read only the first time, or when asked for a ``fresh`` value; a value
    older than ``max_age`` is returned as it is while one read in the background replaces it.
    Before this, every event that came upon an aged cache waited for a list of every namespace
    (or node), the eviction with it: a tail of the quota benchmark. Staleness stays bounded by
    ``max_age`` plus one read. A background read that fails keeps the old value, and the next
    ``get()`` after that tries again. Concurrent ``fresh`` callers share one read when it
    started after they asked.
    """

    def __init__(self, load: Callable[[], Awaitable[T]], max_age: float,
                 spawn: Callable[[Awaitable[Any]], None], monotonic: Callable[[], float] = time.monotonic,
                 what: str = "value") -> None:
        """``spawn`` keeps the background read's task (the actuator cancels its tasks at stop)."""
        self._load = load
        self._max_age = max_age
        self._spawn = spawn
        self._monotonic = monotonic
        self._what = what
        self._value: T | None = None
        self._read_at = float("-inf")  # when the read that gave the value started
        self._loaded = False
        self._reads = 0  # reads started so far; counted, as two clock readings can be equal
        self._value_read = 0  # the number of the read that gave the value
        self._lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None

    async def get(self, fresh: bool = False) -> T:
        if fresh or not self._loaded:
            return await self._read(self._reads)
        idle = self._background is None or self._background.done()
        if idle and self._monotonic() - self._read_at > self._max_age:
            self._background = asyncio.ensure_future(self._refresh())
            self._spawn(self._background)
        return self._current()

    def _current(self) -> T:
        if not self._loaded:
            raise RuntimeError("RefreshingCache read before its first load")
        return self._value  # type: ignore[return-value]  # T itself may include None

    async def _read(self, started_before: int) -> T:
        """A value from a read started after ``started_before`` reads had started."""
        async with self._lock:
            if self._loaded and self._value_read > started_before:
                return self._current()  # a read that started after we asked: as fresh as ours
            self._reads += 1
            number, started = self._reads, self._monotonic()
            value = await self._load()
            self._value, self._read_at, self._value_read, self._loaded = value, started, number, True
            return value

    async def _refresh(self) -> None:
        try:
            await self._read(self._reads)
        except Exception as exc:  # the old value stays; the next get() after max_age tries again
            log.warning("reading %s failed, the last one stays in use: %s", self._what,
                        (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300])
