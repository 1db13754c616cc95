"""The native rating path (native/, streams/native_rating.py) against the Python path.

The Python path (``RatingStage(..., native=False)``: pydantic-core validation, ``Rater.rate``,
``encode_rated``, ``rated_row``) is the definition. On the same records the native stage must
give the same rows (values, their types and the rated line's bytes), the same dead letters and
the same counters, whether it rated a line itself or declined it to the Python path.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from gpumeter_native import NativeRater
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.sim.config import FleetConfig
from collectors.sim.fleet import SimulatedFleet
from gpumeter.core import jsonio
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import join, split
from gpumeter.core.settings import DEFAULTS_DIR
from gpumeter.infra.schema import RATED_USAGE
from pricing.rating import Rater
from streams import native_rating
from streams.native_rating import NativeRating
from streams.stage import RatingStage
from testkit import builders

CARDS = load_rate_cards(DEFAULTS_DIR / "ratecards")


def stages() -> tuple[RatingStage, RatingStage]:
    assert native_rating.BUILT, "gpumeter_native is not built: `make install` builds it"
    native = RatingStage(CARDS, "samples")
    assert native.native
    return native, RatingStage(CARDS, "samples", native=False)


def dead_view(dead: list[Any]) -> list[dict[str, Any]]:
    """Dead letters without the moment they were made."""
    return [{**letter.model_dump(), "rejected_at": None} for letter in dead]


def assert_same(native: RatingStage, python: RatingStage, record: bytes, partition: int = 1,
                offset: int = 7) -> list[Any]:
    rows, dead = native.rate_record(record, partition, offset)
    expected_rows, expected_dead = python.rate_record(record, partition, offset)
    assert rows == expected_rows
    assert [row[-1] for row in rows] == [row[-1] for row in expected_rows]  # the rated lines, byte for byte
    types = [[type(value) for value in row] for row in rows]
    assert types == [[type(value) for value in row] for row in expected_rows]
    assert dead_view(dead) == dead_view(expected_dead)
    assert native.counters == python.counters
    return rows


def fleet_lines(count: int) -> list[bytes]:
    fleet = SimulatedFleet(FleetConfig(seed=11, window_seconds=15,
                                       nodes={"H100-SXM-80GB": 6, "A100-SXM-40GB": 4, "L40S-48GB": 2}))
    lines: list[bytes] = []
    while len(lines) < count:
        lines.extend(jsonio.dumpb(sample) for sample in fleet.step_dicts())
    return lines[:count]


def test_a_simulated_fleet_rates_the_same_natively_and_every_line_natively() -> None:
    native, python = stages()
    lines = fleet_lines(3000)
    for offset, start in enumerate(range(0, len(lines), 500)):
        record = join(lines[start:start + 500])
        # The native path took every line itself: none was declined to the Python path.
        assert None not in native._native.rate_lines(split(record), 0, offset)  # type: ignore[union-attr]
        assert_same(native, python, record, partition=offset % 3, offset=offset)
    assert native.counters.rated == 3000


def test_random_samples_of_every_kind_and_card_rate_the_same() -> None:
    native, python = stages()
    lines = [jsonio.dumpb(sample) for sample in builders.random_samples(seed=5, count=1500)]
    for offset, start in enumerate(range(0, len(lines), 250)):
        assert_same(native, python, join(lines[start:start + 250]), offset=offset)


def gpu(**changes: Any) -> dict[str, Any]:
    document = builders.sample("g-1", kind="gpu", start="2026-11-03T00:00:00Z", seconds=15, quantity="1",
                               gpu_model="H100-SXM-80GB", utilization="0.5", energy_joules="120.25",
                               labels={"gpu_uuid": "GPU-1", "container": "main"})
    document.update(changes)
    return document


def line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode()


def without(name: str) -> dict[str, Any]:
    document = gpu()
    del document[name]
    return document


# Lines the native path takes itself (the row must still equal the Python path's).
TAKEN = {
    "plain": line(gpu()),
    "quantity as an integer": line(gpu(quantity=2)),
    # Window and quantity are Python's to read (through a prototype): a JSON float is exact there.
    "JSON float quantity": line(gpu(quantity=1.5)),
    "fractional GPU": line(gpu(quantity="0.142857142857", mig_profile="1g.10gb")),
    "utilization as an integer": line(gpu(utilization=1)),
    "telemetry null": line(gpu(utilization=None, energy_joules=None, power_watts=None)),
    "largest utilization": line(gpu(utilization="999999999999.999999")),
    "largest energy": line(gpu(energy_joules="9" * 32)),
    "negative priority": line(gpu(priority=-2147483648)),
    "largest priority": line(gpu(priority=2147483647)),
    "spot": line(gpu(capacity_type="spot")),
    "no capacity type": line(without("capacity_type")),
    "no labels": line(without("labels")),
    "empty labels": line(gpu(labels={})),
    "gpu_model null on cpu": line(gpu(kind="cpu", gpu_model=None, mig_profile=None, quantity="12")),
    "event_id of 128 characters": line(gpu(event_id="é" * 128)),
    "names with non-ASCII and inner spaces": line(gpu(pod="pod ünïcode", node="n\u2028ode",
                                                      labels={"é": "\u2028"})),
    "offset window": line(gpu(window_start="2026-11-03T05:30:00+05:30",
                              window_end="2026-11-03T05:30:15+05:30")),
    "nanosecond window": line(gpu(window_start="2026-11-03T00:00:00.123456789Z",
                                  window_end="2026-11-03T00:00:15.000000001Z")),
    "window across a month": line(gpu(window_start="2026-10-31T23:59:50Z",
                                      window_end="2026-11-01T00:00:05Z")),
}

# Lines the native path declines: the Python path accepts or rejects them, with its reason.
DECLINED = {
    "escaped string": line(gpu(pod='po"d')),
    "escaped label": line(gpu(labels={"a": "b\\c"})),
    "JSON float utilization": line(gpu(utilization=0.5)),
    "exponent telemetry": line(gpu(energy_joules="1e3")),
    "leading zero": line(gpu(utilization="00.5")),
    "leading point": line(gpu(utilization=".5")),
    "utilization at its limit": line(gpu(utilization="1000000000000")),
    "energy at its limit": line(gpu(energy_joules="1" + "0" * 32)),
    "negative telemetry": line(gpu(power_watts="-1")),
    "negative zero": line(gpu(utilization="?")).replace(b'"?"', b"-0"),
    "priority beyond int32": line(gpu(priority=2147483648)),
    "priority as text": line(gpu(priority="5")),
    "priority as float": line(gpu(priority=1.0)),
    "capacity type null": line(gpu(capacity_type=None)),
    "unknown capacity type": line(gpu(capacity_type="preemptible")),
    "labels null": line(gpu(labels=None)),
    "label not a string": line(gpu(labels={"a": 1})),
    "repeated label": b'{"labels": {"a": "1", "a": "2"}, ' + line(without("labels"))[1:],
    "repeated field": b'{"pod": "other", ' + line(gpu())[1:],
    "unknown field": line(gpu(colour="blue")),
    "tenant breaking its pattern": line(gpu(tenant="Team-A")),
    "event_id of 129 characters": line(gpu(event_id="x" * 129)),
    "empty event_id": line(gpu(event_id="")),
    "blank pod": line(gpu(pod=" \t")),
    "cluster of 254 characters": line(gpu(cluster="c" * 254)),
    "gpu without model": line(gpu(gpu_model=None)),
    "cpu with a model": line(gpu(kind="cpu")),
    "unknown kind": line(gpu(kind="tpu")),
    "window reversed": line(gpu(window_start="2026-11-03T00:00:15Z", window_end="2026-11-03T00:00:00Z")),
    "window too long": line(gpu(window_end="2026-11-03T01:00:01Z")),
    "window in 2400": line(gpu(window_start="2400-01-01T00:00:00Z", window_end="2400-01-01T00:00:15Z")),
    "window without offset": line(gpu(window_start="2026-11-03T00:00:00", window_end="2026-11-03T00:00:15")),
    "before any card": line(gpu(window_start="2001-01-01T00:00:00Z", window_end="2001-01-01T00:00:15Z")),
    "quantity with 13 places": line(gpu(quantity="1.0000000000001")),
    "quantity at its limit": line(gpu(quantity="1000000000")),
    "not JSON": b"{not json",
    "an array": b"[1, 2]",
    "not UTF-8": line(gpu())[:-2] + b'\xff"}',
    "too large": line(gpu(labels={f"k{i}": "v" * 100 for i in range(700)})),
}


@pytest.mark.parametrize("name", sorted(TAKEN))
def test_a_plain_sample_is_rated_natively_as_the_python_path_rates_it(name: str) -> None:
    native, python = stages()
    assert native._native.rate_lines([TAKEN[name]], 0, 1)[0] is not None  # type: ignore[union-attr]
    assert len(assert_same(native, python, TAKEN[name])) == 1


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_anything_else_goes_to_the_python_path_and_ends_the_same(name: str) -> None:
    native, python = stages()
    assert native._native.rate_lines([DECLINED[name]], 0, 1)[0] is None  # type: ignore[union-attr]
    assert_same(native, python, DECLINED[name])


def test_repeated_event_ids_are_duplicates_or_conflicts_as_in_the_python_path() -> None:
    native, python = stages()
    record = join([line(gpu(event_id="a")), line(gpu(event_id="b")), line(gpu(event_id="a")),
                   line(gpu(event_id="b", quantity="2")), line(gpu(event_id="c"))])
    rows = assert_same(native, python, record)
    assert [row[0] for row in rows] == ["a", "b", "c"]
    assert native.counters.duplicates == 1 and native.counters.by_reason == {"duplicate_conflict": 1}
    # Later records too, natively rated or not.
    assert assert_same(native, python, join([line(gpu(event_id="a", quantity="3"))]), offset=8) == []


def test_new_rate_cards_are_used_from_the_next_record() -> None:
    native, python = stages()
    assert_same(native, python, line(gpu(event_id="before")))
    corrected = builders.card_set([builders.rate_card(version="2026-11-corrected")])
    native.use_cards(corrected)
    python.use_cards(corrected)
    rows = assert_same(native, python, line(gpu(event_id="after")))
    assert rows[0][RATED_USAGE.insert_columns.index("rate_card")] == "2026-11-corrected"


def native_rater(columns: tuple[str, ...]) -> NativeRater:
    """A native rater of the default cards writing rows of these columns."""
    rating = NativeRating(Rater(CARDS))
    return NativeRater(rating.window, rating.rating, Decimal, columns)


def test_the_native_row_places_each_value_by_the_column_names_it_is_given() -> None:
    _, python = stages()
    columns = RATED_USAGE.insert_columns
    [expected], _ = python.rate_record(TAKEN["plain"], 0, 1)
    [row] = native_rater(columns[::-1]).rate_lines([TAKEN["plain"]], 0, 1)
    assert row is not None
    assert row[:-1] == expected[:-1][::-1]
    assert row[-1] == expected[-1]


def test_a_column_the_native_path_cannot_fill_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="colour"):
        native_rater((*RATED_USAGE.insert_columns, "colour")).rate_lines([TAKEN["plain"]], 0, 1)
    with pytest.raises(ValueError, match="named twice"):
        native_rater((*RATED_USAGE.insert_columns, "pod"))


decimal_texts = st.one_of(
    st.decimals(min_value=0, max_value=Decimal(10) ** 13, allow_nan=False, allow_infinity=False).map(str),
    st.from_regex(r"\A[0-9]{1,14}(\.[0-9]{0,14})?\Z"),
    st.integers(min_value=-5, max_value=10**14),
    st.sampled_from(["1e3", "-0", " 1", "1 ", "+1", "0x10", "", "1_000"]),
)


@settings(max_examples=300, deadline=None)
@given(quantity=decimal_texts, utilization=decimal_texts, energy=decimal_texts,
       priority=st.integers(min_value=-(2**32), max_value=2**32))
def test_any_decimal_text_or_priority_ends_as_the_python_path_says(quantity: Any, utilization: Any,
                                                                   energy: Any, priority: int) -> None:
    native, python = stages()
    assert_same(native, python, line(gpu(quantity=quantity, utilization=utilization, energy_joules=energy,
                                         priority=priority)))
