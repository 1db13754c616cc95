"""Request rate limits of the invoice API: one token bucket per caller (issue 31).

A caller is a valid token (its SHA-256 digest) or, for a request without a valid token, the
client address: a flood of unknown tokens is limited too, and cannot use up a valid token's
allowance. A bucket holds ``burst`` requests and refills at ``rate`` per second; a request that
finds it empty is refused with the seconds until one request's worth is back (Retry-After).

Buckets of addresses are bounded in number (oldest dropped first): a spray of source addresses
costs a bounded amount of memory. A dropped bucket comes back full, which is what an idle
caller's bucket would be anyway.

Not thread-safe: the API's middleware runs on its event loop thread only.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_BUCKETS = 10_000


class RateLimiter:
    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_buckets: int = MAX_BUCKETS) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be above 0 and burst at least 1")
        self.rate, self.burst = rate, burst
        self._clock = clock
        self._max = max_buckets
        # key -> (requests left, when last counted); most recently used last
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> int:
        """0 when ``key`` may make a request now (and it is counted); otherwise the whole seconds
        to wait before one is allowed (at least 1)."""
        now = self._clock()
        left, then = self._buckets.pop(key, (float(self.burst), now))
        left = min(float(self.burst), left + (now - then) * self.rate)
        if left >= 1.0 - 1e-9:  # waiting exactly Retry-After must be enough, float error or not
            self._remember(key, left - 1.0, now)
            return 0
        self._remember(key, left, now)
        return max(1, math.ceil((1.0 - left) / self.rate))

    def _remember(self, key: str, left: float, now: float) -> None:
        self._buckets[key] = (left, now)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
