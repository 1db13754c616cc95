"""How long the actuator waits before trying again (an eviction, a quota event, a record)."""

from __future__ import annotations


def backoff_seconds(attempt: int, cap: float, base: float = 1.0) -> float:
    """Exponential back-off: base, 2·base, 4·base ... never above ``cap`` (attempt counts from 0)."""
    if attempt < 0:
        raise ValueError("attempt counts from 0")
    # 2**attempt overflows float near attempt 1024; the cap is reached long before.
    return float(min(cap, base * 2 ** min(attempt, 62)))
