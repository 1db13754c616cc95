"""The invoice ledger's rules (contract 3, step 6): what to issue next, its number, its hashes.

Pure: the store (pricing/ledger_store.py) reads the ledger into a ``LedgerView`` and claims
positions; everything decided here is a function of that view.

- Every issued invoice has a global position ``seq`` (1, 2, 3, ... without gaps) and a number
  ``GM-<year>-<nnnnnn>`` counted per year without gaps. Both come from the rows a closer has
  seen: it claims position k only after seeing positions 1..k-1, so the k-th invoice's
  number is fixed by the k-1 before it.
- The content hash is SHA-256 of the canonical JSON of the issued document (keys sorted, no
  spaces, UTF-8); the chain hash is SHA-256(previous chain hash + content hash), so changing
  any stored invoice, even together with its own hash, breaks every later link.
- A tenant-month has at most one final; usage that arrives after it is issued as numbered
  adjustments that reference the final, each the difference per line, so tier bands continue
  where the issued quantity stopped. Credit grants are drawn down in issue order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpumeter.core.money import exact
from gpumeter.core.ratecard import RateCardSet
from gpumeter.core.tenants import TenantPolicy
from pricing.invoice import ZERO, Invoice, InvoiceLine, LineKey, UsageLine, price_lines, true_up
from pricing.terms import credit_sources, credits_remaining, draw, release

NUMBER_PREFIX = "GM"


class LedgerError(RuntimeError):
    """The stored ledger breaks its own rules (a gap, a doubly claimed position, a bad hash)."""


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The bytes the content hash covers: sorted keys, no whitespace, UTF-8.

    Every value of an invoice document is a string, null, list or object (money and quantities
    are strings), so the form is unambiguous for any verifier.
    """
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chain_hash(previous_chain: str, content_sha256: str) -> str:
    return sha256_hex(f"{previous_chain}:{content_sha256}".encode("ascii"))


def invoice_number(year: int, year_seq: int) -> str:
    return f"{NUMBER_PREFIX}-{year:04d}-{year_seq:06d}"


def month_has_ended(period: str, now: datetime) -> bool:
    """True from the first instant (UTC) of the month after ``period``."""
    year, month = (int(part) for part in period.split("-"))
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return now >= following


@dataclass(frozen=True)
class Entry:
    """One ledger row: an issued invoice at its position."""

    seq: int
    year: int
    year_seq: int
    invoice: Invoice  # number, issued_at, adjusts and credit draws set
    document: str  # canonical JSON of invoice.issued_document(), as stored
    content_sha256: str
    chain_sha256: str
    claim: str  # who wrote it: one close run's id
    # Unrounded line quantities (the document carries six places): adjustments need exact deltas.
    exact_quantities: tuple[Decimal, ...]

    @property
    def number(self) -> str:
        return invoice_number(self.year, self.year_seq)


@dataclass
class LedgerView:
    """What a closer knows of the ledger: its tail, the per-year counters, the issued invoices of
    the tenant-months it may issue for, and every tenant's credit drawn per source."""

    last_seq: int = 0
    last_chain: str = ""
    last_year: int = 0
    year_counts: dict[int, int] = field(default_factory=dict)
    issued: dict[tuple[str, str], list[Entry]] = field(default_factory=dict)
    drawn: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    periods: frozenset[str] | None = None  # None: every period's invoices are kept
    readonly: bool = False  # read without tail and counters: cannot number an invoice

    def copy(self) -> LedgerView:
        """A view to extend with a batch of invoices before they are claimed."""
        return LedgerView(
            last_seq=self.last_seq, last_chain=self.last_chain, last_year=self.last_year,
            year_counts=dict(self.year_counts), issued={k: list(v) for k, v in self.issued.items()},
            drawn={k: dict(v) for k, v in self.drawn.items()}, periods=self.periods, readonly=self.readonly,
        )

    def add(self, entry: Entry) -> None:
        """Fold the row at position last_seq + 1 into the view."""
        if entry.seq != self.last_seq + 1:
            raise LedgerError(f"ledger position {entry.seq} follows {self.last_seq}: a gap")
        if entry.year_seq != self.year_counts.get(entry.year, 0) + 1:
            raise LedgerError(f"{entry.number} at position {entry.seq} skips or repeats a number")
        self.last_seq, self.last_chain = entry.seq, entry.chain_sha256
        self.last_year = max(self.last_year, entry.year)
        self.year_counts[entry.year] = entry.year_seq
        invoice = entry.invoice
        if self.periods is None or invoice.period in self.periods:
            self.issued.setdefault((invoice.tenant, invoice.period), []).append(entry)
        self.note_draws(invoice.tenant, invoice.credit_draws)

    def note_draws(self, tenant: str, draws: Mapping[str, Decimal]) -> None:
        drawn = self.drawn.setdefault(tenant, {})
        for source, amount in draws.items():
            drawn[source] = drawn.get(source, ZERO) + amount

    def issued_for(self, tenant: str, period: str) -> list[Entry]:
        return self.issued.get((tenant, period), [])


def next_invoice(
    tenant: str, period: str, usage: list[UsageLine], cards: RateCardSet, policy: TenantPolicy | None,
    view: LedgerView, issuing: bool,
) -> Invoice | None:
    """The invoice to issue now for a tenant-month, or None when everything is issued already.

    Nothing issued yet: the month in full (status final, or draft when not ``issuing``).
    Issued before: the difference between the month in full and everything issued for it
    (status adjustment), referencing the final; credits drawn only for the added amount.
    """
    issued = [entry.invoice for entry in view.issued_for(tenant, period)]
    lines, currency = price_lines(usage, cards, tenant, period)
    subtotal = sum((line.amount for line in lines), ZERO)
    month_true_up = true_up(subtotal, policy, period)
    issued_draws: dict[str, Decimal] = {}
    for invoice in issued:
        for source, amount in invoice.credit_draws.items():
            issued_draws[source] = issued_draws.get(source, ZERO) + amount
    delta_lines = _line_deltas(lines, issued)
    delta_true_up = month_true_up - sum((i.commitment_true_up for i in issued), ZERO)
    before_credits = subtotal + month_true_up
    delta_before = before_credits - sum((i.subtotal + i.commitment_true_up for i in issued), ZERO)
    drawn = view.drawn.get(tenant, {})
    sources = credit_sources(policy, period, drawn, issued_draws)
    if delta_before >= 0:
        draws = draw(delta_before, sources)
    else:  # the month's bill shrank: credits may exceed it now, so give the excess back
        draws = release(sum(issued_draws.values(), ZERO) - before_credits, issued_draws, sources)
    credits = sum(draws.values(), ZERO)
    if issued and not delta_lines and delta_true_up == 0 and credits == 0 and delta_before == 0:
        return None
    after = dict(drawn)
    for source, amount in draws.items():
        after[source] = after.get(source, ZERO) + amount
    delta_subtotal = sum((line.amount for line in delta_lines), ZERO)
    return Invoice(
        tenant=tenant,
        period=period,
        currency=currency,
        status="adjustment" if issued else ("final" if issuing else "draft"),
        lines=delta_lines,
        subtotal=delta_subtotal,
        commitment_true_up=delta_true_up,
        credits=credits,
        total=delta_subtotal + delta_true_up - credits,
        adjusts=view.issued_for(tenant, period)[0].number if issued else None,
        credit_draws=draws,
        credits_remaining=credits_remaining(policy, period, after),
    )


def _line_deltas(lines: list[InvoiceLine], issued: Iterable[Invoice]) -> list[InvoiceLine]:
    # Quantities carry 60 significant digits (unit-seconds / 3600 does not terminate), so the sum of
    # what was issued can miss the month's quantity in the last digits (a residue near 1e-55, and
    # far more in the default 28-digit context); without rounding it off, every later close would
    # issue a 0.00 adjustment for it (seen after `rerate` moved quantities between lines).
    with exact():
        return _deltas(lines, issued)


def _deltas(lines: list[InvoiceLine], issued: Iterable[Invoice]) -> list[InvoiceLine]:
    billed_quantity: dict[LineKey, Decimal] = {}
    billed_amount: dict[LineKey, Decimal] = {}
    for invoice in issued:
        for line in invoice.lines:
            billed_quantity[line.key] = billed_quantity.get(line.key, ZERO) + line.quantity
            billed_amount[line.key] = billed_amount.get(line.key, ZERO) + line.amount
    deltas = []
    for line in lines:
        quantity = _denoised(line.quantity - billed_quantity.pop(line.key, ZERO))
        amount = line.amount - billed_amount.pop(line.key, ZERO)
        if quantity != 0 or amount != 0:
            deltas.append(line.model_copy(update={"quantity": quantity, "amount": amount}))
    # A line billed before with no usage now (only when stored usage shrank): billed back.
    # Sorted as invoice lines are (a None gpu_model does not compare with a name).
    for key in sorted(billed_quantity, key=lambda k: (k.rate_card, k.kind, k.gpu_model or "",
                                                      k.mig_profile or "", k.capacity_type)):
        quantity = _denoised(billed_quantity[key])
        if quantity != 0 or billed_amount[key] != 0:
            deltas.append(InvoiceLine(rate_card=key.rate_card, kind=key.kind, gpu_model=key.gpu_model,
                                      mig_profile=key.mig_profile, capacity_type=key.capacity_type,
                                      quantity=-quantity, amount=-billed_amount[key]))
    return deltas


# Far below any real quantity difference (unit_seconds has 21 places: 1e-21 / 3600 unit-hours),
# far above the residue of 60-digit arithmetic on quantities below 1e12 unit-hours.
QUANTITY_NOISE = Decimal("1e-40")


def _denoised(quantity: Decimal) -> Decimal:
    return ZERO if abs(quantity) < QUANTITY_NOISE else quantity


def entry_for(invoice: Invoice, view: LedgerView, claim: str, now: datetime) -> Entry:
    """The ledger row that issues ``invoice`` at the next position of ``view``.

    The year of the number never goes back, even if this machine's clock is behind the one
    that wrote the last row.
    """
    if view.readonly:
        raise LedgerError("a read-only ledger view cannot number an invoice")
    year = max(now.year, view.last_year)
    year_seq = view.year_counts.get(year, 0) + 1
    issued = invoice.model_copy(update={"number": invoice_number(year, year_seq), "issued_at": now})
    document = canonical_json(issued.issued_document()).decode("utf-8")
    content = sha256_hex(document.encode("utf-8"))
    return Entry(
        seq=view.last_seq + 1, year=year, year_seq=year_seq, invoice=issued, document=document,
        content_sha256=content, chain_sha256=chain_hash(view.last_chain, content), claim=claim,
        exact_quantities=tuple(line.quantity for line in issued.lines),
    )
