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

Located = tuple[int, int, Usage]  # (source partition, source offset, usage)


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
    try:
        numbers = Decimal(first), Decimal(second), Decimal(third)
    except InvalidOperation:
        return None
    for number in numbers:
        if not number.is_finite() or number < _ZERO:
            return None
    return numbers


def _usage(line: bytes) -> Located | None:
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(document) is not dict:
        return None
    get = document.get
    # One chained check per JSON type: this runs for every sample the worker rates.
    event_id, namespace, pod, pod_uid = get("event_id"), get("namespace"), get("pod"), get("pod_uid")
    if not (type(event_id) is type(namespace) is type(pod) is type(pod_uid) is str) or not event_id:
        return None
    priority, partition, offset = get("priority", 0), get("source_partition", -1), get("source_offset", -1)
    if not (type(priority) is type(partition) is type(offset) is int):
        return None
    kind_name, capacity = get("kind"), get("capacity_type", "on-demand")
    if not (type(kind_name) is type(capacity) is str):
        return None
    kind, capacity_type = _KINDS.get(kind_name), _CAPACITY_TYPES.get(capacity)
    tenant = _tenant(get("tenant"))
    if kind is None or capacity_type is None or tenant is None:
        return None
    first, last = get("window_start"), get("window_end")
    start = _moments.get(first) if type(first) is str else None
    end = _moments.get(last) if type(last) is str else None
    start = start or _moment(first)
    end = end or _moment(last)
    if start is None or end is None or end <= start:
        return None
    numbers = _decimals(get("quantity"), get("unit_seconds"), get("list_cost"))
    if numbers is None:
        return None
    quantity, unit_seconds, list_cost = numbers
    return partition, offset, Usage(event_id, tenant, kind, namespace, pod, pod_uid, start, end, quantity,
                                    unit_seconds, list_cost, capacity_type, priority)


def read_usages(record: bytes) -> list[Located] | None:
    """Every line of a rated record as (source partition, source offset, usage), or None when
    any line is not plainly what the rating agent writes (then RatedLine decides)."""
    located = []
    for line in split(record):
        usage = _usage(line)
        if usage is None:
            return None
        located.append(usage)
    return located
