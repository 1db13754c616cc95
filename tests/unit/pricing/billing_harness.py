"""The billing pipeline under test, as the stream and the invoice job run it: parse_sample ->
Rater.rate -> Σ unit_seconds per LineKey per tenant-month, deduplicated by event_id ->
build_invoice. Samples, rate cards and tenants come from testkit.builders."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from gpumeter.core.models import parse_sample
from gpumeter.core.money import exact
from gpumeter.core.ratecard import RateCardSet
from pricing.invoice import Invoice, LineKey, UsageLine, build_invoice
from pricing.rating import Rater
from testkit.builders import A100, CARDS, L4, TENANTS, card_set, sample, tenants_file


def mixed_samples() -> list[dict[str, Any]]:
    """team-a's November: one sample through each kind of line (on-demand, spot, MIG,
    reserved, cpu, memory), quantities and seconds that round."""
    return [
        sample("e1", quantity="1234.5"),
        sample("e2", capacity_type="spot", quantity="10"),
        sample("e3", gpu_model=A100, mig_profile="1g.5gb", quantity="0.333333", seconds=7),
        sample("e4", gpu_model=L4, capacity_type="reserved", quantity="3"),
        sample("e5", kind="cpu", quantity="64", seconds=1),
        sample("e6", kind="memory", quantity="512"),
    ]


def aggregate(
    samples: Iterable[Mapping[str, Any]], cards: RateCardSet
) -> dict[tuple[str, str], list[UsageLine]]:
    """parse -> rate -> Σ unit_seconds per LineKey, grouped by (tenant, period); dedup by event_id."""
    rater = Rater(cards)
    seen: set[str] = set()
    sums: dict[tuple[str, str], dict[LineKey, Decimal]] = {}
    for raw in samples:
        parsed = parse_sample(json.dumps(raw).encode("utf-8"))
        if parsed.event_id in seen:
            continue
        seen.add(parsed.event_id)
        # Rated in the caller's ordinary Decimal context, as a stream processor would.
        rated = rater.rate(parsed)
        key = LineKey(rated.rate_card, rated.kind, rated.gpu_model, rated.mig_profile, rated.capacity_type)
        bucket = sums.setdefault((rated.tenant, rated.period), {})
        with exact():  # the aggregation (ClickHouse sum over Decimal(38, 18)) is exact
            bucket[key] = bucket.get(key, Decimal(0)) + rated.unit_seconds
    return {
        group: [UsageLine(key, total) for key, total in lines.items()] for group, lines in sums.items()
    }


def run_pipeline(
    samples: Iterable[Mapping[str, Any]],
    cards: Sequence[Mapping[str, Any]] = CARDS,
    tenants: Sequence[Mapping[str, Any]] | None = TENANTS,
) -> dict[tuple[str, str], Invoice]:
    cardset = card_set(cards)
    policies = tenants_file(tenants or [])
    return {
        (tenant, period): build_invoice(tenant, period, usage, cardset, policies.policy(tenant))
        for (tenant, period), usage in aggregate(samples, cardset).items()
    }


def documents(invoices: Mapping[tuple[str, str], Invoice]) -> dict[tuple[str, str], dict[str, Any]]:
    return {group: normalise(invoice.to_document()) for group, invoice in invoices.items()}


def normalise(document: Mapping[str, Any]) -> dict[str, Any]:
    """The document with lines in a canonical order (the contract does not fix line order)."""
    result = dict(document)
    result["lines"] = sorted(
        document["lines"],
        key=lambda line: (
            line["rate_card"],
            line["kind"],
            line["gpu_model"] or "",
            line["mig_profile"] or "",
            line["capacity_type"],
        ),
    )
    return result
