"""The Kafka ACLs of each gpumeter role (contract 9): one principal per role, each allowed
what its clients do and nothing else.

This list is the one place they are written. The integration tests grant it to a cluster
running Kafka's StandardAuthorizer; a deployment (a chart, a platform's ACL tooling) renders
the same list. Names come from the topic registry and the settings (topic prefix, worker and
hooks groups), so a prefixed installation gets prefixed ACLs.

Samples are billed as written: whoever may write the samples topic decides what a tenant pays.
That is the agent's principal alone (and the CLI's, for `gpumeter ingest`); a tenant's
credentials get no ACL at all.

The registry's topics are created by the platform or an administrator principal, not by these
roles; the one topic a role creates is the worker's ledger changelog. Operations implied by
Kafka are not repeated (READ and WRITE imply DESCRIBE on the same resource).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpumeter.core import topics
from gpumeter.core.settings import Settings

Role = Literal["agent", "worker", "hooks", "cli", "insights"]
ROLES: tuple[Role, ...] = ("agent", "worker", "hooks", "cli", "insights")

Resource = Literal["topic", "group"]
Operation = Literal["read", "write", "create", "describe", "describe_configs"]


@dataclass(frozen=True, order=True)
class KafkaAcl:
    """ALLOW ``operation`` on the literal resource ``name`` (from any host)."""

    resource: Resource
    name: str
    operation: Operation


def _topic(settings: Settings, base: str, *operations: Operation) -> list[KafkaAcl]:
    return [KafkaAcl("topic", settings.kafka.topic(base), operation) for operation in operations]


def role_acls(settings: Settings) -> dict[Role, tuple[KafkaAcl, ...]]:
    """Every role's ACLs under ``settings``."""
    prefix = settings.kafka.topic_prefix
    worker_group = topics.worker_group_id(prefix, settings.worker.group)
    changelog = topics.ledger_changelog_topic(prefix, settings.worker.group)
    actuator_group = topics.actuator_group_id(prefix, settings.hooks.group)
    acls: dict[Role, list[KafkaAcl]] = {
        # The node agent (and the simulated fleet): publishes, never reads.
        "agent": [
            *_topic(settings, topics.SAMPLES, "write"),
            *_topic(settings, topics.TOPOLOGY, "write"),
            *_topic(settings, topics.ALLOCATION, "write"),
        ],
        # `gpumeter worker`: rates samples, stores dead letters and quota events it reads back
        # from their topics, keeps the quota ledgers in a changelog it creates itself (and
        # verifies under create_topics: false).
        "worker": [
            *_topic(settings, topics.SAMPLES, "read"),
            *_topic(settings, topics.RATED, "read", "write"),
            *_topic(settings, topics.DEADLETTER, "read", "write"),
            *_topic(settings, topics.QUOTA_EVENTS, "read", "write"),
            KafkaAcl("topic", changelog, "read"),
            KafkaAcl("topic", changelog, "write"),
            KafkaAcl("topic", changelog, "create"),
            KafkaAcl("topic", changelog, "describe_configs"),
            KafkaAcl("group", worker_group, "read"),
        ],
        # `gpumeter hooks`: the extender's feeds read quota events, topology and allocation
        # without a group (and verify those topics under create_topics: false); the actuator
        # reads quota events in its group and publishes its preemption records.
        "hooks": [
            *_topic(settings, topics.QUOTA_EVENTS, "read", "describe_configs"),
            *_topic(settings, topics.TOPOLOGY, "read", "describe_configs"),
            *_topic(settings, topics.ALLOCATION, "read", "describe_configs"),
            *_topic(settings, topics.PREEMPTIONS, "write"),
            KafkaAcl("group", actuator_group, "read"),
        ],
        # An operator's CLI: `ingest` publishes samples and its rejected lines as dead letters,
        # `drain` compares the worker group's commits with those topics' ends, `quota status`
        # reads the ledger changelog (assigned partitions, no group).
        "cli": [
            *_topic(settings, topics.SAMPLES, "write"),
            *_topic(settings, topics.DEADLETTER, "write"),
            KafkaAcl("group", worker_group, "describe"),
            KafkaAcl("topic", changelog, "read"),
        ],
        # `gpumeter insights` (unless --no-publish): idle-GPU advice.
        "insights": [*_topic(settings, topics.ADVICE, "write", "describe_configs")],
    }
    return {role: tuple(entries) for role, entries in acls.items()}
