"""What the worker's faust consumer commits after acknowledgements (streams/faust_consumer.py).

faust's own bookkeeping (``ack``, ``_filter_committable_offsets``, ``perform_seek``) runs as
is; only the consumer thread (aiokafka's consumer and the broker behind it) is a stand-in,
behaving as aiokafka 0.12 does: ``seek_to_committed`` answers the committed offset per
partition (None where the group has none) and moves the fetch position only to a committed
offset above 0; ``earliest_offsets`` answers the log start; ``seek_wait`` moves the position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import faust
import pytest
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP
from faust.types.tuples import Message

from streams.faust_consumer import SeekSafeConsumer, SeekSafeTransport

TOPIC = "samples"
TP0 = TP(TOPIC, 0)


class ConsumerThreadStandIn:
    def __init__(self, committed: int | None, log_start: int = 0, fetched_to: int | None = None) -> None:
        self.committed = committed
        self.log_start = log_start
        # Where the fetcher is: a fresh assignment starts at the reset position (log start).
        self.fetch_position = fetched_to if fetched_to is not None else log_start

    async def seek_to_committed(self) -> Mapping[TP, int | None]:
        if self.committed and self.committed > 0:
            self.fetch_position = self.committed
        return {TP0: self.committed}

    async def earliest_offsets(self, *partitions: TP) -> Mapping[TP, int]:
        return {tp: self.log_start for tp in partitions}

    async def seek_wait(self, partitions: Mapping[TP, int]) -> None:
        self.fetch_position = partitions[TP0]

    async def position(self, tp: TP) -> int | None:
        return self.fetch_position


def consumer_on(broker: ConsumerThreadStandIn, strict: bool = True) -> aiokafka_driver.Consumer:
    app = faust.App("strict-commit-test", broker="kafka://127.0.0.1:1", store="memory://",
                    autodiscover=False, web_enabled=False)
    app.topics.add(app.topic(TOPIC, value_serializer="raw"))
    asyncio.run(app.topics._update_indices())  # type: ignore[attr-defined]  # as on subscription: acks on

    async def ignore(*args: object, **kwargs: object) -> None:
        return None

    transport = SeekSafeTransport(app.conf.broker_consumer, app)
    kind = SeekSafeConsumer if strict else aiokafka_driver.Consumer
    consumer = kind(transport, callback=ignore, on_partitions_revoked=ignore,
                    on_partitions_assigned=ignore)
    consumer._thread.seek_to_committed = broker.seek_to_committed  # type: ignore[method-assign,assignment]
    consumer._thread.earliest_offsets = broker.earliest_offsets  # type: ignore[method-assign]
    consumer._thread.seek_wait = broker.seek_wait  # type: ignore[method-assign]
    consumer._thread.position = broker.position  # type: ignore[method-assign]
    consumer.assignment = lambda: {TP0}  # type: ignore[method-assign]
    return consumer


def ack(consumer: aiokafka_driver.Consumer, offsets: Iterable[int]) -> None:
    for offset in offsets:
        consumer.ack(Message(TOPIC, 0, offset, 0.0, 0, None, b"k", b"v", None))


def to_commit(consumer: aiokafka_driver.Consumer) -> int | None:
    return consumer._filter_committable_offsets({TP0}).get(TP0)


def test_nothing_is_committed_between_an_assignment_and_its_seek() -> None:
    # A batch stored after a rebalance acknowledges offset 150 while 100-149 were dropped; the
    # partition comes back to this worker and the commit timer runs before the seek.
    consumer = consumer_on(ConsumerThreadStandIn(committed=100))
    asyncio.run(consumer.on_partitions_assigned({TP0}))
    ack(consumer, [150])
    assert to_commit(consumer) is None
    asyncio.run(consumer.perform_seek())
    assert to_commit(consumer) is None, "150 is not where the partition's commit stands (100)"
    ack(consumer, range(100, 150))
    assert to_commit(consumer) == 151


def test_a_run_one_past_the_committed_offset_is_not_committed() -> None:
    consumer = consumer_on(ConsumerThreadStandIn(committed=100))
    asyncio.run(consumer.perform_seek())
    ack(consumer, range(101, 121))  # offset 100 was never stored
    assert to_commit(consumer) is None
    ack(consumer, [100])
    assert to_commit(consumer) == 121


@pytest.mark.parametrize("committed", [None, 0], ids=["none-for-the-group", "offset-zero"])
def test_without_a_committed_offset_the_run_must_start_where_the_consumer_was_put(
    committed: int | None,
) -> None:
    consumer = consumer_on(ConsumerThreadStandIn(committed=committed, log_start=0))
    asyncio.run(consumer.perform_seek())
    ack(consumer, range(50, 61))
    assert to_commit(consumer) is None
    ack(consumer, range(0, 50))
    assert to_commit(consumer) == 61


@pytest.mark.parametrize("committed", [None, 0], ids=["none-for-the-group", "offset-zero"])
def test_a_partition_without_a_committed_offset_is_read_again_from_its_beginning(
    committed: int | None,
) -> None:
    # The worker fetched 1,697 records of it, then dropped them in a rebalance (its pending
    # batch, the cleared stream queues) and got the partition again.
    thread = ConsumerThreadStandIn(committed=committed, log_start=0, fetched_to=1_697)
    consumer = consumer_on(thread)
    asyncio.run(consumer.on_partitions_assigned({TP0}))
    asyncio.run(consumer.perform_seek())
    assert thread.fetch_position == 0
    ack(consumer, range(1_697, 1_800))
    assert to_commit(consumer) is None
    ack(consumer, range(0, 1_697))
    assert to_commit(consumer) == 1_800


def test_a_partition_whose_log_starts_later_commits_from_its_log_start() -> None:
    consumer = consumer_on(ConsumerThreadStandIn(committed=None, log_start=7_000))
    asyncio.run(consumer.perform_seek())
    ack(consumer, range(7_000, 7_010))
    assert to_commit(consumer) == 7_010


def test_acknowledgements_from_an_earlier_ownership_are_forgotten_on_assignment() -> None:
    consumer = consumer_on(ConsumerThreadStandIn(committed=300))
    ack(consumer, range(100, 151))  # acknowledged while the partition belonged to another worker
    asyncio.run(consumer.on_partitions_assigned({TP0}))
    asyncio.run(consumer.perform_seek())
    ack(consumer, range(300, 311))
    assert to_commit(consumer) == 311
    assert consumer._acked[TP0] == []


def test_runs_continue_from_the_last_commit_and_gaps_the_fetch_loop_saw_count() -> None:
    consumer = consumer_on(ConsumerThreadStandIn(committed=10))
    asyncio.run(consumer.perform_seek())
    ack(consumer, [10, 11])
    assert to_commit(consumer) == 12
    consumer._committed_offset[TP0] = 12  # what _commit_offsets records once the broker took it
    # The fetch loop read 14 right after 11 (12 and 13 compacted away): its call.
    asyncio.run(consumer._add_gap(TP0, 12, 14))
    assert to_commit(consumer) is None, "14 arrived but is not processed yet"
    ack(consumer, [14, 15])
    assert to_commit(consumer) == 16


def test_faust_alone_continues_and_commits_past_records_nobody_stored() -> None:
    """Why this consumer exists: the same situations on faust's own consumer."""
    thread = ConsumerThreadStandIn(committed=None, fetched_to=1_697)
    ahead = consumer_on(thread, strict=False)
    asyncio.run(ahead.perform_seek())
    assert thread.fetch_position == 1_697  # records 0-1,696 are never read again
    consumer = consumer_on(ConsumerThreadStandIn(committed=100), strict=False)
    asyncio.run(consumer.perform_seek())
    ack(consumer, range(101, 121))
    assert to_commit(consumer) == 121  # offset 100 skipped
    fresh = consumer_on(ConsumerThreadStandIn(committed=None), strict=False)
    asyncio.run(fresh.perform_seek())
    ack(fresh, range(50, 61))
    assert to_commit(fresh) == 61  # offsets 0-49 skipped
