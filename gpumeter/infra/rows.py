"""A declared table's rows as the pipeline carries them: values in the table's insert order,
optionally followed by their *line*.

A row may carry, one value past its table's columns, its line: the same record as one JSON
object keyed by column names (the bytes the worker already wrote for the rated topic).
Sending the lines (JSONEachRow) instead of encoding the values column by column moves the
encoding out of the worker's Python (clickhouse-connect's Native encoding, ~5-7 µs a rated
row) into the server's C++ parser (gpumeter/infra/insert.py); the values still serve
everything that reads them (duplicate checks, fingerprints, dead letters). A trailing value,
not a tuple subclass with an attribute: that cost ~2 µs a row to build, this ~0.1.

Free of any client library: the rating stage builds rows without a ClickHouse client in reach.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from gpumeter.core.models import RatedUsage
from gpumeter.infra.schema import RATED_USAGE
from gpumeter.infra.tables import Table

Row = tuple[Any, ...]


def with_line(values: tuple[Any, ...], line: bytes) -> tuple[Any, ...]:
    return (*values, line)


def values_of(table: Table, row: Sequence[Any]) -> Sequence[Any]:
    """The row's values for ``table.insert_columns``, without a line it may carry."""
    columns = len(table.insert_columns)
    return row[:columns] if len(row) > columns else row


def have_lines(table: Table, rows: Sequence[Sequence[Any]]) -> bool:
    columns = len(table.insert_columns) + 1
    return bool(rows) and all(len(row) == columns for row in rows)


_rated_values = operator.itemgetter(*RATED_USAGE.insert_columns)  # of a RatedUsage's field dict


def rated_row(rated: RatedUsage, line: bytes | None = None) -> Row:
    """A rated sample as a rated_usage row, in the table's insert order; with ``line`` (its
    rated JSON, ``encode_rated``) carried past the values, which the store then sends instead
    of encoding the values (gpumeter/infra/insert.py)."""
    values: Row = _rated_values(rated.__dict__)  # a third of getattr's cost on a pydantic model
    return values if line is None else with_line(values, line)
