"""An append-only disk spool that keeps samples through a Kafka outage.

Layout: a directory of segment files ``<seq:020d>.seg``, each starting with an
8-byte file magic and holding records::

    magic (2 bytes, C5 9E) | length (u32 BE) | crc32 of length+payload (u32 BE) | payload

Guarantees and policies:

* ``append(batch)`` writes the whole batch with one ``write`` and one ``fsync``;
  when it returns, every accepted record survives a crash (kill -9, power loss).
* The spool is bounded in total bytes. A record that does not fit is *dropped*,
  counted in :attr:`Spool.dropped` and logged at ERROR (the oldest data is kept:
  it is what the broker has not seen for longest, and deleting acknowledged
  writes would break the guarantee above).
* Writes go to one active segment, sealed at ``segment_bytes``; replay reads
  sealed segments oldest first and a segment is deleted only after the caller's
  ``send`` returned for all of its records (i.e. the broker acknowledged them).
  A segment that fails half-way is replayed again whole: replay is
  at-least-once and the samples' ``event_id`` makes the duplicates harmless.
* Restart is corruption-tolerant: each segment is scanned; a torn tail or a
  damaged record (bad magic, impossible length, CRC mismatch) is skipped and
  counted in :attr:`Spool.corrupt_records`, and the scan resynchronises on the
  next record whose magic and CRC check out, so the rest of the file is kept.
  After a restart writes always go to a new segment, never after a torn tail.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FILE_MAGIC = b"GMSPOOL1"
RECORD_MAGIC = b"\xc5\x9e"
_HEADER = struct.Struct(">2sII")  # magic, length, crc
HEADER_BYTES = _HEADER.size
MAX_RECORD_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
_FULL_LOG_INTERVAL_S = 60.0


class SpoolError(RuntimeError):
    pass


def encode_record(payload: bytes) -> bytes:
    length = struct.pack(">I", len(payload))
    crc = zlib.crc32(payload, zlib.crc32(length))
    return _HEADER.pack(RECORD_MAGIC, len(payload), crc) + payload


def _valid_at(data: bytes | memoryview, pos: int) -> int | None:
    """Length of the valid record at ``pos``, or None."""
    end = len(data)
    if end - pos < HEADER_BYTES:
        return None
    magic, length, crc = _HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC or length > MAX_RECORD_BYTES or pos + HEADER_BYTES + length > end:
        return None
    body_start = pos + HEADER_BYTES
    computed = zlib.crc32(data[body_start : body_start + length], zlib.crc32(struct.pack(">I", length)))
    return length if computed == crc else None


def scan_records(data: bytes) -> tuple[list[bytes], int]:
    """(payloads, corrupt regions) of one segment's bytes; never raises on damage."""
    payloads: list[bytes] = []
    corrupt = 0
    pos = len(FILE_MAGIC) if data.startswith(FILE_MAGIC) else 0
    if pos == 0 and data:
        corrupt += 1  # damaged file header: look for records anyway
    end = len(data)
    view = memoryview(data)
    in_bad_region = pos == 0 and bool(data)
    while pos < end:
        length = _valid_at(view, pos)
        if length is not None:
            start = pos + HEADER_BYTES
            payloads.append(bytes(view[start : start + length]))
            pos = start + length
            in_bad_region = False
            continue
        if not in_bad_region:
            corrupt += 1
            in_bad_region = True
        nxt = data.find(RECORD_MAGIC, pos + 1)
        if nxt < 0:
            break
        pos = nxt
    return payloads, corrupt


@dataclass
class Segment:
    seq: int
    path: Path
    bytes: int
    records: int
    corrupt: int = 0


class Spool:
    """A bounded, crash-safe FIFO of byte records on disk."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: bool = True,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        if segment_bytes > max_bytes:
            segment_bytes = max_bytes
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._on_drop = on_drop
        self._lock = threading.RLock()
        self._sealed: list[Segment] = []
        self._active: Segment | None = None
        self._fd: int | None = None
        self.dropped = 0
        self.corrupt_records = 0
        self.appended = 0
        self.removed_records = 0
        self._full_since: float | None = None
        self._last_full_log = 0.0
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    # -- recovery ----------------------------------------------------------------------------------

    def _recover(self) -> None:
        for leftover in self.directory.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)
        found = []
        for path in self.directory.iterdir():
            match = _SEGMENT_NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        for seq, path in sorted(found):
            data = path.read_bytes()
            payloads, corrupt = scan_records(data)
            if corrupt:
                log.error(
                    "spool segment %s: skipped %d damaged record region(s), kept %d records",
                    path.name,
                    corrupt,
                    len(payloads),
                )
            self.corrupt_records += corrupt
            if not payloads:
                path.unlink(missing_ok=True)
                continue
            self._sealed.append(Segment(seq, path, len(data), len(payloads), corrupt))
        if self._sealed:
            log.warning(
                "spool %s holds %d records (%d bytes) from before the restart",
                self.directory,
                self.records,
                self.size_bytes,
            )

    # -- depth -------------------------------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        with self._lock:
            total = sum(s.bytes for s in self._sealed)
            return total + (self._active.bytes if self._active else 0)

    @property
    def records(self) -> int:
        with self._lock:
            total = sum(s.records for s in self._sealed)
            return total + (self._active.records if self._active else 0)

    def __len__(self) -> int:
        return self.records

    @property
    def full(self) -> bool:
        return self._full_since is not None

    # -- writing -----------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        last = max([s.seq for s in self._sealed] + ([self._active.seq] if self._active else []), default=0)
        return last + 1

    def _open_active(self) -> Segment:
        seq = self._next_seq()
        path = self.directory / f"{seq:020d}.seg"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o640)
        os.write(fd, FILE_MAGIC)
        if self.fsync:
            os.fsync(fd)
            self._fsync_dir()
        self._fd = fd
        self._active = Segment(seq, path, len(FILE_MAGIC), 0)
        return self._active

    def _fsync_dir(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def seal(self) -> None:
        """Close the active segment so replay may take it."""
        with self._lock:
            if self._active is None:
                return
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._active.records:
                self._sealed.append(self._active)
            else:
                self._active.path.unlink(missing_ok=True)
            self._active = None

    def append(self, payloads: Sequence[bytes], *, moved: bool = False) -> int:
        """Write ``payloads`` durably (one fsync per segment touched); returns how many were kept.

        Records beyond the byte bound are dropped and counted, never silently. ``moved``: the
        records are being moved to the tail from a segment under replay, which is removed
        once this returns, so they do not count against the bound a second time (a full
        spool must not drop what it already holds).
        """
        if not payloads:
            return 0
        with self._lock:
            total = self.size_bytes
            if moved:
                total -= len(FILE_MAGIC) + sum(HEADER_BYTES + len(payload) for payload in payloads)
            kept = 0
            dropped = 0
            chunk: list[bytes] = []
            chunk_bytes = 0
            for payload in payloads:
                if len(payload) > MAX_RECORD_BYTES:
                    dropped += 1
                    log.error(
                        "spool: record of %d bytes exceeds the %d-byte record limit; dropped",
                        len(payload),
                        MAX_RECORD_BYTES,
                    )
                    continue
                record = encode_record(payload)
                if total + len(record) + (len(FILE_MAGIC) if self._active is None else 0) > self.max_bytes:
                    dropped += 1
                    continue
                active = self._active
                pending = active.bytes + chunk_bytes if active is not None else 0
                if active is None or (
                    (active.records or chunk) and pending + len(record) > self.segment_bytes
                ):
                    if chunk:
                        self._write(chunk, chunk_bytes)
                        kept += len(chunk)
                        chunk, chunk_bytes = [], 0
                    self.seal()
                    if total + len(FILE_MAGIC) + len(record) > self.max_bytes:
                        dropped += 1
                        continue
                    self._open_active()
                    total += len(FILE_MAGIC)
                chunk.append(record)
                chunk_bytes += len(record)
                total += len(record)
            if chunk:
                self._write(chunk, chunk_bytes)
                kept += len(chunk)
            self.appended += kept
            if dropped:
                self._report_drop(dropped)
            elif kept:
                self._full_since = None
            return kept

    def _write(self, records: list[bytes], size: int) -> None:
        assert self._fd is not None and self._active is not None
        blob = b"".join(records)
        view = memoryview(blob)
        written = 0
        while written < len(blob):
            written += os.write(self._fd, view[written:])
        if self.fsync:
            os.fsync(self._fd)
        self._active.bytes += size
        self._active.records += len(records)

    def _report_drop(self, count: int) -> None:
        self.dropped += count
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        if self._last_full_log == 0.0 or now - self._last_full_log >= _FULL_LOG_INTERVAL_S:
            self._last_full_log = now
            log.error(
                "SPOOL FULL: %s holds %d bytes of a %d-byte bound; dropped %d record(s) now, %d in total. "
                "Usage in dropped records is NOT billed: restore Kafka or raise the spool bound.",
                self.directory,
                self.size_bytes,
                self.max_bytes,
                count,
                self.dropped,
            )
        if self._on_drop is not None:
            self._on_drop(count)

    # -- reading -----------------------------------------------------------------------------------

    def pending(self) -> list[Segment]:
        """Segments to replay, oldest first (the active one is sealed first)."""
        with self._lock:
            self.seal()
            return list(self._sealed)

    def read(self, segment: Segment) -> list[bytes]:
        payloads, corrupt = scan_records(segment.path.read_bytes())
        if corrupt > segment.corrupt:
            # Damage that appeared after the segment was scanned (disk fault): count what is new.
            with self._lock:
                self.corrupt_records += corrupt - segment.corrupt
                segment.corrupt = corrupt
            log.error("spool segment %s: %d damaged record region(s) skipped", segment.path.name, corrupt)
        return payloads

    def iter_records(self) -> Iterator[bytes]:
        """Every record in order, without removing anything."""
        for segment in self.pending():
            yield from self.read(segment)

    def remove(self, segment: Segment) -> None:
        with self._lock:
            if segment in self._sealed:
                self._sealed.remove(segment)
                self.removed_records += segment.records
            segment.path.unlink(missing_ok=True)
            self._fsync_dir()
            if self.size_bytes < self.max_bytes:
                self._full_since = None

    def replay(
        self,
        send: Callable[[list[bytes]], None],
        *,
        deadline: float | None = None,
        max_segments: int | None = None,
    ) -> int:
        """Hand each sealed segment's records to ``send``, oldest first, deleting a segment when
        ``send`` returns. ``send`` raises to stop (the segment stays). Returns records replayed."""
        replayed = 0
        for count, segment in enumerate(self.pending()):
            if max_segments is not None and count >= max_segments:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            payloads = self.read(segment)
            if payloads:
                send(payloads)
            self.remove(segment)
            replayed += len(payloads)
        return replayed

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                if self.fsync:
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
            if self._active is not None:
                if self._active.records:
                    self._sealed.append(self._active)
                else:
                    self._active.path.unlink(missing_ok=True)
                self._active = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
