"""`gpumeter drain`: wait until everything published before it started is rated and stored.

The worker's consumer group commits a sample's offset only after its rated record is
flushed to Kafka and stored in ClickHouse, and a dead letter's offset only after it is
stored. So:
1. wait until the group's committed offsets reach the samples topic's end offsets
   taken at start;
2. then take the dead-letter topic's end offsets (every dead letter step 1 caused is in
   it by now) and wait until the group's commits reach those.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from kafka import TopicPartition

from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.infra import kafka


class DrainTimeout(RuntimeError):
    pass


def _behind(targets: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int]) -> int:
    return sum(max(0, end - committed.get(tp, 0)) for tp, end in targets.items())


def drain(settings: Settings, timeout: float = 120.0,
          on_progress: Callable[[str, int], None] | None = None) -> None:
    group = topics.worker_group_id(settings.kafka.topic_prefix, settings.worker.group)
    deadline = time.monotonic() + timeout
    samples = settings.kafka.topic(topics.SAMPLES)
    downstream = [settings.kafka.topic(topics.DEADLETTER)]

    def wait_for(stage: str, targets: Mapping[TopicPartition, int]) -> None:
        while True:
            behind = _behind(targets, kafka.committed_offsets(settings.kafka, group))
            if on_progress is not None:
                on_progress(stage, behind)
            if behind == 0:
                return
            if time.monotonic() > deadline:
                raise DrainTimeout(
                    f"{stage}: {behind} records still unprocessed after {timeout:.0f} s "
                    f"(is `gpumeter worker` running?)"
                )
            time.sleep(0.5)

    wait_for("rating", kafka.end_offsets(settings.kafka, [samples]))
    wait_for("storing", kafka.end_offsets(settings.kafka, downstream))
