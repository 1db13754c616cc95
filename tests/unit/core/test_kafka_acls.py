"""The ACL list of gpumeter/core/kafka_acls.py: each role's reach, under the settings' names."""

from __future__ import annotations

import pytest

from gpumeter.core import topics
from gpumeter.core.kafka_acls import ROLES, KafkaAcl, role_acls
from gpumeter.core.settings import KafkaSettings, Settings, WorkerSettings

pytestmark = pytest.mark.security


def granted(settings: Settings, role: str, resource: str = "topic") -> dict[str, set[str]]:
    """name -> operations of one role on one resource type."""
    found: dict[str, set[str]] = {}
    for acl in role_acls(settings)[role]:  # type: ignore[index]
        if acl.resource == resource:
            found.setdefault(acl.name, set()).add(acl.operation)
    return found


def test_every_role_has_a_list_and_no_list_names_a_topic_outside_the_registry_and_the_changelog() -> None:
    settings = Settings()
    acls = role_acls(settings)
    assert set(acls) == set(ROLES)
    known = {spec.name for spec in topics.ALL} | {"gpumeter-worker-quota-ledgers-changelog"}
    for role, entries in acls.items():
        assert entries, role
        assert {e.name for e in entries if e.resource == "topic"} <= known, role


def test_only_the_agent_and_the_cli_write_samples_and_only_the_worker_writes_quota_events() -> None:
    settings = Settings()
    writers = {role for role in ROLES if "write" in granted(settings, role).get(topics.SAMPLES, set())}
    assert writers == {"agent", "cli"}
    quota = {role for role in ROLES if "write" in granted(settings, role).get(topics.QUOTA_EVENTS, set())}
    assert quota == {"worker"}


def test_the_agent_reads_nothing_and_joins_no_group() -> None:
    entries = role_acls(Settings())["agent"]
    assert {e.operation for e in entries} == {"write"}
    assert {e.name for e in entries} == {topics.SAMPLES, topics.TOPOLOGY, topics.ALLOCATION}


@pytest.mark.parametrize(
    ("prefix", "group"),
    [pytest.param("", "gpumeter-worker", id="defaults"), pytest.param("acme.", "billing", id="prefixed")],
)
def test_names_follow_the_topic_prefix_and_the_worker_group(prefix: str, group: str) -> None:
    settings = Settings(kafka=KafkaSettings(topic_prefix=prefix), worker=WorkerSettings(group=group))
    worker = role_acls(settings)["worker"]
    assert KafkaAcl("group", f"{prefix}{group}", "read") in worker
    assert KafkaAcl("topic", f"{prefix}{group}-quota-ledgers-changelog", "create") in worker
    assert KafkaAcl("topic", f"{prefix}gpumeter.usage.samples.v1", "read") in worker
    assert KafkaAcl("group", f"{prefix}gpumeter-hooks-actuator", "read") in role_acls(settings)["hooks"]
