"""Invoices (contract 3, steps 4-6 and contract 4b): pure functions over aggregated usage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumeter.core.money import SECONDS_PER_HOUR, exact, format_money, format_quantity, round_money
from gpumeter.core.ratecard import Rate, RateCard, RateCardSet
from gpumeter.core.tenants import TenantPolicy
from pricing.rating import find_rate
from pricing.terms import credit_sources, credits_remaining, draw

ZERO = Decimal(0)
InvoiceStatus = Literal["draft", "final", "adjustment"]


@dataclass(frozen=True, order=True)
class LineKey:
    """One invoice line: (rate card version, kind, gpu_model, mig_profile, capacity_type)."""

    rate_card: str
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: str


@dataclass(frozen=True)
class UsageLine:
    """Σ unit-seconds of one tenant-month for one line key (deduplicated by event_id upstream)."""

    key: LineKey
    unit_seconds: Decimal


class InvoiceLine(BaseModel):
    model_config = ConfigDict(frozen=True)

    rate_card: str
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: str
    quantity: Decimal  # unit-hours, unrounded
    amount: Decimal  # rounded to cents

    @property
    def key(self) -> LineKey:
        return LineKey(self.rate_card, self.kind, self.gpu_model, self.mig_profile, self.capacity_type)


class Invoice(BaseModel):
    model_config = ConfigDict(frozen=True)

    tenant: str
    period: str
    currency: str
    status: InvoiceStatus
    lines: list[InvoiceLine]
    subtotal: Decimal
    commitment_true_up: Decimal
    credits: Decimal
    total: Decimal
    # Set once the invoice is issued (the ledger numbers it); None on drafts.
    number: str | None = None
    issued_at: datetime | None = None
    adjusts: str | None = None  # an adjustment's original: the number of the month's final
    # Credits applied, per source (the monthly allowance or a grant id); their sum is credits.
    credit_draws: dict[str, Decimal] = Field(default_factory=dict)
    # Σ balance of the tenant's credit grants still usable after this invoice.
    credits_remaining: Decimal = Decimal(0)

    def issued_document(self) -> dict[str, object]:
        """Contract 4b plus what an issued invoice carries: number, issue time, the original it
        adjusts, credits per source and credits remaining. The content hash covers exactly this."""
        issued_at = self.issued_at.isoformat(timespec="milliseconds") if self.issued_at else None
        draws = self.credit_draws
        return {
            **self.to_document(),
            "number": self.number,
            "issued_at": issued_at,
            "adjusts": self.adjusts,
            "credit_draws": {source: format_money(draws[source]) for source in sorted(draws)},
            "credits_remaining": format_money(self.credits_remaining),
        }

    def to_document(self) -> dict[str, object]:
        """The contract 4b JSON document: money with two decimals, quantities with six."""
        return {
            "tenant": self.tenant,
            "period": self.period,
            "currency": self.currency,
            "status": self.status,
            "lines": [
                {
                    "rate_card": line.rate_card,
                    "kind": line.kind,
                    "gpu_model": line.gpu_model,
                    "mig_profile": line.mig_profile,
                    "capacity_type": line.capacity_type,
                    "quantity": format_quantity(line.quantity),
                    "amount": format_money(line.amount),
                }
                for line in self.lines
            ],
            "subtotal": format_money(self.subtotal),
            "commitment_true_up": format_money(self.commitment_true_up),
            "credits": format_money(self.credits),
            "total": format_money(self.total),
        }


class InvoiceError(ValueError):
    """Usage that cannot be invoiced (e.g. a line whose rate card is gone)."""


def tiered_amount_seconds(rate: Rate, unit_seconds: Decimal) -> Decimal:
    """Σ over bands (unit-seconds in band x band price), bands filled in order.

    Working in unit-seconds keeps every step exact; the caller divides by 3600 once.
    """
    if not rate.tiers:
        return unit_seconds * rate.list_price
    total = ZERO
    lower = ZERO
    for tier in rate.tiers:
        upper = None if tier.up_to is None else tier.up_to * SECONDS_PER_HOUR
        if unit_seconds <= lower:
            break
        in_band = unit_seconds - lower if upper is None else min(unit_seconds, upper) - lower
        total += in_band * tier.unit_price
        if upper is None:
            break
        lower = upper
    return total


@dataclass(frozen=True)
class Band:
    """The part of a line's quantity in one tier band (lower, upper], and its price."""

    lower: Decimal
    upper: Decimal | None  # None: unbounded
    quantity: Decimal
    unit_price: Decimal


def bands(rate: Rate, quantity: Decimal) -> list[Band]:
    """The bands a line quantity (unit-hours) fills, in order; one open band for a flat rate.

    For display: the line amount stays the one computed (and rounded once) by line_amount.
    """
    if not rate.tiers:
        return [Band(ZERO, None, quantity, rate.list_price)]
    filled: list[Band] = []
    lower = ZERO
    for tier in rate.tiers:
        if quantity <= lower and filled:
            break
        top = quantity if tier.up_to is None else min(quantity, tier.up_to)
        filled.append(Band(lower, tier.up_to, max(top - lower, ZERO), tier.unit_price))
        if tier.up_to is None:
            break
        lower = tier.up_to
    return filled


def _card_and_rate(cards: RateCardSet, key: LineKey) -> tuple[RateCard, Rate]:
    """The card a line was rated with and its rate for the line, or InvoiceError."""
    try:
        card = cards.by_version(key.rate_card)
    except KeyError:
        raise InvoiceError(f"rate card {key.rate_card} is not loaded; cannot price {key}") from None
    rate = find_rate(card, key.kind, key.gpu_model, key.mig_profile)
    if rate is None:
        raise InvoiceError(f"rate card {key.rate_card} has no rate for {key}")
    return card, rate


def rate_of(cards: RateCardSet, key: LineKey) -> tuple[Rate, Decimal]:
    """The rate and capacity multiplier that price a line."""
    card, rate = _card_and_rate(cards, key)
    return rate, card.capacity_multipliers[key.capacity_type]


def line_amount(cards: RateCardSet, usage: UsageLine) -> tuple[Decimal, Decimal, str]:
    """(unit-hours, amount rounded to cents, currency) for one line."""
    card, rate = _card_and_rate(cards, usage.key)
    multiplier = card.capacity_multipliers[usage.key.capacity_type]
    with exact():
        quantity = usage.unit_seconds / SECONDS_PER_HOUR
        amount = tiered_amount_seconds(rate, usage.unit_seconds) * multiplier / SECONDS_PER_HOUR
        return quantity, round_money(amount), card.currency


def price_lines(
    usage: list[UsageLine], cards: RateCardSet, tenant: str, period: str, default_currency: str | None = None
) -> tuple[list[InvoiceLine], str]:
    """The priced lines of one tenant-month, sorted, and their one currency."""
    lines: list[InvoiceLine] = []
    currencies: set[str] = set()
    for item in sorted(usage, key=lambda u: _sort_key(u.key)):
        quantity, amount, currency = line_amount(cards, item)
        currencies.add(currency)
        key = item.key
        lines.append(
            InvoiceLine(
                rate_card=key.rate_card,
                kind=key.kind,
                gpu_model=key.gpu_model,
                mig_profile=key.mig_profile,
                capacity_type=key.capacity_type,
                quantity=quantity,
                amount=amount,
            )
        )
    if len(currencies) > 1:
        raise InvoiceError(f"{tenant} {period}: usage priced in several currencies {sorted(currencies)}")
    currency = currencies.pop() if currencies else (default_currency or cards.cards[-1].currency)
    return lines, currency


def true_up(subtotal: Decimal, policy: TenantPolicy | None, period: str) -> Decimal:
    """Contract 3, step 5: commitment - subtotal when the subtotal is below the month's commitment."""
    commitment = policy.commitment_in(period) if policy is not None else ZERO
    return round_money(commitment - subtotal) if subtotal < commitment else ZERO


def build_invoice(
    tenant: str,
    period: str,
    usage: list[UsageLine],
    cards: RateCardSet,
    policy: TenantPolicy | None,
    status: InvoiceStatus = "draft",
    default_currency: str | None = None,
) -> Invoice:
    """The invoice of one tenant and month from its aggregated usage lines, as if nothing had been
    issued before: credit grants at their full balance (the ledger prices with history instead).

    The credits figure is what was applied, so subtotal + true-up - credits = total holds on
    every invoice even when the tenant's credits exceed the bill.
    """
    lines, currency = price_lines(usage, cards, tenant, period, default_currency)
    subtotal = sum((line.amount for line in lines), ZERO)
    commitment_true_up = true_up(subtotal, policy, period)
    before_credits = subtotal + commitment_true_up
    draws = draw(before_credits, credit_sources(policy, period, {}, {}))
    credits = sum(draws.values(), ZERO)
    return Invoice(
        tenant=tenant,
        period=period,
        currency=currency,
        status=status,
        lines=lines,
        subtotal=subtotal,
        commitment_true_up=commitment_true_up,
        credits=credits,
        total=before_credits - credits,
        credit_draws=draws,
        credits_remaining=credits_remaining(policy, period, draws),
    )


def adjustment(current: Invoice, finalized: list[Invoice]) -> Invoice | None:
    """What a month's recomputed invoice adds to the invoices already finalized for it.

    A finalized invoice never changes (contract 3, step 6): late usage is billed as the
    difference per line, so tier bands continue where the finalized quantity stopped.
    None when nothing changed.
    """
    billed_quantity: dict[LineKey, Decimal] = {}
    billed_amount: dict[LineKey, Decimal] = {}
    for invoice in finalized:
        for line in invoice.lines:
            billed_quantity[line.key] = billed_quantity.get(line.key, ZERO) + line.quantity
            billed_amount[line.key] = billed_amount.get(line.key, ZERO) + line.amount
    lines = []
    for line in current.lines:
        quantity = line.quantity - billed_quantity.get(line.key, ZERO)
        amount = line.amount - billed_amount.get(line.key, ZERO)
        if quantity != 0 or amount != 0:
            lines.append(line.model_copy(update={"quantity": quantity, "amount": amount}))
    true_up = current.commitment_true_up - sum((i.commitment_true_up for i in finalized), ZERO)
    credits = current.credits - sum((i.credits for i in finalized), ZERO)
    total = current.total - sum((i.total for i in finalized), ZERO)
    if not lines and true_up == 0 and credits == 0 and total == 0:
        return None
    return Invoice(
        tenant=current.tenant,
        period=current.period,
        currency=current.currency,
        status="adjustment",
        lines=lines,
        subtotal=sum((line.amount for line in lines), ZERO),
        commitment_true_up=true_up,
        credits=credits,
        total=total,
    )


def _sort_key(key: LineKey) -> tuple[str, str, str, str, str]:
    return (key.rate_card, key.kind, key.gpu_model or "", key.mig_profile or "", key.capacity_type)
