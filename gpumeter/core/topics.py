"""The Kafka topic registry (DESIGN.md data flow)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions_key: str  # which Settings.partitions field sets the count
    compacted: bool = False
    key: str = "tenant"


SAMPLES = "gpumeter.usage.samples.v1"
RATED = "gpumeter.usage.rated.v1"
DEADLETTER = "gpumeter.deadletter.v1"
TOPOLOGY = "gpumeter.node.topology.v1"
QUOTA_EVENTS = "gpumeter.quota.events.v1"
ALLOCATION = "gpumeter.node.allocation.v1"
PREEMPTIONS = "gpumeter.preemptions.v1"
# Idle-GPU advice (insights): advice only, nothing acts on it automatically.
ADVICE = "gpumeter.advice.v1"

ALL: tuple[TopicSpec, ...] = (
    TopicSpec(SAMPLES, "samples"),
    TopicSpec(RATED, "rated"),
    TopicSpec(DEADLETTER, "other"),
    TopicSpec(TOPOLOGY, "other", compacted=True, key="node"),
    TopicSpec(ALLOCATION, "other", compacted=True, key="node"),
    TopicSpec(QUOTA_EVENTS, "other"),
    TopicSpec(PREEMPTIONS, "other"),
    TopicSpec(ADVICE, "other"),
)


def topic_name(base: str, prefix: str = "") -> str:
    """Topic name under an optional prefix, which isolates tenants of one broker (e.g. tests)."""
    return f"{prefix}{base}"
