"""A ClickHouse table declared once: its DDL and its row codec both come from the declaration.

The owner of a table (the pipeline for rated_usage, pricing for invoices, ...) declares it
with ``Table``; ``create_sql()`` is its CREATE statement and ``insert_columns`` / ``row_of``
the column order every insert uses, so no column tuple is kept in step with DDL by hand.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    # A DEFAULT expression filled in by the server: such a column is not part of inserted rows.
    default: str | None = None
    comment: str | None = None
    # A compression codec of the column's own, e.g. "NONE" for values that do not compress.
    codec: str | None = None

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
    _getter: Callable[[Any], tuple[Any, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name}: a column is declared twice")
        object.__setattr__(self, "_getter", operator.attrgetter(*self.insert_columns))

    @property
    def insert_columns(self) -> tuple[str, ...]:
        """The columns of an inserted row, in declaration order."""
        return tuple(column.name for column in self.columns if column.default is None)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table {self.name} has no column {name}")

    def create_sql(self, name: str | None = None) -> str:
        """The CREATE statement; ``name`` creates a twin (e.g. for a copy-and-exchange migration)."""
        body = ",\n    ".join(column.ddl for column in self.columns)
        sql = f"CREATE TABLE IF NOT EXISTS {name or self.name} (\n    {body}\n)\nENGINE = {self.engine}"
        if self.primary_key is not None:
            sql += f"\nPRIMARY KEY {self.primary_key}"
        if self.partition_by is not None:
            sql += f"\nPARTITION BY {self.partition_by}"
        if self.order_by is not None:
            sql += f"\nORDER BY {self.order_by}"
        if self.settings is not None:
            sql += f"\nSETTINGS {self.settings}"
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
class Migration:
    """One forward-only step of one owner's schema: never edit one that has shipped."""

    version: int
    name: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class SchemaOwner:
    """A package's tables and the migrations that create and evolve them."""

    owner: str
    migrations: tuple[Migration, ...]
