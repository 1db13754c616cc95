"""Kafka ACLs as the trust boundary (issue 31): a cluster enforcing ACLs (StandardAuthorizer),
one SCRAM principal per role granted exactly gpumeter/core/kafka_acls.py's list, clients over
SASL_SSL only.

What a role may do is shown by doing it with the product's own clients (the worker process,
the CLI); what it may not, by the broker's refusal."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from kafka.errors import AuthorizationError, TopicAuthorizationFailedError

from gpumeter.app import schema
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.kafka_acls import ROLES, role_acls
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.infra import clickhouse, kafka
from testkit.builders import sample
from testkit.secure_kafka import ADMIN, SecureKafka, secure_kafka
from tests.services import Endpoints, Namespaces, isolated_settings, run_cli, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.security]

PREFIX = "acl."
TENANT = "tenant-creds"  # a tenant's credentials: a valid login, no ACL


@pytest.fixture(scope="module")
def acl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """One node enforcing ACLs; the registry's topics created and every role granted its list
    by the administrator."""
    with secure_kafka(tmp_path_factory.mktemp("kafka-acls"), [*ROLES, TENANT], nodes=1,
                      authorize=True) as secure:
        kafka.ensure_topics(secure.settings(ADMIN, topic_prefix=PREFIX))
        granted = role_acls(Settings(kafka=secure.settings(ADMIN, topic_prefix=PREFIX)))
        for role, entries in granted.items():
            secure.grant(role, entries)
        yield secure


def as_user(secure: SecureKafka, user: str) -> KafkaSettings:
    return secure.settings(user, topic_prefix=PREFIX)


def send(settings: KafkaSettings, base: str) -> None:
    producer = kafka.make_producer(settings, max_block_ms=15_000)
    try:
        producer.send(settings.topic(base), key=b"team-a", value=b"{}").get(timeout=30)
    finally:
        producer.close(timeout=10)


def read(settings: KafkaSettings, base: str) -> None:
    """Consume a topic in a group, as the worker and the actuator do."""
    consumer = kafka.make_consumer(settings, settings.topic(base), group_id=f"{PREFIX}reader",
                                   enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        consumer.poll(timeout_ms=5000)
    finally:
        consumer.close()


def visible(settings: KafkaSettings, base: str) -> bool:
    """Whether the topic shows in the cluster's metadata for this principal (DESCRIBE)."""
    consumer = kafka.make_consumer(settings, group_id=None, enable_auto_commit=False)
    try:
        return bool(consumer.partitions_for_topic(settings.topic(base)))
    finally:
        consumer.close()


def test_the_agent_produces_samples_but_cannot_write_quota_events_nor_read_rated_usage(
    acl_kafka: SecureKafka,
) -> None:
    agent = as_user(acl_kafka, "agent")
    for allowed in (topics.SAMPLES, topics.TOPOLOGY, topics.ALLOCATION):
        send(agent, allowed)
    with pytest.raises(TopicAuthorizationFailedError):
        send(agent, topics.QUOTA_EVENTS)
    # Rated usage is invisible to the agent, and it has no group to read in.
    assert visible(as_user(acl_kafka, "worker"), topics.RATED) and not visible(agent, topics.RATED)
    with pytest.raises(AuthorizationError):
        read(agent, topics.RATED)


@pytest.mark.parametrize(
    ("operation", "base"),
    [
        pytest.param(send, topics.SAMPLES, id="produce-samples"),
        pytest.param(send, topics.QUOTA_EVENTS, id="produce-quota-events"),
        pytest.param(read, topics.RATED, id="consume-rated"),
        pytest.param(read, topics.SAMPLES, id="consume-samples"),
    ],
)
def test_a_principal_without_acls_is_refused(
    acl_kafka: SecureKafka, operation: Callable[[KafkaSettings, str], None], base: str
) -> None:
    with pytest.raises(AuthorizationError):
        operation(as_user(acl_kafka, TENANT), base)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("ingest", "{samples}"), id="ingest-produces"),
        pytest.param(("drain", "--timeout", "20"), id="drain-reads-offsets"),
    ],
)
def test_the_cli_reports_a_refusal_in_one_line_naming_the_user(
    acl_kafka: SecureKafka, tmp_path: Path, command: tuple[str, ...]
) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(sample("ev-tenant", tenant="team-a")) + "\n")
    settings = Settings(data_dir=tmp_path / "data", kafka=as_user(acl_kafka, TENANT))
    result = run_cli(settings, *(part.format(samples=samples) for part in command), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"did not authorize user '{TENANT}'" in lines[0] and "AuthorizationFailedError" in lines[0]


def test_the_worker_rates_and_the_cli_ingests_drains_and_reads_quotas_each_as_its_own_principal(
    acl_kafka: SecureKafka,
    endpoints: Endpoints,
    namespaces: Namespaces,
    worker_factory: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    base = isolated_settings(endpoints, tmp_path / "data")
    namespaces.add(base, topics=False)  # the topics live on this module's cluster
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  - tenant: team-a\n    gpu_hours: '100'\n")
    base.tenants = tenants
    client = clickhouse.connect(base.clickhouse.dsn)
    try:
        schema.migrate(client)
    finally:
        client.close()
    # Topics of its own (the other tests publish into the module's), granted as the fixture does.
    prefix = "acl-pipeline."
    kafka.ensure_topics(acl_kafka.settings(ADMIN, topic_prefix=prefix))
    worker = base.model_copy(update={"kafka": acl_kafka.settings("worker", topic_prefix=prefix)})
    cli = base.model_copy(update={"kafka": acl_kafka.settings("cli", topic_prefix=prefix)})
    granted = role_acls(worker)
    for role in ("worker", "cli"):
        acl_kafka.grant(role, granted[role])

    lines = [json.dumps(sample(f"ev-{hour}", tenant="team-a", start=f"2026-11-10T0{hour}:00:00Z"))
             for hour in range(3)]
    usage = tmp_path / "usage.jsonl"
    usage.write_text("\n".join([*lines, '{"kind": "not-a-sample"}']) + "\n")
    ingested = run_cli(cli, "ingest", str(usage))
    assert ingested.returncode == 2 and "accepted 3, rejected 1" in ingested.stdout, ingested.stderr

    running = worker_factory(worker, "acl-worker")
    drained = run_cli(cli, "drain", "--timeout", "120")
    assert drained.returncode == 0, f"{drained.stderr}\nworker: {running.log_tail()}"

    def stored(table: str) -> int:
        reader = clickhouse.connect(base.clickhouse.dsn)
        try:
            return int(reader.query(f"SELECT count() FROM {table} FINAL").result_rows[0][0])
        finally:
            reader.close()

    assert stored("rated_usage") == 3 and stored("dead_letters") == 1

    def ledger_counted() -> bool:
        status = run_cli(cli, "quota", "status", "--json")
        assert status.returncode == 0, status.stderr
        [team] = json.loads(status.stdout)["tenants"]
        used = {m["metric"]: m["used"] for m in team["metrics"]}
        return used.get("gpu_hours") is not None and Decimal(used["gpu_hours"]) == Decimal(3)

    wait_until(ledger_counted, 60, f"the ledger changelog read by the CLI; worker: {running.log_tail()}")
    assert running.alive(), running.log_tail()
