"""`gpumeter worker` as a child process: the demo runs one, tests SIGTERM or SIGKILL it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpumeter.app.runtime.process import log_tail
from gpumeter.core.settings import Settings, settings_env


class WorkerProcess:
    def __init__(self, settings: Settings, log_path: Path, loglevel: str = "info") -> None:
        self.settings = settings
        self.log_path = log_path
        self.loglevel = loglevel
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpumeter.app.cli", "worker", "--loglevel", self.loglevel],
                env=settings_env(self.settings), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def kill9(self) -> None:
        """SIGKILL: no shutdown hooks, no final commit."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)
