"""Invoices (contract 3, steps 4-6 and contract 4b): pure functions over aggregated usage."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpumeter.core.money import SECONDS_PER_HOUR, exact, format_money, format_quantity, round_money
from gpumeter.core.ratecard import Rate, RateCardSet
from gpumeter.core.tenants import TenantPolicy
from pricing.rating import find_rate

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


def line_amount(cards: RateCardSet, usage: UsageLine) -> tuple[Decimal, Decimal, str]:
    """(unit-hours, amount rounded to cents, currency) for one line."""
    key = usage.key
    try:
        card = cards.by_version(key.rate_card)
    except KeyError:
        raise InvoiceError(f"rate card {key.rate_card} is not loaded; cannot price {key}") from None
    rate = find_rate(card, key.kind, key.gpu_model, key.mig_profile)
    if rate is None:
        raise InvoiceError(f"rate card {key.rate_card} has no rate for {key}")
    multiplier = card.capacity_multipliers[key.capacity_type]
    with exact():
        quantity = usage.unit_seconds / SECONDS_PER_HOUR
        amount = tiered_amount_seconds(rate, usage.unit_seconds) * multiplier / SECONDS_PER_HOUR
        return quantity, round_money(amount), card.currency


def build_invoice(
    tenant: str,
    period: str,
    usage: list[UsageLine],
    cards: RateCardSet,
    policy: TenantPolicy | None,
    status: InvoiceStatus = "draft",
    default_currency: str | None = None,
) -> Invoice:
    """The invoice of one tenant and month from its aggregated usage lines."""
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
    subtotal = sum((line.amount for line in lines), ZERO)
    true_up, credits, total = settle(subtotal, policy)
    return Invoice(
        tenant=tenant,
        period=period,
        currency=currency,
        status=status,
        lines=lines,
        subtotal=subtotal,
        commitment_true_up=true_up,
        credits=credits,
        total=total,
    )


def settle(subtotal: Decimal, policy: TenantPolicy | None) -> tuple[Decimal, Decimal, Decimal]:
    """(commitment true-up, credits applied, total) per contract 3, step 5.

    The credits figure is what was applied, so subtotal + true-up - credits = total
    holds on every invoice even when the tenant's credits exceed the bill.
    """
    commitment = policy.commitment if policy and policy.commitment is not None else ZERO
    available = policy.credits if policy and policy.credits is not None else ZERO
    true_up = round_money(commitment - subtotal) if subtotal < commitment else ZERO
    before_credits = subtotal + true_up
    applied = round_money(min(available, before_credits))
    return true_up, applied, before_credits - applied


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
