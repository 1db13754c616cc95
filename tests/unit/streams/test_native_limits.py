"""The native checks' contract-1 limits (native/src/validate.rs) against gpumeter.core's.

The native crate keeps its limits as constants (its checks are code shaped by each rule; see
validate.rs for why they are not passed in) and exposes them; these tests hold them equal to
what UsageSample states, so a rule changed in Python fails here until the crate follows.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, get_args

import gpumeter_native as native
import pytest
from pydantic.fields import FieldInfo

from gpumeter.core import models
from gpumeter.core.models import UsageSample
from gpumeter.core.validation import TENANT_PATTERN

_CONSTRAINTS = ("min_length", "max_length", "ge", "le", "pattern")


def constraints(field: FieldInfo) -> dict[str, Any]:
    """The constraints a field states, by name (min_length, le, pattern, ...)."""
    return {name: getattr(item, name) for item in field.metadata for name in _CONSTRAINTS
            if hasattr(item, name)}


NAME = {"min_length": 1, "max_length": native.NAME_MAX_CHARS, "pattern": native.NAME_PATTERN}


@pytest.mark.parametrize(("field", "expected"), [
    pytest.param("event_id", {"min_length": 1, "max_length": native.EVENT_ID_MAX_CHARS}, id="event_id"),
    *(pytest.param(name, NAME, id=name) for name in ("cluster", "node", "namespace", "pod", "pod_uid")),
    pytest.param("tenant", {"pattern": native.TENANT_PATTERN}, id="tenant"),
    pytest.param("priority", {"ge": native.PRIORITY_MIN, "le": native.PRIORITY_MAX}, id="priority"),
])
def test_the_fields_checked_natively_have_the_native_limits(field: str, expected: dict[str, Any]) -> None:
    assert constraints(UsageSample.model_fields[field]) == expected


@pytest.mark.parametrize(("native_value", "python_value"), [
    pytest.param(native.TENANT_PATTERN, TENANT_PATTERN, id="tenant pattern"),
    pytest.param((native.PRIORITY_MIN, native.PRIORITY_MAX), (models.INT32_MIN, models.INT32_MAX),
                 id="int32"),
    pytest.param(Decimal(10) ** native.UTILIZATION_DIGITS, models.UTILIZATION_LIMIT, id="utilization"),
    pytest.param(Decimal(10) ** native.TELEMETRY_DIGITS, models.TELEMETRY_LIMIT, id="telemetry"),
    pytest.param(native.MAX_SAMPLE_BYTES, models.MAX_SAMPLE_BYTES, id="sample bytes"),
    pytest.param(sorted(native.KINDS), sorted(get_args(models.Kind)), id="kinds"),
    pytest.param(sorted(native.CAPACITY_TYPES), sorted(get_args(models.CapacityType)), id="capacity types"),
])
def test_a_native_limit_equals_python_s(native_value: object, python_value: object) -> None:
    assert native_value == python_value
