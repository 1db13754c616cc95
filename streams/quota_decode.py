"""The quota agent's fast reading of rated records, for the records the rating agent writes.

``RatedLine.model_validate_json`` (streams/quota.py) is the definition of what a rated line
says; it costs ~6 µs a line, the quota agent's largest cost. ``read_usages`` reads the same
lines natively (native/src/rated_reader.rs ``RatedReader``) and takes only what is unmistakable:
every field it uses present with exactly the JSON type the rating agent writes (text for
strings, decimals, times and the GPU model, which may also be null or absent; integers for
integers), decimals as finite non-negative decimal strings (``Decimal(text)``, which is how
pydantic reads a decimal string), tenants by their pattern,
timestamps by pydantic's own validator for that field (``_moment``, cached: a record repeats
a few windows).
Anything else, valid or not, returns None, and the caller reads the record with RatedLine,
which decides and words the refusal; without the extension every record goes to RatedLine.
tests/unit/streams/test_quota_decode.py compares both on the same bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson
from pydantic import AwareDatetime, TypeAdapter, ValidationError

from quota.accounting import Usage

_ZERO = Decimal(0)
_MOMENT = TypeAdapter(AwareDatetime)
_CACHE_LIMIT = 4096

# Timestamps pydantic accepted before, by their JSON text, as UTC datetimes.
_moments: dict[str, datetime] = {}
# Decimal texts read before (finite, >= 0), by their JSON text.
_numbers: dict[str, Decimal] = {}

Located = tuple[int, int, Usage]  # (source partition, source offset, usage)


def _moment(value: Any) -> datetime | None:
    if type(value) is not str:
        return None
    moment = _moments.get(value)
    if moment is None:
        try:
            moment = _MOMENT.validate_json(orjson.dumps(value)).astimezone(UTC)
        except ValidationError:
            return None
        if len(_moments) >= _CACHE_LIMIT:
            _moments.clear()
        _moments[value] = moment
    return moment


def _number(text: str) -> Decimal | None:
    number = _numbers.get(text)
    if number is None:
        try:
            number = Decimal(text)
        except InvalidOperation:
            return None
        if not number.is_finite() or number < _ZERO:
            return None
        if len(_numbers) >= _CACHE_LIMIT:
            _numbers.clear()
        _numbers[text] = number
    return number


def read_usages(record: bytes) -> list[Located] | None:
    """Every line of a rated record as (source partition, source offset, usage), or None when
    any line is not plainly what the rating agent writes, or the extension is not built (then
    RatedLine decides).

    The native reader (native/src/rated_reader.rs) makes the checks the module doc lists, with
    ``_moment``, ``_number`` and ``Usage.trusted`` for the values; a line with an escaped string
    or a repeated field is left to RatedLine too."""
    if _NATIVE is None:
        return None
    return _NATIVE.read(record)


try:
    from gpumeter_native import RatedReader

    _NATIVE: RatedReader | None = RatedReader(_moment, _number, Usage.trusted)
except ImportError:  # not built (`make install` builds it)
    _NATIVE = None
