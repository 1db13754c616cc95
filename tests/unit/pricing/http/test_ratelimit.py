"""The API's token buckets on a clock of the test's own (pure: no server, no sleeping)."""

from __future__ import annotations

import pytest

from pricing.http.ratelimit import RateLimiter

pytestmark = pytest.mark.security


class Clock:
    """A fake clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_served_then_refused_with_the_seconds_to_wait() -> None:
    clock = Clock()
    limiter = RateLimiter(2, 5, clock=clock)
    assert [limiter.take("a") for _ in range(5)] == [0] * 5
    # Empty: one request's worth comes back in 1/2 s, rounded up to whole seconds.
    assert limiter.take("a") == 1
    clock.now += 0.5
    assert limiter.take("a") == 0
    assert limiter.take("a") == 1


def test_waiting_exactly_retry_after_is_enough() -> None:
    clock = Clock()
    limiter = RateLimiter(0.3, 1, clock=clock)
    assert limiter.take("a") == 0
    clock.now += 1.0  # 0.3 of a request back; 0.7 / 0.3 = 2.33 s more: told 3
    wait = limiter.take("a")
    assert wait == 3
    clock.now += wait
    assert limiter.take("a") == 0


def test_callers_have_buckets_of_their_own_and_refill_stops_at_the_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(1, 3, clock=clock)
    assert [limiter.take("a") for _ in range(4)] == [0, 0, 0, 1]
    assert limiter.take("b") == 0
    clock.now += 3600  # an hour idle refills 3, not 3,600
    assert [limiter.take("a") for _ in range(4)] == [0, 0, 0, 1]


def test_the_number_of_buckets_is_bounded_and_a_dropped_one_comes_back_full() -> None:
    clock = Clock()
    limiter = RateLimiter(1, 1, clock=clock, max_buckets=3)
    for key in ("a", "b", "c", "d"):
        assert limiter.take(key) == 0
    assert len(limiter._buckets) == 3
    assert limiter.take("a") == 0  # "a" was the oldest: dropped, so full again
    assert limiter.take("d") == 1


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_a_limit_that_admits_nothing_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate, burst)
