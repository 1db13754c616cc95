"""The JSON fast path of contract 1 (models.read_sample_json) against the full model.

The fast path may decline a sample (None: the full model decides), but whatever it accepts
the full model must accept with the very same values; and it must accept ordinary samples,
or it would be no fast path at all.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from gpumeter.core import jsonio
from gpumeter.core.models import UsageSample, parse_sample, read_sample_json
from testkit import builders
from testkit.builders import OMIT


def full_model(raw: bytes) -> UsageSample | None:
    """The model's own verdict on ``raw`` (None: rejected), without the fast path."""
    try:
        document = jsonio.loads(raw)
    except jsonio.JSONInputError:
        return None
    if not isinstance(document, dict):
        return None
    try:
        return UsageSample.model_validate(document)
    except ValidationError:
        return None


def exact_values(sample: UsageSample) -> dict[str, Any]:
    """Field values with each Decimal's digits and exponent (Decimal("1.0") == Decimal("1"))."""
    return {name: (value.as_tuple() if isinstance(value, Decimal) else (type(value), value))
            for name, value in sample.__dict__.items()}


def assert_same_verdict(raw: bytes) -> UsageSample | None:
    fast = read_sample_json(raw)
    slow = full_model(raw)
    if fast is not None:
        assert slow is not None, f"fast path accepted what the model rejects: {raw!r}"
        assert exact_values(fast) == exact_values(slow)
        assert fast.model_fields_set == slow.model_fields_set
        assert fast.window_seconds == slow.window_seconds and fast.unit_seconds == slow.unit_seconds
        assert str(fast.unit_seconds) == str(slow.unit_seconds)
        assert fast.model_dump_json() == slow.model_dump_json()
        assert fast == slow
    return fast


def line(event_id: str = "ev-1", **changes: Any) -> bytes:
    return json.dumps(builders.sample(event_id, **changes)).encode()


def patched(**fields: Any) -> bytes:
    """A gpu sample line with ``fields`` set afterwards, whatever the kind."""
    return json.dumps({**builders.sample("ev-1"), **fields}).encode()


ORDINARY = [
    line(),
    line(kind="cpu", gpu_model=OMIT, quantity="48"),
    line(kind="memory", gpu_model=None, mig_profile=None, quantity=480),
    line(kind="storage", gpu_model=OMIT, quantity="1024.5", capacity_type=OMIT),
    line(gpu_model="A100-SXM-40GB", mig_profile="1g.5gb", quantity="0.142857142857"),
    line(start="2026-11-10T00:00:00.123456789+05:30", seconds=60, end="2026-11-10T00:01:00.000000001+05:30"),
    line(capacity_type="spot", priority=-2147483648, utilization="0.00", memory_used_bytes="130567005798",
         power_watts="1237.5", energy_joules=74250, labels={"a": "b", "é": "\u2028"}),
    line(quantity="0", seconds=1),
    line(quantity=" 2.50 ", priority=2147483647),
    line(start="1970-01-01T00:00:00Z", seconds=3600),
    line(start="2299-12-31T23:00:00Z", end="2299-12-31T23:59:59.999999999Z"),
    line(quantity="999999999.999999999999"),
    line(quantity="1e2", utilization="1E-3", energy_joules="+5"),
]


@pytest.mark.parametrize("raw", ORDINARY)
def test_ordinary_samples_take_the_fast_path_with_the_models_values(raw: bytes) -> None:
    assert assert_same_verdict(raw) is not None


DECLINED_OR_REJECTED = [
    line(quantity=1.5),  # a JSON float: left to the model, which reads it as an exact Decimal
    line(utilization=0.5),
    line(quantity="1_000"), line(quantity="١"), line(quantity="NaN"), line(quantity="-1"),
    line(quantity="1e9"), line(quantity="0.0000000000001"), line(quantity=True), line(quantity=None),
    line(seconds=0), line(seconds=3601), line(end="2026-11-10T01:00:00.000000001Z"),
    line(start="2026-11-10T00:00:00.000000002Z", end="2026-11-10T00:00:00.000000001Z"),
    line(start="1969-12-31T23:59:59Z", seconds=60), line(start="2299-12-31T23:59:59Z", seconds=60),
    line(start="2026-11-10T00:00:00", seconds=60), line(start="2026-11-10 00:00:00Z", seconds=60),
    line(start="2026-11-10T00:00:00.1234567891Z", end="2026-11-10T00:01:00Z"),
    line(start="2026-02-30T00:00:00Z", end="2026-03-01T00:00:00Z"),
    line(kind="gpu", gpu_model=OMIT), patched(kind="cpu"),
    patched(kind="cpu", gpu_model=None, mig_profile="1g.5gb"),
    line(kind="tpu"), line(capacity_type="preemptible"), line(priority=2147483648), line(priority="1"),
    line(priority=1.0), line(tenant="Team-A"), line(node=" "),
    line(node="\x1c"),  # whitespace to Python, not to the model's (Rust) pattern: both accept it
    line(event_id=""),
    line(event_id="e" * 129), line(labels={"a": 1}), line(color="red"), line(utilization="1000000000000"),
    line(memory_used_bytes="1e32"), line(power_watts="-0.1"),
    # Whitespace and digits as Python's str.strip and re.ASCII see them, not Rust's.
    line(quantity="\x1c1\x1f"), line(quantity="\u00a01\u2003"), line(quantity="1\n"), line(quantity="\uff11"),
    line(quantity="0.1000000000000"), line(quantity=10**30), line(quantity="1e999999999999999999"),
    b'{"event_id": "a", "event_id": "b"}', b"[1, 2]", b"not json", b'{"quantity": NaN}',
    line()[:-1] + b', "quantity": "2"}',  # a repeated key: the last one counts, on both paths
    b"\xef\xbb\xbf" + line(), line().replace(b'"ev-1"', b'"ev-\\ud800"'), line() + b" x",
]


@pytest.mark.parametrize("raw", DECLINED_OR_REJECTED)
def test_unusual_samples_get_the_models_verdict(raw: bytes) -> None:
    assert_same_verdict(raw)


def test_a_json_float_quantity_is_still_accepted_exactly_by_the_model() -> None:
    raw = line(quantity=1.5)
    assert read_sample_json(raw) is None
    assert parse_sample(raw).quantity == Decimal("1.5")


def test_the_model_keeps_its_rejection_reasons_when_the_fast_path_declines() -> None:
    with pytest.raises(ValueError, match="window_end must be after window_start"):
        parse_sample(line(seconds=0))
    with pytest.raises(ValueError, match="gpu_model is required when kind is gpu"):
        parse_sample(line(gpu_model=OMIT))
