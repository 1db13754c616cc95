"""Bounded polls for tests against real servers: wait on what the system reports, never on time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], what: str, timeout: float = 60.0, interval: float = 0.2) -> Any:
    """Poll until ``check()`` returns something truthy and return it; AssertionError naming
    ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
