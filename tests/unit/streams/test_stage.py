"""The rating stage reading multi-sample records (streams/stage.py): one outcome per line."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpumeter.core import jsonio
from gpumeter.core.models import RatedUsage, parse_sample
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import join
from gpumeter.core.settings import DEFAULTS_DIR
from streams.stage import RatingStage, _fingerprint, encode_rated
from testkit import builders


def sample(event_id: str, tenant: str = "team-a", quantity: str | float = "1") -> bytes:
    """One minute of cpu as a sample line."""
    document = builders.sample(
        event_id, kind="cpu", tenant=tenant, namespace=tenant, start="2026-11-03T00:00:00Z", seconds=60,
        quantity=quantity,
    )
    return json.dumps(document).encode()


def test_stage_rates_each_line_and_dead_letters_bad_ones_with_their_index() -> None:
    stage = RatingStage(load_rate_cards(DEFAULTS_DIR / "ratecards"), "samples")
    record = join([sample("a"), b"not json", sample("b", quantity="-1"), sample("a"), sample("c")])
    outcomes = stage.process_record(record, partition=2, offset=40)
    assert [o.rated.event_id for o in outcomes if o.rated] == ["a", "c"]
    dead = [o.dead for o in outcomes if o.dead]
    assert [(d.source_partition, d.source_offset, d.source_index, d.reason_code) for d in dead] == [
        (2, 40, 1, "not_json"), (2, 40, 2, "invalid"),
    ]
    assert [o.duplicate for o in outcomes] == [False, False, False, True, False]


def test_a_replayed_event_id_with_other_billing_fields_is_a_dead_letter_not_a_silent_drop() -> None:
    stage = RatingStage(load_rate_cards(DEFAULTS_DIR / "ratecards"), "samples")
    first = stage.process(sample("same", quantity="1"), 0, 1)
    identical = stage.process(sample("same", quantity="1"), 0, 2)
    conflicting = stage.process(sample("same", quantity="2"), 0, 3)
    assert first.rated is not None and identical.duplicate
    assert conflicting.dead is not None and conflicting.dead.reason_code == "duplicate_conflict"
    assert conflicting.dead.event_id == "same" and conflicting.dead.source_offset == 3


def test_rated_json_is_what_pydantic_writes_for_the_model() -> None:
    """encode_rated writes with orjson; consumers read the rated topic as RatedUsage JSON."""
    stage = RatingStage(load_rate_cards(DEFAULTS_DIR / "ratecards"), "samples")
    gpu = builders.sample("g", kind="gpu", start="2026-11-03T05:30:00.123456789+05:30", seconds=60,
                          quantity="0.142857142857", gpu_model="A100-SXM-40GB", mig_profile="1g.5gb",
                          capacity_type="spot", utilization="0.5", energy_joules="1e3",
                          labels={"é": "\u2028"})
    record = join([sample("a", quantity="2.50"), json.dumps(gpu).encode(), sample("f", quantity=1.5)])
    rated = [o.rated for o in stage.process_record(record, partition=0, offset=1) if o.rated]
    assert [r.event_id for r in rated] == ["a", "g", "f"]
    for usage in rated:
        assert encode_rated(usage) == usage.model_dump_json().encode()
        assert RatedUsage.model_validate_json(encode_rated(usage)) == usage
    # A JSON float quantity is read exactly (the full model's path), never through a binary float.
    assert rated[2].quantity == Decimal("1.5") and rated[2].unit_seconds == Decimal("90")


def test_a_rated_samples_fingerprint_is_its_samples() -> None:
    """The stage remembers a rated sample by fields read from its instance dict; a replay is
    compared by the parsed sample's attributes. Both must give one tuple for one sample, or
    every honest replay would look like a conflict (and a conflict like a replay)."""
    stage = RatingStage(builders.card_set(), "samples")
    compared = 0
    for document in builders.random_samples(seed=4, count=300):
        parsed = parse_sample(jsonio.dumpb(document))
        outcome = stage.process(jsonio.dumpb(document), 0, compared)
        if outcome.rated is None:
            continue
        remembered = stage._seen[parsed.event_id]
        assert remembered == _fingerprint(parsed) == _fingerprint(outcome.rated)
        assert remembered == (parsed.tenant, parsed.kind, parsed.window_start, parsed.window_end,
                              parsed.unit_seconds, parsed.quantity, parsed.gpu_model, parsed.mig_profile,
                              parsed.capacity_type)
        compared += 1
    assert compared > 200


def test_a_rated_line_names_exactly_the_columns_rated_usage_is_inserted_with() -> None:
    """The sink sends rated lines to rated_usage as JSONEachRow, strictly: a field the table
    lacks would make every row unstorable, a column the line lacks would take its default."""
    from gpumeter.infra.schema import RATED_USAGE

    stage = RatingStage(load_rate_cards(DEFAULTS_DIR / "ratecards"), "samples")
    rated = stage.process(sample("cols"), 0, 1).rated
    assert rated is not None
    keys = list(json.loads(encode_rated(rated)))
    assert sorted(keys) == sorted(RATED_USAGE.insert_columns) and len(keys) == len(set(keys))


HUGE_INTEGER = "9" * 5_000  # beyond Python's 4,300-digit int conversion limit


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize(
    "poison",
    [
        pytest.param(b'{"priority": ' + HUGE_INTEGER.encode() + b"}", id="huge-integer-alone"),
        pytest.param(sample("p")[:-1] + b', "priority": ' + HUGE_INTEGER.encode() + b"}", id="huge-priority"),
        pytest.param(sample("p").replace(b'"quantity": "1"', b'"quantity": ' + HUGE_INTEGER.encode()),
                     id="huge-quantity"),
    ],
)
@pytest.mark.security
def test_a_poisoned_line_is_a_dead_letter_and_the_samples_beside_it_are_rated(
    native: bool, poison: bytes
) -> None:
    """Issue 31, point 1: one line must not take its record (and the partition) down with it."""
    stage = RatingStage(load_rate_cards(DEFAULTS_DIR / "ratecards"), "samples", native=native)
    rows, dead = stage.rate_record(join([sample("a"), poison, sample("b")]), partition=0, offset=9)
    assert [row[0] for row in rows] == ["a", "b"]
    assert [(d.source_index, d.reason_code) for d in dead] == [(1, "not_json")]
    assert "digits" in dead[0].reason
