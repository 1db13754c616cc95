"""The worker logs at the level it is given (streams.app._Worker), not at faust's DEBUG."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import faust
import pytest

from gpumeter.infra.kafka_log import KafkaErrorThrottle
from streams.app import _Worker


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield root
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.mark.parametrize(
    ("loglevel", "expected"),
    [pytest.param("warn", logging.WARNING, id="warn"), pytest.param("error", logging.ERROR, id="error")],
)
def test_root_logger_keeps_the_requested_level(root_logger: logging.Logger, loglevel: str,
                                               expected: int) -> None:
    app = faust.App("gpumeter-test-logging", broker="kafka://127.0.0.1:1", autodiscover=False,
                    web_enabled=False)
    worker = _Worker(app, (), loglevel=loglevel, quiet=True)
    root_logger.handlers[:] = [logging.StreamHandler()]
    root_logger.setLevel(expected)  # as mode's logging set-up leaves it before the signal below

    worker.on_setup_root_logger(root_logger, expected)

    assert root_logger.level == expected
    # A debug call from a library is dropped before any record is built.
    assert not logging.getLogger("aiokafka.conn").isEnabledFor(logging.DEBUG)
    assert not any(type(handler).__name__ == "SpinnerHandler" for handler in root_logger.handlers)


def test_the_worker_throttles_kafka_client_errors_on_the_root_handlers(root_logger: logging.Logger) -> None:
    app = faust.App("gpumeter-test-logging-2", broker="kafka://127.0.0.1:1", autodiscover=False,
                    web_enabled=False)
    throttle = KafkaErrorThrottle()
    worker = _Worker(app, (), throttle, loglevel="warn", quiet=True)
    handler = logging.StreamHandler()
    root_logger.handlers[:] = [handler]
    worker.on_setup_root_logger(root_logger, logging.WARNING)
    assert throttle in handler.filters
    unreachable = logging.LogRecord("aiokafka.conn", logging.ERROR, __file__, 1, "Unable connect to %s",
                                    ("n1",), None)
    assert [handler.filter(unreachable) for _ in range(3)] == [True, False, False]
