"""Which windows the agent collected, and what to do about the ones it missed.

A window is missed when a cycle overran the interval (a slow kubelet, a stalled API
server) or the agent was not running (restart, upgrade, crash). Decision: a missed
window is *backfilled*, bounded, else *counted*:

* the most recent ``max_backfill`` missed windows (default 8: two minutes at 15 s)
  are billed from the current observation (the kubelet's allocation and the pod
  metadata of the window just collected): a pod holds what it holds now, from its
  start, up to its end if it finished. Those samples carry no telemetry (nothing was
  measured) and the label ``backfilled: "true"``; their event ids are the ones a
  normal collection of that window would have had, so a window that was in fact
  published is stored once (the first copy wins).
* older missed windows, and windows before the host booted (a node that was down
  held nothing), are not billed; they are counted (``gpumeter_agent_windows_skipped``)
  and logged. Guessing further back would bill pods that may have ended and been
  deleted meanwhile.

The last completed window is kept in a small JSON file beside the spool (on the
host), so a restarted agent knows where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_BACKFILL = 8
STATE_FILE = "agent-state.json"

Window = tuple[datetime, datetime]


def host_boot_time(proc_root: Path | None) -> datetime | None:
    """The host's boot time (``btime`` of /proc/stat, which is not namespaced), or None."""
    if proc_root is None:
        return None
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), UTC)
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class WindowTracker:
    interval: int
    state_path: Path | None = None
    max_backfill: int = DEFAULT_MAX_BACKFILL
    boot_time: datetime | None = None
    identity: str = ""  # cluster/node: a state file of another node (a moved host path) is ignored
    last_end: datetime | None = None
    backfilled: int = 0
    skipped: int = 0
    _loaded: bool = field(default=False, repr=False)

    def load(self) -> None:
        """Read the last completed window from the state file (once; a bad file is ignored)."""
        self._loaded = True
        if self.state_path is None:
            return
        try:
            state = json.loads(self.state_path.read_text())
            if state.get("interval") != self.interval or state.get("identity", "") != self.identity:
                return  # windows of another length or node are not this agent's to continue
            self.last_end = datetime.fromisoformat(state["last_window_end"])
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the agent state file %s: %s", self.state_path, exc)

    def plan(self, window_start: datetime) -> list[Window]:
        """The missed windows to backfill before ``window_start``, oldest first; the rest are counted."""
        if not self._loaded:
            self.load()
        if self.last_end is None or window_start <= self.last_end:
            return []
        step = timedelta(seconds=self.interval)
        missed = int((window_start - self.last_end) / step)
        recent = min(missed, max(self.max_backfill, 0))
        starts = [window_start - k * step for k in range(recent, 0, -1)]
        if self.boot_time is not None:
            starts = [start for start in starts if start >= self.boot_time]
        backfill = starts
        skipped = missed - len(backfill)
        if skipped:
            self.skipped += skipped
            log.warning(
                "%d window(s) of %d s between %s and %s were not collected and are not billed",
                skipped,
                self.interval,
                self.last_end.isoformat(),
                window_start.isoformat(),
            )
        return [(start, start + step) for start in backfill]

    def count_unfilled(self, windows: list[Window]) -> None:
        """Planned windows the source could not backfill: counted as skipped."""
        self.skipped += len(windows)

    def done(self, window_end: datetime, backfilled: int = 0) -> None:
        """A window (and ``backfilled`` missed ones) published: remember it, on disk too."""
        self.backfilled += backfilled
        if self.last_end is None or window_end > self.last_end:
            self.last_end = window_end
        if self.state_path is None:
            return
        state = {
            "interval": self.interval,
            "identity": self.identity,
            "last_window_end": window_end.isoformat(),
        }
        partial = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        try:
            partial.write_text(json.dumps(state))
            os.replace(partial, self.state_path)  # never half a file after a crash
        except OSError as exc:
            log.warning("cannot write the agent state file %s: %s", self.state_path, exc)
            with contextlib.suppress(OSError):
                partial.unlink()
