"""faust's Kafka consumer with the seek after recovery made safe (a fix for faust-streaming 0.15).

The defect, found with per-partition ack bookkeeping logged at a stall (a restarted worker whose
samples partition 1 sat at committed offset 1186 while offsets 1193 onwards were acknowledged,
1186-1192 never delivered, for as long as the worker ran):

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
"""

from __future__ import annotations

import asyncio
from typing import Any

from faust.transport.drivers import aiokafka as aiokafka_driver

# Event-loop turns for the fetch loop to notice the stopped flow: its pending hand-over
# (``wait_first`` of the delivery and ``suspend_flow``) wakes in one or two turns, and it
# then leaves its batch without awaiting anything. The seek itself awaits the consumer's
# thread, many more turns; these make the order explicit rather than a matter of timing.
_TURNS_FOR_FETCH_LOOP = 5


class SeekSafeConsumer(aiokafka_driver.Consumer):
    async def perform_seek(self) -> None:
        if self.flow_active:
            self.stop_flow()
            for _ in range(_TURNS_FOR_FETCH_LOOP):
                await asyncio.sleep(0)
        await super().perform_seek()


class SeekSafeTransport(aiokafka_driver.Transport):
    Consumer = SeekSafeConsumer


def seek_safe_transport(app: Any) -> SeekSafeTransport:
    """The transport faust's App would build for ``kafka://`` URLs, with the consumer above."""
    return SeekSafeTransport(app.conf.broker_consumer, app)
