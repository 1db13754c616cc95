"""Stopping detached service processes (gpumeter.app.runtime.process), on real child processes.

The children here stand in for the voters of a KRaft quorum: on SIGTERM each one waits until
every one of them has been told to stop, then exits cleanly and says so in a file; one that is
never let go is killed. That is what the nodes of `gpumeter up --brokers 3` do (the real cluster
path is tests/integration/test_kafka_cluster.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpumeter.app.runtime import process

VOTER = """
import pathlib, signal, sys, time
me, everyone = pathlib.Path(sys.argv[1]), [pathlib.Path(p) for p in sys.argv[2:]]
def leave(*_):
    (me.parent / (me.name + ".told")).touch()
    while not all((p.parent / (p.name + ".told")).exists() for p in everyone):
        time.sleep(0.05)
    (me.parent / (me.name + ".clean")).touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
me.touch()
while True:
    time.sleep(0.05)
"""


def start_voters(tmp_path: Path, count: int) -> list[Path]:
    names = [tmp_path / f"voter-{index}" for index in range(count)]
    pid_files = []
    for name in names:
        pid_file = tmp_path / f"{name.name}.pid"
        process.spawn([sys.executable, "-c", VOTER, str(name), *map(str, names)],
                      tmp_path / f"{name.name}.log", pid_file, tmp_path)
        pid_files.append(pid_file)
    deadline = time.monotonic() + 30
    for name in names:  # each has its SIGTERM handler once its own file exists
        while not name.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert name.exists(), (tmp_path / f"{name.name}.log").read_text()
    return pid_files


def test_voters_stopped_together_all_leave_cleanly(tmp_path: Path) -> None:
    pid_files = start_voters(tmp_path, 3)

    assert process.stop_together(pid_files, timeout=30) == pid_files

    assert sorted(path.name for path in tmp_path.glob("*.clean")) == [
        "voter-0.clean", "voter-1.clean", "voter-2.clean"]
    assert not any(pid_file.exists() for pid_file in pid_files)


def test_a_voter_stopped_alone_is_killed_once_the_timeout_passes(tmp_path: Path) -> None:
    pid_files = start_voters(tmp_path, 2)

    assert process.stop(pid_files[0], timeout=1) is True

    assert process.read_pid(pid_files[0]) is None
    assert list(tmp_path.glob("*.clean")) == []  # killed, not left: the other was never told
    assert process.stop_together(pid_files, timeout=30) == [pid_files[1]]  # only it still ran
