"""One log line per kind of Kafka client error per minute, and a count of all of them.

While a broker is down aiokafka logs every failed connection and fetch: a worker logged 80 to
180 lines per outage of 15 s in the broker-loss chaos tests. Operators need to know that Kafka
is unreachable, once, and how often it failed: the first line of each kind (logger and message
template) is let through, repeats within ``window`` seconds are counted and dropped, and the
next line of that kind says how many were dropped. Every error counts in ``errors`` (the
worker's ``gpumeter_worker_kafka_client_errors`` metric).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily

KAFKA_LOGGERS = ("aiokafka", "kafka")


class KafkaErrorThrottle(logging.Filter):
    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window = window
        self.clock = clock
        self.errors = 0
        # (logger, message template) -> (when it was last let through, repeats dropped since)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(KAFKA_LOGGERS):
            return True
        self.errors += 1
        key = (record.name, str(record.msg))
        now = self.clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.window:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        dropped = last[1] if last is not None else 0
        self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like this in the last {self.window:.0f} s not logged)"
        return True


def install(throttle: KafkaErrorThrottle, logger: logging.Logger | None = None) -> None:
    """Put ``throttle`` on every handler of ``logger`` (the root logger by default): a filter on
    a library's logger would not see its child loggers' records."""
    for handler in (logger or logging.getLogger()).handlers:
        if throttle not in handler.filters:
            handler.addFilter(throttle)


def uninstall(throttle: KafkaErrorThrottle, logger: logging.Logger | None = None) -> None:
    for handler in (logger or logging.getLogger()).handlers:
        handler.removeFilter(throttle)


class KafkaErrorsCollector:
    """The throttle's count as a Prometheus counter (``<prefix>_kafka_client_errors``)."""

    def __init__(self, throttle: KafkaErrorThrottle, prefix: str) -> None:
        self.throttle = throttle
        self.name = f"{prefix}_kafka_client_errors"

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            self.name, "Warnings and errors the Kafka clients logged (a broker away: logged once a minute)",
            value=self.throttle.errors)
