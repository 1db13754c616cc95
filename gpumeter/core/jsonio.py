"""JSON in and out without ever passing money or quantities through float.

Numbers with a fraction or exponent parse to ``Decimal``; integers stay ``int``.
NaN and Infinity are refused: they are valid for Python's json module but not JSON.
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import datetime
from decimal import Decimal
from typing import Any


class JSONInputError(ValueError):
    """Bytes that are not one valid JSON document."""


def _refuse_constant(name: str) -> Any:
    raise JSONInputError(f"non-standard JSON constant {name!r}")


def loads(data: bytes | str) -> Any:
    """Parse JSON; floats become Decimal. Raises JSONInputError with a short reason."""
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        return json.loads(data, parse_float=Decimal, parse_constant=_refuse_constant)
    except JSONInputError:
        raise
    except UnicodeDecodeError as exc:
        raise JSONInputError(f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise JSONInputError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError as exc:
        raise JSONInputError("not JSON: nested too deeply") from exc
    except ValueError as exc:
        # Python refuses integers longer than sys.get_int_max_str_digits() with a plain
        # ValueError; uncaught it wedged a partition (issue 31): it is bad input like any other.
        limit = sys.get_int_max_str_digits()
        raise JSONInputError(f"not JSON: an integer of more than {limit} digits") from exc


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        # Strings, not JSON numbers: a consumer's float parser must never see money.
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def dumps(value: Any) -> str:
    """Compact JSON with Decimals as strings and datetimes as ISO 8601."""
    return json.dumps(value, default=_default, separators=(",", ":"), ensure_ascii=False)


def dumpb(value: Any) -> bytes:
    return dumps(value).encode("utf-8")


def raw_text(raw: bytes) -> str:
    """A payload as text for a dead-letter record; non-UTF-8 bytes are kept as base64."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")
