"""`gpumeter up | down | status`: the local Kafka broker and local ClickHouse server together."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from kafka.errors import KafkaError

from gpumeter.app import schema
from gpumeter.app.runtime.chserver import LOOPBACK, LocalClickHouse
from gpumeter.app.runtime.kafka_broker import (
    LocalKafkaCluster,
    RuntimeSetupError,
    min_insync_for,
    record_node_count,
    replication_for,
)
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.infra import clickhouse, kafka


@dataclass(frozen=True)
class LocalServices:
    kafka: LocalKafkaCluster
    clickhouse: LocalClickHouse | None  # None when the DSN points at a remote server or chdb://

    @classmethod
    def from_settings(cls, settings: Settings, brokers: int | None = None) -> LocalServices:
        cluster = LocalKafkaCluster.from_settings(settings.data_dir, settings.kafka, brokers)
        dsn = clickhouse.parse_dsn(settings.clickhouse.dsn)
        local_ch = None
        if dsn.scheme == "http" and dsn.host in LOOPBACK:
            local_ch = LocalClickHouse(settings.data_dir / "clickhouse", dsn.host, dsn.port,
                                       tcp_port=_tcp_port_for(dsn.port))
        return cls(cluster, local_ch)

    def kafka_settings(self, settings: Settings) -> KafkaSettings:
        """The settings clients of this local cluster use: every node in the bootstrap list,
        replication min(3, N) and min ISR min(2, N) (contract 9)."""
        nodes = len(self.kafka.nodes)
        if nodes == 1:
            return settings.kafka
        return settings.kafka.model_copy(update={
            "bootstrap": self.kafka.bootstrap, "replication_factor": replication_for(nodes),
            "min_insync_replicas": min_insync_for(nodes)})


def _tcp_port_for(http_port: int) -> int:
    # 8123 -> 9000 as ClickHouse's defaults; other HTTP ports get a neighbour that is unlikely taken.
    return 9000 if http_port == 8123 else http_port + 1


def namespaced(settings: Settings, topic_prefix: str, database: str, group: str) -> Settings:
    """The same services under a namespace of their own: topic prefix, database, consumer group."""
    isolated = settings.model_copy(deep=True)
    isolated.kafka.topic_prefix = topic_prefix
    isolated.clickhouse.dsn = clickhouse.parse_dsn(settings.clickhouse.dsn).with_database(database).text
    isolated.worker.group = group
    return isolated


def drop_namespace(settings: Settings) -> None:
    """Delete a namespace's topics, consumer group and database (demo resets, benchmark clean-up)."""
    client = kafka.admin(settings.kafka)
    try:
        if kafka.delete_topics_under(settings.kafka, client):
            time.sleep(2)  # deletion is asynchronous on the broker
        with contextlib.suppress(KafkaError):  # the group may never have existed
            client.delete_groups([settings.kafka.topic_prefix + settings.worker.group])
    finally:
        client.close()
    clickhouse.drop_database(settings.clickhouse.connection_dsn())


def up(settings: Settings, brokers: int | None = None) -> list[str]:
    """Start what is missing, create topics, migrate the schema. Idempotent. Returns what it did."""
    services = LocalServices.from_settings(settings, brokers)
    record_node_count(settings.data_dir, len(services.kafka.nodes))
    kafka_settings = services.kafka_settings(settings)
    done: list[str] = []
    started = services.kafka.start()
    if started:
        done.append("started Kafka " + ", ".join(f"node {n.node_id} on {n.bootstrap}" for n in started))
    try:
        kafka.wait_for_broker(kafka_settings, timeout=90)
    except kafka.KafkaUnavailable as exc:
        details = "; ".join(node.failure_detail() for node in services.kafka.nodes)
        raise RuntimeSetupError(f"{exc}; {details}") from None
    created = kafka.ensure_topics(kafka_settings)
    if created:
        done.append(f"created topics {', '.join(created)}")
    if len(services.kafka.nodes) > 1:
        done.append(f"point clients at this cluster: GPUMETER_KAFKA_BOOTSTRAP={kafka_settings.bootstrap} "
                    f"GPUMETER_KAFKA_REPLICATION_FACTOR={kafka_settings.replication_factor} "
                    f"GPUMETER_KAFKA_MIN_INSYNC_REPLICAS={kafka_settings.min_insync_replicas}")
    if services.clickhouse is not None and services.clickhouse.start():
        done.append(f"started ClickHouse {services.clickhouse.url}")
    client = clickhouse.connect(settings.clickhouse.connection_dsn())
    applied = schema.migrate(client)
    client.close()
    if applied:
        done.append(f"applied schema migrations {', '.join(applied)}")
    return done


def down(settings: Settings) -> list[str]:
    services = LocalServices.from_settings(settings)
    done = []
    if services.clickhouse is not None and services.clickhouse.stop():
        done.append("stopped ClickHouse")
    stopped = services.kafka.stop()
    if stopped:
        done.append("stopped Kafka " + ", ".join(f"node {node.node_id}" for node in stopped))
    return done


def status(settings: Settings) -> dict[str, str]:
    services = LocalServices.from_settings(settings)
    kafka_settings = services.kafka_settings(settings)
    nodes = services.kafka.nodes
    alive = [node for node in nodes if node.answers()]
    report = {
        "kafka.bootstrap": kafka_settings.bootstrap,
        "kafka.answers": "yes" if alive else "no",
        "kafka.pid": ", ".join(str(node.pid() or "-") for node in nodes),
        "clickhouse.dsn": clickhouse.parse_dsn(settings.clickhouse.dsn).url,
        "data_dir": str(settings.data_dir),
    }
    if len(nodes) > 1:
        report["kafka.nodes"] = f"{len(alive)} of {len(nodes)} answer"
    if services.clickhouse is not None:
        report["clickhouse.url"] = services.clickhouse.url
        report["clickhouse.answers"] = "yes" if services.clickhouse.answers() else "no"
        report["clickhouse.pid"] = str(services.clickhouse.pid() or "-")
    if alive:
        try:
            client = kafka.admin(kafka_settings)
            prefix = settings.kafka.topic_prefix
            topics = sorted(t for t in client.list_topics() if t.startswith(prefix + "gpumeter."))
            client.close()
            report["topics"] = ", ".join(topics) or "-"
        except kafka.KafkaUnavailable:
            report["topics"] = "?"
    return report


def status_document(settings: Settings) -> dict[str, Any]:
    """`gpumeter status --json` (contract 9): each Kafka node and the ClickHouse server."""
    services = LocalServices.from_settings(settings)
    document: dict[str, Any] = {
        "kafka": [{"node_id": node.node_id, "port": node.port, "pid": node.pid(), "alive": node.answers()}
                  for node in services.kafka.nodes],
        "clickhouse": None,
    }
    if services.clickhouse is not None:
        server = services.clickhouse
        document["clickhouse"] = {"url": server.url, "pid": server.pid(), "alive": server.answers()}
    else:
        document["clickhouse"] = {"url": clickhouse.parse_dsn(settings.clickhouse.dsn).url,
                                  "pid": None, "alive": None}
    return document
