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
from testkit.builders import CARDS, TENANTS, card_set, tenants_file


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
