"""Detached service processes with pid files: start, find, stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process is alive, else None (a stale file is removed)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return None
    except PermissionError:
        return pid
    if _is_zombie(pid):
        pid_file.unlink(missing_ok=True)
        return None
    return pid


def _is_zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" in status


def spawn(argv: Sequence[str], log_file: Path, pid_file: Path, cwd: Path,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session so it outlives the CLI and can be stopped as a group."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            list(argv), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )
    pid_file.write_text(f"{process.pid}\n")
    return process


def stop(pid_file: Path, timeout: float = 30.0) -> bool:
    """SIGTERM the process group, wait, then SIGKILL. True when something was stopped."""
    return bool(stop_together([pid_file], timeout))


def stop_together(pid_files: Sequence[Path], timeout: float = 30.0) -> list[Path]:
    """SIGTERM every process group at once, wait for all of them, then SIGKILL what is left;
    returns the pid files of those that were running. For processes that need one another to
    stop cleanly, such as the voters of a KRaft quorum: stopped one by one, the last has no
    quorum left to leave and waits until it is killed."""
    running = {pid_file: pid for pid_file in pid_files if (pid := read_pid(pid_file)) is not None}
    for pid in running.values():
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in running.values()):
        time.sleep(0.2)
    left = [pid for pid in running.values() if _alive(pid)]
    for pid in left:
        _signal_group(pid, signal.SIGKILL)
    if left:
        time.sleep(0.5)
    for pid_file in running:
        pid_file.unlink(missing_ok=True)
    return list(running)


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        if finished == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _is_zombie(pid)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def log_tail(log_file: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
