"""faust's Kafka consumer with the seek after recovery made safe (a fix for faust-streaming 0.15).

How the defects were found and what they cost: docs/decisions/0004-faust-consumer-fixes.md.

When a worker has a table to recover (the quota ledger's changelog), faust's Recovery resumes
the flow to read the changelog, then, with the flow still running, resumes the stream
partitions and awaits ``perform_seek`` (a round trip for the committed offsets), and only
then resumes flow control, which clears every stream's queue (``clear_on_resume``). Records
fetched from the stream partitions in that window are put in the queues and cleared, while
the fetch loop keeps recording them as read: after the seek it sets the read offset past
them, so their re-fetched copies are dropped as already read. Nothing ever acknowledges
those offsets, and faust commits only up to the first gap in the acknowledged offsets: the
partition's commit stays there while later samples are processed (``gpumeter drain`` waits
for ever; a restart would replay everything since).

The fix stops the flow before seeking, so the fetch loop has left its batch (it stops at the
first record after ``stop_flow``) and records nothing as read until Recovery resumes the flow
after the seek. Every caller of ``perform_seek`` resumes the flow itself afterwards (Recovery)
or calls it with the flow already stopped (the fetch loop).

Two more defects lose records after a rebalance (tests/chaos/test_rebalance.py):

- aiokafka's ``seek_to_committed`` does not move a partition the group has no committed offset
  for (none, or 0): a worker that had fetched records of it and dropped them in a rebalance
  (pending batch, cleared stream queues) went on from past them. ``_position_uncommitted``
  puts such a partition back at its beginning (``earliest``; stored records are folded).
- faust commits the first run of consecutive acknowledged offsets, and its check that the run
  starts at the committed offset lets a run start one past it (``min(acked) - committed > 1``)
  and is skipped when the committed offset is unknown (0, none yet, or between an assignment
  and its seek). An offset acknowledged by a batch that outlived a rebalance is such a run.
  ``_new_offset`` here commits a run only when it starts exactly at the committed offset (or
  where the seek put a partition without one), nothing between an assignment and its seek,
  and acknowledgements from before an assignment are forgotten.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP

log = logging.getLogger("gpumeter.worker")

# Event-loop turns for the fetch loop to notice the stopped flow: its pending hand-over
# (``wait_first`` of the delivery and ``suspend_flow``) wakes in one or two turns, and it
# then leaves its batch without awaiting anything. The seek itself awaits the consumer's
# thread, many more turns; these make the order explicit rather than a matter of timing.
_TURNS_FOR_FETCH_LOOP = 5


class SeekSafeConsumer(aiokafka_driver.Consumer):
    """Stops the flow before seeking, and commits only runs that start at the committed offset."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Partitions sought since their assignment, each with the offset its next commit must
        # start at when the group has no committed offset for it (None: it has one).
        self._start: dict[TP, int | None] = {}

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        # Acknowledgements recorded before this assignment come from batches of an earlier
        # ownership: what they stored is found again (and folded) when the records are re-read.
        self.forget_acknowledged(assigned)
        await super().on_partitions_assigned(assigned, generation_id)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        # faust drops their acknowledgements itself; until the next seek, nothing is committed.
        for tp in revoked:
            self._start.pop(tp, None)
        await super().on_partitions_revoked(revoked)

    def forget_acknowledged(self, partitions: Iterable[TP]) -> None:
        for tp in partitions:
            self._start.pop(tp, None)
            self._acked.pop(tp, None)
            self._acked_index.pop(tp, None)
            self._gap.pop(tp, None)

    async def perform_seek(self) -> None:
        if self.flow_active:
            self.stop_flow()
            for _ in range(_TURNS_FOR_FETCH_LOOP):
                await asyncio.sleep(0)
        await super().perform_seek()
        uncommitted = []
        for tp in self.assignment():
            if not self.app.topics.acks_enabled_for(tp.topic):
                continue
            if self._committed_offset.get(tp) is None:
                uncommitted.append(tp)
                self._start.pop(tp, None)
            else:
                self._start[tp] = None  # commits continue from the committed offset
        if uncommitted:
            await self._position_uncommitted(uncommitted)

    async def _position_uncommitted(self, partitions: list[TP]) -> None:
        """Where the next commit of each partition the group has no committed offset for
        (none, or 0) must start, and the consumer put back there.

        aiokafka's ``seek_to_committed`` leaves such a partition wherever its fetcher was. A
        worker that fetched records of it and dropped them in a rebalance (pending batch,
        cleared stream queues) would go on from past them, never storing them: a CI run lost
        1,697 of 15,000 samples so. With ``earliest`` it is sought to its first offset (an
        explicit seek: a lazy reset leaves no position, which faust's livelock check asserts
        on); stored records are found again and folded.
        """
        starts: dict[TP, int | None]
        try:
            if self.app.conf.consumer_auto_offset_reset == "earliest":
                beginnings = await self._thread.earliest_offsets(*partitions)
                await self._thread.seek_wait(
                    {TopicPartition(tp.topic, tp.partition): beginnings[tp] for tp in partitions})
                starts = dict(beginnings)
            else:
                starts = {tp: await self.position(tp) for tp in partitions}
        except Exception as exc:  # their commits wait for the next seek
            log.warning("partitions without a committed offset not positioned after the seek (%s): "
                        "not committing them yet", exc)
            return
        for tp in partitions:
            start = starts.get(tp)
            if start is not None:
                self._start[tp] = start

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit: one past the run of acknowledged offsets (gaps the fetch loop
        found count as acknowledged) that starts exactly at the committed offset, if any."""
        if tp not in self._start:
            return None  # assigned but not sought yet: where the next run must start is unknown
        committed = self._committed_offset.get(tp)
        expected = committed if committed is not None else self._start[tp]
        acked = self._acked[tp]
        if expected is None or not acked:
            return None
        self._merge_gaps(tp, acked)
        acked.sort()
        index = self._acked_index[tp]
        stale = bisect.bisect_left(acked, expected)  # at or below a commit: nothing to do
        if stale:
            index.difference_update(acked[:stale])
            del acked[:stale]
        if not acked or acked[0] != expected:
            return None
        run = 1
        while run < len(acked) and acked[run] == expected + run:
            run += 1
        index.difference_update(acked[:run])
        del acked[:run]
        return expected + run

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        """The fetch loop read ``offset_to`` right after ``offset_from - 1``: the offsets between
        have no record. faust's version also marks ``offset_to`` itself (a record not yet
        processed) and clamps at one past the committed offset (skipping the committed one)."""
        committed = self._committed_offset.get(tp)
        if committed is not None:
            offset_from = max(offset_from, committed)
        if offset_from < offset_to:
            gaps = self._gap[tp]
            gaps.addi(offset_from, offset_to)
            gaps.merge_overlaps()

    def _merge_gaps(self, tp: TP, acked: list[int]) -> None:
        """Offsets the fetch loop saw missing (compaction, transaction markers) below the highest
        acknowledged one are acknowledged too: no record will ever carry them."""
        gaps = self._gap.get(tp)
        if not gaps:
            return
        highest = max(acked)
        missing = sorted(gaps.overlap(0, highest + 1), key=lambda interval: interval.begin)
        if not missing:
            return
        known = set(acked)
        for interval in missing:
            acked.extend(offset for offset in range(interval.begin, interval.end) if offset not in known)
        gaps.chop(0, max(highest + 1, missing[-1].end))


class SeekSafeTransport(aiokafka_driver.Transport):
    Consumer = SeekSafeConsumer


def seek_safe_transport(app: Any) -> SeekSafeTransport:
    """The transport faust's App would build for ``kafka://`` URLs, with the consumer above."""
    return SeekSafeTransport(app.conf.broker_consumer, app)
