"""Contract 1 (UsageSample) validation and the Decimal-only JSON reader."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core import jsonio
from gpumeter.core.models import SampleRejected, UsageSample, parse_sample, utc_month
from pricing.rating import Rater
from testkit.builders import OMIT, card_set, sample


def valid(**changes: Any) -> dict[str, Any]:
    """A one-minute H100 sample without the optional fields (so their defaults are what is
    tested), then ``changes`` set as given; a field changed to OMIT is left out."""
    document = sample(
        namespace="ml", pod="train-0", pod_uid="7f1c", end="2026-11-10T00:01:00Z",
        capacity_type=OMIT, mig_profile=OMIT,
    )
    document.update(changes)
    return {key: value for key, value in document.items() if value is not OMIT}


def rejected(document: Any) -> SampleRejected:
    with pytest.raises(SampleRejected) as caught:
        parse_sample(document if isinstance(document, bytes | str) else json.dumps(document, default=str))
    return caught.value


# --- accepted ------------------------------------------------------------------------------------


def test_minimal_gpu_sample_and_defaults():
    sample = parse_sample(json.dumps(valid()))
    assert sample.capacity_type == "on-demand"
    assert sample.priority == 0
    assert sample.mig_profile is None
    assert sample.labels == {}
    assert sample.quantity == Decimal("1")
    assert sample.window_seconds == Decimal(60)


@pytest.mark.parametrize("kind", ["cpu", "memory", "storage"])
def test_non_gpu_kinds_without_gpu_model(kind):
    sample = parse_sample(valid(kind=kind, gpu_model=OMIT))
    assert sample.kind == kind
    assert sample.gpu_model is None


def test_all_optional_fields():
    document = valid(
        mig_profile="1g.10gb",
        capacity_type="spot",
        priority=-5,
        utilization=0.5,  # JSON number: parsed to Decimal by jsonio, never float
        memory_used_bytes=123456789,
        power_watts="350.5",
        energy_joules=0,
        labels={"team": "vision", "job": "x"},
    )
    sample = parse_sample(json.dumps(document).encode("utf-8"))
    assert sample.utilization == Decimal("0.5")
    assert isinstance(sample.utilization, Decimal)
    assert sample.power_watts == Decimal("350.5")
    assert sample.priority == -5
    assert sample.labels == {"team": "vision", "job": "x"}
    assert sample.capacity_type == "spot"


@pytest.mark.parametrize("capacity_type", ["on-demand", "spot", "reserved"])
def test_capacity_types(capacity_type):
    assert parse_sample(valid(capacity_type=capacity_type)).capacity_type == capacity_type


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        pytest.param("0", Decimal(0), id="zero-string"),
        pytest.param(0, Decimal(0), id="zero-number"),
        pytest.param("1.5", Decimal("1.5"), id="fraction-string"),
        pytest.param(2, Decimal(2), id="integer-number"),
        pytest.param("0.000000000001", Decimal("1E-12"), id="12-places"),  # 12 places: the maximum
        pytest.param("999999999.999999999999", Decimal("999999999.999999999999"),
                     id="just-below-1e9"),
        pytest.param("1e2", Decimal(100), id="exponent"),
    ],
)
def test_quantity_accepted(quantity, expected):
    assert parse_sample(valid(quantity=quantity)).quantity == expected


def test_quantity_as_json_number_is_exact():
    # 0.1 as a JSON number must become Decimal("0.1"), not the binary float 0.1000000000000000055...
    raw = json.dumps(valid()).replace('"quantity": "1"', '"quantity": 0.1')
    sample = parse_sample(raw)
    assert sample.quantity == Decimal("0.1")
    assert str(sample.quantity) == "0.1"


def test_quantity_decimal_object_accepted_in_dict():
    assert parse_sample(valid(quantity=Decimal("2.25"))).quantity == Decimal("2.25")


def test_window_of_exactly_3600_seconds_is_accepted():
    sample = parse_sample(valid(window_end="2026-11-10T01:00:00Z"))
    assert sample.window_seconds == Decimal(3600)


def test_window_of_one_microsecond_is_accepted():
    sample = parse_sample(valid(window_end="2026-11-10T00:00:00.000001Z"))
    assert sample.window_seconds == Decimal("0.000001")


def test_windows_with_mixed_offsets():
    # 08:00+08:00 = 00:00Z, so the window is 30 minutes
    sample = parse_sample(valid(window_start="2026-11-10T08:00:00+08:00", window_end="2026-11-10T00:30:00Z"))
    assert sample.window_seconds == Decimal(1800)
    # 19:00-05:00 = 00:00Z = 01:00+01:00: zero length, rejected
    error = rejected(valid(window_start="2026-11-09T19:00:00-05:00", window_end="2026-11-10T01:00:00+01:00"))
    assert "window_end" in error.reason


def test_offset_is_kept_and_month_is_utc():
    sample = parse_sample(
        valid(window_start="2026-12-01T05:00:00+08:00", window_end="2026-12-01T05:10:00+08:00")
    )
    assert sample.window_start.utcoffset() == timedelta(hours=8)
    assert sample.period_month == "2026-11"
    assert utc_month(datetime(2026, 11, 30, 20, 0, tzinfo=timezone(timedelta(hours=-5)))) == "2026-12"
    assert utc_month(datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == "2026-12"


def test_tenant_pattern_accepts_edges():
    assert parse_sample(valid(tenant="a")).tenant == "a"
    assert parse_sample(valid(tenant="0-team")).tenant == "0-team"
    name = "a" + "b" * 62  # 63 chars: the maximum
    assert parse_sample(valid(tenant=name)).tenant == name


def test_event_id_length_edges():
    assert parse_sample(valid(event_id="x" * 128)).event_id == "x" * 128
    assert "event_id" in rejected(valid(event_id="x" * 129)).reason


def test_sample_is_frozen():
    sample = parse_sample(valid())
    with pytest.raises(ValueError):
        sample.quantity = Decimal(5)  # type: ignore[misc]


def test_unit_seconds_is_quantity_times_seconds():
    sample = parse_sample(valid(quantity="0.5", window_end="2026-11-10T00:00:01.5Z"))
    assert sample.unit_seconds == Decimal("0.75")


# --- rejected, each with a reason that names the field --------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        pytest.param({"kind": "tpu"}, "kind", id="kind-unknown"),
        pytest.param({"kind": "GPU"}, "kind", id="kind-upper-case"),
        pytest.param({"event_id": ""}, "event_id", id="event_id-empty"),
        pytest.param({"event_id": OMIT}, "event_id", id="event_id-missing"),
        pytest.param({"cluster": ""}, "cluster", id="cluster-empty"),
        pytest.param({"cluster": "   "}, "cluster", id="cluster-blank"),
        pytest.param({"node": " "}, "node", id="node-blank"),
        pytest.param({"namespace": "\t"}, "namespace", id="namespace-tab"),
        pytest.param({"pod": ""}, "pod", id="pod-empty"),
        pytest.param({"pod_uid": "  "}, "pod_uid", id="pod_uid-blank"),
        pytest.param({"tenant": ""}, "tenant", id="tenant-empty"),
        pytest.param({"tenant": "   "}, "tenant", id="tenant-blank"),
        pytest.param({"tenant": "Team-A"}, "tenant", id="tenant-upper-case"),
        pytest.param({"tenant": "-team"}, "tenant", id="tenant-leading-dash"),
        pytest.param({"tenant": "team_a"}, "tenant", id="tenant-underscore"),
        pytest.param({"tenant": "team-a\n"}, "tenant", id="tenant-trailing-newline"),
        pytest.param({"tenant": "a" * 64}, "tenant", id="tenant-64-chars"),
        pytest.param({"tenant": OMIT}, "tenant", id="tenant-missing"),
        pytest.param({"window_start": "yesterday"}, "window_start", id="window_start-words"),
        # a date, no time
        pytest.param({"window_start": "2026-11-10"}, "window_start", id="window_start-date-only"),
        pytest.param({"window_start": "2026-13-10T00:00:00Z"}, "window_start", id="window_start-month-13"),
        pytest.param({"window_start": "2026-11-10T00:00:00"}, "window_start", id="window_start-naive"),
        pytest.param({"window_end": "2026-11-10T00:01:00"}, "window_end", id="window_end-naive"),
        # epoch numbers are not RFC 3339
        pytest.param({"window_start": 1794268800}, "window_start", id="window_start-epoch-number"),
        pytest.param({"window_start": OMIT}, "window_start", id="window_start-missing"),
        pytest.param({"window_end": "2026-11-10T00:00:00Z"}, "window_end", id="window_end-equals-start"),
        pytest.param({"window_end": "2026-11-09T23:59:59Z"}, "window_end", id="window_end-before-start"),
        # 3600.000001 s
        pytest.param({"window_end": "2026-11-10T01:00:00.000001Z"}, "window", id="window-an-hour-and-1us"),
        pytest.param({"window_end": "2026-11-10T02:00:00Z"}, "window", id="window-two-hours"),
        pytest.param({"quantity": "-1"}, "quantity", id="quantity-negative"),
        pytest.param({"quantity": "-0.000001"}, "quantity", id="quantity-negative-tiny"),
        pytest.param({"quantity": ""}, "quantity", id="quantity-empty"),
        pytest.param({"quantity": "abc"}, "quantity", id="quantity-words"),
        pytest.param({"quantity": "NaN"}, "quantity", id="quantity-nan-string"),
        pytest.param({"quantity": "Infinity"}, "quantity", id="quantity-infinity-string"),
        pytest.param({"quantity": "-inf"}, "quantity", id="quantity-minus-inf-string"),
        pytest.param({"quantity": True}, "quantity", id="quantity-bool"),
        pytest.param({"quantity": None}, "quantity", id="quantity-null"),
        pytest.param({"quantity": [1]}, "quantity", id="quantity-list"),
        pytest.param({"quantity": "0.0000000000001"}, "quantity", id="quantity-13-places"),
        pytest.param({"quantity": "1000000000"}, "quantity", id="quantity-1e9"),
        pytest.param({"quantity": 10**12}, "quantity", id="quantity-1e12-number"),
        pytest.param({"quantity": OMIT}, "quantity", id="quantity-missing"),
        pytest.param({"gpu_model": OMIT}, "gpu_model", id="gpu_model-missing"),
        pytest.param({"gpu_model": None}, "gpu_model", id="gpu_model-null"),
        pytest.param({"gpu_model": ""}, "gpu_model", id="gpu_model-empty"),
        pytest.param({"kind": "cpu"}, "gpu_model", id="gpu_model-on-cpu"),  # gpu_model forbidden for cpu
        pytest.param({"kind": "memory", "gpu_model": OMIT, "mig_profile": "1g.5gb"}, "mig_profile",
                     id="mig_profile-on-memory"),
        pytest.param({"capacity_type": "preemptible"}, "capacity_type", id="capacity_type-unknown"),
        pytest.param({"priority": "5"}, "priority", id="priority-string"),
        pytest.param({"priority": 1.5}, "priority", id="priority-fraction"),
        pytest.param({"utilization": -0.1}, "utilization", id="utilization-negative"),
        pytest.param({"power_watts": "-1"}, "power_watts", id="power_watts-negative"),
        pytest.param({"labels": {"a": 1}}, "labels", id="labels-non-string-value"),
        pytest.param({"labels": ["a"]}, "labels", id="labels-list"),
        pytest.param({"surprise": 1}, "surprise", id="unknown-field"),
        pytest.param({"unit_seconds": "1"}, "unit_seconds", id="unit_seconds-is-derived"),
    ],
)
def test_rejected_with_reason_naming_the_field(changes, field):
    error = rejected(valid(**changes))
    assert field in error.reason, error.reason
    assert error.code == "invalid"
    assert "\n" not in error.reason  # one line


def test_float_quantity_rejected_when_given_as_python_float():
    error = rejected_dict(valid(quantity=0.5))
    assert "quantity" in error.reason
    assert "float" in error.reason


def test_float_telemetry_rejected_when_given_as_python_float():
    assert "utilization" in rejected_dict(valid(utilization=0.5)).reason


def rejected_dict(document: dict[str, Any]) -> SampleRejected:
    with pytest.raises(SampleRejected) as caught:
        parse_sample(document)
    return caught.value


def test_naive_datetime_object_rejected():
    error = rejected_dict(valid(window_start=datetime(2026, 11, 10), window_end=datetime(2026, 11, 10, 0, 1)))
    assert "window_start" in error.reason


def test_several_problems_are_all_named():
    error = rejected(valid(kind="tpu", quantity="-1", tenant="BAD"))
    for field in ("kind", "quantity", "tenant"):
        assert field in error.reason


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(b"not json", "not_json", id="words"),
        pytest.param(b"", "not_json", id="empty"),
        pytest.param(b"{", "not_json", id="unclosed-brace"),
        pytest.param(b"\xff\xfe{}", "not_json", id="not-utf8"),
        pytest.param(b'{"quantity": NaN}', "not_json", id="nan"),
        pytest.param(b'{"quantity": Infinity}', "not_json", id="infinity"),
        pytest.param(b'{"quantity": -Infinity}', "not_json", id="minus-infinity"),
        pytest.param(b"[1, 2]", "not_object", id="array"),
        pytest.param(b'"a string"', "not_object", id="string"),
        pytest.param(b"42", "not_object", id="number"),
        pytest.param(b"null", "not_object", id="null"),
    ],
)
def test_not_a_json_object(raw, code):
    error = rejected(raw)
    assert error.code == code
    assert error.reason


def test_nan_in_a_valid_looking_sample_is_rejected():
    raw = json.dumps(valid()).replace('"quantity": "1"', '"quantity": NaN')
    assert rejected(raw).code == "not_json"


def test_parse_accepts_bytes_str_and_dict_equally():
    document = valid(quantity="2.5")
    from_bytes = parse_sample(json.dumps(document).encode("utf-8"))
    from_text = parse_sample(json.dumps(document))
    from_dict = parse_sample(document)
    assert from_bytes == from_text == from_dict


def test_model_validate_directly_rejects_extra_fields():
    with pytest.raises(ValueError):
        UsageSample.model_validate(valid(extra="x"))


# --- rules the contract states where the implementation is lenient -------------------------------


@pytest.mark.parametrize(
    "timestamp",
    [
        "2026-11-10T00Z",  # hour only: not RFC 3339 (needs hh:mm:ss)
        "2026-W46-2T00:00:00Z",  # ISO week date
        "20261110T000000Z",  # ISO basic format
        "2026-11-10T08:00:00+0800",  # offset without colon (the same instant as 00:00Z)
    ],
)
def test_non_rfc3339_timestamps_are_rejected(timestamp):
    assert "window_start" in rejected(valid(window_start=timestamp)).reason


@pytest.mark.parametrize(
    ("start", "end"),
    [
        # UTC instant is in year 10000
        pytest.param("9999-12-31T23:00:00-01:00", "9999-12-31T23:30:00-01:00", id="utc-in-year-10000"),
        # UTC instant is in year 0
        pytest.param("0001-01-01T00:00:00+01:00", "0001-01-01T00:30:00+01:00", id="utc-in-year-0"),
    ],
)
def test_timestamps_outside_the_utc_range_are_rejected_not_crashing(start, end):
    """A sample must either be rejected by parse_sample (SampleRejected, dead-lettered) or be
    rateable; a bare OverflowError later (UTC month, rating) would stop a stream processor."""
    document = valid(kind="cpu", gpu_model=OMIT, window_start=start, window_end=end)
    try:
        sample = parse_sample(document)
    except SampleRejected as exc:
        assert "window_start" in exc.reason
        return
    with contextlib.suppress(SampleRejected):
        Rater(card_set()).rate(sample)
    assert sample.period_month  # the invoice month of an accepted sample can always be computed


@pytest.mark.parametrize("quantity", ["1_000", "١٢"], ids=["digit-separator", "arabic-indic-digits"])
def test_quantity_must_be_a_plain_decimal_string(quantity):
    assert "quantity" in rejected(valid(quantity=quantity)).reason


# --- jsonio: numbers become Decimal, never float ---------------------------------------------------


def _walk(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [item for child in value.values() for item in _walk(child)]
    if isinstance(value, list):
        return [item for child in value for item in _walk(child)]
    return [value]


def test_jsonio_numbers_are_decimal_or_int_never_float():
    parsed = jsonio.loads(
        b'{"a": 0.1, "b": [1.5, 2, -3e-2, 1E400, -0.0], "c": {"d": 12345678901234567890.123456789}, "e": 7}'
    )
    leaves = _walk(parsed)
    assert not any(isinstance(leaf, float) for leaf in leaves)
    assert parsed["a"] == Decimal("0.1")
    assert parsed["b"] == [Decimal("1.5"), 2, Decimal("-0.03"), Decimal("1E400"), Decimal("-0.0")]
    assert isinstance(parsed["b"][1], int)
    assert parsed["c"]["d"] == Decimal("12345678901234567890.123456789")
    assert isinstance(parsed["e"], int)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", '{"x": NaN}', "[Infinity]"])
def test_jsonio_refuses_non_standard_constants(text):
    with pytest.raises(jsonio.JSONInputError):
        jsonio.loads(text)


@pytest.mark.parametrize(
    "data",
    [b"\xc3\x28", b"{'a': 1}", b"{} {}", b"[" * 100_000],
    ids=["invalid-utf8", "single-quotes", "two-documents", "nested-100000-deep"],
)
def test_jsonio_errors_are_json_input_errors(data):
    with pytest.raises(jsonio.JSONInputError):
        jsonio.loads(data)


def test_jsonio_accepts_str_and_bytes():
    assert jsonio.loads('{"a": 1.25}') == jsonio.loads(b'{"a": 1.25}') == {"a": Decimal("1.25")}


def test_jsonio_dumps_decimals_as_strings():
    text = jsonio.dumps({"money": Decimal("3027.63"), "at": datetime(2026, 11, 1, tzinfo=UTC)})
    assert json.loads(text) == {"money": "3027.63", "at": "2026-11-01T00:00:00+00:00"}
    assert jsonio.loads(jsonio.dumpb({"q": Decimal("0.1")})) == {"q": "0.1"}


# --- contract 1 amended ranges: what storage can hold ------------------------------------------

INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"priority": INT32_MAX + 1}, id="priority-above-int32"),
        pytest.param({"priority": 3_000_000_000}, id="priority-3e9"),
        pytest.param({"priority": -(2**31) - 1}, id="priority-below-int32"),
        pytest.param({"utilization": "1000000000000"}, id="utilization-beyond-decimal-18-6"),
        pytest.param({"energy_joules": "1e32"}, id="energy-beyond-decimal-38-6"),
        pytest.param({"memory_used_bytes": "1e32"}, id="memory-bytes-beyond-decimal-38-6"),
        pytest.param({"power_watts": "1e32"}, id="power-beyond-decimal-38-6"),
        pytest.param({"window_start": "2400-01-01T00:00:00Z", "window_end": "2400-01-01T00:01:00Z"},
                     id="window-in-2400"),
        pytest.param({"window_start": "2299-12-31T23:59:30Z", "window_end": "2300-01-01T00:00:30Z"},
                     id="window-ending-in-2300"),
        pytest.param({"window_start": "1969-12-31T23:59:00Z", "window_end": "1970-01-01T00:00:00Z"},
                     id="window-before-1970"),
        pytest.param({"window_start": "2026-11-10T00:00:00.1234567891Z"}, id="ten-fraction-digits"),
    ],
)
def test_values_storage_cannot_hold_are_rejected_at_validation(changes):
    field = next(iter(changes)).split("_")[0]
    error = rejected(valid(**changes))
    assert field in error.reason, error.reason
    assert error.code == "invalid"


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"priority": INT32_MAX}, id="priority-int32-max"),
        pytest.param({"priority": -(2**31)}, id="priority-int32-min"),
        pytest.param({"utilization": "999999999999.999999"}, id="utilization-at-column-max"),
        pytest.param({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:01:00Z"},
                     id="window-at-1970"),
        pytest.param({"window_start": "2299-12-31T23:59:00Z", "window_end": "2299-12-31T23:59:59Z"},
                     id="window-late-2299"),
    ],
)
def test_values_at_the_storage_bounds_are_accepted(changes):
    parse_sample(json.dumps(valid(**changes)))


@pytest.mark.parametrize(
    ("start", "end", "seconds"),
    [
        pytest.param("2026-11-10T00:00:00.000000001Z", "2026-11-10T00:01:00.000000002Z", "60.000000001",
                     id="nanoseconds"),
        pytest.param("2026-11-10T00:00:00.0000009Z", "2026-11-10T00:00:01.0000001Z", "0.9999992",
                     id="sub-microsecond-digits"),
        pytest.param("2026-11-10T00:00:14.999999999+01:00", "2026-11-10T00:00:29.999999999+01:00", "15",
                     id="nano-with-offset"),
        pytest.param("2026-11-10T00:00:00.5Z", "2026-11-10T00:00:01.25Z", "0.75", id="short-fractions"),
    ],
)
def test_rfc3339nano_windows_are_exact(start, end, seconds):
    """Go agents send RFC3339Nano: the billed window length keeps every digit."""
    sample = parse_sample(json.dumps(valid(window_start=start, window_end=end, quantity="3")))
    assert sample.window_seconds == Decimal(seconds)
    assert sample.unit_seconds == Decimal(seconds) * 3


def test_copies_differing_below_a_microsecond_are_not_the_same_billing_fields():
    first = parse_sample(json.dumps(valid(window_end="2026-11-10T00:01:00.000000001Z")))
    second = parse_sample(json.dumps(valid(window_end="2026-11-10T00:01:00.000000002Z")))
    assert first.unit_seconds != second.unit_seconds
