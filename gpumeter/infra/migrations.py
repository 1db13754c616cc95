"""Forward-only schema migrations, applied by one runner at a time (contract 9).

``migrate`` takes the schema lock first: a claim in ``schema_lock`` made by insert
deduplication (gpumeter/infra/claims.py, the invoice ledger's mechanism), with a lease so that
a runner that died holding it blocks the others for ``lease`` seconds at most. It waits for a
held lock up to ``lock_timeout`` and releases it whatever happens, so a failed run leaves the
lock free and the versions it did not finish unrecorded.

On one node the owners' migrations are replayed as written. On a cluster (``Topology`` with a
cluster) an owner with no version applied gets its current declarations rendered for the
topology (``ON CLUSTER``, Replicated*, ``_local`` + Distributed) and every version marked
applied. Most shipped migrations are written for one node, so an owner on a cluster that is
behind is refused with one line, unless every migration it lacks is written for every topology
(``Migration.for_every_topology``: settings changes and drops only, rendered by ``ModifySettings``
and ``Drop`` for the layout and applied ON CLUSTER; tested on two shards here, not on replicas).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from clickhouse_connect.driver.client import Client

from gpumeter.infra import claims
from gpumeter.infra.tables import (
    SINGLE_NODE,
    Column,
    Drop,
    ModifySettings,
    SchemaOwner,
    Step,
    Table,
    Topology,
)

LOCK_TIMEOUT_SECONDS = 300.0
LEASE_SECONDS = 3600
_POLL_SECONDS = 0.2

SCHEMA_MIGRATIONS = Table(
    name="schema_migrations",
    columns=(
        Column("owner", "LowCardinality(String)"),
        Column("version", "UInt32"),
        Column("name", "String"),
        Column("applied_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="MergeTree",
    order_by="(owner, version)",
)

# A log of lock states: position k holds "held" (with a lease) or "released"; its tail is the
# lock's state. Never sharded, and on a cluster one replica set, so a claim is cluster-wide.
SCHEMA_LOCK = Table(
    name="schema_lock",
    columns=(
        Column("seq", "UInt64"),
        Column("holder", "String"),
        Column("state", "LowCardinality(String)", comment="held | released"),
        Column("expires_at", "DateTime64(3, 'UTC')"),
        Column("at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="MergeTree",
    order_by="seq",
    dedup_window=10_000,
)


class SchemaError(RuntimeError):
    """The schema cannot be brought up to date; the message is one line for the operator."""


class SchemaLockTimeout(SchemaError):
    pass


def applied_migrations(client: Client) -> set[tuple[str, int]]:
    """The (owner, version) pairs recorded; empty where schema_migrations does not exist yet."""
    if not client.query("EXISTS TABLE schema_migrations").result_rows[0][0]:
        return set()
    rows = client.query(f"SELECT owner, version FROM {SCHEMA_MIGRATIONS.name}").result_rows
    return {(str(owner), int(version)) for owner, version in rows}


def pending(client: Client, owners: Sequence[SchemaOwner]) -> list[str]:
    """``owner/version`` of every migration not applied yet, in order."""
    done = applied_migrations(client)
    return [f"{owner.owner}/{migration.version}" for owner in owners for migration in owner.migrations
            if (owner.owner, migration.version) not in done]


def unknown(client: Client, owners: Sequence[SchemaOwner]) -> list[str]:
    """``owner/version`` of every migration applied that these owners do not declare: the
    database was migrated by a newer release."""
    known = {(owner.owner, migration.version) for owner in owners for migration in owner.migrations}
    names = {owner.owner for owner in owners}
    return [f"{owner}/{version}" for owner, version in sorted(applied_migrations(client))
            if owner in names and (owner, version) not in known]


def check_topology(client: Client, topology: Topology) -> None:
    """Refuse, with one line naming the setting, a topology this server cannot hold: a cluster
    it does not know, a macro its config lacks, a Keeper that does not answer. Reads only."""
    if topology.cluster is None:
        return
    rows = client.query("SELECT DISTINCT cluster FROM system.clusters").result_rows
    clusters = sorted(str(row[0]) for row in rows)
    if topology.cluster not in clusters:
        raise SchemaError(f"clickhouse.cluster {topology.cluster!r}: the server has no such cluster in its "
                          f"remote_servers (it has: {', '.join(clusters) or 'none'})")
    macros = {str(row[0]) for row in client.query("SELECT macro FROM system.macros").result_rows}
    setting = "clickhouse.replicated" if topology.replicated else "clickhouse.cluster"
    for macro in ("shard", "replica"):
        if macro not in macros:
            raise SchemaError(f"{setting}: the server's config has no {{{macro}}} macro (<macros>), which "
                              "the Replicated tables' Keeper paths need")
    problem = _keeper_problem(client)
    if problem is not None:
        raise SchemaError(f"clickhouse.cluster {topology.cluster!r}: the server's Keeper (ZooKeeper) does "
                          f"not answer, and ON CLUSTER DDL and Replicated tables need it: {problem}")


def _keeper_problem(client: Client) -> str | None:
    try:
        client.query("SELECT count() FROM system.zookeeper WHERE path = '/'")
    except Exception as exc:  # the server's error, reported in one line
        text = _first_line(exc)
        # An embedded server (chdb) has no system.zookeeper and opens its Keeper session lazily:
        # there the first Replicated CREATE (the schema tables', before any other) finds out.
        return None if "UNKNOWN_TABLE" in text else text
    return None


def migrate(client: Client, owners: Sequence[SchemaOwner], topology: Topology = SINGLE_NODE,
            lock_timeout: float = LOCK_TIMEOUT_SECONDS, lease: int = LEASE_SECONDS) -> list[str]:
    """Bring every owner's schema up to date under the schema lock; returns ``owner/version``
    applied. On one node every statement is idempotent (IF NOT EXISTS, MODIFY to a declared
    type), so a step interrupted half-way is simply run again."""
    check_topology(client, topology)
    bootstrap = [(f"database {client.database}", f"CREATE DATABASE IF NOT EXISTS {client.database}"
                  f"{topology.on_cluster}")] if topology.cluster is not None else []
    bootstrap += [(table.name, statement) for table in (SCHEMA_MIGRATIONS, SCHEMA_LOCK)
                  for statement in table.create_statements(topology)]
    for what, statement in bootstrap:
        try:
            client.command(statement)
        except Exception as exc:
            if topology.cluster is None:
                raise
            # Before the lock: a cluster that cannot take ON CLUSTER DDL changes nothing.
            raise SchemaError(f"clickhouse.cluster {topology.cluster!r}: creating {what} failed: "
                              f"{_first_line(exc)}") from exc
    with schema_lock(client, lock_timeout, lease):
        done = applied_migrations(client)
        applied: list[str] = []
        for owner in owners:
            missing = [m for m in owner.migrations if (owner.owner, m.version) not in done]
            if not missing:
                continue
            if topology.cluster is not None and len(missing) == len(owner.migrations):
                for statement in owner.create_statements(topology):
                    client.command(statement)
            else:
                if topology.cluster is not None:
                    for_one_node = [m for m in missing if not m.for_every_topology]
                    if for_one_node:
                        raise SchemaError(
                            f"{owner.owner} migration {for_one_node[0].version} is written for one node: on "
                            f"cluster {topology.cluster} it must be written for the cluster and applied by "
                            "hand (docs/operations.md, ClickHouse clusters)")
                for migration in missing:
                    for step in migration.statements:
                        run_statement(client, step, topology)
                    _record(client, owner, [migration.version])
                    applied.append(f"{owner.owner}/{migration.version}")
                continue
            _record(client, owner, [m.version for m in missing])
            applied.extend(f"{owner.owner}/{m.version}" for m in missing)
        return applied


def run_statement(client: Client, statement: Step, topology: Topology = SINGLE_NODE) -> None:
    """One step of a migration: a statement, a settings change or a drop rendered for
    ``topology``, or a copy made one partition at a time."""
    if isinstance(statement, str):
        client.command(statement)
        return
    if isinstance(statement, ModifySettings | Drop):
        for sql in statement.statements(topology):
            client.command(sql)
        return
    for key in client.query(statement.keys_sql()).result_rows:
        client.command(statement.insert_sql(), parameters={f"k{i}": value for i, value in enumerate(key)})


def _record(client: Client, owner: SchemaOwner, versions: list[int]) -> None:
    names = {m.version: m.name for m in owner.migrations}
    client.insert(SCHEMA_MIGRATIONS.name, [[owner.owner, version, names[version]] for version in versions],
                  column_names=list(SCHEMA_MIGRATIONS.insert_columns))


@contextmanager
def schema_lock(client: Client, timeout: float = LOCK_TIMEOUT_SECONDS, lease: int = LEASE_SECONDS
                ) -> Iterator[str]:
    """Hold the schema lock for the block; yields the holder's id."""
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    position = _acquire(client, holder, timeout, lease)
    try:
        yield holder
    finally:
        _set(client, position + 1, holder, "released", 0)


def lock_state(client: Client) -> tuple[int, str, str, bool] | None:
    """The lock's last position: (seq, holder, state, lease still running); None: never taken."""
    rows = client.query(f"SELECT seq, holder, state, expires_at > now64(3) FROM {SCHEMA_LOCK.name} "
                        "ORDER BY seq DESC LIMIT 1").result_rows
    return (int(rows[0][0]), str(rows[0][1]), str(rows[0][2]), bool(rows[0][3])) if rows else None


def _acquire(client: Client, holder: str, timeout: float, lease: int) -> int:
    deadline = time.monotonic() + timeout
    while True:
        state = lock_state(client)
        if state is None or state[2] == "released" or not state[3]:
            position = state[0] + 1 if state is not None else 1
            if _set(client, position, holder, "held", lease) == [holder]:
                return position
            continue  # another runner took this position: read the new tail
        if time.monotonic() >= deadline:
            raise SchemaLockTimeout(
                f"the schema lock is held by {state[1]} (position {state[0]}); waited {timeout:.0f} s. "
                f"A runner that died releases it when its lease ends (at most {lease} s)")
        time.sleep(_POLL_SECONDS)


def _set(client: Client, position: int, holder: str, state: str, lease: int) -> list[str]:
    """Claim ``position`` of the lock log for ``holder``; returns the holders found there."""
    expires_at = client.query(f"SELECT now64(3) + toIntervalSecond({int(lease)})").result_rows[0][0]

    def holders() -> list[str]:
        rows = client.query(f"SELECT holder FROM {SCHEMA_LOCK.name} WHERE seq = %(seq)s",
                            parameters={"seq": position}).result_rows
        return [str(row[0]) for row in rows]

    row: tuple[Any, ...] = (position, holder, state, expires_at)
    return claims.claim(client, SCHEMA_LOCK, [row], f"gpumeter-schema-lock-{position}", holders)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
