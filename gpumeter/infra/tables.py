"""A ClickHouse table declared once: its DDL and its row codec both come from the declaration.

The owner of a table (the pipeline for rated_usage, pricing for invoices, ...) declares it
with ``Table``; ``create_sql()`` is its CREATE statement and ``insert_columns`` / ``row_of``
the column order every insert uses, so no column tuple is kept in step with DDL by hand.

``create_statements(topology)`` renders the same declaration for a ClickHouse cluster
(contract 9; docs/operations.md, "ClickHouse clusters"):

- single node (no cluster): the plain engine, as ``create_sql()``;
- replicated: ``Replicated*`` engines at ``/clickhouse/tables/{shard}/{database}/<table>`` with
  replica ``{replica}``, created ``ON CLUSTER`` (the one DDL propagation mode);
- sharded: a table with a ``shard_by`` key becomes ``<table>_local`` on every node plus
  ``<table>`` = ``Distributed(cluster, currentDatabase(), <table>_local, shard_by)``, so
  readers and writers keep using the table's name; views connect the ``_local`` tables;
- a table without ``shard_by`` (the invoice ledger, invoices, ``schema_migrations``) is never
  sharded: on any cluster it is one replica set over every node (Keeper path
  ``/clickhouse/tables/global/{database}/<table>``, replica ``{shard}-{replica}``), so each
  node reads it whole and insert-deduplication claims on it are decided cluster-wide.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MERGE_TREE = re.compile(r"^(\w*MergeTree)(?:\((.*)\))?$")
LOCAL_SUFFIX = "_local"
SHARD_PATH = "/clickhouse/tables/{shard}/{database}"
# Never-sharded tables: one replica set over every node of the cluster.
GLOBAL_PATH = "/clickhouse/tables/global/{database}"


@dataclass(frozen=True)
class Topology:
    """How the database's tables are laid out (contract 9's ``clickhouse.cluster``,
    ``replicated`` and ``sharded``). No cluster: one node, the plain DDL."""

    cluster: str | None = None
    replicated: bool = False
    sharded: bool = False

    def __post_init__(self) -> None:
        if self.cluster is not None and not IDENTIFIER.match(self.cluster):
            raise ValueError(f"clickhouse.cluster {self.cluster!r} is not a plain identifier")
        if (self.replicated or self.sharded) and self.cluster is None:
            raise ValueError("clickhouse.replicated and clickhouse.sharded need clickhouse.cluster "
                             "(DDL reaches every node by ON CLUSTER)")
        if self.cluster is not None and not (self.replicated or self.sharded):
            raise ValueError(f"clickhouse.cluster {self.cluster!r} needs clickhouse.replicated or "
                             "clickhouse.sharded (plain tables ON CLUSTER would hold other rows on "
                             "every node)")

    @classmethod
    def of(cls, settings: Any) -> Topology:
        """The topology of ``clickhouse.*`` settings (``cluster``, ``replicated``, ``sharded``)."""
        return cls(settings.cluster, settings.replicated, settings.sharded)

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER {self.cluster}" if self.cluster is not None else ""

    @property
    def name(self) -> str:
        """plain | replicated | sharded | replicated-sharded (golden files, messages)."""
        parts = [part for part, on in (("replicated", self.replicated), ("sharded", self.sharded)) if on]
        return "-".join(parts) or "plain"


SINGLE_NODE = Topology()


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    # A DEFAULT expression filled in by the server: such a column is not part of inserted rows
    # (unless ``backfill``).
    default: str | None = None
    comment: str | None = None
    # A compression codec of the column's own, e.g. "NONE" for values that do not compress.
    codec: str | None = None
    # The default only fills rows written before the column was added; inserts carry a value.
    backfill: bool = False

    @property
    def inserted(self) -> bool:
        """Whether inserted rows carry this column."""
        return self.default is None or self.backfill

    @property
    def ddl(self) -> str:
        text = f"{self.name} {self.type}"
        if self.default is not None:
            text += f" DEFAULT {self.default}"
        if self.comment is not None:
            text += " COMMENT '" + self.comment.replace("'", "''") + "'"
        if self.codec is not None:
            text += f" CODEC({self.codec})"
        return text


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    engine: str
    order_by: str | None
    partition_by: str | None = None
    # Key-value engines (EmbeddedRocksDB) take a PRIMARY KEY and no ORDER BY.
    primary_key: str | None = None
    # Engine settings fixed at creation, e.g. "index_granularity = 256".
    settings: str | None = None
    # How many recent insert tokens the table remembers (insert_deduplication_token): rendered as
    # non_replicated_deduplication_window, or replicated_deduplication_window on Replicated*.
    dedup_window: int | None = None
    # The sharding expression on a sharded cluster; None: never sharded (one replica set).
    shard_by: str | None = None
    # Data-skipping indexes, each as declared in a CREATE: "INDEX <name> <expr> TYPE ... GRANULARITY n".
    indexes: tuple[str, ...] = ()
    _getter: Callable[[Any], tuple[Any, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name}: a column is declared twice")
        object.__setattr__(self, "_getter", operator.attrgetter(*self.insert_columns))

    @property
    def insert_columns(self) -> tuple[str, ...]:
        """The columns of an inserted row, in declaration order."""
        return tuple(column.name for column in self.columns if column.inserted)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table {self.name} has no column {name}")

    def create_sql(self, name: str | None = None) -> str:
        """The CREATE statement; ``name`` creates a twin (e.g. for a copy-and-exchange migration)."""
        return self._create(name or self.name, self.engine, self._settings(replicated=False), "")

    def create_statements(self, topology: Topology = SINGLE_NODE) -> tuple[str, ...]:
        """The statements that create this table on ``topology`` (see the module's docstring)."""
        if topology.cluster is None:
            return (self.create_sql(),)
        settings = self._settings(replicated=True)
        if self.shard_by is None:
            engine = self._replicated(f"{GLOBAL_PATH}/{self.name}", "{shard}-{replica}")
            return (self._create(self.name, engine, settings, topology.on_cluster),)
        local = self.local_name(topology)
        engine = self.engine
        if topology.replicated:
            engine = self._replicated(f"{SHARD_PATH}/{local}", "{replica}")
        elif self.dedup_window is not None:
            settings = self._settings(replicated=False)
        statements = [self._create(local, engine, settings, topology.on_cluster)]
        if topology.sharded:
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {self.name}{topology.on_cluster} AS {local}\n"
                f"ENGINE = Distributed({topology.cluster}, currentDatabase(), {local}, {self.shard_by})")
        return tuple(statements)

    def local_name(self, topology: Topology) -> str:
        """The table that holds this node's rows: ``<name>_local`` for a sharded table."""
        return self.name + LOCAL_SUFFIX if topology.sharded and self.shard_by is not None else self.name

    def _replicated(self, path: str, replica: str) -> str:
        match = _MERGE_TREE.match(self.engine)
        if match is None:
            raise ValueError(f"table {self.name}: engine {self.engine} has no Replicated form")
        arguments = f"'{path}', '{replica}'" + (f", {match.group(2)}" if match.group(2) else "")
        return f"Replicated{match.group(1)}({arguments})"

    def _settings(self, replicated: bool) -> str | None:
        settings = [self.settings] if self.settings is not None else []
        if self.dedup_window is not None:
            window = "replicated" if replicated else "non_replicated"
            settings.append(f"{window}_deduplication_window = {self.dedup_window}")
        return ", ".join(settings) or None

    def _create(self, name: str, engine: str, settings: str | None, on_cluster: str) -> str:
        body = ",\n    ".join((*(column.ddl for column in self.columns), *self.indexes))
        sql = f"CREATE TABLE IF NOT EXISTS {name}{on_cluster} (\n    {body}\n)\nENGINE = {engine}"
        if self.primary_key is not None:
            sql += f"\nPRIMARY KEY {self.primary_key}"
        if self.partition_by is not None:
            sql += f"\nPARTITION BY {self.partition_by}"
        if self.order_by is not None:
            sql += f"\nORDER BY {self.order_by}"
        if settings is not None:
            sql += f"\nSETTINGS {settings}"
        return sql

    def row_of(self, record: Any) -> tuple[Any, ...]:
        """An object's attributes named like the insert columns, in their order."""
        values = self._getter(record)
        return values if isinstance(values, tuple) else (values,)

    def row_from(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """A mapping's values for the insert columns (missing keys are None)."""
        return tuple(values.get(name) for name in self.insert_columns)

    def as_mapping(self, row: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(self.insert_columns, row, strict=True))


@dataclass(frozen=True)
class View:
    """A materialized view that copies what is inserted into ``source`` to ``target``.

    ``select`` names the source as ``{source}``: on a sharded cluster the view connects the
    ``_local`` tables of each node (source and target are sharded alike, so a row's rollup
    stays on its shard)."""

    name: str
    target: Table
    source: Table
    select: str

    def __post_init__(self) -> None:
        if (self.source.shard_by is None) != (self.target.shard_by is None):
            raise ValueError(f"view {self.name}: its source and target must both be sharded or neither")

    def create_sql(self, topology: Topology = SINGLE_NODE) -> str:
        return (f"CREATE MATERIALIZED VIEW IF NOT EXISTS {self.name}{topology.on_cluster} "
                f"TO {self.target.local_name(topology)} AS "
                + self.select.strip().format(source=self.source.local_name(topology)))


@dataclass(frozen=True)
class CopyByPartition:
    """A migration step: ``INSERT INTO target SELECT * FROM source`` as one insert per value of
    ``by`` (expressions over ``source``'s columns that decide ``target``'s partition), so that each
    insert fills one partition of ``target``. One INSERT SELECT of a large table would split every
    block of ~a million rows across all the partitions it spans (a block of one tenant's month
    spans ~8 days): thousands of small parts per partition, until the engine refuses the insert
    (``parts_to_throw_insert``). ``where`` narrows each insert further for pruning (``source``'s
    own partition key). Re-runnable where the steps before it drop and re-create ``target``."""

    source: str
    target: str
    by: str
    where: str | None = None

    def keys_sql(self) -> str:
        """The values of ``by`` present in ``source`` (with ``where``'s columns), one row each."""
        group = self.by if self.where is None else f"{self.where}, {self.by}"
        return f"SELECT DISTINCT {group} FROM {self.source} ORDER BY {group}"

    def insert_sql(self) -> str:
        """One insert, for the key row bound as parameters ``k0``, ``k1``, ..."""
        expressions = [self.by] if self.where is None else [self.where, self.by]
        condition = " AND ".join(f"{expression} = %(k{i})s" for i, expression in enumerate(expressions))
        return f"INSERT INTO {self.target} SELECT * FROM {self.source} WHERE {condition}"


@dataclass(frozen=True)
class ModifySettings:
    """A migration step that changes a table's engine settings, written once for every topology:
    on a cluster it is ``ALTER TABLE <the table holding the rows> ON CLUSTER ... MODIFY SETTING``
    (``<table>_local`` when sharded: a Distributed table has no MergeTree settings). Metadata
    only and idempotent, so a migration made of these steps is applied on clusters too."""

    table: Table
    settings: str

    def statements(self, topology: Topology = SINGLE_NODE) -> tuple[str, ...]:
        return (f"ALTER TABLE {self.table.local_name(topology)}{topology.on_cluster} "
                f"MODIFY SETTING {self.settings}",)


@dataclass(frozen=True)
class Drop:
    """A migration step that drops a view or a table nothing reads any more, written once for
    every topology: ``ON CLUSTER`` on a cluster, and for a sharded table its Distributed table
    first, then the ``_local`` table holding the rows. ``IF EXISTS`` and ``SYNC`` (the data goes
    now, not after the Atomic database's delay), so a migration made of these steps is re-runnable
    and applied on clusters too."""

    declaration: Table | View

    def statements(self, topology: Topology = SINGLE_NODE) -> tuple[str, ...]:
        if isinstance(self.declaration, View):
            return (f"DROP VIEW IF EXISTS {self.declaration.name}{topology.on_cluster} SYNC",)
        names = dict.fromkeys((self.declaration.name, self.declaration.local_name(topology)))
        return tuple(f"DROP TABLE IF EXISTS {name}{topology.on_cluster} SYNC" for name in names)


Step = str | CopyByPartition | ModifySettings | Drop


@dataclass(frozen=True)
class Migration:
    """One forward-only step of one owner's schema: never edit one that has shipped."""

    version: int
    name: str
    statements: tuple[Step, ...]

    @property
    def for_every_topology(self) -> bool:
        """Written for clusters as well as one node (every step renders for its topology)."""
        return all(isinstance(step, ModifySettings | Drop) for step in self.statements)


@dataclass(frozen=True)
class SchemaOwner:
    """A package's tables and the migrations that create and evolve them."""

    owner: str
    migrations: tuple[Migration, ...]
    # What the migrations have built by now, in creation order: a fresh cluster database gets
    # these rendered for its topology instead of replaying migrations written for one node.
    current: tuple[Table | View, ...] = ()

    @property
    def version(self) -> int:
        return max((migration.version for migration in self.migrations), default=0)

    def create_statements(self, topology: Topology) -> list[str]:
        statements: list[str] = []
        for declaration in self.current:
            if isinstance(declaration, View):
                statements.append(declaration.create_sql(topology))
            else:
                statements.extend(declaration.create_statements(topology))
        return statements
