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
    pytest.param(line(), id="gpu"),
    pytest.param(line(kind="cpu", gpu_model=OMIT, quantity="48"), id="cpu"),
    pytest.param(line(kind="memory", gpu_model=None, mig_profile=None, quantity=480),
                 id="memory-with-integer-quantity"),
    pytest.param(line(kind="storage", gpu_model=OMIT, quantity="1024.5", capacity_type=OMIT),
                 id="storage-without-capacity-type"),
    pytest.param(line(gpu_model="A100-SXM-40GB", mig_profile="1g.5gb", quantity="0.142857142857"),
                 id="mig-slice-with-twelve-fraction-digits"),
    pytest.param(line(start="2026-11-10T00:00:00.123456789+05:30", seconds=60,
                      end="2026-11-10T00:01:00.000000001+05:30"),
                 id="window-in-nanoseconds-at-plus5h30"),
    pytest.param(line(capacity_type="spot", priority=-2147483648, utilization="0.00",
                      memory_used_bytes="130567005798", power_watts="1237.5", energy_joules=74250,
                      labels={"a": "b", "é": "\u2028"}),
                 id="spot-lowest-priority-with-telemetry-and-unicode-labels"),
    pytest.param(line(quantity="0", seconds=1), id="zero-quantity-one-second"),
    pytest.param(line(quantity=" 2.50 ", priority=2147483647), id="padded-quantity-largest-priority"),
    pytest.param(line(start="1970-01-01T00:00:00Z", seconds=3600), id="window-at-the-epoch"),
    pytest.param(line(start="2299-12-31T23:00:00Z", end="2299-12-31T23:59:59.999999999Z"),
                 id="window-ending-in-the-last-nanosecond-of-2299"),
    pytest.param(line(quantity="999999999.999999999999"), id="largest-quantity"),
    pytest.param(line(quantity="1e2", utilization="1E-3", energy_joules="+5"),
                 id="exponents-and-a-plus-sign"),
]


@pytest.mark.parametrize("raw", ORDINARY)
def test_ordinary_samples_take_the_fast_path_with_the_models_values(raw: bytes) -> None:
    assert assert_same_verdict(raw) is not None


DECLINED_OR_REJECTED = [
    # A JSON float: left to the model, which reads it as an exact Decimal.
    pytest.param(line(quantity=1.5), id="json-float-quantity"),
    pytest.param(line(utilization=0.5), id="json-float-utilization"),
    pytest.param(line(quantity="1_000"), id="quantity-with-underscore"),
    pytest.param(line(quantity="١"), id="quantity-in-arabic-indic-digit"),
    pytest.param(line(quantity="NaN"), id="quantity-nan"),
    pytest.param(line(quantity="-1"), id="negative-quantity"),
    pytest.param(line(quantity="1e9"), id="quantity-too-large"),
    pytest.param(line(quantity="0.0000000000001"), id="quantity-with-thirteen-fraction-digits"),
    pytest.param(line(quantity=True), id="quantity-true"),
    pytest.param(line(quantity=None), id="quantity-null"),
    pytest.param(line(seconds=0), id="empty-window"),
    pytest.param(line(seconds=3601), id="window-longer-than-an-hour"),
    pytest.param(line(end="2026-11-10T01:00:00.000000001Z"), id="window-an-hour-and-a-nanosecond"),
    pytest.param(line(start="2026-11-10T00:00:00.000000002Z", end="2026-11-10T00:00:00.000000001Z"),
                 id="window-ending-before-it-starts"),
    pytest.param(line(start="1969-12-31T23:59:59Z", seconds=60), id="window-before-the-epoch"),
    pytest.param(line(start="2299-12-31T23:59:59Z", seconds=60), id="window-ending-after-2299"),
    pytest.param(line(start="2026-11-10T00:00:00", seconds=60), id="timestamp-without-offset"),
    pytest.param(line(start="2026-11-10 00:00:00Z", seconds=60), id="timestamp-with-space-separator"),
    pytest.param(line(start="2026-11-10T00:00:00.1234567891Z", end="2026-11-10T00:01:00Z"),
                 id="timestamp-with-ten-fraction-digits"),
    pytest.param(line(start="2026-02-30T00:00:00Z", end="2026-03-01T00:00:00Z"), id="february-30"),
    pytest.param(line(kind="gpu", gpu_model=OMIT), id="gpu-without-gpu-model"),
    pytest.param(patched(kind="cpu"), id="cpu-with-gpu-model"),
    pytest.param(patched(kind="cpu", gpu_model=None, mig_profile="1g.5gb"), id="cpu-with-mig-profile"),
    pytest.param(line(kind="tpu"), id="unknown-kind"),
    pytest.param(line(capacity_type="preemptible"), id="unknown-capacity-type"),
    pytest.param(line(priority=2147483648), id="priority-above-int32"),
    pytest.param(line(priority="1"), id="priority-as-string"),
    pytest.param(line(priority=1.0), id="priority-as-float"),
    pytest.param(line(tenant="Team-A"), id="tenant-with-capitals"),
    pytest.param(line(node=" "), id="blank-node"),
    # Whitespace to Python, not to the model's (Rust) pattern: both accept it.
    pytest.param(line(node="\x1c"), id="node-of-a-python-only-whitespace"),
    pytest.param(line(event_id=""), id="empty-event-id"),
    pytest.param(line(event_id="e" * 129), id="event-id-of-129-characters"),
    pytest.param(line(labels={"a": 1}), id="label-value-not-a-string"),
    pytest.param(line(color="red"), id="unknown-field"),
    pytest.param(line(utilization="1000000000000"), id="utilization-too-large"),
    pytest.param(line(memory_used_bytes="1e32"), id="memory-bytes-too-large"),
    pytest.param(line(power_watts="-0.1"), id="negative-power"),
    # Whitespace and digits as Python's str.strip and re.ASCII see them, not Rust's.
    pytest.param(line(quantity="\x1c1\x1f"), id="quantity-padded-with-control-separators"),
    pytest.param(line(quantity="\u00a01\u2003"), id="quantity-padded-with-unicode-spaces"),
    pytest.param(line(quantity="1\n"), id="quantity-with-trailing-newline"),
    pytest.param(line(quantity="\uff11"), id="quantity-in-fullwidth-digit"),
    pytest.param(line(quantity="0.1000000000000"), id="quantity-with-trailing-zero-past-twelve-digits"),
    pytest.param(line(quantity=10**30), id="quantity-integer-of-31-digits"),
    pytest.param(line(quantity="1e999999999999999999"), id="quantity-with-huge-exponent"),
    pytest.param(b'{"event_id": "a", "event_id": "b"}', id="object-with-only-a-repeated-event-id"),
    pytest.param(b"[1, 2]", id="an-array"),
    pytest.param(b"not json", id="not-json"),
    pytest.param(b'{"quantity": NaN}', id="bare-nan"),
    # A repeated key: the last one counts, on both paths.
    pytest.param(line()[:-1] + b', "quantity": "2"}', id="repeated-quantity-key"),
    pytest.param(b"\xef\xbb\xbf" + line(), id="byte-order-mark"),
    pytest.param(line().replace(b'"ev-1"', b'"ev-\\ud800"'), id="lone-surrogate-escape"),
    pytest.param(line() + b" x", id="trailing-garbage"),
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
