"""``/v1/tenants/{tenant}/usage``: month-to-date usage and streaming list cost, from the hourly
rollup (one row per tenant-hour-line) rather than the samples."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from gpumeter.core.money import exact, format_money, format_quantity
from gpumeter.core.tenants import PERIOD_PATTERN
from pricing import store
from pricing.http.access import Scoped
from pricing.http.documents import ERRORS, UsageDocument
from pricing.invoice import LineKey
from pricing.issue import Billing


def usage_routes(context: Billing) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/tenants/{tenant}/usage", tags=["usage"], response_model=UsageDocument, responses=ERRORS)
    def usage(
        tenant: Scoped,
        period: Annotated[str | None, Query(pattern=PERIOD_PATTERN,
                                            description="YYYY-MM (UTC); default: the current month")] = None,
    ) -> JSONResponse:
        """Month-to-date usage per line: unit-hours and streaming list cost (before tiers,
        commitments and credits), each sample once."""
        now = datetime.now(UTC)
        month = period or f"{now.year:04d}-{now.month:02d}"
        lines = store.rollup_usage_to_date(context.client, tenant, month)
        total = sum((cost for _, _, cost, _ in lines), Decimal(0))
        with exact():
            documents = [{
                "rate_card": key.rate_card, "kind": key.kind, "gpu_model": key.gpu_model,
                "mig_profile": key.mig_profile, "capacity_type": key.capacity_type,
                "quantity": format_quantity(seconds / 3600), "list_cost": format_money(cost),
                "samples": count,
            } for key, seconds, cost, count in lines]
        currencies = {_currency(context, key) for key, *_ in lines}
        return JSONResponse({
            "tenant": tenant, "period": month, "as_of": now.isoformat(timespec="seconds"),
            "currency": next(iter(currencies)) if len(currencies) == 1 else None, "lines": documents,
            "list_cost": format_money(total),
        })

    return router


def _currency(context: Billing, key: LineKey) -> str | None:
    """The currency of the card that rated the line (the rollup does not store it); None for a
    card no longer loaded, which leaves the document's currency unstated."""
    try:
        return context.cards.by_version(key.rate_card).currency
    except KeyError:
        return None
