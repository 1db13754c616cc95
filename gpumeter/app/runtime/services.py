"""`gpumeter up | down | status`: the local Kafka broker and local ClickHouse server together."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from kafka.errors import KafkaError

from gpumeter.app import schema
from gpumeter.app.runtime.chserver import LOOPBACK, LocalClickHouse
from gpumeter.app.runtime.kafka_broker import LocalBroker, RuntimeSetupError
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka


@dataclass(frozen=True)
class LocalServices:
    broker: LocalBroker
    clickhouse: LocalClickHouse | None  # None when the DSN points at a remote server or chdb://

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalServices:
        broker = LocalBroker.from_settings(settings.data_dir, settings.kafka)
        dsn = clickhouse.parse_dsn(settings.clickhouse.dsn)
        local_ch = None
        if dsn.scheme == "http" and dsn.host in LOOPBACK:
            local_ch = LocalClickHouse(settings.data_dir / "clickhouse", dsn.host, dsn.port,
                                       tcp_port=_tcp_port_for(dsn.port))
        return cls(broker, local_ch)


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
    clickhouse.drop_database(settings.clickhouse.dsn)


def up(settings: Settings) -> list[str]:
    """Start what is missing, create topics, migrate the schema. Idempotent. Returns what it did."""
    services = LocalServices.from_settings(settings)
    done: list[str] = []
    if services.broker.start():
        done.append(f"started Kafka {services.broker.bootstrap}")
    try:
        kafka.wait_for_broker(settings.kafka.bootstrap, timeout=90)
    except kafka.KafkaUnavailable as exc:
        raise RuntimeSetupError(f"{exc}; {services.broker.failure_detail()}") from None
    created = kafka.ensure_topics(settings.kafka)
    if created:
        done.append(f"created topics {', '.join(created)}")
    if services.clickhouse is not None and services.clickhouse.start():
        done.append(f"started ClickHouse {services.clickhouse.url}")
    client = clickhouse.connect(settings.clickhouse.dsn)
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
    if services.broker.stop():
        done.append("stopped Kafka")
    return done


def status(settings: Settings) -> dict[str, str]:
    services = LocalServices.from_settings(settings)
    report = {
        "kafka.bootstrap": settings.kafka.bootstrap,
        "kafka.answers": "yes" if services.broker.answers() else "no",
        "kafka.pid": str(services.broker.pid() or "-"),
        "clickhouse.dsn": settings.clickhouse.dsn,
        "data_dir": str(settings.data_dir),
    }
    if services.clickhouse is not None:
        report["clickhouse.url"] = services.clickhouse.url
        report["clickhouse.answers"] = "yes" if services.clickhouse.answers() else "no"
        report["clickhouse.pid"] = str(services.clickhouse.pid() or "-")
    if report["kafka.answers"] == "yes":
        try:
            client = kafka.admin(settings.kafka)
            prefix = settings.kafka.topic_prefix
            topics = sorted(t for t in client.list_topics() if t.startswith(prefix + "gpumeter."))
            client.close()
            report["topics"] = ", ".join(topics) or "-"
        except kafka.KafkaUnavailable:
            report["topics"] = "?"
    return report


