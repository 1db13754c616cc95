"""An independent reference implementation of contract 3 (billing arithmetic).

Written from DESIGN.md only, with ``fractions.Fraction`` for exact rational
arithmetic. It deliberately imports nothing from ``pricing`` or ``gpumeter``:
inputs are plain dicts (samples as JSON-like dicts, rate cards and tenant
policies as the YAML documents would load), outputs are contract-4b dicts with
strings. Tests compare the real pipeline against it.

Contract 3, restated as implemented here:

1. hours = window seconds / 3600; unit_hours = quantity x hours.
2. Card = latest ``effective_from`` <= window_start. Rate = most specific of
   (kind, gpu_model, mig_profile) > (kind, gpu_model) > (kind); none = no_rate.
3. Streaming list cost = unit_hours x first price x capacity multiplier.
4. Invoice = one tenant x one UTC month of window_start. Lines keyed by
   (card version, kind, sample gpu_model, sample mig_profile, capacity_type);
   quantity = sum of unit_hours; amount = sum over bands (previous up_to, up_to]
   of hours-in-band x band price, x multiplier, rounded once to cents half-up.
5. True-up = commitment - subtotal when below; credits applied never take the
   total below 0.00.
6. Duplicated event_ids count once (the first occurrence is kept).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

SECONDS_PER_HOUR = Fraction(3600)

RefLineKey = tuple[str, str, str | None, str | None, str]  # card version, kind, model, mig, capacity


def frac(value: Any) -> Fraction:
    """An exact rational from an int, a decimal string, a Decimal or a Fraction (never a float)."""
    if isinstance(value, bool | float):
        raise TypeError(f"refusing inexact or boolean value {value!r}")
    if isinstance(value, int | Fraction | Decimal):
        return Fraction(value)
    if isinstance(value, str):
        return Fraction(value.strip())
    raise TypeError(f"not a number: {value!r}")


def parse_time(value: Any) -> datetime:
    """An aware datetime in UTC from an RFC 3339 string (or an aware datetime)."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError(f"naive timestamp {value!r}")
    return moment.astimezone(UTC)


def window_seconds(sample: Mapping[str, Any]) -> Fraction:
    delta = parse_time(sample["window_end"]) - parse_time(sample["window_start"])
    return Fraction(delta // timedelta(microseconds=1), 1_000_000)


def unit_hours(sample: Mapping[str, Any]) -> Fraction:
    return frac(sample["quantity"]) * window_seconds(sample) / SECONDS_PER_HOUR


def utc_month(sample: Mapping[str, Any]) -> str:
    start = parse_time(sample["window_start"])
    return f"{start.year:04d}-{start.month:02d}"


def select_card(cards: Sequence[Mapping[str, Any]], moment: datetime) -> Mapping[str, Any] | None:
    """Latest effective_from <= moment."""
    best: Mapping[str, Any] | None = None
    best_from: datetime | None = None
    for card in cards:
        effective = parse_time(card["effective_from"])
        if effective <= moment and (best_from is None or effective > best_from):
            best, best_from = card, effective
    return best


def select_rate(
    card: Mapping[str, Any], kind: str, gpu_model: str | None, mig_profile: str | None
) -> Mapping[str, Any] | None:
    for wanted in ((kind, gpu_model, mig_profile), (kind, gpu_model, None), (kind, None, None)):
        for rate in card["rates"]:
            if (rate["kind"], rate.get("gpu_model"), rate.get("mig_profile")) == wanted:
                return rate
    return None


def first_price(rate: Mapping[str, Any]) -> Fraction:
    tiers = rate.get("tiers")
    if tiers:
        return frac(tiers[0]["unit_price"])
    return frac(rate["unit_price"])


def rate_sample(
    sample: Mapping[str, Any], cards: Sequence[Mapping[str, Any]]
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(card, rate) for a sample, or None for no_rate."""
    card = select_card(cards, parse_time(sample["window_start"]))
    if card is None:
        return None
    rate = select_rate(card, sample["kind"], sample.get("gpu_model"), sample.get("mig_profile"))
    if rate is None:
        return None
    return card, rate


def list_cost(sample: Mapping[str, Any], cards: Sequence[Mapping[str, Any]]) -> Fraction | None:
    """Streaming list cost (step 3): unit_hours x first band price x multiplier, unrounded."""
    found = rate_sample(sample, cards)
    if found is None:
        return None
    card, rate = found
    multiplier = frac(card["capacity_multipliers"][sample.get("capacity_type", "on-demand")])
    return unit_hours(sample) * first_price(rate) * multiplier


def banded(rate: Mapping[str, Any], quantity: Fraction) -> Fraction:
    """Σ over bands (previous up_to, up_to] of (hours in band x band price); no tiers = flat."""
    tiers = rate.get("tiers")
    if not tiers:
        return quantity * frac(rate["unit_price"])
    total = Fraction(0)
    lower = Fraction(0)
    for tier in tiers:
        upper = None if tier["up_to"] is None else frac(tier["up_to"])
        top = quantity if upper is None else min(quantity, upper)
        if top > lower:
            total += (top - lower) * frac(tier["unit_price"])
        if upper is None:
            break
        lower = upper
    return total


def half_up(value: Fraction, places: int) -> int:
    """value rounded half away from zero to ``places`` decimals, as an integer count of 10^-places."""
    scaled = value * 10**places
    magnitude = math.floor(abs(scaled) + Fraction(1, 2))
    return magnitude if scaled >= 0 else -magnitude


def fmt_fixed(units: int, places: int) -> str:
    sign = "-" if units < 0 else ""
    whole, part = divmod(abs(units), 10**places)
    return f"{sign}{whole}.{part:0{places}d}"


def money_str(cents: int) -> str:
    return fmt_fixed(cents, 2)


def quantity_str(quantity: Fraction) -> str:
    return fmt_fixed(half_up(quantity, 6), 6)


def card_by_version(cards: Sequence[Mapping[str, Any]], version: str) -> Mapping[str, Any]:
    for card in cards:
        if str(card["version"]) == version:
            return card
    raise KeyError(version)


def line_amount(cards: Sequence[Mapping[str, Any]], key: RefLineKey, quantity: Fraction) -> Fraction:
    """Unrounded amount of one line (step 4)."""
    version, kind, gpu_model, mig_profile, capacity_type = key
    card = card_by_version(cards, version)
    rate = select_rate(card, kind, gpu_model, mig_profile)
    assert rate is not None, key
    return banded(rate, quantity) * frac(card["capacity_multipliers"][capacity_type])


def line_cents(cards: Sequence[Mapping[str, Any]], key: RefLineKey, quantity: Fraction) -> int:
    return half_up(line_amount(cards, key, quantity), 2)


@dataclass
class Aggregated:
    """Usage per (tenant, period): line key -> Σ unit_hours; plus rejected event ids."""

    lines: dict[tuple[str, str], dict[RefLineKey, Fraction]]
    rejected: list[str]


def aggregate(samples: Iterable[Mapping[str, Any]], cards: Sequence[Mapping[str, Any]]) -> Aggregated:
    seen: set[str] = set()
    lines: dict[tuple[str, str], dict[RefLineKey, Fraction]] = {}
    rejected: list[str] = []
    for sample in samples:
        if sample["event_id"] in seen:
            continue
        seen.add(sample["event_id"])
        found = rate_sample(sample, cards)
        if found is None:
            rejected.append(sample["event_id"])
            continue
        card, _rate = found
        key: RefLineKey = (
            str(card["version"]),
            sample["kind"],
            sample.get("gpu_model"),
            sample.get("mig_profile"),
            sample.get("capacity_type", "on-demand"),
        )
        bucket = lines.setdefault((sample["tenant"], utc_month(sample)), {})
        bucket[key] = bucket.get(key, Fraction(0)) + unit_hours(sample)
    return Aggregated(lines, rejected)


def _policy(tenants: Sequence[Mapping[str, Any]] | None, tenant: str) -> Mapping[str, Any]:
    for entry in tenants or ():
        if entry["tenant"] == tenant:
            return entry
    return {}


def settle_cents(subtotal_cents: int, policy: Mapping[str, Any]) -> tuple[int, int, int]:
    """(true-up, credits applied, total) in cents (step 5). Commitment and credits are money (cents)."""
    commitment = policy.get("commitment")
    credits = policy.get("credits")
    commitment_cents = half_up(frac(commitment), 2) if commitment is not None else 0
    credit_cents = half_up(frac(credits), 2) if credits is not None else 0
    true_up = commitment_cents - subtotal_cents if subtotal_cents < commitment_cents else 0
    before = subtotal_cents + true_up
    applied = min(credit_cents, before)
    return true_up, applied, before - applied


def _line_sort(key: RefLineKey) -> tuple[str, str, str, str, str]:
    return (key[0], key[1], key[2] or "", key[3] or "", key[4])


def invoice_document(
    tenant: str,
    period: str,
    lines: Mapping[RefLineKey, Fraction],
    cards: Sequence[Mapping[str, Any]],
    tenants: Sequence[Mapping[str, Any]] | None,
    status: str = "draft",
) -> dict[str, Any]:
    doc_lines = []
    subtotal = 0
    currencies = set()
    for key in sorted(lines, key=_line_sort):
        cents = line_cents(cards, key, lines[key])
        subtotal += cents
        currencies.add(str(card_by_version(cards, key[0])["currency"]))
        doc_lines.append(
            {
                "rate_card": key[0],
                "kind": key[1],
                "gpu_model": key[2],
                "mig_profile": key[3],
                "capacity_type": key[4],
                "quantity": quantity_str(lines[key]),
                "amount": money_str(cents),
            }
        )
    assert len(currencies) <= 1, currencies
    true_up, credits, total = settle_cents(subtotal, _policy(tenants, tenant))
    return {
        "tenant": tenant,
        "period": period,
        "currency": currencies.pop() if currencies else None,
        "status": status,
        "lines": doc_lines,
        "subtotal": money_str(subtotal),
        "commitment_true_up": money_str(true_up),
        "credits": money_str(credits),
        "total": money_str(total),
    }


def reference_invoices(
    samples: Iterable[Mapping[str, Any]],
    cards: Sequence[Mapping[str, Any]],
    tenants: Sequence[Mapping[str, Any]] | None = None,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every (tenant, period) invoice the samples produce, as contract-4b documents."""
    aggregated = aggregate(samples, cards)
    return {
        (tenant, period): invoice_document(tenant, period, lines, cards, tenants)
        for (tenant, period), lines in aggregated.lines.items()
    }
