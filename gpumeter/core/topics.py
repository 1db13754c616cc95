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


# The worker's quota ledgers: a faust table, whose compacted changelog faust names
# "<app id>-<table>-changelog" (the app id is the worker's group).
LEDGER_TABLE = "quota-ledgers"
ACTUATOR_GROUP_SUFFIX = "-actuator"


def worker_group_id(prefix: str, worker_group: str) -> str:
    """The worker's consumer group, which is also its faust app id."""
    return f"{prefix}{worker_group}"


def ledger_changelog_topic(prefix: str, worker_group: str) -> str:
    """The compacted topic of the worker's ledger table."""
    return f"{worker_group_id(prefix, worker_group)}-{LEDGER_TABLE}-changelog"


def actuator_group_id(prefix: str, hooks_group: str) -> str:
    """The quota actuator's consumer group (of the quota events topic)."""
    return f"{prefix}{hooks_group}{ACTUATOR_GROUP_SUFFIX}"
