"""Kafka access for every component: producers, topic creation, offsets (kafka-python)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorError,
    TopicAlreadyExistsError,
)
from kafka.errors import KafkaConnectionError as NoBrokersAvailable

from gpumeter.core.settings import KafkaSettings
from gpumeter.core.topics import ALL, TopicSpec


class KafkaUnavailable(RuntimeError):
    """The broker did not answer in time."""


def make_producer(kafka: KafkaSettings, **overrides: Any) -> KafkaProducer:
    """An idempotent producer that waits for all in-sync replicas: nothing acknowledged is lost."""
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "batch_size": 256 * 1024,
        "retries": 2**31 - 1,
        "max_in_flight_requests_per_connection": 5,
        "request_timeout_ms": 15_000,
    }
    options.update(overrides)
    try:
        return KafkaProducer(**options)
    except NoBrokersAvailable as exc:
        raise KafkaUnavailable(f"no Kafka broker answers at {kafka.bootstrap}") from exc


def admin(kafka: KafkaSettings) -> KafkaAdminClient:
    try:
        return KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)
    except NoBrokersAvailable as exc:
        raise KafkaUnavailable(f"no Kafka broker answers at {kafka.bootstrap}") from exc


def wait_for_broker(bootstrap: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
            client.list_topics()
            client.close()
            return
        except (KafkaError, OSError) as exc:
            last = exc
            time.sleep(0.5)
    raise KafkaUnavailable(f"Kafka at {bootstrap} did not answer within {timeout:.0f} s: {last}")


def _partitions_for(kafka: KafkaSettings, spec: TopicSpec) -> int:
    return int(getattr(kafka.partitions, spec.partitions_key))


def ensure_topics(kafka: KafkaSettings, specs: Iterable[TopicSpec] = ALL) -> list[str]:
    """Create the registry's topics that do not exist yet; returns the names created."""
    client = admin(kafka)
    try:
        existing = set(client.list_topics())
        wanted = []
        for spec in specs:
            name = kafka.topic(spec.name)
            if name in existing:
                continue
            config = {"cleanup.policy": "compact"} if spec.compacted else {}
            wanted.append(
                NewTopic(name, _partitions_for(kafka, spec), 1, topic_configs=config)
            )
        created = []
        for topic in wanted:
            try:
                client.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        client.close()


def delete_topics_under(kafka: KafkaSettings, client: KafkaAdminClient) -> list[str]:
    """Delete every topic under ``kafka.topic_prefix``; returns their names. The broker deletes
    asynchronously: a name may still be listed for a moment after this returns."""
    names = [name for name in client.list_topics() if name.startswith(kafka.topic_prefix)]
    if names:
        client.delete_topics(names)
    return names


def end_offsets(kafka: KafkaSettings, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """High watermark of every partition of ``topics``."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    try:
        partitions = []
        for topic in topics:
            for partition in consumer.partitions_for_topic(topic) or ():
                partitions.append(TopicPartition(topic, partition))
        return dict(consumer.end_offsets(partitions)) if partitions else {}
    finally:
        consumer.close()


def committed_offsets(kafka: KafkaSettings, group: str) -> dict[TopicPartition, int]:
    """The group's committed offsets; empty while its coordinator is still being elected."""
    client = admin(kafka)
    try:
        offsets = client.list_group_offsets({group: None}).get(group, {})
    except (CoordinatorNotAvailableError, NotCoordinatorError, CoordinatorLoadInProgressError):
        return {}
    finally:
        client.close()
    return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
