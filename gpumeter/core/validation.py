"""Reusable field validators for the contracts: strict Decimals and RFC 3339 times."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, GetPydanticSchema
from pydantic_core import core_schema

TENANT_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"


# ASCII decimal notation only: Decimal() alone also takes "1_000" and non-ASCII digits.
_DECIMAL_TEXT = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$", re.ASCII)
# RFC 3339 date-time (section 5.6): full date, T, full time with at most nanoseconds (Go's
# RFC3339Nano), offset. datetime holds microseconds; the digits below a microsecond are read
# separately (sub_microsecond_ns) so a window's length stays exact.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})$", re.ASCII
)
_RFC3339_FRACTION = re.compile(r"\.[0-9]{10,}")
_FRACTION = re.compile(r"\.([0-9]+)")


def _to_decimal(value: Any) -> Decimal:
    """Accept decimal strings, ints and Decimals; refuse floats and non-finite values.

    Floats are refused rather than converted: a binary float has already lost the
    exact value the sender meant, and billing must not guess it back.
    """
    if isinstance(value, bool):
        raise ValueError("must be a number or decimal string, not a boolean")
    if isinstance(value, float):
        raise ValueError("must be a decimal string or exact number, not a binary float")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        result = value
    elif isinstance(value, str):
        text = value.strip()
        if not _DECIMAL_TEXT.match(text):
            raise ValueError(f"must be a decimal number, got {value!r}")
        try:
            result = Decimal(text)
        except InvalidOperation:
            raise ValueError(f"must be a decimal number, got {value!r}") from None
    else:
        raise ValueError(f"must be a decimal number, got {type(value).__name__}")
    if not result.is_finite():
        raise ValueError("must be a finite number")
    return result


def _non_negative(value: Decimal) -> Decimal:
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _max_places(places: int) -> Any:
    def check(value: Decimal) -> Decimal:
        exponent = value.as_tuple().exponent
        if isinstance(exponent, int) and exponent < -places:
            raise ValueError(f"has more than {places} decimal places")
        return value

    return check


def _rfc3339(value: Any) -> datetime:
    """Parse an RFC 3339 timestamp that carries an explicit offset."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        if not _RFC3339.match(value):
            if _RFC3339_FRACTION.search(value):
                raise ValueError(f"timestamp is finer than nanoseconds: {value!r}")
            raise ValueError(f"not an RFC 3339 timestamp with offset (e.g. 2026-11-01T00:00:00Z): {value!r}")
        try:
            parsed = datetime.fromisoformat(value.upper())
        except ValueError:
            raise ValueError(f"not a valid date or time: {value!r}") from None
    else:
        raise ValueError(f"must be an RFC 3339 string, got {type(value).__name__}")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"timestamp needs a UTC offset (Z or +hh:mm): {value!r}")
    try:
        parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"timestamp is outside the representable UTC range: {value!r}") from None
    return parsed


def sub_microsecond_ns(value: Any) -> int:
    """Nanoseconds below the microsecond of an RFC 3339 text (0-999); 0 for anything else.

    ``datetime.fromisoformat`` truncates a 9-digit fraction to microseconds; these are the
    digits it drops.
    """
    if not isinstance(value, str):
        return 0
    match = _FRACTION.search(value)
    if match is None:
        return 0
    digits = match.group(1)
    return int(digits[6:9].ljust(3, "0")) if len(digits) > 6 else 0


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


DecimalValue = Annotated[Decimal, BeforeValidator(_to_decimal)]
NonNegativeDecimal = Annotated[Decimal, BeforeValidator(_to_decimal), AfterValidator(_non_negative)]


def non_negative_decimal(places: int) -> Any:
    """A non-negative Decimal with at most ``places`` fractional digits."""
    return Annotated[
        Decimal,
        BeforeValidator(_to_decimal),
        AfterValidator(_non_negative),
        AfterValidator(_max_places(places)),
    ]


# Kept in the offset it was sent with: month attribution converts to UTC explicitly.
AwareTimestamp = Annotated[datetime, BeforeValidator(_rfc3339)]
UtcTimestamp = Annotated[datetime, BeforeValidator(_rfc3339), AfterValidator(_utc)]


# The JSON fast path (models.read_sample_json) applies the same rules inside pydantic-core.
# What it cannot decide goes to the full model, which decides and words the rejection, so
# the fast path may accept less than the model, never more, and never other values.

# _DECIMAL_TEXT for the Rust regex engine, whose \d would also match non-ASCII digits.
_ASCII_DECIMAL_TEXT = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"


def json_decimal(below: Decimal) -> GetPydanticSchema:
    """``Annotated[Decimal, json_decimal(below)]``: a NonNegativeDecimal field below ``below``
    as pydantic-core alone validates it from JSON: a decimal string (stripped, ASCII
    notation) or an integer, to ``Decimal(text)``.

    The strip removes Unicode whitespace, a subset of what str.strip removes; a string that
    then matches the pattern has no whitespace left at either end, so _to_decimal reads the
    same text. JSON floats are refused here (the full model parses them exactly).
    """
    schema = core_schema.union_schema([
        core_schema.chain_schema([
            core_schema.str_schema(strict=True, strip_whitespace=True, pattern=_ASCII_DECIMAL_TEXT),
            core_schema.decimal_schema(ge=Decimal(0), lt=below),
        ]),
        core_schema.chain_schema([
            core_schema.int_schema(strict=True), core_schema.decimal_schema(ge=Decimal(0), lt=below),
        ]),
    ], mode="left_to_right")
    return GetPydanticSchema(lambda _source, _handler: schema)


def within_places(value: Decimal, places: int) -> bool:
    """At most ``places`` fractional digits, as _max_places counts them (trailing zeros too)."""
    exponent = value.as_tuple().exponent
    return not isinstance(exponent, int) or exponent >= -places


# RFC 3339 text -> (datetime as AwareTimestamp parses it, nanoseconds below its microsecond,
# within 1970-2299). Samples of one window share their timestamps, so a small cache turns
# the regex, parse and range check into one dict lookup for nearly every sample.
_TIMESTAMPS: dict[str, tuple[datetime, int, bool] | None] = {}
_TIMESTAMP_CACHE_SIZE = 4096
# Contract 1, amended: timestamps lie in 1970-2299 (DateTime64's range, the Unix epoch as floor).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
END_OF_RANGE = datetime(2300, 1, 1, tzinfo=UTC)


def checked_timestamp(text: str) -> tuple[datetime, int, bool] | None:
    """(datetime, sub-microsecond ns, between 1970 and 2299) of an RFC 3339 text, or None
    where AwareTimestamp would refuse it."""
    try:
        return _TIMESTAMPS[text]
    except KeyError:
        pass
    entry: tuple[datetime, int, bool] | None
    try:
        parsed = _rfc3339(text)
    except ValueError:
        entry = None
    else:
        entry = (parsed, sub_microsecond_ns(text), EARLIEST <= parsed < END_OF_RANGE)
    if len(_TIMESTAMPS) >= _TIMESTAMP_CACHE_SIZE:
        _TIMESTAMPS.clear()
    _TIMESTAMPS[text] = entry
    return entry
