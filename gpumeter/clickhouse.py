"""ClickHouse access: DSN parsing, client factory, forward-only schema migrations.

Every path (a real server over HTTP, the local server of `gpumeter up`, the in-process
``chdb:///dir`` engine) runs the same SQL against the same schema.

Idempotency by event_id is layered:
1. the sink removes event_ids that are already stored (anti-join) and duplicates
   inside a batch before it inserts, so rated_usage and its hourly rollup never
   count a sample twice in normal operation, retries included;
2. rated_usage is a ReplacingMergeTree ordered by (tenant, event_id), and invoice
   queries read it with FINAL: even a duplicate that slipped past (1), e.g. two sink
   instances racing during a rebalance, is billed once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any
from urllib.parse import quote, unquote, urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ClickHouseConfigError(ValueError):
    """A DSN we cannot use."""


class ClickHouseUnavailable(RuntimeError):
    """No ClickHouse server answered at the DSN."""


@dataclass(frozen=True)
class Dsn:
    scheme: str  # http | https | chdb
    host: str
    port: int
    database: str
    path: str = ""  # chdb data directory
    username: str = "default"
    password: str = ""

    @property
    def url(self) -> str:
        """For messages: the DSN without credentials."""
        if self.scheme == "chdb":
            return f"chdb://{self.path}?database={self.database}"
        return f"{self.scheme}://{self.host}:{self.port}/{self.database}"

    @property
    def text(self) -> str:
        """The DSN again, credentials included: parse_dsn(dsn.text) == dsn."""
        if self.scheme == "chdb" or (self.username == "default" and not self.password):
            return self.url
        credentials = quote(self.username, safe="")
        if self.password:
            credentials += ":" + quote(self.password, safe="")
        return f"{self.scheme}://{credentials}@{self.host}:{self.port}/{self.database}"

    def with_database(self, database: str) -> Dsn:
        return _checked(replace(self, database=database))


def parse_dsn(dsn: str) -> Dsn:
    """``http://host:8123/db``, ``https://...``, or ``chdb:///abs/dir`` (db after ``?database=``)."""
    parsed = urlparse(dsn)
    if parsed.scheme == "chdb":
        if not parsed.path:
            raise ClickHouseConfigError(f"chdb DSN needs a directory: chdb:///path, got {dsn!r}")
        database = "gpumeter"
        for part in parsed.query.split("&"):
            if part.startswith("database="):
                database = part.split("=", 1)[1]
        return _checked(Dsn("chdb", "", 0, database, path=parsed.path))
    if parsed.scheme not in ("http", "https"):
        raise ClickHouseConfigError(
            f"ClickHouse DSN must start with http://, https:// or chdb://, got {dsn!r}"
        )
    if not parsed.hostname:
        raise ClickHouseConfigError(f"ClickHouse DSN has no host: {dsn!r}")
    database = parsed.path.strip("/") or "gpumeter"
    port = parsed.port or (8443 if parsed.scheme == "https" else 8123)
    return _checked(
        Dsn(parsed.scheme, parsed.hostname, port, database,
            username=unquote(parsed.username or "default"), password=unquote(parsed.password or ""))
    )


def _checked(dsn: Dsn) -> Dsn:
    if not SCHEMA_NAME.match(dsn.database):
        raise ClickHouseConfigError(f"database name {dsn.database!r} is not a plain identifier")
    return dsn


def connect(dsn: str | Dsn, create_database: bool = True, **settings: Any) -> Client:
    """A clickhouse-connect client bound to the DSN's database (created when missing)."""
    target = parse_dsn(dsn) if isinstance(dsn, str) else dsn
    if target.scheme == "chdb":
        client = clickhouse_connect.get_client(dsn=f"chdb://{target.path}")
        if create_database:
            client.command(f"CREATE DATABASE IF NOT EXISTS {target.database}")
        client.database = target.database
        return client
    common: dict[str, Any] = {
        "host": target.host,
        "port": target.port,
        "username": target.username,
        "password": target.password,
        "secure": target.scheme == "https",
        "connect_timeout": 5,
        "send_receive_timeout": 60,
        "settings": settings or None,
    }
    try:
        if create_database:
            bootstrap = clickhouse_connect.get_client(**common)
            bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {target.database}")
            bootstrap.close()
        return clickhouse_connect.get_client(database=target.database, **common)
    except OperationalError as exc:
        raise ClickHouseUnavailable(f"no ClickHouse server answers at {target.url}") from exc


# Forward-only migrations: never edit one that has shipped; append a new one instead.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "rated usage, dead letters, hourly rollup, invoices",
        [
            """
            CREATE TABLE IF NOT EXISTS rated_usage (
                event_id String,
                tenant LowCardinality(String),
                period LowCardinality(String),
                kind LowCardinality(String),
                cluster LowCardinality(String),
                node LowCardinality(String),
                namespace LowCardinality(String),
                pod String,
                pod_uid String,
                window_start DateTime64(6, 'UTC'),
                window_end DateTime64(6, 'UTC'),
                quantity Decimal(38, 12),
                unit_seconds Decimal(38, 18),
                gpu_model LowCardinality(Nullable(String)),
                mig_profile LowCardinality(Nullable(String)),
                capacity_type LowCardinality(String),
                priority Int32,
                rate_card LowCardinality(String),
                currency LowCardinality(String),
                unit_price Decimal(38, 12),
                capacity_multiplier Decimal(38, 12),
                list_cost Decimal(38, 18),
                utilization Nullable(Decimal(18, 6)),
                energy_joules Nullable(Decimal(38, 6)),
                labels Map(String, String),
                source_partition Int32,
                source_offset Int64,
                inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
            )
            ENGINE = ReplacingMergeTree
            PARTITION BY period
            ORDER BY (tenant, event_id)
            """,
            """
            CREATE TABLE IF NOT EXISTS dead_letters (
                reason_code LowCardinality(String),
                reason String,
                raw String,
                source_topic LowCardinality(String),
                source_partition Int32,
                source_offset Int64,
                source_index UInt32,
                event_id Nullable(String),
                tenant Nullable(String),
                rejected_at DateTime64(3, 'UTC')
            )
            ENGINE = ReplacingMergeTree
            ORDER BY (source_topic, source_partition, source_offset, source_index)
            """,
            """
            CREATE TABLE IF NOT EXISTS usage_hourly (
                period LowCardinality(String),
                hour DateTime('UTC'),
                tenant LowCardinality(String),
                rate_card LowCardinality(String),
                kind LowCardinality(String),
                gpu_model LowCardinality(String),
                mig_profile LowCardinality(String),
                capacity_type LowCardinality(String),
                unit_seconds Decimal(38, 18),
                list_cost Decimal(38, 18),
                samples UInt64
            )
            ENGINE = SummingMergeTree
            PARTITION BY period
            ORDER BY (tenant, hour, rate_card, kind, gpu_model, mig_profile, capacity_type)
            """,
            """
            CREATE MATERIALIZED VIEW IF NOT EXISTS usage_hourly_mv TO usage_hourly AS
            SELECT period, toStartOfHour(window_start) AS hour, tenant, rate_card, kind,
                   ifNull(gpu_model, '') AS gpu_model, ifNull(mig_profile, '') AS mig_profile,
                   capacity_type, sum(unit_seconds) AS unit_seconds, sum(list_cost) AS list_cost,
                   count() AS samples
            FROM rated_usage
            GROUP BY period, hour, tenant, rate_card, kind, gpu_model, mig_profile, capacity_type
            """,
            """
            CREATE TABLE IF NOT EXISTS invoices (
                tenant LowCardinality(String),
                period LowCardinality(String),
                seq UInt32,
                status LowCardinality(String),
                document String,
                -- Unrounded line quantities, so an adjustment's deltas are exact.
                exact_quantities String,
                finalized_at DateTime64(3, 'UTC') DEFAULT now64(3)
            )
            ENGINE = MergeTree
            ORDER BY (tenant, period, seq)
            """,
        ],
    ),
    (
        2,
        "unit_seconds at 21 places: RFC3339Nano windows x 12-place quantities stay exact",
        [
            "ALTER TABLE rated_usage MODIFY COLUMN unit_seconds Decimal(38, 21)",
            "ALTER TABLE usage_hourly MODIFY COLUMN unit_seconds Decimal(38, 21)",
        ],
    ),
]


def schema_version(client: Client) -> int:
    client.command(
        "CREATE TABLE IF NOT EXISTS schema_version (version UInt32, name String, "
        "applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = MergeTree ORDER BY version"
    )
    result = client.query("SELECT max(version) FROM schema_version")
    return int(result.result_rows[0][0] or 0)


def migrate(client: Client) -> list[int]:
    """Apply the migrations newer than the stored version, in order; returns those applied."""
    current = schema_version(client)
    applied = []
    for version, name, statements in MIGRATIONS:
        if version <= current:
            continue
        for statement in statements:
            client.command(statement)
        client.insert("schema_version", [[version, name]], column_names=["version", "name"])
        applied.append(version)
    return applied


def scalar(client: Client, sql: str, parameters: dict[str, Any] | None = None) -> Any:
    rows = client.query(sql, parameters=parameters).result_rows
    return rows[0][0] if rows else None


def to_decimal(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))
