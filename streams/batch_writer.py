"""Storing what an agent read, in batches, acknowledging each event only once its rows are stored.

The worker's agents do not auto-acknowledge: an event's offset becomes committable only
after the batch holding its rows is stored in ClickHouse (faust flushes the producer before
every commit), so a committed record is stored, and a crash replays what was not. ClickHouse
being down stalls the batch with exponential back-off; nothing is acknowledged meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from faust.types import TP, EventT, StreamT

from gpumeter.infra.rows import Row
from streams.sink import StoreResult, first_line

log = logging.getLogger("gpumeter.worker")
T = TypeVar("T")


@dataclass
class PendingBatch:
    """Events held unacknowledged until the rows they produced are stored (rows may be fewer)."""

    events: list[EventT] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # rows each event added, in order
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


Rejected = list[tuple[Row, str]]


def _in_daemon_thread(function: Callable[[], T]) -> asyncio.Future[T]:
    """Run blocking I/O off the event loop in a daemon thread.

    Unlike the default executor's threads, a daemon thread does not hold the process at
    exit, so SIGTERM stops a worker whose ClickHouse call hangs until its timeout.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            value = function()
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
            loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            loop.call_soon_threadsafe(settle, lambda: future.set_result(value))

    threading.Thread(target=run, name="clickhouse-store", daemon=True).start()
    return future


class BatchWriter:
    """Flushes a PendingBatch into ClickHouse, retrying transient failures with back-off.

    Rows the store refuses for good come back from it and go to ``on_rejected`` (which
    dead-letters them, reason ``unstorable``), and later copies of a billed event_id that
    differ from it to ``on_conflicts`` (``duplicate_conflict``), before their events are
    acknowledged. After ``stop()`` nothing more
    is acknowledged: a batch not stored stays uncommitted and is replayed by the next owner.

    One batch is stored while the next is gathered: a full batch is handed to a task and
    ``add`` returns, so the agent rates on while ClickHouse works; the next batch starts only
    once the one before it is stored and acknowledged, so batches are stored and acknowledged
    in order and the store sees every earlier batch when it looks for replays.
    """

    def __init__(
        self, store: Callable[[Sequence[Row]], StoreResult], name: str, batch_size: int, max_backoff: float,
        on_rejected: Callable[[Rejected], Awaitable[None]] | None = None,
        on_conflicts: Callable[[Rejected], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.batch_size = batch_size
        self.max_backoff = max_backoff
        self.on_rejected = on_rejected
        self.on_conflicts = on_conflicts
        self.pending = PendingBatch()
        self.stream: StreamT | None = None
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()  # clear while a batch is being stored
        self._idle.set()
        self._in_flight: asyncio.Task[None] | None = None  # the batch being stored
        self._failure: BaseException | None = None  # what ended a batch's task unexpectedly
        # Per partition, the consumer generation in which it was last revoked from this worker.
        self._revoked_in: dict[TP, int] = {}

    def stop(self) -> None:
        self._stopping.set()

    def _stale(self, event: EventT) -> bool:
        """Fetched before its partition was last revoked from this worker: by then the
        partition's earlier records held here were dropped, and it may belong to another worker."""
        if not self._revoked_in:
            return False
        revoked_in = self._revoked_in.get(event.message.tp)
        if revoked_in is None:
            return False
        fetched_in = getattr(event.message, "generation_id", None)
        return fetched_in is None or fetched_in <= revoked_in

    async def add(self, event: EventT, rows: list[Row]) -> None:
        """Hold ``event`` until a flush stores its ``rows`` (none: just acknowledge it in order).

        An event fetched before its partition was revoked (the agent held it while the
        rebalance dropped the partition's pending batch) is dropped too: stored and acknowledged
        after the records before it were dropped, it would be a committable offset past records
        nobody stored. It is read again from the committed offset, here or by the new owner.
        """
        if self._stale(event):
            return
        async with self.pending.lock:
            self.pending.events.append(event)
            self.pending.rows.extend(rows)
            self.pending.sizes.append(len(rows))
            full = len(self.pending.rows) >= self.batch_size or len(self.pending.events) >= self.batch_size
        if full:
            await self._launch()

    async def flush(self) -> None:
        """Store what is pending and wait until it, and every batch before it, is stored and
        acknowledged (or the writer is stopped)."""
        await self._launch()
        await self._settle()

    async def _launch(self) -> None:
        """Hand what is pending to a task of its own, once the batch before it is done.

        Storing beside the agent was tried four times with the store in a thread and was slower
        each time while the consumer fetched 1 MiB a partition: the agent, no longer waiting
        for its batch, starved the fetching thread (a worker whose store cost nothing was slower
        than the real one). With bigger fetches (``worker.fetch_partition_bytes``) it is faster:
        9.2-9.9k against 7.6k samples/s, alternated (README, Measured).
        """
        while True:
            self._raise_failure()
            if self._nothing_to_launch():
                return
            # The batch before is waited for without the lock: the agent goes on adding
            # meanwhile (an add that fills the batch waits here itself, which bounds the batch).
            # Holding the lock, a flush of the timer stopped the agent for a whole store: the
            # fleet's window waited behind ClickHouse, and a quota crossing behind the window
            # with it (benchmarks/quota_latency.py).
            await self._settle()
            async with self.pending.lock:
                self._raise_failure()
                if self._nothing_to_launch():  # revoked, taken by another launch, or stopped meanwhile
                    return
                if self._in_flight is not None and not self._in_flight.done():
                    continue  # another launch got in first: its batch goes before this one
                rows, events = self.pending.rows, self.pending.events
                self.pending.rows, self.pending.events, self.pending.sizes = [], [], []
                self._idle.clear()
                self._in_flight = asyncio.ensure_future(self._store_then_idle(rows, events))
                return

    def _nothing_to_launch(self) -> bool:
        return not self.pending.events or self.stream is None or self._stopping.is_set()

    async def _store_then_idle(self, rows: list[Row], events: list[EventT]) -> None:
        try:
            await self._store_and_ack(rows, events)
        except Exception as exc:
            # Its events stay unacknowledged; the agent stops at its next batch, as it stopped
            # when it stored its batches itself.
            self._failure = exc
        except asyncio.CancelledError as exc:
            self._failure = exc
            raise
        finally:
            self._idle.set()

    async def _settle(self) -> None:
        """Wait for the batch being stored, if any."""
        flight = self._in_flight
        if flight is not None:
            # asyncio.wait: the flight's own failure is _failure's to report, and cancelling
            # the waiter (shutdown) cancels the waiter only, never the store under way.
            await asyncio.wait({flight})
            if flight is self._in_flight:
                self._in_flight = None
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self.name}: storing a batch failed") from self._failure

    async def revoke(self, revoked: set[TP], generation: int | None, wait_seconds: float = 10.0) -> None:
        """Partitions taken away in a rebalance (``generation``: the consumer generation ending):
        drop their pending events and rows, so the batch is not stored behind the new owner's
        back (faust seeks every partition back to its committed offset, so they are read again,
        here or by the new owner), and give a batch being stored a bounded time to finish
        before the partitions move; its events of these partitions are not acknowledged."""
        for tp in revoked:
            self._revoked_in[tp] = generation if generation is not None else -1
        # No await until the pending lists are rebuilt: add() cannot interleave.
        kept_events: list[EventT] = []
        kept_rows: list[Row] = []
        kept_sizes: list[int] = []
        position = 0
        dropped = 0
        for event, size in zip(self.pending.events, self.pending.sizes, strict=True):
            if event.message.tp in revoked:
                dropped += size
            else:
                kept_events.append(event)
                kept_rows.extend(self.pending.rows[position:position + size])
                kept_sizes.append(size)
            position += size
        self.pending.events, self.pending.rows, self.pending.sizes = kept_events, kept_rows, kept_sizes
        if dropped:
            log.info("%s: %d pending rows of revoked partitions dropped", self.name, dropped)
        if not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), wait_seconds)
            except TimeoutError:
                # Its rows are then stored after the new owner may have read them again: the
                # sink's id lookup and insert tokens keep them from being billed twice.
                log.warning("%s: a batch still being stored %.0f s into a rebalance", self.name,
                            wait_seconds)

    async def _store_and_ack(self, rows: list[Row], events: list[EventT]) -> None:
        if rows:
            result = await self._store_with_retry(rows)
            if result is None:
                return  # stopping: leave the batch unacknowledged
            if result.rejected:
                if self.on_rejected is None:
                    log.error("%s: %d rows refused by ClickHouse and not kept: %s", self.name,
                              len(result.rejected), result.rejected[0][1])
                else:
                    await self.on_rejected(result.rejected)
            if result.conflicts:
                if self.on_conflicts is None:
                    log.error("%s: %d conflicting copies of billed event_ids not kept: %s", self.name,
                              len(result.conflicts), result.conflicts[0][1])
                else:
                    await self.on_conflicts(result.conflicts)
        if self._stopping.is_set() or self.stream is None:
            return
        for event in events:
            # Stored, but its partition was revoked meanwhile: its owner reads it again from
            # the committed offset (and finds it stored); an acknowledgement here is stale.
            if not self._stale(event):
                await self.stream.ack(event)

    async def _store_with_retry(self, rows: list[Row]) -> StoreResult | None:
        """The store's result, or None once stop() was called before the rows were stored."""
        delay = 0.2
        attempt = 0
        while not self._stopping.is_set():
            attempt += 1
            try:
                # A thread keeps the event loop (and the consumer's heartbeats) alive during I/O.
                result = await _in_daemon_thread(lambda: self.store(rows))
                if attempt > 1:
                    log.warning("%s: stored %d rows after %d attempts", self.name, len(rows), attempt)
                return result
            except Exception as exc:  # transient: not stored, try again
                pause = delay * (0.5 + random.random())
                log.warning("%s: storing %d rows failed (attempt %d, retry in %.1fs): %s",
                            self.name, len(rows), attempt, pause, first_line(exc)[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause)
                delay = min(delay * 2, self.max_backoff)
        return None

