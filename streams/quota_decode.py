"""The quota agent's fast reading of rated records, for the records the rating agent writes.

``RatedLine.model_validate_json`` (streams/quota.py) is the definition of what a rated line
says; it costs ~6 µs a line, the quota agent's largest cost. ``read_usages`` reads the same
lines with orjson and takes only what is unmistakable: every field it uses present with
exactly the JSON type the rating agent writes (text for strings, decimals and times, integers
for integers), decimals as finite non-negative decimal strings (``Decimal(text)``, which is
how pydantic reads a decimal string), tenants and timestamps checked once by pydantic's own
validators for those fields (then cached: a record repeats a few tenants and windows).
Anything else, valid or not, returns None, and the caller reads the record with RatedLine, which decides and
words the refusal. tests/unit/streams/test_quota_decode.py compares both on the same bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from operator import itemgetter
from typing import Annotated, Any, get_args

import orjson
from pydantic import AwareDatetime, Field, TypeAdapter, ValidationError

from gpumeter.core.models import CapacityType, Kind
from gpumeter.core.records import split
from gpumeter.core.validation import TENANT_PATTERN
from quota.accounting import Usage

_KINDS: dict[str, Kind] = {kind: kind for kind in get_args(Kind)}
_CAPACITY_TYPES: dict[str, CapacityType] = {name: name for name in get_args(CapacityType)}
_ZERO = Decimal(0)
_TENANT = TypeAdapter(Annotated[str, Field(pattern=TENANT_PATTERN)])
_MOMENT = TypeAdapter(AwareDatetime)
_CACHE_LIMIT = 4096

# Values pydantic accepted before, by their JSON text: tenants, and timestamps as UTC datetimes.
_tenants: set[str] = set()
_moments: dict[str, datetime] = {}
# Decimal texts read before (finite, >= 0), by their JSON text.
_numbers: dict[str, Decimal] = {}

Located = tuple[int, int, Usage]  # (source partition, source offset, usage)

# The fields without a default in RatedLine, read in one call (a missing one: KeyError).
_REQUIRED = itemgetter(
    "event_id", "namespace", "pod", "pod_uid", "kind", "tenant", "window_start", "window_end",
    "quantity", "unit_seconds", "list_cost",
)


def _tenant(value: Any) -> str | None:
    if type(value) is not str:
        return None
    if value not in _tenants:
        try:
            _TENANT.validate_python(value)
        except ValidationError:
            return None
        if len(_tenants) >= _CACHE_LIMIT:
            _tenants.clear()
        _tenants.add(value)
    return value


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


def _decimals(first: Any, second: Any, third: Any) -> tuple[Decimal, Decimal, Decimal] | None:
    """Non-negative decimal strings as pydantic reads them: ``Decimal(text)``, finite, >= 0."""
    if not (type(first) is type(second) is type(third) is str):
        return None
    # Quantities, window lengths and costs repeat across a fleet's lines: each text is read
    # and checked once (a Decimal is immutable, so one instance serves every line).
    known = _numbers.get
    quantity, seconds, cost = known(first), known(second), known(third)
    if quantity is None or seconds is None or cost is None:
        quantity, seconds, cost = _number(first), _number(second), _number(third)
        if quantity is None or seconds is None or cost is None:
            return None
    return quantity, seconds, cost


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


def _usage(line: bytes) -> Located | None:
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(document) is not dict:
        return None
    try:
        (event_id, namespace, pod, pod_uid, kind_name, tenant_text, first, last,
         quantity_text, seconds_text, cost_text) = _REQUIRED(document)
    except KeyError:  # the rating agent writes every field: a line without one, RatedLine decides
        return None
    get = document.get
    # One chained check per JSON type: this runs for every sample the worker rates.
    if not (type(event_id) is type(namespace) is type(pod) is type(pod_uid) is str) or not event_id:
        return None
    priority, partition, offset = get("priority", 0), get("source_partition", -1), get("source_offset", -1)
    if not (type(priority) is type(partition) is type(offset) is int):
        return None
    capacity = get("capacity_type", "on-demand")
    if not (type(kind_name) is type(capacity) is str):
        return None
    kind, capacity_type = _KINDS.get(kind_name), _CAPACITY_TYPES.get(capacity)
    tenant = _tenant(tenant_text)
    if kind is None or capacity_type is None or tenant is None:
        return None
    start = _moments.get(first) if type(first) is str else None
    end = _moments.get(last) if type(last) is str else None
    start = start or _moment(first)
    end = end or _moment(last)
    if start is None or end is None or end <= start:
        return None
    numbers = _decimals(quantity_text, seconds_text, cost_text)
    if numbers is None:
        return None
    quantity, unit_seconds, list_cost = numbers
    # Every check Usage.__post_init__ makes was made above (aware UTC windows, end after
    # start, Decimal amounts): built without repeating them.
    return partition, offset, Usage.trusted(event_id, tenant, kind, namespace, pod, pod_uid, start, end,
                                            quantity, unit_seconds, list_cost, capacity_type, priority)


def read_usages(record: bytes) -> list[Located] | None:
    """Every line of a rated record as (source partition, source offset, usage), or None when
    any line is not plainly what the rating agent writes (then RatedLine decides).

    Natively where the extension is built (native/src/rated_reader.rs: the same checks,
    with ``_moment``, ``_number`` and ``Usage.trusted`` for the values; a line with an escaped
    string or a repeated field is left to RatedLine too), else in Python."""
    if _NATIVE is not None:
        return _NATIVE.read(record)
    return read_usages_python(record)


def read_usages_python(record: bytes) -> list[Located] | None:
    located = []
    for line in split(record):
        usage = _usage(line)
        if usage is None:
            return None
        located.append(usage)
    return located


try:
    from gpumeter_native import RatedReader

    _NATIVE: RatedReader | None = RatedReader(_moment, _number, Usage.trusted)
except ImportError:  # not built (`make install` builds it)
    _NATIVE = None
