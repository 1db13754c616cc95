"""Billing terms over months (contract 3, step 5, with terms): credit sources and how an invoice
draws on them. Pure: values in, values out.

Credits come from two kinds of source:
- the monthly allowance (the tenants file's old ``credits`` field): the same amount for every
  month's invoices, not carried over;
- credit grants: a balance granted once, usable by the invoices of months start..end, drawn
  down invoice by invoice in issue order.

An invoice draws the monthly allowance first (it lapses at month end anyway), then grants by
earliest expiry (open-ended last), then by start month and id: the credit most at risk of
lapsing is used first. Amounts are cents already (the tenants file holds money with at most
two places), so no draw needs rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from gpumeter.core.tenants import MONTHLY_CREDITS, TenantPolicy

ZERO = Decimal(0)
# Sorts after every YYYY-MM: an open-ended grant is drawn last.
_NEVER = "9999-99"


@dataclass(frozen=True)
class CreditSource:
    source: str  # MONTHLY_CREDITS or a grant id
    available: Decimal  # what it can still give to invoices of this month
    order: tuple[str, str, str]  # drawing order: (expiry, start, id)


def credit_sources(
    policy: TenantPolicy | None, period: str, drawn: Mapping[str, Decimal],
    drawn_this_month: Mapping[str, Decimal],
) -> list[CreditSource]:
    """What the tenant's invoices of ``period`` may still draw, in drawing order.

    ``drawn`` is Σ per grant over every invoice issued to the tenant so far (any month);
    ``drawn_this_month`` the same over the invoices issued for ``period`` (the monthly
    allowance is counted there).
    """
    if policy is None:
        return []
    sources = []
    if policy.credits:
        left = policy.credits - drawn_this_month.get(MONTHLY_CREDITS, ZERO)
        sources.append(CreditSource(MONTHLY_CREDITS, max(left, ZERO), ("", "", "")))
    for grant in policy.credit_grants:
        if grant.usable_in(period):
            left = grant.amount - drawn.get(grant.id, ZERO)
            order = (grant.end or _NEVER, grant.start, grant.id)
            sources.append(CreditSource(grant.id, max(left, ZERO), order))
    return sorted(sources, key=lambda source: source.order)


def draw(need: Decimal, sources: list[CreditSource]) -> dict[str, Decimal]:
    """Take up to ``need`` from the sources in order; only sources that gave something appear."""
    taken: dict[str, Decimal] = {}
    for source in sources:
        if need <= 0:
            break
        amount = min(source.available, need)
        if amount > 0:
            taken[source.source] = amount
            need -= amount
    return taken


def release(
    excess: Decimal, issued: Mapping[str, Decimal], sources: list[CreditSource]
) -> dict[str, Decimal]:
    """Give back ``excess`` of what earlier invoices of the month drew, last-drawn source first.

    Needed only when a month's bill shrinks after it was issued (a lowered commitment in the
    tenants file); the amounts are negative draws.
    """
    order = {source.source: source.order for source in sources}
    given: dict[str, Decimal] = {}
    for name in sorted(issued, key=lambda n: order.get(n, (_NEVER, _NEVER, n)), reverse=True):
        if excess <= 0:
            break
        amount = min(issued[name], excess)
        if amount > 0:
            given[name] = -amount
            excess -= amount
    return given


def credits_remaining(policy: TenantPolicy | None, period: str, drawn: Mapping[str, Decimal]) -> Decimal:
    """Σ balance of the tenant's grants not expired by the end of ``period`` (after ``drawn``)."""
    if policy is None:
        return ZERO
    return sum(
        (max(grant.amount - drawn.get(grant.id, ZERO), ZERO)
         for grant in policy.credit_grants if grant.end is None or grant.end > period),
        ZERO,
    )
