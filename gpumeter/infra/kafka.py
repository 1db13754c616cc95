"""Kafka access for every component: producers, topic creation, offsets (kafka-python)."""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import (
    AuthorizationError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorError,
    SaslAuthenticationFailedError,
    TopicAlreadyExistsError,
)
from kafka.errors import KafkaConnectionError as NoBrokersAvailable

from gpumeter.core.settings import KafkaSettings
from gpumeter.core.topics import ALL, TopicSpec

log = logging.getLogger(__name__)

class KafkaUnavailable(RuntimeError):
    """The broker did not answer in time."""


class KafkaAuthenticationFailed(KafkaUnavailable):
    """The cluster refused the credentials: waiting will not help."""


def _auth_failure(kafka: KafkaSettings, exc: Exception) -> str:
    # The server's message, never the password (the settings hold a path to it, not the text).
    return (f"Kafka at {kafka.bootstrap} refused {kafka.sasl_mechanism or kafka.security_protocol} "
            f"authentication as {kafka.sasl_username!r}: {exc}")


class _AuthFailureWatch(logging.Handler):
    """kafka-python retries a bootstrap whose SASL handshake the broker refused until its
    timeout and then reports only "Unable to bootstrap"; the refusal itself reaches its log
    as the exception argument of the failed connection. Collected here, so a wrong password
    is reported at once instead of waited out."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.refused: list[Exception] = []

    def emit(self, record: logging.LogRecord) -> None:
        arguments = record.args if isinstance(record.args, tuple) else ()
        self.refused.extend(a for a in arguments if isinstance(a, SaslAuthenticationFailedError))


@contextlib.contextmanager
def _refused_credentials() -> Iterator[list[Exception]]:
    watch = _AuthFailureWatch()
    loggers = [logging.getLogger(name) for name in ("kafka.net.manager", "kafka.net.connection")]
    for logger in loggers:
        logger.addHandler(watch)
    try:
        yield watch.refused
    finally:
        for logger in loggers:
            logger.removeHandler(watch)


def refusal(kafka: KafkaSettings, exc: AuthorizationError) -> str:
    """One line for an operation the cluster's ACLs refused: who was refused what. Waiting or
    retrying will not help; the role's ACLs (gpumeter/core/kafka_acls.py) must be granted."""
    who = f"user {kafka.sasl_username!r}" if kafka.uses_sasl else f"this {kafka.security_protocol} client"
    detail = str(exc).split(": ", 1)[-1] if ": " in str(exc) else ""
    return (f"Kafka at {kafka.bootstrap} did not authorize {who}: {type(exc).__name__}"
            f"{f' ({detail})' if detail else ''}; grant it its role's ACLs (gpumeter.core.kafka_acls)")


# How long a topic one broker does not know yet is asked for again before it counts as missing.
METADATA_SETTLE_SECONDS = 5.0


class TopicMismatch(RuntimeError):
    """Existing topics differ from what the settings ask for (``create_topics: false``); one
    line per topic in the message."""


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of SSL and SASL_SSL: the cluster's CA (or the system's), the client
    certificate for mTLS when one is set, host names checked."""
    if not kafka.uses_tls:
        return None
    context = ssl.create_default_context(cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None)
    if kafka.ssl_certfile is not None and kafka.ssl_keyfile is not None:
        context.load_cert_chain(str(kafka.ssl_certfile), str(kafka.ssl_keyfile))
    return context


def security_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Security keyword arguments, spelled alike by kafka-python and aiokafka (both take
    ``security_protocol``, ``sasl_*`` and ``ssl_context``). The password is read from its file here,
    per client, and goes nowhere else."""
    options: dict[str, Any] = {"security_protocol": kafka.security_protocol}
    if kafka.uses_sasl:
        options.update(sasl_mechanism=kafka.sasl_mechanism, sasl_plain_username=kafka.sasl_username,
                       sasl_plain_password=kafka.sasl_password())
    context = ssl_context(kafka)
    if context is not None:
        options["ssl_context"] = context
    return options


def client_options(kafka: KafkaSettings) -> dict[str, Any]:
    """What every kafka-python client (consumer, admin) of these settings is built with."""
    return {"bootstrap_servers": kafka.bootstrap, **security_options(kafka)}


def compression_type(kafka: KafkaSettings) -> str | None:
    return None if kafka.compression == "none" else kafka.compression


def make_consumer(kafka: KafkaSettings, *topics: str, **options: Any) -> KafkaConsumer:
    try:
        return KafkaConsumer(*topics, **client_options(kafka), **options)
    except NoBrokersAvailable as exc:
        raise KafkaUnavailable(f"no Kafka broker answers at {kafka.bootstrap}") from exc


def make_producer(kafka: KafkaSettings, **overrides: Any) -> KafkaProducer:
    """An idempotent producer that waits for all in-sync replicas: nothing acknowledged is lost."""
    options: dict[str, Any] = {
        **client_options(kafka),
        "compression_type": compression_type(kafka),
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
        return KafkaAdminClient(**client_options(kafka), request_timeout_ms=10_000)
    except NoBrokersAvailable as exc:
        raise KafkaUnavailable(f"no Kafka broker answers at {kafka.bootstrap}") from exc


def wait_for_broker(bootstrap: str | KafkaSettings, timeout: float = 60.0) -> None:
    """Wait until the cluster answers an admin request with at least ``replication_factor``
    brokers registered (topics of that replication can then be created). An authentication
    failure is not waited out: it is raised at once (a wrong password never turns into a hang)."""
    kafka = bootstrap if isinstance(bootstrap, KafkaSettings) else KafkaSettings(bootstrap=bootstrap)
    bootstrap = kafka.bootstrap
    deadline = time.monotonic() + timeout
    last: Exception | str | None = None
    with _refused_credentials() as refused:
        while time.monotonic() < deadline:
            try:
                client = KafkaAdminClient(**client_options(kafka), request_timeout_ms=3000)
                try:
                    brokers = sum(1 for b in client.describe_cluster()["brokers"] if not b.get("is_fenced"))
                finally:
                    client.close()
                if brokers >= kafka.replication_factor:
                    return
                last = f"{brokers} of {kafka.replication_factor} brokers registered"
            except SaslAuthenticationFailedError as exc:
                raise KafkaAuthenticationFailed(_auth_failure(kafka, exc)) from None
            except (KafkaError, OSError) as exc:
                last = exc
            if refused:
                raise KafkaAuthenticationFailed(_auth_failure(kafka, refused[0]))
            time.sleep(0.5)
    raise KafkaUnavailable(f"Kafka at {bootstrap} did not answer within {timeout:.0f} s: {last}")


def _partitions_for(kafka: KafkaSettings, spec: TopicSpec) -> int:
    return int(getattr(kafka.partitions, spec.partitions_key))


# Compacted topics are read whole by whoever starts: the worker its quota ledger changelog,
# the hooks the topology and allocation topics. Kafka compacts only closed segments, and with
# the broker's defaults (1 GiB, 7 days) a segment of the ledger changelog stays open for hours
# at 1,000 tenants (~44 KiB a ledger, one write a tenant a window): a restart then read every
# write since, not one ledger a tenant (benchmarks/ledger_recovery.py). Small segments, closed
# at least every 10 minutes, and a cleaner that runs once a tenth of the log is dirty keep
# what a restart reads near the live state: at most one 8 MiB segment a partition beyond it.
COMPACTED_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(8 * 1024 * 1024),
    "segment.ms": str(10 * 60 * 1000),
    "min.cleanable.dirty.ratio": "0.1",
}


def _topic_configs(kafka: KafkaSettings, spec: TopicSpec) -> dict[str, str]:
    config = {"min.insync.replicas": str(kafka.min_insync_replicas)}
    if spec.compacted:
        config.update(COMPACTED_TOPIC_CONFIGS)
    return config


def _compaction_differences(client: KafkaAdminClient, topics: list[str]) -> dict[str, dict[str, str]]:
    """Per compacted topic, the settings of COMPACTED_TOPIC_CONFIGS it does not have: {key: its
    value}. A topic created before those settings existed keeps the broker's defaults."""
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, dict.fromkeys(COMPACTED_TOPIC_CONFIGS))
                 for name in topics]
    found: dict[str, dict[str, str]] = {}
    for by_name in client.describe_configs(resources, config_filter="all").values():
        for name, values in by_name.items():
            for key, wanted in COMPACTED_TOPIC_CONFIGS.items():
                actual = values.get(key, {}).get("value")
                if actual is not None and str(actual) != wanted:
                    found.setdefault(name, {})[key] = str(actual)
    return found


def _align_compaction(client: KafkaAdminClient, differences: dict[str, dict[str, str]]) -> None:
    """Set our compaction settings on topics gpumeter manages (IncrementalAlterConfigs: every
    other setting of the topic stays as it is)."""
    if not differences:
        return
    resources = [ConfigResource(ConfigResourceType.TOPIC, name,
                                {key: COMPACTED_TOPIC_CONFIGS[key] for key in keys})
                 for name, keys in differences.items()]
    try:
        answers = client.alter_configs(resources, incremental=True).get("topic", {})
    except KafkaError as exc:  # e.g. no AlterConfigs ACL: slower restarts, never a refusal to start
        answers = {name: str(exc) for name in differences}
    for name, keys in differences.items():
        answer = answers.get(name, "no answer")
        if answer == "OK":
            log.info("kafka: topic %s: set %s (was %s)", name,
                     ", ".join(f"{k}={COMPACTED_TOPIC_CONFIGS[k]}" for k in keys),
                     ", ".join(f"{k}={v}" for k, v in keys.items()))
        else:
            log.warning("kafka: topic %s: could not set its compaction settings (%s)", name, answer)
            _warn_compaction({name: keys})


def _warn_compaction(differences: dict[str, dict[str, str]]) -> None:
    """On topics gpumeter does not manage, large segments cost restart time, not correctness:
    say so and start."""
    for name, keys in differences.items():
        fix = ",".join(f"{k}={COMPACTED_TOPIC_CONFIGS[k]}" for k in keys)
        log.warning("kafka: compacted topic %s has %s: a restart reads far more than the live state; "
                    "set kafka-configs --alter --entity-type topics --entity-name %s --add-config %s",
                    name, "; ".join(f"{k} {v}" for k, v in keys.items()), name, fix)


def topic_mismatches(kafka: KafkaSettings, specs: Iterable[TopicSpec] = ALL) -> list[str]:
    """One line per registry topic that is missing or whose partitions, replication factor or
    ``min.insync.replicas`` differ from the settings; empty when all agree."""
    specs = list(specs)
    client = admin(kafka)
    try:
        described = _described(client, [kafka.topic(spec.name) for spec in specs])
        configs = _min_isr(client, list(described))
    finally:
        client.close()
    problems = []
    for spec in specs:
        name = kafka.topic(spec.name)
        if name not in described:
            problems.append(f"{name}: missing (create it, or set kafka.create_topics: true)")
            continue
        partitions = described[name]["partitions"]
        differences = []
        if len(partitions) != _partitions_for(kafka, spec):
            differences.append(f"{len(partitions)} partitions, settings say {_partitions_for(kafka, spec)}")
        replication = min(len(p["replica_nodes"]) for p in partitions)
        if replication < kafka.replication_factor:
            differences.append(f"replication {replication}, settings say {kafka.replication_factor}")
        isr = configs.get(name)
        if isr is not None and isr < kafka.min_insync_replicas:
            differences.append(f"min.insync.replicas {isr}, settings say {kafka.min_insync_replicas}")
        if differences:
            problems.append(f"{name}: " + "; ".join(differences))
    return problems


def _described(client: KafkaAdminClient, names: list[str],
               settle: float = METADATA_SETTLE_SECONDS) -> dict[str, dict[str, Any]]:
    """The metadata of those of ``names`` that exist, by name. KRaft brokers apply the controller's
    metadata log asynchronously, so for a moment after a topic is created a broker may not list it,
    or describe it as unknown: a name missing either way is asked for again for ``settle`` seconds
    before it counts as missing (only a topic really missing pays that wait)."""
    deadline = time.monotonic() + settle
    while True:
        existing = set(client.list_topics())
        listed = [name for name in names if name in existing]
        described = {d["name"]: d for d in client.describe_topics(listed)
                     if d["error_code"] == 0 and d["partitions"]} if listed else {}
        if len(described) == len(names) or time.monotonic() >= deadline:
            return described
        time.sleep(0.2)


def _min_isr(client: KafkaAdminClient, topics: list[str]) -> dict[str, int]:
    """Each topic's effective ``min.insync.replicas`` (its own, else the broker's default)."""
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, {"min.insync.replicas": None})
                 for name in topics]
    found: dict[str, int] = {}
    for by_name in client.describe_configs(resources, config_filter="all").values():
        for name, values in by_name.items():
            entry = values.get("min.insync.replicas")
            if entry is not None and entry.get("value") is not None:
                found[name] = int(entry["value"])
    return found


def ensure_topics(kafka: KafkaSettings, specs: Iterable[TopicSpec] = ALL) -> list[str]:
    """Create the registry's topics that do not exist yet (with the configured replication and
    ``min.insync.replicas``); returns the names created. With ``create_topics: false`` nothing
    is created: topics are verified, and TopicMismatch names every one that differs."""
    specs = list(specs)
    if not kafka.create_topics:
        problems = topic_mismatches(kafka, specs)
        if problems:
            raise TopicMismatch("\n".join(problems))
        client = admin(kafka)
        try:
            compacted = [kafka.topic(spec.name) for spec in specs if spec.compacted]
            _warn_compaction(_compaction_differences(client, compacted))
        finally:
            client.close()
        return []
    client = admin(kafka)
    try:
        existing = set(client.list_topics())
        wanted = []
        compacted_before = []
        for spec in specs:
            name = kafka.topic(spec.name)
            if name in existing:
                if spec.compacted:
                    compacted_before.append(name)
                continue
            wanted.append(NewTopic(name, _partitions_for(kafka, spec), kafka.replication_factor,
                                   topic_configs=_topic_configs(kafka, spec)))
        created = []
        for topic in wanted:
            try:
                client.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
        _wait_for_leaders(client, {topic.name: topic.num_partitions for topic in wanted})
        _align_compaction(client, _compaction_differences(client, compacted_before))
        return created
    finally:
        client.close()


def _wait_for_leaders(client: KafkaAdminClient, partitions: dict[str, int], timeout: float = 30.0) -> None:
    """Until every partition of these new topics has a leader in the metadata: the controller
    answers CreateTopics before the brokers know the topic, and a client that starts at once
    (the worker after `gpumeter up`) would meet UnknownTopicOrPartition."""
    deadline = time.monotonic() + timeout
    while partitions and time.monotonic() < deadline:
        described = client.describe_topics(list(partitions))
        ready = {d["name"] for d in described
                 if len([p for p in d["partitions"] if p.get("leader_id", -1) >= 0]) == partitions[d["name"]]}
        partitions = {name: count for name, count in partitions.items() if name not in ready}
        if partitions:
            time.sleep(0.2)


def delete_topics_under(kafka: KafkaSettings, client: KafkaAdminClient) -> list[str]:
    """Delete every topic under ``kafka.topic_prefix``; returns their names. The broker deletes
    asynchronously: a name may still be listed for a moment after this returns."""
    names = [name for name in client.list_topics() if name.startswith(kafka.topic_prefix)]
    if names:
        client.delete_topics(names)
    return names


def end_offsets(kafka: KafkaSettings, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """High watermark of every partition of ``topics``."""
    consumer = make_consumer(kafka, enable_auto_commit=False)
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
