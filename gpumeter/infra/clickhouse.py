"""ClickHouse access: DSN parsing, client factory.

Every path (a real server over HTTP, the local server of `gpumeter up`, the in-process
``chdb:///dir`` engine) runs the same SQL against the same schema. Tables are declared by
their owners (gpumeter/infra/schema.py, pricing/store.py, ...); the app layer hands the
owners to ``migrations.migrate``.
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
# Session settings of every client. An insert into a Distributed table returns only once each
# shard has the rows (insert_distributed_sync: distributed_foreground_insert in newer releases,
# which keep the old name as an alias), so a read right after it sees them: the sink's claims,
# the rated rows checked on a retry. No effect on inserts into other tables.
SESSION_SETTINGS: dict[str, Any] = {"insert_distributed_sync": 1}


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


def without_password(dsn: str) -> str:
    """A DSN's text for messages: a password in it is replaced by ``***``."""
    parsed = urlparse(dsn)
    if parsed.password is None:
        return dsn
    user = parsed.username or ""
    host = parsed.netloc.rpartition("@")[2]
    return parsed._replace(netloc=f"{user}:***@{host}").geturl()


def parse_dsn(dsn: str) -> Dsn:
    """``http://host:8123/db``, ``https://...``, or ``chdb:///abs/dir`` (db after ``?database=``).
    Error messages never carry the DSN's password."""
    shown = without_password(dsn)
    try:
        parsed = urlparse(dsn)
        port = parsed.port
    except ValueError as exc:  # e.g. a port that is not a number
        raise ClickHouseConfigError(f"ClickHouse DSN {shown!r} is not a URL: {exc}") from None
    if parsed.scheme == "chdb":
        if not parsed.path:
            raise ClickHouseConfigError(f"chdb DSN needs a directory: chdb:///path, got {shown!r}")
        database = "gpumeter"
        for part in parsed.query.split("&"):
            if part.startswith("database="):
                database = part.split("=", 1)[1]
        return _checked(Dsn("chdb", "", 0, database, path=parsed.path))
    if parsed.scheme not in ("http", "https"):
        raise ClickHouseConfigError(
            f"ClickHouse DSN must start with http://, https:// or chdb://, got {shown!r}"
        )
    if not parsed.hostname:
        raise ClickHouseConfigError(f"ClickHouse DSN has no host: {shown!r}")
    database = parsed.path.strip("/") or "gpumeter"
    port = port or (8443 if parsed.scheme == "https" else 8123)
    return _checked(
        Dsn(parsed.scheme, parsed.hostname, port, database,
            username=unquote(parsed.username or "default"), password=unquote(parsed.password or ""))
    )


def _checked(dsn: Dsn) -> Dsn:
    if not SCHEMA_NAME.match(dsn.database):
        raise ClickHouseConfigError(f"database name {dsn.database!r} is not a plain identifier")
    return dsn


# How long a client waits for a statement's answer. Workers, the API and the hooks get an answer
# within it or fail fast. The month's batch commands (invoice close, report, reconcile, rerate)
# read a whole month in one statement: minutes at fleet scale (docs/capacity.md), so they wait.
RECEIVE_TIMEOUT_S = 60.0
BATCH_RECEIVE_TIMEOUT_S = 6 * 3600.0


def connect(dsn: str | Dsn, create_database: bool = True, batch: bool = False, **settings: Any) -> Client:
    """A clickhouse-connect client bound to the DSN's database (created when missing); ``batch``:
    one that waits BATCH_RECEIVE_TIMEOUT_S for an answer instead of RECEIVE_TIMEOUT_S."""
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
        "send_receive_timeout": BATCH_RECEIVE_TIMEOUT_S if batch else RECEIVE_TIMEOUT_S,
        "settings": {**SESSION_SETTINGS, **settings},
    }
    try:
        if create_database:
            bootstrap = clickhouse_connect.get_client(**common)
            bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {target.database}")
            bootstrap.close()
        return clickhouse_connect.get_client(database=target.database, **common)
    except OperationalError as exc:
        raise ClickHouseUnavailable(f"no ClickHouse server answers at {target.url}") from exc


def drop_database(dsn: str | Dsn, cluster: str | None = None) -> None:
    """Drop the DSN's database (on every node of ``cluster``) and wait until its tables are gone
    (``SYNC``)."""
    target = parse_dsn(dsn) if isinstance(dsn, str) else dsn
    client = connect(target)
    on_cluster = f" ON CLUSTER {cluster}" if cluster is not None else ""
    try:
        client.command(f"DROP DATABASE IF EXISTS {target.database}{on_cluster} SYNC")
    finally:
        client.close()


def scalar(client: Client, sql: str, parameters: dict[str, Any] | None = None) -> Any:
    rows = client.query(sql, parameters=parameters).result_rows
    return rows[0][0] if rows else None


def to_decimal(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))
