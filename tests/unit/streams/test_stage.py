"""The rating stage reading multi-sample records (streams/stage.py): one outcome per line."""

from __future__ import annotations

import json

from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import join
from gpumeter.core.settings import DEFAULTS_DIR
from streams.stage import RatingStage
from testkit import builders


def sample(event_id: str, tenant: str = "team-a", quantity: str = "1") -> bytes:
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
