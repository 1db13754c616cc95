"""Verifying topics (``create_topics: false``) right after they were created.

KRaft brokers apply the controller's metadata log asynchronously: for a moment after CreateTopics
returns, a broker other than the one that answered may not list a new topic, or may describe it
as UNKNOWN_TOPIC_OR_PARTITION with no partitions. A stand-in admin client (named as such) answers
list_topics / describe_topics / describe_configs with kafka-python's shapes, from a broker that
learns the lagging topic only after a set number of metadata requests. The real cluster path is
tests/integration/test_kafka_cluster.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpumeter.core import topics
from gpumeter.core.settings import KafkaSettings
from gpumeter.infra import kafka

UNKNOWN_TOPIC_OR_PARTITION = 3


class LaggingBrokerAdmin:
    """Every registry topic exists as the settings ask; ``late`` is unknown to this broker for its
    first ``lag`` metadata requests, as ``unknown`` says: absent from the list, or listed but
    described with UNKNOWN_TOPIC_OR_PARTITION (the list came from a broker that knew it)."""

    def __init__(self, settings: KafkaSettings, late: str, lag: int, unknown: str) -> None:
        self.settings = settings
        self.late = late
        self.lag = lag
        self.unknown = unknown
        self.metadata_requests = 0

    def list_topics(self) -> list[str]:
        self.metadata_requests += 1
        names = [self.settings.topic(spec.name) for spec in topics.ALL]
        if self.metadata_requests <= self.lag and self.unknown == "list":
            names.remove(self.late)
        return names

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.metadata_requests += 1
        described = []
        for name in names:
            spec = next(spec for spec in topics.ALL if self.settings.topic(spec.name) == name)
            if name == self.late and self.metadata_requests <= self.lag and self.unknown == "describe":
                described.append({"error_code": UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []})
                continue
            count = kafka._partitions_for(self.settings, spec)
            described.append({"error_code": 0, "name": name, "partitions": [
                {"error_code": 0, "partition_index": index, "leader_id": 1, "replica_nodes": [1],
                 "isr_nodes": [1]} for index in range(count)]})
        return described

    def describe_configs(self, resources: list[Any], config_filter: str = "all") -> dict[str, Any]:
        return {"topic": {resource.name: {"min.insync.replicas": {"value": "1"}} for resource in resources}}

    def close(self) -> None:
        pass


@pytest.mark.parametrize("unknown", ["list", "describe"])
def test_a_topic_a_lagging_broker_does_not_know_yet_is_asked_for_again_not_reported_missing(
    unknown: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = KafkaSettings(bootstrap="127.0.0.1:9092", create_topics=False)
    late = settings.topic(topics.ALL[-1].name)
    stand_in = LaggingBrokerAdmin(settings, late, lag=3, unknown=unknown)
    monkeypatch.setattr(kafka, "admin", lambda _settings: stand_in)
    monkeypatch.setattr(kafka.time, "sleep", lambda _seconds: None)

    assert kafka.topic_mismatches(settings) == []
    assert kafka.ensure_topics(settings) == []


def test_a_topic_missing_for_good_is_reported_once_the_grace_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = KafkaSettings(bootstrap="127.0.0.1:9092", create_topics=False)
    late = settings.topic(topics.ALL[-1].name)
    stand_in = LaggingBrokerAdmin(settings, late, lag=10**9, unknown="list")
    monkeypatch.setattr(kafka, "admin", lambda _settings: stand_in)
    slept: list[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(kafka.time, "sleep", sleep)
    monkeypatch.setattr(kafka.time, "monotonic", lambda: clock[0])

    assert kafka.topic_mismatches(settings) == [
        f"{late}: missing (create it, or set kafka.create_topics: true)"]
    assert 0 < sum(slept) <= kafka.METADATA_SETTLE_SECONDS + 1
