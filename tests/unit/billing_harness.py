"""Shared fixtures for the billing tests: rate cards and tenants as plain dicts, a sample
factory, and the pipeline under test (parse_sample -> Rater.rate -> Σ unit_seconds per
LineKey per tenant-month, deduplicated by event_id -> build_invoice)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpumeter.core.models import parse_sample
from gpumeter.core.money import exact
from gpumeter.core.ratecard import RateCard, RateCardSet
from gpumeter.core.tenants import TenantsFile
from pricing.invoice import Invoice, LineKey, UsageLine, build_invoice
from pricing.rating import Rater

H100 = "H100-SXM-80GB"
A100 = "A100-SXM-40GB"
L4 = "L4-24GB"

# Same content as gpumeter/defaults/ratecards, written out here so the tests do not
# depend on the shipped defaults staying as they are.
CARD_OCT: dict[str, Any] = {
    "version": "2026-10",
    "currency": "USD",
    "effective_from": "2026-10-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.4"},
    "rates": [
        {
            "kind": "gpu",
            "gpu_model": H100,
            "unit_price": "2.75",
            "tiers": [{"up_to": 1000, "unit_price": "2.75"}, {"up_to": None, "unit_price": "2.40"}],
        },
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.45"},
        {"kind": "gpu", "unit_price": "1.90"},
        {"kind": "cpu", "unit_price": "0.045"},
        {"kind": "memory", "unit_price": "0.005"},
        {"kind": "storage", "unit_price": "0.0002"},
    ],
}

CARD_NOV: dict[str, Any] = {
    "version": "2026-11",
    "currency": "USD",
    "effective_from": "2026-11-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.35"},
    "rates": [
        {
            "kind": "gpu",
            "gpu_model": H100,
            "unit_price": "2.50",
            "tiers": [
                {"up_to": 1000, "unit_price": "2.50"},
                {"up_to": 10000, "unit_price": "2.25"},
                {"up_to": None, "unit_price": "2.00"},
            ],
        },
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.40"},
        {"kind": "gpu", "unit_price": "1.80"},
        {"kind": "cpu", "unit_price": "0.04"},
        {"kind": "memory", "unit_price": "0.005"},
        {"kind": "storage", "unit_price": "0.0002"},
    ],
}

CARDS: list[dict[str, Any]] = [CARD_OCT, CARD_NOV]

TENANTS: list[dict[str, Any]] = [
    {"tenant": "team-a", "commitment": "1000.00", "credits": "250.00"},
    {"tenant": "research", "commitment": "15000.00"},
    {"tenant": "inference", "credits": "100.00"},
    {"tenant": "rich", "credits": "100000.00"},
]


def card_set(cards: Sequence[Mapping[str, Any]] = CARDS) -> RateCardSet:
    return RateCardSet(cards=[RateCard.model_validate(card) for card in cards])


def tenants_file(tenants: Sequence[Mapping[str, Any]] = TENANTS) -> TenantsFile:
    return TenantsFile.model_validate({"tenants": list(tenants)})


def sample(
    event_id: str,
    *,
    tenant: str = "team-a",
    kind: str = "gpu",
    gpu_model: str | None = H100,
    mig_profile: str | None = None,
    capacity_type: str = "on-demand",
    start: str = "2026-11-10T00:00:00Z",
    seconds: int | str = 3600,
    quantity: str | int = "1",
) -> dict[str, Any]:
    """A valid contract-1 sample dict; window_end keeps window_start's offset."""
    begin = datetime.fromisoformat(start)
    end = begin + timedelta(microseconds=int(Decimal(str(seconds)) * 1_000_000))
    document: dict[str, Any] = {
        "event_id": event_id,
        "kind": kind,
        "cluster": "c1",
        "node": "node-1",
        "tenant": tenant,
        "namespace": "ns",
        "pod": "pod-1",
        "pod_uid": "uid-1",
        "window_start": start,
        "window_end": end.isoformat(),
        "quantity": quantity,
        "capacity_type": capacity_type,
    }
    if kind == "gpu":
        document["gpu_model"] = gpu_model
        document["mig_profile"] = mig_profile
    return document


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
