"""Decimals sent as text store the values clickhouse-connect's own encoding stores.

Reference: the client's encoder for the column type (the code path ``client.insert`` of
Decimal objects runs), read back as the scaled integer it would send. The text path must
name the same value, or refuse (OverflowError) a value the column cannot hold, where the
server would otherwise store NULL (Nullable) or refuse the whole insert.
"""

from __future__ import annotations

from decimal import Context, Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from clickhouse_connect.datatypes.registry import get_from_name

from gpumeter.infra.insert import decimal_text, decimal_texts, insert_lines, insert_rows, wire
from gpumeter.infra.rows import have_lines, values_of, with_line
from gpumeter.infra.schema import EVENT_IDS, QUOTA_EVENTS, RATED_USAGE

TYPES = [(38, 12), (38, 21), (38, 18), (18, 6), (38, 6)]

VALUES = [
    "0", "1", "1.5", "-2.25", "0.000001", "0.0000001", "1E+3", "1.2E+5", "1E-7", "3600.000000000000000000",
    "0.045833333333333333", "0.142857142857", "514.2857142852", "999999999999.999999",
    "1.1234567890129", "0.99999999999999999999", "0.1234567890123456789012345", "12345678901234567.5",
    "99999999999999999999999999.999999999999", "-0", "0E-30",
]


def client_scaled(value: Decimal, precision: int, scale: int) -> int:
    """The integer clickhouse-connect sends for ``value`` in a Decimal(precision, scale) column."""
    column = get_from_name(f"Decimal({precision}, {scale})")
    dest = bytearray()
    column._write_column_binary([value], dest, SimpleNamespace(column_name="c"))  # type: ignore[arg-type]
    return int.from_bytes(dest, "little", signed=True)


def text_scaled(text: str, scale: int) -> int:
    """The integer the server stores for text within the scale (no rounding: checked below)."""
    number = Decimal(text)
    assert -number.as_tuple().exponent <= scale, text  # type: ignore[operator]
    return int(number.scaleb(scale, context=Context(prec=100)))  # exact: no rounding to 28 digits


def fits(value: Decimal, precision: int, scale: int) -> bool:
    return value.copy_abs() < Decimal(10) ** (precision - scale)  # abs() would round to 28 digits


@pytest.mark.parametrize(("precision", "scale"), TYPES, ids=[f"Decimal({p},{s})" for p, s in TYPES])
@pytest.mark.parametrize("raw", VALUES)
def test_text_names_the_value_the_client_stores(raw: str, precision: int, scale: int) -> None:
    value = Decimal(raw)
    if not fits(value, precision, scale):
        with pytest.raises(OverflowError):
            decimal_text(value, precision, scale)
        return
    expected = client_scaled(value, precision, scale)
    if abs(expected) >= 10**precision:  # its rounding carried: a value beyond the declared precision
        with pytest.raises(OverflowError):
            decimal_text(value, precision, scale)
        return
    assert text_scaled(decimal_text(value, precision, scale), scale) == expected


@pytest.mark.parametrize(
    ("raw", "precision", "scale", "text"),
    [
        # Within the scale: the value's own text.
        pytest.param("1.5", 38, 12, "1.5", id="within-the-scale"),
        # Beyond it: truncated, as the client does.
        pytest.param("1.1234567890129", 38, 12, "1.123456789012", id="beyond-the-scale-truncated"),
        # Truncated, not rounded: since clickhouse-connect 1.13 the client scales exactly (1.12
        # rounded 999999.99999999999999 to 18 digits first, which carried to 1000000: it stored 1).
        pytest.param("0.99999999999999999999", 18, 6, "0.999999", id="truncated-never-carries-to-one"),
        pytest.param("999999999999.9999999", 18, 6, "999999999999.999999", id="truncated-at-the-largest"),
        # Never exponent notation on the wire.
        pytest.param("1E+3", 38, 12, "1000.000000000000", id="positive-exponent-written-out"),
        pytest.param("1E-7", 38, 21, "0.000000100000000000000", id="negative-exponent-written-out"),
        pytest.param("-2.25", 18, 6, "-2.25", id="negative"),
    ],
)
def test_texts_computed_by_hand(raw: str, precision: int, scale: int, text: str) -> None:
    assert decimal_text(Decimal(raw), precision, scale) == text


@pytest.mark.parametrize(
    ("value", "precision", "scale"),
    [
        # utilization's column: the server would store NULL
        pytest.param(Decimal(10) ** 12, 18, 6, id="utilization 1e12"),
        pytest.param(Decimal(10) ** 26, 38, 12, id="1e26 in 38-12"),
        pytest.param(Decimal(10) ** 17, 38, 21, id="1e17 in 38-21"),
        pytest.param(Decimal("-1E+12"), 18, 6, id="-1e12 in 18-6"),
    ],
)
def test_values_beyond_the_column_are_refused(value: Decimal, precision: int, scale: int) -> None:
    with pytest.raises(OverflowError):
        decimal_text(value, precision, scale)


@pytest.mark.parametrize(
    "value", [Decimal("NaN"), Decimal("Infinity"), "abc", True], ids=["NaN", "Infinity", "text", "bool"]
)
def test_non_numbers_are_refused_as_permanent_errors(value: Any) -> None:
    with pytest.raises(ValueError):  # ValueError: the sink's permanent class, unlike InvalidOperation
        decimal_text(value, 38, 12)


def test_numbers_of_other_types_are_read_as_the_client_reads_them() -> None:
    assert decimal_texts([None, 3, 0.1, Decimal("2")], 38, 12) == [None, "3", "0.1", "2"]


def test_wire_types_come_from_the_declaration() -> None:
    rated = wire(RATED_USAGE)
    assert rated.names == RATED_USAGE.insert_columns
    declared = {c.name: c.type for c in RATED_USAGE.columns}
    sent = dict(zip(rated.names, rated.types, strict=True))
    assert sent["quantity"] == "String" and sent["utilization"] == "Nullable(String)"
    assert sent["tenant"] == declared["tenant"] and sent["labels"] == "Map(String, String)"
    assert {(RATED_USAGE.insert_columns[c.index], c.precision, c.scale) for c in rated.decimals} == {
        ("quantity", 38, 12), ("unit_seconds", 38, 21), ("unit_price", 38, 12),
        ("capacity_multiplier", 38, 12), ("list_cost", 38, 18), ("utilization", 18, 6),
        ("energy_joules", 38, 6)}
    assert "id_hash" not in wire(EVENT_IDS).names  # filled by the server
    assert {c.scale for c in wire(QUOTA_EVENTS).decimals} == {6, 12}


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], dict[str, Any]]] = []

    def insert(self, table: str, data: list[Any], **kwargs: Any) -> None:
        self.calls.append((table, data, kwargs))


def test_rows_go_column_oriented_with_type_names_and_settings() -> None:
    client = RecordingClient()
    row = tuple(RATED_USAGE.row_from({"event_id": "e1", "quantity": Decimal("1.5"), "utilization": None}))
    insert_rows(client, RATED_USAGE, [row, row], {"insert_deduplication_token": "t"})  # type: ignore[arg-type]
    ((table, columns, kwargs),) = client.calls
    assert table == "rated_usage"
    assert kwargs == {"column_names": list(RATED_USAGE.insert_columns),
                      "column_type_names": list(wire(RATED_USAGE).types),
                      "column_oriented": True, "settings": {"insert_deduplication_token": "t"}}
    names = RATED_USAGE.insert_columns
    assert list(columns[names.index("event_id")]) == ["e1", "e1"]
    assert columns[names.index("quantity")] == ["1.5", "1.5"]
    assert columns[names.index("utilization")] == [None, None]
    insert_rows(client, RATED_USAGE, [])  # type: ignore[arg-type]
    assert len(client.calls) == 1


@pytest.mark.parametrize(("precision", "scale"), TYPES, ids=[f"Decimal({p},{s})" for p, s in TYPES])
def test_a_column_is_sent_as_its_values_one_by_one(precision: int, scale: int) -> None:
    """The whole-column check (one regex) names the values decimal_text names one by one
    (the same numbers: a text "007" may stay as it came), or refuses alike."""
    def numbers(texts: list[str | None]) -> list[Decimal | None]:
        assert all(t is None or ("E" not in t and "\n" not in t) for t in texts)
        return [None if t is None else Decimal(t) for t in texts]

    def one_by_one(values: list[Any]) -> list[Decimal | None] | type[Exception]:
        try:
            return numbers([None if v is None else decimal_text(v, precision, scale) for v in values])
        except (OverflowError, ValueError) as exc:
            return type(exc)

    def whole(values: list[Any]) -> list[Decimal | None] | type[Exception]:
        try:
            return numbers(decimal_texts(values, precision, scale))
        except (OverflowError, ValueError) as exc:
            return type(exc)

    plain: list[Any] = [Decimal("1.5"), None, Decimal("-0"), Decimal(7), Decimal("0.000001"), 3]
    columns: list[list[Any]] = [plain, [None, None], [Decimal(v) for v in VALUES],
               [Decimal(v) for v in VALUES if "E" not in v],
               *([*plain, Decimal(v)] for v in VALUES), [*plain, "1\n2"], [*plain, "007"], [*plain, " 1"],
               [*plain, True], [*plain, 0.1], [*plain, 1e-07], [Decimal(10) ** (precision - scale - 1)]]
    for values in columns:
        assert whole(values) == one_by_one(values), values


class RecordingRawClient(RecordingClient):
    def raw_insert(self, table: str, column_names: Any = None, insert_block: Any = None,
                   settings: dict[str, Any] | None = None, fmt: str | None = None) -> None:
        options = {"column_names": column_names, "settings": settings, "fmt": fmt}
        self.calls.append((table, [insert_block], options))


def rated_values(event_id: str) -> tuple[Any, ...]:
    return tuple(RATED_USAGE.row_from({"event_id": event_id, "quantity": Decimal("1.5")}))


def test_a_line_carried_past_the_values_is_not_sent_as_a_column() -> None:
    client = RecordingClient()
    plain, carrying = rated_values("e1"), with_line(rated_values("e1"), b'{"event_id":"e1"}')
    insert_rows(client, RATED_USAGE, [plain])  # type: ignore[arg-type]
    insert_rows(client, RATED_USAGE, [carrying])  # type: ignore[arg-type]
    (_, without, _), (_, with_, _) = client.calls
    assert len(with_) == len(RATED_USAGE.insert_columns)
    assert [list(column) for column in with_] == [list(column) for column in without]
    assert values_of(RATED_USAGE, carrying) == plain and values_of(RATED_USAGE, plain) == plain


def test_lines_are_sent_joined_as_json_each_row_refusing_fields_that_are_not_columns() -> None:
    client = RecordingRawClient()
    rows = [with_line(rated_values(f"e{i}"), b'{"event_id":"e%d"}' % i) for i in range(3)]
    assert have_lines(RATED_USAGE, rows)
    assert not have_lines(RATED_USAGE, [*rows, rated_values("plain")])
    assert not have_lines(RATED_USAGE, [])
    insert_lines(client, RATED_USAGE, rows, {"insert_deduplication_token": "t"})  # type: ignore[arg-type]
    insert_lines(client, RATED_USAGE, [])  # type: ignore[arg-type]
    ((table, (body,), kwargs),) = client.calls
    assert table == "rated_usage"
    assert body == b'{"event_id":"e0"}\n{"event_id":"e1"}\n{"event_id":"e2"}'
    assert kwargs["fmt"] == "JSONEachRow"
    assert kwargs["settings"] == {"date_time_input_format": "best_effort", "input_format_parallel_parsing": 0,
                                  "insert_deduplication_token": "t", "input_format_skip_unknown_fields": 0}


def test_load_client_extras_resolves_what_the_first_insert_would_import() -> None:
    """In a fresh interpreter (this one may have resolved them already): before the call the
    lazy attributes are unresolved, after it both are (a module, or None where not installed),
    so the first insert imports nothing."""
    import subprocess
    import sys

    probe = (
        "from clickhouse_connect.driver import options\n"
        "from gpumeter.infra.insert import load_client_extras\n"
        "before = {'pd', 'np'} & set(vars(options))\n"
        "load_client_extras()\n"
        "after = {'pd', 'np'} & set(vars(options))\n"
        "print(sorted(before), sorted(after))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "['np',", "'pd']"]
