"""Disk spool: order, bounds and drop counting, corruption tolerance, crash safety (kill -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.agent.spool import FILE_MAGIC, HEADER_BYTES, Spool, encode_record, scan_records

pytestmark = pytest.mark.agent

ROOT = Path(__file__).resolve().parents[4]


def records(n: int, size: int = 100, start: int = 0) -> list[bytes]:
    return [f"{i:08d}".encode() + b"." * (size - 8) for i in range(start, start + n)]


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def test_write_then_replay_oldest_first_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=2000)
    written = records(100)
    for start in range(0, 100, 7):
        assert spool.append(written[start : start + 7]) == len(written[start : start + 7])
    assert spool.records == 100 and len(segment_files(tmp_path)) > 5
    assert spool.size_bytes == sum(p.stat().st_size for p in segment_files(tmp_path))
    got: list[bytes] = []
    assert spool.replay(got.extend) == 100
    assert got == written
    assert spool.records == 0 and spool.size_bytes == 0 and segment_files(tmp_path) == []


def test_replay_keeps_a_segment_whose_send_failed(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1100)
    spool.append(records(30))
    batches: list[list[bytes]] = []

    def flaky(batch: list[bytes]) -> None:
        if len(batches) == 2:
            raise ConnectionError("broker went away")
        batches.append(batch)

    with pytest.raises(ConnectionError):
        spool.replay(flaky)
    sent = [r for b in batches for r in b]
    assert sent == records(30)[: len(sent)]
    remaining = list(spool.iter_records())
    assert sent + remaining == records(30)  # nothing lost, nothing reordered
    # and new writes go behind the backlog
    spool.append([b"newest"])
    assert list(spool.iter_records())[-1] == b"newest"


def test_survives_reopen(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.append(records(10))
    reopened = Spool(tmp_path)
    assert reopened.records == 10
    reopened.append(records(5, start=10))
    assert list(reopened.iter_records()) == records(15)


def test_bound_drops_new_records_and_counts_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    drops: list[int] = []
    spool = Spool(tmp_path, max_bytes=5000, segment_bytes=1000, on_drop=drops.append)
    kept = spool.append(records(100))
    assert 0 < kept < 100
    assert spool.dropped == 100 - kept and sum(drops) == 100 - kept
    assert spool.size_bytes <= 5000 and spool.full
    assert "SPOOL FULL" in caplog.text
    assert list(spool.iter_records()) == records(kept)  # the oldest are kept
    # replay frees room; the spool accepts again and is no longer full
    spool.replay(lambda batch: None)
    assert spool.append(records(1)) == 1 and not spool.full


def test_a_full_spool_moves_records_under_replay_to_its_tail_without_dropping(tmp_path: Path) -> None:
    """A replay writes a stalled tenant's records back behind the rest before it removes their
    segment: on a full spool they must not count twice against the bound."""
    bound = len(FILE_MAGIC) + 10 * (HEADER_BYTES + 100)
    spool = Spool(tmp_path, max_bytes=bound, segment_bytes=bound)
    assert spool.append(records(10)) == 10 and spool.append(records(1, start=10)) == 0  # full

    def move_the_odd_ones_back(batch: list[bytes]) -> None:
        assert spool.append(batch[1::2], moved=True) == 5

    spool.replay(move_the_odd_ones_back)
    assert spool.dropped == 1  # only the record refused while full
    assert list(spool.iter_records()) == records(10)[1::2]


def test_torn_tail_is_skipped_and_counted(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.append(records(20))
    (segment,) = segment_files(tmp_path)
    size = segment.stat().st_size
    os.truncate(segment, size - 30)  # a crash in the middle of the last record
    reopened = Spool(tmp_path)
    assert reopened.corrupt_records == 1
    assert list(reopened.iter_records()) == records(19)


def test_flipped_bytes_lose_only_the_damaged_record(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.append(records(20))
    (segment,) = segment_files(tmp_path)
    data = bytearray(segment.read_bytes())
    record_size = HEADER_BYTES + 100
    middle = len(FILE_MAGIC) + 7 * record_size + HEADER_BYTES + 50  # inside record 7's payload
    data[middle] ^= 0xFF
    header = len(FILE_MAGIC) + 12 * record_size + 3  # record 12's length field
    data[header] ^= 0x40
    segment.write_bytes(bytes(data))
    reopened = Spool(tmp_path)
    assert reopened.corrupt_records == 2
    expected = [r for i, r in enumerate(records(20)) if i not in (7, 12)]
    assert list(reopened.iter_records()) == expected


def test_damage_after_open_is_counted_at_replay(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(5))
    spool.seal()
    (segment,) = segment_files(tmp_path)
    data = bytearray(segment.read_bytes())
    data[-10] ^= 0x01
    segment.write_bytes(bytes(data))
    got: list[bytes] = []
    spool.replay(got.extend)
    assert got == records(4) and spool.corrupt_records == 1


def test_garbage_and_empty_files_do_not_stop_recovery(tmp_path: Path) -> None:
    (tmp_path / f"{1:020d}.seg").write_bytes(b"")
    (tmp_path / f"{2:020d}.seg").write_bytes(os.urandom(4096))
    (tmp_path / f"{3:020d}.seg").write_bytes(FILE_MAGIC + encode_record(b"survivor"))
    spool = Spool(tmp_path)
    assert list(spool.iter_records()) == [b"survivor"]
    assert spool.corrupt_records >= 1
    assert not (tmp_path / f"{1:020d}.seg").exists()


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=30),
    cut=st.integers(min_value=0, max_value=10_000),
    flip=st.integers(min_value=0, max_value=10_000),
)
def test_scan_never_invents_records(payloads: list[bytes], cut: int, flip: int) -> None:
    """Whatever the damage, every record read back is one that was written, in order."""
    data = bytearray(FILE_MAGIC + b"".join(encode_record(p) for p in payloads))
    if data:
        data[flip % len(data)] ^= 0x5A
    damaged = bytes(data[: max(len(FILE_MAGIC), len(data) - cut % 64)])
    got, _ = scan_records(damaged)
    position = 0
    for record in got:
        while position < len(payloads) and payloads[position] != record:
            position += 1
        assert position < len(payloads), "a record that was never written came back"
        position += 1


def test_kill_9_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.collectors.agent.spool_writer", str(directory)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    acked = 0
    deadline = time.monotonic() + 60
    try:
        while acked < 20_000 and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            acked = int(line.split()[1])
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert acked >= 1000, "the writer acknowledged too little to test anything"
    spool = Spool(directory)
    numbers = [int(r.split(b"-")[1]) for r in spool.iter_records()]
    assert numbers[:acked] == list(range(1, acked + 1)), "an acknowledged record was lost or reordered"
    assert numbers == list(range(1, len(numbers) + 1))  # anything after the last ack is whole or absent
    assert spool.corrupt_records <= 1  # at most the one record torn by the kill
