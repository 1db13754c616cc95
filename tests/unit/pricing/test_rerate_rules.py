"""The pure rules of `gpumeter rerate` (pricing/rerate_rules.py); expected values by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from pricing.invoice import LineKey
from pricing.rerate_rules import (
    UINT64,
    Group,
    Rating,
    Rerater,
    RerateRefused,
    Selector,
    chunk_token,
    chunks,
    compensation,
    plan,
    rerated,
    segments,
)
from testkit.builders import CARD_NOV, CARD_OCT, H100, card_set, rate_card

LATE = rate_card(version="v2", effective_from="2026-11-15T00:00:00Z",
                 rates=[{"kind": "gpu", "unit_price": "2.00"}, {"kind": "cpu", "unit_price": "0.05"}])
CARDS = card_set([CARD_OCT, CARD_NOV, LATE])
GPU = Selector("gpu", H100, None, "on-demand")
CPU_SPOT = Selector("cpu", None, None, "spot")


def group(segment: int, selector: Selector, stored: Rating, rows: int = 1, tenant: str = "team-a",
          seconds: str = "3600", cost: str = "1") -> Group:
    return Group(segment, tenant, selector, stored, rows, Decimal(seconds), Decimal(cost))


def row(event_id: str, start: datetime, tenant: str = "team-a", **fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "event_id": event_id, "tenant": tenant, "period": "2026-11", "kind": "gpu", "gpu_model": H100,
        "mig_profile": None, "capacity_type": "on-demand", "window_start": start,
        "unit_seconds": Decimal(7200),
        "rate_card": "2026-11", "currency": "USD", "unit_price": Decimal("2.5"),
        "capacity_multiplier": Decimal(1), "list_cost": Decimal(5),
    }
    values.update(fields)
    return values


def test_the_month_is_cut_where_a_card_takes_effect() -> None:
    pieces = segments(CARDS, "2026-11")
    assert [(p.start.day, p.end.month, p.end.day, p.card.version if p.card else None) for p in pieces] == [
        (1, 11, 15, "2026-11"), (15, 12, 1, "v2")]
    # A month before every card has one piece and no card.
    (before,) = segments(CARDS, "2026-01")
    assert before.card is None
    # December: v2 from its first instant to the end of the year.
    (december,) = segments(CARDS, "2026-12")
    assert (december.start, december.end, december.card and december.card.version) == (
        datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC), "v2")


def test_stale_groups_are_those_whose_stored_rating_the_cards_no_longer_give() -> None:
    nov_h100 = Rating("2026-11", "USD", Decimal("2.50"), Decimal(1))
    fresh_first_half = group(0, GPU, nov_h100, rows=3)
    stale_second_half = group(1, GPU, nov_h100, rows=2, seconds="7200")  # v2 from the 15th: 2.00
    stale_spot_cpu = group(1, CPU_SPOT, Rating("2026-11", "USD", Decimal("0.04"), Decimal("0.35")), rows=4,
                           tenant="team-b")
    month = plan(CARDS, "2026-11", [fresh_first_half, stale_second_half, stale_spot_cpu])
    assert month.stale == [stale_second_half, stale_spot_cpu]
    assert month.stale_rows == 6 and month.rows_by_tenant == {"team-a": 2, "team-b": 4}
    assert month.fresh[stale_second_half] == Rating("v2", "USD", Decimal("2.00"), Decimal(1))
    assert month.fresh[stale_spot_cpu] == Rating("v2", "USD", Decimal("0.05"), Decimal("0.35"))
    # The lines move: team-a's second half from the 2026-11 line to v2's.
    after = {u.key: u.unit_seconds for u in month.lines_after()["team-a"]}
    assert after == {LineKey("2026-11", "gpu", H100, None, "on-demand"): Decimal(3600),
                     LineKey("v2", "gpu", H100, None, "on-demand"): Decimal(7200)}
    before = {u.key: u.unit_seconds for u in month.lines_before()["team-a"]}
    assert before == {LineKey("2026-11", "gpu", H100, None, "on-demand"): Decimal(10800)}


def test_a_price_stored_with_other_trailing_zeros_is_not_stale() -> None:
    stored = Rating("2026-11", "USD", Decimal("2.500000000000"), Decimal("1.000000000000"))
    assert plan(CARDS, "2026-11", [group(0, GPU, stored)]).stale == []


def test_rows_the_cards_cannot_rate_refuse_the_whole_month() -> None:
    only_gpu = card_set([rate_card(rates=[{"kind": "gpu", "unit_price": "1.80"}])])
    cpu = group(0, Selector("cpu", None, None, "on-demand"), Rating("v1", "USD", Decimal("0.04"), Decimal(1)),
                rows=7)
    with pytest.raises(RerateRefused, match=r"7 stored row\(s\) of 2026-11 cannot be re-rated.*kind=cpu"):
        plan(only_gpu, "2026-11", [cpu])
    with pytest.raises(RerateRefused, match="no rate card is in force at any time in 2026-01"):
        plan(CARDS, "2026-01", [])


def test_a_rerated_row_has_the_streaming_list_cost_of_its_new_rating() -> None:
    old = row("e1", datetime(2026, 11, 20, 3, 15, tzinfo=UTC), unit_seconds=Decimal("5400.5"))
    new = rerated(old, Rating("v2", "USD", Decimal("2.00"), Decimal("0.35")))
    # 5400.5 unit-seconds = 1.500138888... unit-hours x 2.00 x 0.35 = 1.050097222..., 18 places half-up
    assert new["list_cost"] == Decimal("1.050097222222222222")
    assert (new["rate_card"], new["unit_price"], new["capacity_multiplier"]) == ("v2", Decimal("2.00"),
                                                                                 Decimal("0.35"))
    rating = ("rate_card", "unit_price", "capacity_multiplier", "list_cost")
    unchanged = {k: v for k, v in old.items() if k not in rating}
    assert {k: v for k, v in new.items() if k not in rating} == unchanged


def test_the_rerater_rates_by_the_segment_of_window_start() -> None:
    rerater = Rerater(segments(CARDS, "2026-11"))
    first = row("a", datetime(2026, 11, 14, 23, 59, 59, 999999))  # naive UTC, as the client returns it
    second = row("b", datetime(2026, 11, 15, tzinfo=UTC))
    assert rerater.rating(first) == Rating("2026-11", "USD", Decimal("2.50"), Decimal(1))
    assert rerater.rating(second) == Rating("v2", "USD", Decimal("2.00"), Decimal(1))


def test_compensation_takes_each_rows_contribution_out_of_its_hour() -> None:
    rows = [row("a", datetime(2026, 11, 2, 5, 10, tzinfo=UTC)),
            row("b", datetime(2026, 11, 2, 5, 50, tzinfo=UTC), unit_seconds=Decimal("0.5"),
                list_cost=Decimal("0.000347222222222222")),
            row("c", datetime(2026, 11, 2, 6, 0, tzinfo=UTC), mig_profile="1g.10gb")]
    hour5, hour6 = datetime(2026, 11, 2, 5, tzinfo=UTC), datetime(2026, 11, 2, 6, tzinfo=UTC)
    assert compensation(rows) == [
        ("2026-11", hour5, "team-a", "2026-11", "gpu", H100, "", "on-demand", Decimal("-7200.5"),
         Decimal("-5.000347222222222222"), UINT64 - 2),
        ("2026-11", hour6, "team-a", "2026-11", "gpu", H100, "1g.10gb", "on-demand", Decimal(-7200),
         Decimal(-5), UINT64 - 1),
    ]
    # What the engine does with the samples column: UInt64 addition wraps modulo 2**64.
    assert (2 + (UINT64 - 2)) % UINT64 == 0


def test_chunks_end_at_every_tenant_hour_and_at_the_limit() -> None:
    at = [datetime(2026, 11, 2, 5, m, tzinfo=UTC) for m in (0, 10, 20, 30, 40)]
    rows = [row(f"a{i}", t) for i, t in enumerate(at)] + [row("b0", datetime(2026, 11, 2, 6, tzinfo=UTC))] + [
        row("c0", datetime(2026, 11, 2, 6, tzinfo=UTC), tenant="team-c")]
    assert [[r["event_id"] for r in chunk] for chunk in chunks(rows, limit=2)] == [
        ["a0", "a1"], ["a2", "a3"], ["a4"], ["b0"], ["c0"]]
    assert chunks([], limit=2) == []


def test_a_chunk_token_names_its_rows_and_both_ratings() -> None:
    old = [row("a", datetime(2026, 11, 2, tzinfo=UTC)), row("b", datetime(2026, 11, 2, tzinfo=UTC))]
    v2 = [rerated(r, Rating("v2", "USD", Decimal("2.00"), Decimal(1))) for r in old]
    v3 = [rerated(r, Rating("v3", "USD", Decimal("2.00"), Decimal(1))) for r in old]
    token = chunk_token("2026-11", old, v2)
    assert token == chunk_token("2026-11", [dict(r) for r in old], [dict(r) for r in v2])  # deterministic
    assert len({token, chunk_token("2026-11", old, v3), chunk_token("2026-11", old[:1], v2[:1]),
                chunk_token("2026-12", old, v2)}) == 4
