"""Compacted topics are compacted while the worker runs (issue 28, point 5).

A worker reads its quota ledger changelog whole at every start. Kafka compacts only closed
segments, and a topic created with the broker's defaults closes one at 1 GiB or after 7 days:
at 1,000 tenants (~44 KiB a ledger, one write a tenant a 15 s window, ~3 MB/s) a restarted
worker would read every write of the last hours, not one ledger per tenant
(benchmarks/ledger_recovery.py). The bounds below follow from the 30 s goal, not from the code:
what a restart reads beyond the live ledgers is at most one open segment per partition plus
the dirty share the cleaner leaves.
"""

from __future__ import annotations

import logging

import pytest
from kafka.admin import ConfigResource, ConfigResourceType

from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.core.topics import TopicSpec, ledger_changelog_topic
from gpumeter.infra import kafka

KEYS = ("cleanup.policy", "segment.bytes", "segment.ms", "min.cleanable.dirty.ratio")


def configs(settings: Settings, names: list[str]) -> dict[str, dict[str, str]]:
    client = kafka.admin(settings.kafka)
    try:
        answer = client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, dict.fromkeys(KEYS)) for name in names],
            config_filter="all")
    finally:
        client.close()
    found: dict[str, dict[str, str]] = {}
    for by_name in answer.values():
        for name, values in by_name.items():
            found[name] = {key: str(values[key]["value"]) for key in KEYS if key in values}
    return found


def test_compacted_topics_close_segments_small_and_often_enough_for_the_cleaner(settings: Settings) -> None:
    changelog = ledger_changelog_topic("", settings.worker.group)
    kafka.ensure_topics(settings.kafka, [TopicSpec(changelog, "rated", compacted=True)])
    compacted = [settings.kafka.topic(spec.name) for spec in topics.ALL if spec.compacted]
    found = configs(settings, [*compacted, settings.kafka.topic(changelog)])
    assert len(found) == len(compacted) + 1
    for name, values in found.items():
        assert values["cleanup.policy"] == "compact", name
        assert int(values["segment.bytes"]) <= 16 * 2**20, name  # not the broker's 1 GiB
        assert int(values["segment.ms"]) <= 15 * 60 * 1000, name  # not 7 days
        assert float(values["min.cleanable.dirty.ratio"]) <= 0.25, name  # not half the log


def test_other_topics_keep_the_brokers_segments(settings: Settings) -> None:
    samples = settings.kafka.topic(topics.SAMPLES)
    values = configs(settings, [samples])[samples]
    assert values["cleanup.policy"] == "delete"
    assert int(values["segment.bytes"]) == 2**30


def created_with_broker_defaults(settings: Settings, name: str) -> None:
    """A compacted topic as an older release created it: compact, nothing else set."""
    from kafka.admin import NewTopic

    client = kafka.admin(settings.kafka)
    try:
        partitions = settings.kafka.partitions.rated  # as the settings ask: only the segments differ
        client.create_topics([NewTopic(name, partitions, settings.kafka.replication_factor,
                                       topic_configs={"cleanup.policy": "compact"})])
    finally:
        client.close()


def test_a_compacted_topic_created_before_gets_the_small_segments_when_topics_are_managed(
    settings: Settings,
) -> None:
    changelog = ledger_changelog_topic("", settings.worker.group + "-older")
    name = settings.kafka.topic(changelog)
    created_with_broker_defaults(settings, name)
    assert int(configs(settings, [name])[name]["segment.bytes"]) == 2**30  # the broker's default

    kafka.ensure_topics(settings.kafka, [TopicSpec(changelog, "rated", compacted=True)])
    values = configs(settings, [name])[name]
    assert values["cleanup.policy"] == "compact"
    assert int(values["segment.bytes"]) <= 16 * 2**20
    assert int(values["segment.ms"]) <= 15 * 60 * 1000
    assert float(values["min.cleanable.dirty.ratio"]) <= 0.25


def test_an_unmanaged_compacted_topic_with_large_segments_is_reported_and_left_alone(
    settings: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    changelog = ledger_changelog_topic("", settings.worker.group + "-unmanaged")
    name = settings.kafka.topic(changelog)
    created_with_broker_defaults(settings, name)
    unmanaged = settings.kafka.model_copy(update={"create_topics": False})

    with caplog.at_level(logging.WARNING, logger="gpumeter.infra.kafka"):
        kafka.ensure_topics(unmanaged, [TopicSpec(changelog, "rated", compacted=True)])  # starts anyway
    (line,) = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert "segment.bytes 1073741824" in line and "kafka-configs" in line
    assert int(configs(settings, [name])[name]["segment.bytes"]) == 2**30  # not altered
