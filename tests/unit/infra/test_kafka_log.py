"""gpumeter/infra/kafka_log.py: a broker outage is one log line per kind per minute, and a count."""

from __future__ import annotations

import logging

from gpumeter.infra.kafka_log import KafkaErrorThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(name: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, ("n1",), None)


def test_repeats_of_one_kind_are_dropped_within_the_window_and_counted_in_the_next_line() -> None:
    clock = Clock()
    throttle = KafkaErrorThrottle(window=60, clock=clock)
    unreachable = "Unable connect to node with id %s"
    let_through = [throttle.filter(record("aiokafka.conn", unreachable)) for _ in range(120)]
    assert let_through == [True] + [False] * 119
    other = record("aiokafka.consumer.fetcher", "Failed fetch messages from %s")
    assert throttle.filter(other) and other.msg == "Failed fetch messages from %s"
    clock.now += 61
    later = record("aiokafka.conn", unreachable)
    assert throttle.filter(later)
    assert later.msg == f"{unreachable} (119 more like this in the last 60 s not logged)"
    assert throttle.errors == 122


def test_other_loggers_and_lower_levels_pass_untouched_and_uncounted() -> None:
    throttle = KafkaErrorThrottle(window=60, clock=Clock())
    for _ in range(5):
        assert throttle.filter(record("gpumeter.worker", "storing failed"))
        assert throttle.filter(record("aiokafka.conn", "connected", level=logging.INFO))
    assert throttle.errors == 0


def test_the_count_is_a_prometheus_counter_and_uninstall_lets_lines_through_again() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpumeter.infra import kafka_log
    from gpumeter.infra.kafka_log import KafkaErrorsCollector

    logger = logging.getLogger("test_kafka_log_root")
    seen: list[logging.LogRecord] = []

    class Recording(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger.addHandler(Recording())
    throttle = KafkaErrorThrottle(window=60, clock=Clock())
    kafka_log.install(throttle, logger)
    registry = CollectorRegistry()
    registry.register(KafkaErrorsCollector(throttle, "gpumeter_hooks"))
    for _ in range(3):
        logger.handle(record("aiokafka.conn", "Unable connect to node with id %s"))
    assert len(seen) == 1
    assert "gpumeter_hooks_kafka_client_errors_total 3.0" in generate_latest(registry).decode()
    kafka_log.uninstall(throttle, logger)
    logger.handle(record("aiokafka.conn", "Unable connect to node with id %s"))
    assert len(seen) == 2
