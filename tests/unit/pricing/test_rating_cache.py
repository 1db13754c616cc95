"""Rater's per-sample fast path (price cache per card and selector, money operations called
directly) against the Fraction reference and against the straightforward composition.

Reference 1: tests/unit/reference_billing.py (contract 3 from DESIGN.md, exact rationals): the
card in force at window_start, the most specific rate, its first band price, the capacity
multiplier, unit-seconds and the list cost rounded half-up to 18 places.
Reference 2: what rating is defined as in code, step by step with no cache: ``find_rate`` on
``RateCardSet.card_at``, ``UsageSample.unit_seconds`` and ``list_cost``; compared bit for bit
(Decimal coefficient and exponent), since stored rows and rated JSON carry the text.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

import pricing.rating as rating
from gpumeter.core.models import RatedUsage, SampleRejected, UsageSample, parse_sample
from gpumeter.core.ratecard import RateCardSet
from pricing.rating import Rater, find_rate, list_cost
from testkit.builders import A100, H100, card_set, sample
from tests.unit import reference_billing as ref

L40S = "L40S-48GB"

# Awkward on purpose: many-digit prices and multipliers (a zero one too), a tiered rate whose
# first band is the list price, MIG > model > kind fallbacks, a kind one card does not price
# (memory before November) and a model the later card does not price (no gpu fallback).
CARD_EARLY: dict[str, Any] = {
    "version": "early",
    "currency": "USD",
    "effective_from": "2026-10-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.612345", "spot": "0"},
    "rates": [
        {"kind": "gpu", "gpu_model": H100, "unit_price": "2.123456789",
         "tiers": [{"up_to": 10, "unit_price": "2.123456789"}, {"up_to": None, "unit_price": "1"}]},
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.4444444"},
        {"kind": "gpu", "gpu_model": A100, "unit_price": "1.3"},
        {"kind": "gpu", "unit_price": "1.90"},
        {"kind": "cpu", "unit_price": "0.0451"},
        {"kind": "storage", "unit_price": "0.00020"},
    ],
}
CARD_LATE: dict[str, Any] = {
    "version": "late",
    "currency": "EUR",
    "effective_from": "2026-11-01T00:00:00+01:00",  # 2026-10-31T23:00Z: an offset edge
    "capacity_multipliers": {"on-demand": "1.000", "reserved": "0.333333333333", "spot": "0.35"},
    "rates": [
        {"kind": "gpu", "gpu_model": H100, "unit_price": "2.50"},
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.40"},
        {"kind": "cpu", "unit_price": "0.04"},
        {"kind": "memory", "unit_price": "0.0051"},
        {"kind": "storage", "unit_price": "0.0002"},
    ],
}
DOCS = [CARD_EARLY, CARD_LATE]
CARDS: RateCardSet = card_set(DOCS)
GPUS = ((H100, None), (H100, "3g.40gb"), (A100, "1g.5gb"), (A100, "2g.10gb"), (A100, None), (L40S, None))


def samples(seed: int, count: int) -> list[dict[str, Any]]:
    """Windows from before the first card to past the switch, in three offsets, with odd
    lengths (to the microsecond) and quantities of up to 12 places."""
    rng = random.Random(seed)
    base = datetime(2026, 9, 28, tzinfo=UTC)
    docs = []
    for index in range(count):
        kind = rng.choice(("gpu", "gpu", "cpu", "memory", "storage"))
        begin = base + timedelta(minutes=rng.randrange(0, 60 * 24 * 50))
        if rng.random() < 0.2:  # crowd the switch instant, from both sides
            begin = datetime(2026, 10, 31, 23, tzinfo=UTC) + timedelta(seconds=rng.randrange(-90, 90))
        length = timedelta(microseconds=rng.choice((60_000_000, 59_999_999, 3_600_000_000, 1, 123_456_789)))
        offset = rng.choice((UTC, timezone(timedelta(hours=9, minutes=30)), timezone(timedelta(hours=-7))))
        places = rng.randrange(0, 13)
        quantity = f"{Decimal(rng.randrange(0, 10**(places + 4))).scaleb(-places):f}"
        model, mig = rng.choice(GPUS) if kind == "gpu" else (None, None)
        docs.append(sample(
            f"c-{seed}-{index}", kind=kind, start=begin.astimezone(offset),
            end=(begin + length).astimezone(offset), quantity=quantity,
            capacity_type=rng.choice(("on-demand", "reserved", "spot")), gpu_model=model, mig_profile=mig,
        ))
    return docs


DOC_SAMPLES = samples(seed=5, count=1500)


def expected_from_reference(doc: dict[str, Any]) -> dict[str, Any] | None:
    """What contract 3 says a sample is priced at, from the Fraction reference (None = no_rate)."""
    found = ref.rate_sample(doc, DOCS)
    if found is None:
        return None
    card, rate = found
    cost = ref.list_cost(doc, DOCS)
    assert cost is not None
    return {
        "rate_card": card["version"],
        "currency": card["currency"],
        "unit_price": ref.first_price(rate),
        "capacity_multiplier": ref.frac(card["capacity_multipliers"][doc["capacity_type"]]),
        "unit_seconds": ref.frac(doc["quantity"]) * ref.window_seconds(doc),
        "list_cost": Decimal(ref.fmt_fixed(ref.half_up(cost, 18), 18)),
        "period": ref.utc_month(doc),
        "window_start": ref.parse_time(doc["window_start"]),
    }


def straightforward(parsed: UsageSample) -> tuple[str, Decimal, Decimal, Decimal, Decimal]:
    """(card version, unit_seconds, unit price, multiplier, list cost) with no cache at all."""
    card = CARDS.card_at(parsed.window_start)
    assert card is not None
    rate = find_rate(card, parsed.kind, parsed.gpu_model, parsed.mig_profile)
    assert rate is not None
    multiplier = card.capacity_multipliers[parsed.capacity_type]
    unit_seconds = parsed.unit_seconds
    cost = list_cost(unit_seconds, rate.list_price, multiplier)
    return card.version, unit_seconds, rate.list_price, multiplier, cost


def rate_or_reason(rater: Rater, parsed: UsageSample) -> RatedUsage | tuple[str, str]:
    try:
        return rater.rate(parsed, 4, 7)
    except SampleRejected as exc:
        return (exc.code, exc.reason)


def test_every_sample_is_priced_as_the_reference_says() -> None:
    rater = Rater(CARDS)  # one rater throughout: its caches fill as the worker's do
    outcomes = {"rated": 0, "no card": 0, "no rate": 0}
    for doc in DOC_SAMPLES:
        parsed = parse_sample(doc)
        expected = expected_from_reference(doc)
        result = rate_or_reason(rater, parsed)
        if expected is None:
            assert isinstance(result, tuple) and result[0] == "no_rate", doc
            outcomes["no card" if "no rate card in force" in result[1] else "no rate"] += 1
            continue
        assert isinstance(result, RatedUsage), (doc, result)
        outcomes["rated"] += 1
        assert result.rate_card == expected["rate_card"]
        assert result.currency == expected["currency"]
        assert Fraction(result.unit_price) == expected["unit_price"]
        assert Fraction(result.capacity_multiplier) == expected["capacity_multiplier"]
        assert Fraction(result.unit_seconds) == expected["unit_seconds"]
        # Value and shape: 18 places, as ClickHouse's Decimal(38, 18) and the rated JSON carry it.
        assert result.list_cost.as_tuple() == expected["list_cost"].as_tuple(), doc
        assert result.period == expected["period"]
        assert result.window_start == expected["window_start"]
        assert result.window_start.utcoffset() == timedelta(0)
        assert result.window_end.utcoffset() == timedelta(0)
        assert (result.source_partition, result.source_offset) == (4, 7)
    # The draw covers every branch (counts fixed by the seed, checked so the test cannot pass empty).
    assert min(outcomes.values()) >= 30, outcomes


def test_the_fast_path_is_bit_for_bit_the_straightforward_composition() -> None:
    rater = Rater(CARDS)
    compared = 0
    for doc in DOC_SAMPLES:
        parsed = parse_sample(doc)
        result = rate_or_reason(rater, parsed)
        if not isinstance(result, RatedUsage):
            continue
        version, unit_seconds, price, multiplier, cost = straightforward(parsed)
        assert result.rate_card == version
        for got, want in ((result.unit_seconds, unit_seconds), (result.unit_price, price),
                          (result.capacity_multiplier, multiplier), (result.list_cost, cost)):
            assert got.as_tuple() == want.as_tuple(), doc
        compared += 1
    assert compared > 1000


def test_many_digit_products_match_the_straightforward_composition() -> None:
    """Beyond what the Fraction reference checks exactly (products past the 60-digit context):
    the same operations in the same order give the same rounded digits."""
    docs = [
        {"version": "wide", "currency": "USD", "effective_from": "2026-01-01T00:00:00Z",
         "capacity_multipliers": {"on-demand": "0.99999999999999999999999999999999999999",
                                  "reserved": "7.0000000000000000000000000000001", "spot": "0"},
         "rates": [{"kind": "cpu", "unit_price": "1.23456789012345678901234567890123456789"}]},
    ]
    cards = card_set(docs)
    rater = Rater(cards)
    for capacity in ("on-demand", "reserved", "spot"):
        for quantity in ("999999999.999999999999", "0.000000000001", "123456789.123456789012"):
            parsed = parse_sample(sample("w", kind="cpu", gpu_model=None, quantity=quantity,
                                         seconds="3599.999999", capacity_type=capacity))
            card = cards.card_at(parsed.window_start)
            assert card is not None
            multiplier = card.capacity_multipliers[capacity]
            expected = list_cost(parsed.unit_seconds, card.rates[0].list_price, multiplier)
            assert rater.rate(parsed).list_cost.as_tuple() == expected.as_tuple()


def test_cached_answers_do_not_depend_on_the_order_or_on_earlier_samples() -> None:
    """A fresh rater per sample (nothing cached) and one rater over a shuffled order agree on
    every field, so a cache entry never leaks across cards, selectors or capacity types."""
    shuffled = list(DOC_SAMPLES)
    random.Random(9).shuffle(shuffled)
    shared = Rater(CARDS)
    for doc in shuffled:
        parsed = parse_sample(doc)
        alone, together = rate_or_reason(Rater(CARDS), parsed), rate_or_reason(shared, parsed)
        if isinstance(alone, RatedUsage):
            assert isinstance(together, RatedUsage)
            assert alone.model_dump_json() == together.model_dump_json()
        else:
            assert alone == together


def test_no_rate_reasons_name_the_card_and_the_selector() -> None:
    rater = Rater(CARDS)
    late_l40s = parse_sample(sample("l", start="2026-11-10T00:00:00Z", gpu_model=L40S, mig_profile=None))
    early_memory = parse_sample(sample("m", kind="memory", gpu_model=None, start="2026-10-10T00:00:00Z"))
    too_early = parse_sample(sample("e", start="2026-09-30T23:59:59+00:00"))
    for _ in range(2):  # the second time from the cache: the same refusal
        assert rate_or_reason(rater, late_l40s) == (
            "no_rate", f"rate card late has no rate for kind=gpu gpu_model={L40S} mig_profile=None")
        assert rate_or_reason(rater, early_memory) == (
            "no_rate", "rate card early has no rate for kind=memory gpu_model=None mig_profile=None")
        assert rate_or_reason(rater, too_early) == (
            "no_rate", "no rate card in force at 2026-09-30T23:59:59+00:00")


def test_switch_instant_in_another_offset_picks_the_later_card() -> None:
    # CARD_LATE is in force from 2026-11-01T00:00+01:00 = 2026-10-31T23:00Z.
    rater = Rater(CARDS)
    before = rater.rate(parse_sample(sample("b", start="2026-10-31T22:59:59.999999Z")))
    at = rater.rate(parse_sample(sample("a", start="2026-10-31T18:00:00-05:00")))
    assert (before.rate_card, before.period) == ("early", "2026-10")
    assert before.unit_price == Decimal("2.123456789")
    assert (at.rate_card, at.unit_price, at.period) == ("late", Decimal("2.50"), "2026-10")
    # 1 H100 hour at 2.50 x 1.000
    assert at.list_cost == Decimal("2.5") and at.list_cost.as_tuple().exponent == -18


def test_a_small_moment_cache_is_cleared_without_changing_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [rate_or_reason(Rater(CARDS), parse_sample(doc)) for doc in DOC_SAMPLES[:300]]
    monkeypatch.setattr(rating, "_MOMENT_CACHE_SIZE", 3)
    rater = Rater(CARDS)
    got = [rate_or_reason(rater, parse_sample(doc)) for doc in DOC_SAMPLES[:300]]
    assert len(rater._starts) <= 3 and len(rater._ends) <= 3
    assert [r.model_dump_json() if isinstance(r, RatedUsage) else r for r in got] == \
        [r.model_dump_json() if isinstance(r, RatedUsage) else r for r in expected]


def test_rated_instances_do_not_share_their_fields_set() -> None:
    rater = Rater(card_set())
    first, second = (rater.rate(parse_sample(sample(f"s{i}"))) for i in range(2))
    assert first.__pydantic_fields_set__ == set(RatedUsage.model_fields)
    assert first.__pydantic_fields_set__ is not second.__pydantic_fields_set__

