"""Aligning the compaction settings of a topic created before them, when the broker refuses.

A stand-in admin client (named as such) answers as kafka-python's KafkaAdminClient.alter_configs
does: per resource, "OK" or the error's text, or it raises as the client does when the broker
cannot be asked. The real broker path is tests/integration/test_compacted_topics.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from gpumeter.infra import kafka

TOPIC = "gpumeter.node.topology.v1"
DIFFERENCES = {TOPIC: {"segment.bytes": "1073741824", "segment.ms": "604800000"}}


class StandInAdmin:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.asked: list[Any] = []

    def alter_configs(self, resources: list[Any], incremental: bool | None = None) -> dict[str, Any]:
        self.asked.append((resources, incremental))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_only_the_differing_settings_are_set_incrementally(caplog: pytest.LogCaptureFixture) -> None:
    admin = StandInAdmin({"topic": {TOPIC: "OK"}})
    with caplog.at_level(logging.INFO, logger="gpumeter.infra.kafka"):
        kafka._align_compaction(admin, DIFFERENCES)
    ((resources, incremental),) = admin.asked
    assert incremental is True  # AlterConfigs would reset every other setting of the topic
    (resource,) = resources
    assert resource.name == TOPIC
    assert resource.configs == {"segment.bytes": str(8 * 2**20), "segment.ms": str(10 * 60 * 1000)}
    assert "set segment.bytes=8388608, segment.ms=600000" in caplog.text


@pytest.mark.parametrize("answer", [
    {"topic": {TOPIC: "[Error 29] TopicAuthorizationFailedError: "}},
    KafkaTimeoutError("Timed out waiting for the controller"),
])
def test_a_refusal_is_a_warning_with_the_fix_never_a_failure_to_start(
    answer: dict[str, Any] | Exception, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpumeter.infra.kafka"):
        kafka._align_compaction(StandInAdmin(answer), DIFFERENCES)
    assert f"topic {TOPIC}: could not set its compaction settings" in caplog.text
    assert "kafka-configs --alter" in caplog.text and "segment.bytes=8388608" in caplog.text
