"""Kafka record framing for the samples and rated topics: one or more JSON lines per record.

A record carries the samples of one tenant (its key) as newline-separated JSON documents;
a record holding a single JSON object is the one-line case, so both framings read the
same. Batching matters because a stream processor pays a fixed cost per Kafka record, so
the pipeline's throughput scales with samples per record
(docs/decisions/0002-records-carry-json-lines.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gpumeter.core import jsonio

MAX_BATCH_SAMPLES = 500
# Well under Kafka's default 1 MiB message limit, with room for headers and framing.
MAX_BATCH_BYTES = 512 * 1024


def split(record: bytes) -> list[bytes]:
    """The JSON lines of a record; blank lines are ignored."""
    return [line for line in record.split(b"\n") if line.strip()]


def join(lines: list[bytes]) -> bytes:
    return b"\n".join(lines)


class RecordBatcher:
    """Groups payloads by key into records of at most MAX_BATCH_SAMPLES lines / MAX_BATCH_BYTES.

    Order is kept per key, which is all Kafka keeps too (one key, one partition).
    """

    def __init__(self, max_samples: int = MAX_BATCH_SAMPLES, max_bytes: int = MAX_BATCH_BYTES) -> None:
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self._lines: dict[bytes, list[bytes]] = {}
        self._sizes: dict[bytes, int] = {}

    def add(self, key: bytes, payload: bytes) -> tuple[bytes, bytes, int] | None:
        """Queue ``payload``; returns (key, record, line count) when this key's batch is full."""
        lines = self._lines.setdefault(key, [])
        size = self._sizes.get(key, 0)
        ready = None
        if lines and (len(lines) >= self.max_samples or size + len(payload) + 1 > self.max_bytes):
            ready = (key, join(lines), len(lines))
            lines = self._lines[key] = []
            size = 0
        lines.append(payload)
        self._sizes[key] = size + len(payload) + 1
        return ready

    def drain(self) -> Iterator[tuple[bytes, bytes, int]]:
        """Every queued batch, emptying the batcher."""
        for key, lines in self._lines.items():
            if lines:
                yield key, join(lines), len(lines)
        self._lines.clear()
        self._sizes.clear()


def tenant_records(samples: Iterable[Mapping[str, Any]]) -> Iterator[tuple[bytes, bytes]]:
    """Sample documents as the records a node agent sends: (tenant key, record), the full
    batches as they fill, then the rest; lazily, so each record can be sent as it comes."""
    batcher = RecordBatcher()
    for sample in samples:
        ready = batcher.add(sample["tenant"].encode(), jsonio.dumpb(sample))
        if ready is not None:
            yield ready[0], ready[1]
    for key, record, _count in batcher.drain():
        yield key, record


def group_by_key(
    messages: list[tuple[bytes, bytes]],
    max_samples: int = MAX_BATCH_SAMPLES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[tuple[bytes, list[int]]]:
    """Indexes of ``messages`` (key, one JSON line) grouped into records: per key, in order, bounded.

    For senders that must map a failed record back to the samples in it (the node agent's
    spool keeps samples, not records).
    """
    open_groups: dict[bytes, tuple[list[int], int]] = {}
    closed: list[tuple[bytes, list[int]]] = []
    for index, (key, value) in enumerate(messages):
        members, size = open_groups.get(key, ([], 0))
        if members and (len(members) >= max_samples or size + len(value) + 1 > max_bytes):
            closed.append((key, members))
            members, size = [], 0
        members.append(index)
        open_groups[key] = (members, size + len(value) + 1)
    closed.extend((key, members) for key, (members, _) in open_groups.items() if members)
    return closed
