"""The batch writer: events acknowledged only once their rows are stored, in order, retried with
back-off, dropped when their partition is revoked, and nothing more after stop().

The stores are stand-ins (the ClickHouse sink has its own tests, test_sink.py); rows need
only their event_id first.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

from clickhouse_connect.driver.exceptions import OperationalError

from gpumeter.infra.rows import Row
from streams.batch_writer import BatchWriter
from streams.sink import StoreResult


def row(event_id: str) -> Row:
    return (event_id,)


class FakeStream:
    def __init__(self) -> None:
        self.acked: list[object] = []

    async def ack(self, event: object) -> None:
        self.acked.append(event)


class LoggingStream(FakeStream):
    """Acknowledgements written into the same log as the stores, to check their order."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def ack(self, event: object) -> None:
        self.log.append(f"ack {event}")
        await super().ack(event)


def gated_store(log: list[str], release: threading.Event,
                gated: str) -> Callable[[Sequence[Row]], StoreResult]:
    """A store that logs each batch and holds the batch of ids ``gated`` until ``release``."""

    def store(rows: Sequence[Row]) -> StoreResult:
        ids = ",".join(r[0] for r in rows)
        log.append(f"storing {ids}")
        if ids == gated:
            release.wait(5)
        log.append(f"stored {ids}")
        return StoreResult(stored=len(rows))

    return store


def test_writer_dead_letters_refused_rows_then_acknowledges_everything() -> None:
    seen: list[list[tuple[Row, str]]] = []

    async def dead_letter(rejected: list[tuple[Row, str]]) -> None:
        seen.append(rejected)

    def store(rows: Sequence[Row]) -> StoreResult:
        return StoreResult(stored=len(rows) - 1, rejected=[(rows[1], "refused")])

    async def run() -> FakeStream:
        writer = BatchWriter(store, "rated", batch_size=100, max_backoff=0.1, on_rejected=dead_letter)
        writer.stream = stream = FakeStream()  # type: ignore[assignment]
        for index in range(3):
            await writer.add(index, [row(f"e{index}")])  # type: ignore[arg-type]
        await writer.flush()
        return stream

    stream = asyncio.run(run())
    assert stream.acked == [0, 1, 2]
    assert [[r[0] for r, _ in batch] for batch in seen] == [["e1"]]


def test_a_stopped_writer_acknowledges_nothing_it_has_not_stored() -> None:
    attempts = 0

    def store(rows: Sequence[Row]) -> StoreResult:
        nonlocal attempts
        attempts += 1
        raise OperationalError("connection refused")

    async def run() -> FakeStream:
        writer = BatchWriter(store, "rated", batch_size=100, max_backoff=60.0)
        writer.stream = stream = FakeStream()  # type: ignore[assignment]
        await writer.add("event", [row("e1")])  # type: ignore[arg-type]
        flushing = asyncio.create_task(writer.flush())
        while attempts < 2:
            await asyncio.sleep(0.01)
        writer.stop()
        await asyncio.wait_for(flushing, 5)  # returns although the back-off would last longer
        return stream

    stream = asyncio.run(run())
    assert stream.acked == []
class FakeMessage:
    def __init__(self, tp: str, generation_id: int) -> None:
        self.tp = tp
        self.generation_id = generation_id  # the consumer generation it was fetched in


class FakeEvent:
    """What BatchWriter reads of a faust event: its message's topic-partition."""

    def __init__(self, name: str, tp: str, generation: int = 1) -> None:
        self.name = name
        self.message = FakeMessage(tp, generation)

    def __repr__(self) -> str:
        return self.name


class RecordingStore:
    """A store that takes every row and records each batch's event ids."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, rows: Sequence[Row]) -> StoreResult:
        self.batches.append([r[0] for r in rows])
        return StoreResult(stored=len(rows))

    def writer(self) -> tuple[BatchWriter, FakeStream]:
        writer = BatchWriter(self, "rated", batch_size=100, max_backoff=0.1)
        writer.stream = stream = FakeStream()  # type: ignore[assignment]
        return writer, stream


def test_a_revoked_partitions_pending_rows_are_dropped_and_the_rest_stored() -> None:
    store = RecordingStore()

    async def run() -> FakeStream:
        writer, stream = store.writer()
        await writer.add(FakeEvent("a1", "p0"), [row("a1"), row("a1b")])  # type: ignore[arg-type]
        await writer.add(FakeEvent("b1", "p1"), [row("b1")])  # type: ignore[arg-type]
        await writer.add(FakeEvent("a2", "p0"), [])  # type: ignore[arg-type]
        await writer.add(FakeEvent("b2", "p1"), [row("b2")])  # type: ignore[arg-type]
        await writer.revoke({"p0"}, generation=1)  # type: ignore[arg-type]
        await writer.flush()
        return stream

    stream = asyncio.run(run())
    assert [repr(event) for event in stream.acked] == ["b1", "b2"]
    assert store.batches == [["b1", "b2"]]


def test_an_event_fetched_before_its_partition_was_revoked_is_neither_stored_nor_acknowledged() -> None:
    """The agent held a2 (fetched in generation 1) while the rebalance dropped a1: storing and
    acknowledging a2 would make an offset past a1 committable, a1 never stored."""
    store = RecordingStore()

    async def run() -> FakeStream:
        writer, stream = store.writer()
        await writer.add(FakeEvent("a1", "p0", generation=1), [row("a1")])  # type: ignore[arg-type]
        await writer.revoke({"p0"}, generation=1)  # type: ignore[arg-type]
        await writer.add(FakeEvent("a2", "p0", generation=1), [row("a2")])  # type: ignore[arg-type]
        await writer.add(FakeEvent("b1", "p1", generation=1), [row("b1")])  # type: ignore[arg-type]
        # Generation 2: p0 assigned here again and read from its committed offset.
        await writer.add(FakeEvent("a1", "p0", generation=2), [row("a1")])  # type: ignore[arg-type]
        await writer.flush()
        return stream

    stream = asyncio.run(run())
    assert [repr(event) for event in stream.acked] == ["b1", "a1"]
    assert store.batches == [["b1", "a1"]]


def test_a_rebalance_waits_for_the_batch_being_stored_before_the_partitions_move() -> None:
    order: list[str] = []
    release = threading.Event()

    def store(rows: Sequence[Row]) -> StoreResult:
        release.wait(5)
        order.append("stored")
        return StoreResult(stored=len(rows))

    async def run() -> FakeStream:
        writer = BatchWriter(store, "rated", batch_size=100, max_backoff=0.1)
        writer.stream = stream = FakeStream()  # type: ignore[assignment]
        await writer.add(FakeEvent("a1", "p0"), [row("a1")])  # type: ignore[arg-type]
        flushing = asyncio.ensure_future(writer.flush())
        await asyncio.sleep(0.05)  # the store is under way in its thread
        revoking = asyncio.ensure_future(writer.revoke({"p0"}, generation=1))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        order.append("revoke still waiting" if not revoking.done() else "revoke returned early")
        release.set()
        await revoking
        order.append("revoked")
        await flushing
        return stream

    stream = asyncio.run(run())
    assert order == ["revoke still waiting", "stored", "revoked"]
    # Stored, yet not acknowledged: p0 is no longer this worker's; its owner reads a1 again from
    # the committed offset and finds it stored.
    assert stream.acked == []


def test_the_next_batch_is_gathered_while_one_is_stored_and_batches_are_acknowledged_in_order() -> None:
    """A full batch goes to a task: the agent's add returns while ClickHouse works. The next
    full batch waits for it, so stores and acknowledgements keep their order."""
    log: list[str] = []
    release = threading.Event()
    store = gated_store(log, release, "e1,e2")

    async def run() -> LoggingStream:
        writer = BatchWriter(store, "rated", batch_size=2, max_backoff=0.1)
        writer.stream = stream = LoggingStream(log)  # type: ignore[assignment]
        await writer.add("e1", [row("e1")])  # type: ignore[arg-type]
        await asyncio.wait_for(writer.add("e2", [row("e2")]), 1)  # type: ignore[arg-type]  # full: handed over
        await asyncio.sleep(0.05)
        assert log == ["storing e1,e2"] and stream.acked == []
        await asyncio.wait_for(writer.add("e3", [row("e3")]), 1)  # type: ignore[arg-type]  # gathered meanwhile
        fourth = asyncio.ensure_future(writer.add("e4", [row("e4")]))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not fourth.done()  # the second full batch waits for the first
        release.set()
        await asyncio.wait_for(fourth, 5)
        await writer.flush()
        return stream

    stream = asyncio.run(run())
    assert log == ["storing e1,e2", "stored e1,e2", "ack e1", "ack e2",
                   "storing e3,e4", "stored e3,e4", "ack e3", "ack e4"]
    assert stream.acked == ["e1", "e2", "e3", "e4"]


def test_a_timed_flush_waiting_for_the_batch_being_stored_does_not_hold_the_agent() -> None:
    """The worker's flush timer fires while a batch is stored and rows are pending: the agent
    goes on adding (it rates on, so a quota crossing behind the fleet's window is not held for
    a ClickHouse round), and what it added is stored after that batch, in order."""
    log: list[str] = []
    release = threading.Event()
    store = gated_store(log, release, "e1,e2,e3")

    async def run() -> tuple[LoggingStream, bool]:
        writer = BatchWriter(store, "rated", batch_size=3, max_backoff=0.1)
        writer.stream = stream = LoggingStream(log)  # type: ignore[assignment]
        for event in ("e1", "e2", "e3"):  # full: being stored until released
            await writer.add(event, [row(event)])  # type: ignore[arg-type]
        await writer.add("e4", [row("e4")])  # type: ignore[arg-type]  # pending
        timer = asyncio.ensure_future(writer.flush())  # the flush timer, while e1-e3 are stored
        await asyncio.sleep(0.05)
        fifth = asyncio.ensure_future(writer.add("e5", [row("e5")]))  # type: ignore[arg-type]
        await asyncio.wait({fifth}, timeout=2)
        added_while_storing = fifth.done() and log == ["storing e1,e2,e3"]
        release.set()
        await asyncio.wait_for(asyncio.gather(fifth, timer), 5)
        await writer.flush()
        return stream, added_while_storing

    stream, added_while_storing = asyncio.run(run())
    assert added_while_storing
    assert log == ["storing e1,e2,e3", "stored e1,e2,e3", "ack e1", "ack e2", "ack e3",
                   "storing e4,e5", "stored e4,e5", "ack e4", "ack e5"]
    assert stream.acked == ["e1", "e2", "e3", "e4", "e5"]


def test_a_batch_that_fails_beyond_its_retries_stops_the_agent_at_its_next_batch() -> None:
    """An unexpected failure in a batch's task (here: dead-lettering refused rows) leaves its
    events unacknowledged and is raised to the agent, which stops as it did when it stored
    its batches itself; nothing after it is acknowledged."""

    async def dead_letter(rejected: list[tuple[Row, str]]) -> None:
        raise ConnectionError("dead-letter topic away")

    def store(rows: Sequence[Row]) -> StoreResult:
        return StoreResult(stored=0, rejected=[(rows[0], "refused")])

    async def run() -> tuple[FakeStream, list[str]]:
        writer = BatchWriter(store, "rated", batch_size=1, max_backoff=0.1, on_rejected=dead_letter)
        writer.stream = stream = FakeStream()  # type: ignore[assignment]
        await writer.add("e1", [row("e1")])  # type: ignore[arg-type]
        raised: list[str] = []
        for attempt in (writer.add("e2", [row("e2")]), writer.flush()):  # type: ignore[arg-type]
            try:
                await attempt
            except RuntimeError as exc:
                raised.append(f"{exc} <- {exc.__cause__}")
        return stream, raised

    stream, raised = asyncio.run(run())
    assert stream.acked == []
    assert raised == ["rated: storing a batch failed <- dead-letter topic away"] * 2


def test_a_writer_stopped_while_a_batch_is_stored_stores_and_acknowledges_nothing_more() -> None:
    stored: list[list[str]] = []
    release = threading.Event()

    def store(rows: Sequence[Row]) -> StoreResult:
        release.wait(5)
        stored.append([r[0] for r in rows])
        return StoreResult(stored=len(rows))

    async def run() -> FakeStream:
        writer = BatchWriter(store, "rated", batch_size=1, max_backoff=0.1)
        writer.stream = stream = FakeStream()  # type: ignore[assignment]
        await writer.add("e1", [row("e1")])  # type: ignore[arg-type]  # handed to a task
        second = asyncio.ensure_future(writer.add("e2", [row("e2")]))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        writer.stop()
        release.set()
        await asyncio.wait_for(second, 5)
        await asyncio.wait_for(writer.flush(), 5)
        return stream

    stream = asyncio.run(run())
    assert stored == [["e1"]]  # e1 was on its way; e2 never goes
    assert stream.acked == []  # stored or not, nothing is acknowledged after stop()
