"""Inserting a declared Table's rows: column by column, with the declared types, Decimals as text.

clickhouse-connect's plain ``client.insert(table, rows, column_names=...)`` costs, per batch,
a ``DESCRIBE TABLE`` round trip (the types are looked up on every insert), and per value of
a wide Decimal column about 1 µs of Python (``Decimal(str(x)) * mult``, ``int``,
``int.to_bytes``; a rated row has seven). ``insert_rows`` names the types from the
declaration instead and sends each Decimal column as a String column of the values' text:
the server converts text to the column's Decimal as it parses any Decimal literal (Native
input type conversion), exactly, in C++.

Two ways the server's conversion differs from the client's own encoding are closed here,
so the stored values are the ones the client would have stored:

- A value beyond the column's precision (``|x| >= 10^(P-S)``): the client refuses it only
  when it overflows the integer width, the server turns it into NULL in a Nullable column
  (silently: a poisoned telemetry value would be stored as "no value"). Here it is refused,
  OverflowError, as the client refuses a value it cannot encode, so the sink's permanent
  error path makes it an ``unstorable`` dead letter.
- Digits beyond the scale: the server truncates them, and since clickhouse-connect 1.13 so does
  the client (exactly: before 1.13 it rounded the scaled value to P significant digits first,
  which differed when that rounding carried, a ``0.99999999999999999999`` into
  ``Decimal(18, 6)``; pyproject.toml requires 1.13). Such a value (rare: rating stores values
  at their column's scale) is sent as the text of the client's own scaled integer, so the text
  path stores what the client's encoding stores whichever way that rounds
  (tests/unit/infra/test_insert.py compares them value by value).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import MAX_PREC, Decimal, InvalidOperation, localcontext
from typing import Any

from clickhouse_connect.driver.client import Client

from gpumeter.infra.tables import Table

_DECIMAL_TYPE = re.compile(r"^(Nullable\()?Decimal\((\d+), *(\d+)\)\)?$")


@dataclass(frozen=True)
class DecimalColumn:
    """A Decimal(precision, scale) column sent as text."""

    index: int
    precision: int
    scale: int


@dataclass(frozen=True)
class Wire:
    """How a table's rows travel: its insert columns, their wire types, its Decimal columns."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    decimals: tuple[DecimalColumn, ...]


_WIRES: dict[str, Wire] = {}


def wire(table: Table) -> Wire:
    cached = _WIRES.get(table.name)
    if cached is not None and cached.names == table.insert_columns:
        return cached
    types = [column.type for column in table.columns if column.inserted]
    decimals = []
    for index, name in enumerate(types):
        match = _DECIMAL_TYPE.match(name)
        if match is not None:
            decimals.append(DecimalColumn(index, int(match.group(2)), int(match.group(3))))
            types[index] = "Nullable(String)" if match.group(1) else "String"
    made = _WIRES[table.name] = Wire(table.insert_columns, tuple(types), tuple(decimals))
    return made


def decimal_text(value: Any, precision: int, scale: int) -> str:
    """The text of ``value`` that a Decimal(precision, scale) column stores as the client would.

    OverflowError for a value the column cannot hold (see the module doc), ValueError for
    one that is not a number (as the client's ``Decimal(str(x))`` raises).
    """
    if type(value) is Decimal:
        number = value
    else:
        try:
            number = Decimal(str(value))
        except InvalidOperation:  # an ArithmeticError, which the sink would take for transient
            raise ValueError(f"{value!r} is not a number for a Decimal({precision}, {scale})") from None
    if not number.is_finite():
        raise ValueError(f"{number} cannot be stored in a Decimal({precision}, {scale}) column")
    if number.adjusted() >= precision - scale:
        raise OverflowError(f"{number} does not fit a Decimal({precision}, {scale}) column")
    text = str(number)
    point = text.find(".")
    if "E" not in text and (point < 0 or len(text) - point - 1 <= scale):
        return text  # plain digits within the scale: the server reads exactly this value
    return _scaled_text(number, precision, scale)


def _scaled_text(number: Decimal, precision: int, scale: int) -> str:
    """The value the client's encoding stores (the digits beyond the scale truncated), as text."""
    with localcontext() as context:
        context.prec = MAX_PREC  # exact, as the client's own multiplication since 1.13
        context.clamp = 0
        scaled = int(number * Decimal(10) ** scale)
    if abs(scaled) >= 10**precision:  # beyond the column (the check above makes this a safeguard)
        raise OverflowError(f"{number} does not fit a Decimal({precision}, {scale}) column")
    digits = str(abs(scaled)).rjust(scale + 1, "0")
    sign = "-" if scaled < 0 else ""
    return sign + (f"{digits[:-scale]}.{digits[-scale:]}" if scale else digits)


def decimal_texts(values: Sequence[Any], precision: int, scale: int) -> list[str | None]:
    """``decimal_text`` of each value (None stays None).

    Checked a column at a time: when every value's own text is a plain decimal within the
    column's integer digits and scale, the texts are sent as they are (one regex over the
    joined column instead of ~0.5 µs of Python a value); otherwise value by value.
    """
    texts: list[str | None] = [None if value is None else str(value) for value in values]
    present = [text for text in texts if text is not None]
    joined = "\n".join(present)
    # (a text holding a line break of its own would pass for two values)
    if present and joined.count("\n") == len(present) - 1 and _plain(precision, scale).fullmatch(joined):
        return texts
    return [None if value is None else decimal_text(value, precision, scale) for value in values]


_PLAIN: dict[tuple[int, int], re.Pattern[str]] = {}


def _plain(precision: int, scale: int) -> re.Pattern[str]:
    """Lines of plain decimals with at most precision - scale integer digits and scale places:
    str() of a Decimal never pads, so that many digits means below 10^(precision - scale)."""
    pattern = _PLAIN.get((precision, scale))
    if pattern is None:
        number = f"-?[0-9]{{1,{precision - scale}}}" + (f"(?:\\.[0-9]{{1,{scale}}})?" if scale else "")
        pattern = _PLAIN[(precision, scale)] = re.compile(f"{number}(?:\n{number})*")
    return pattern


def load_client_extras() -> None:
    """Import now what clickhouse-connect imports lazily on a process's first ``client.insert``
    of rows: pandas and numpy, only to ask whether the data is a DataFrame or an array. That
    import is ~0.4 s of CPU holding the GIL, in the middle of whatever runs then: in the worker,
    the first quota event (or dead letter) it stored held the rating and quota agents, and the
    crossings behind them, that long (py-spy, benchmarks/quota_latency.py). The worker calls
    this at start instead."""
    from clickhouse_connect.driver import options

    _ = (options.pd, options.np)  # each resolved (imported, or None if absent) and kept


def insert_rows(client: Client, table: Table, rows: Sequence[Sequence[Any]],
                settings: dict[str, Any] | None = None) -> None:
    """Insert ``rows`` (values in ``table.insert_columns`` order, a line past them ignored) as
    described in the module doc.

    Raises what ``client.insert`` raises, and OverflowError / ValueError (permanent: the
    rows hold a value their column cannot store) before anything is sent.
    """
    if not rows:
        return
    layout = wire(table)
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True))
    if len(columns) == len(layout.names) + 1:
        columns.pop()  # the rows' lines (gpumeter/infra/rows.py)
    if len(columns) != len(layout.names):
        raise ValueError(f"{table.name}: rows of {len(columns)} values for {len(layout.names)} columns")
    for column in layout.decimals:
        columns[column.index] = decimal_texts(columns[column.index], column.precision, column.scale)
    client.insert(table.name, columns, column_names=list(layout.names), column_type_names=list(layout.types),
                  column_oriented=True, settings=settings)


# How the worker's JSON reads: RFC 3339 timestamps ("...T00:00:00.123456Z"), Decimals as strings.
# Parsed in one thread: for a batch of a few thousand lines the parallel parser's threads cost
# the server more than they save (3-10 µs a row more CPU and wall time, alternated three times).
_JSON_INPUT = {"date_time_input_format": "best_effort", "input_format_parallel_parsing": 0}


def insert_lines(client: Client, table: Table, rows: Sequence[Sequence[Any]],
                 settings: dict[str, Any] | None = None, project: bool = False) -> None:
    """Insert the lines ``rows`` carry (``rows.have_lines`` of a table whose columns they name).

    The server's JSON parser truncates digits beyond a column's scale, as clickhouse-connect's
    own encoding does since 1.13 (before, it rounded to the precision first: a
    ``0.99999999999999999999`` utilization was 0.999999 here, 1.000000 there). Validated and
    rated records carry no such digits in a billed column (quantity has at most 12 places and 9
    integer digits, unit_seconds 21 places, list cost 18), only in telemetry. A value beyond
    a column's digits is refused by the server (code 69, permanent) as ``insert_rows``
    refuses it; integers wrap in the server's parser (3000000000 into Int32), so only
    validated records (priority is a checked int32) may carry lines.

    Columns a line does not name get their defaults; a field that is not a column is refused:
    a rated line naming a field the table lacks means the two drifted apart. ``project``: the
    table takes some of the lines' fields (event_ids' claims from rated lines): the others are
    skipped instead.
    """
    if not rows:
        return
    body = b"\n".join([row[-1] for row in rows])
    options = {**_JSON_INPUT, **(settings or {}), "input_format_skip_unknown_fields": int(project)}
    client.raw_insert(table.name, None, body, settings=options, fmt="JSONEachRow")
