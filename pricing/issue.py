"""Issuing invoices: read usage and the ledger from ClickHouse, price, number, store, export.

Drafts can be produced any time. Issuing (closing a month, or ``--finalize``) is refused for a
month that has not ended, and goes through the ledger: each invoice claims the next ledger
position (pricing/ledger_store.py); a closer that loses a position to a concurrent closer
folds the winner's row into its view and decides again, so two closes at once produce one set
of invoices.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.client import Client

from gpumeter.core.ratecard import RateCardSet, load_rate_cards
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantsFile, load_tenants
from gpumeter.infra import clickhouse
from pricing import ledger_store, store
from pricing.exports import Paper, write_invoice
from pricing.invoice import Invoice, UsageLine
from pricing.ledger import Entry, LedgerView, entry_for, month_has_ended, next_invoice

# Invoices per claim: one insert of up to this many rows (a few KiB each).
CLAIM_BATCH = 200


class MonthOpen(ValueError):
    """Issuing an invoice for a month that has not ended."""


@dataclass(frozen=True)
class Billing:
    """What every invoice of one run needs, loaded once."""

    cards: RateCardSet
    tenants: TenantsFile
    client: Client
    seller: tuple[str, ...] = ()  # the PDF's seller block


@dataclass
class MonthData:
    """A month's usage lines per tenant and the ledger as far as it concerns the month.

    The ledger is read before the usage: every invoice in the view was priced from usage read
    before it was stored, so the usage read here covers it (usage only grows).
    """

    usage: dict[str, list[UsageLine]]
    ledger: LedgerView = field(default_factory=LedgerView)

    @classmethod
    def load(cls, client: Client, period: str, tenant: str | None = None,
             for_issuing: bool = False) -> MonthData:
        ledger = ledger_store.load_view(client, {period}, tenant, for_issuing)
        return cls(store.usage_lines_by_tenant(client, period, tenant), ledger)


@contextmanager
def billing(settings: Settings, batch: bool = False) -> Iterator[Billing]:
    """What a run needs; ``batch`` for the commands that read a whole month in one statement (its
    client waits past the interactive timeout: clickhouse.BATCH_RECEIVE_TIMEOUT_S)."""
    client = clickhouse.connect(settings.clickhouse.connection_dsn(), batch=batch)
    try:
        seller = tuple(line.strip() for line in settings.invoices.seller.split("|") if line.strip())
        yield Billing(load_rate_cards(settings.rate_cards), load_tenants(settings.tenants), client, seller)
    finally:
        client.close()


def invoice_for(context: Billing, tenant: str, period: str, finalize: bool = False,
                prefetched: MonthData | None = None) -> Invoice:
    """The invoice to hand out now for one tenant-month.

    Nothing issued yet: the draft. Issued before: the adjustment pending for usage that
    arrived since (unnumbered), or the last invoice issued when nothing arrived. With
    ``finalize`` the pending invoice is issued (numbered and stored) first.
    """
    if finalize:
        issued = close(context, period, [tenant])
        if issued:
            return issued[-1].invoice
    month = prefetched or MonthData.load(context.client, period, tenant)
    pending = next_invoice(tenant, period, month.usage.get(tenant, []), context.cards,
                           context.tenants.policy(tenant), month.ledger, issuing=False)
    if pending is not None:
        return pending
    return month.ledger.issued_for(tenant, period)[-1].invoice


def billable_tenants(context: Billing, period: str, month: MonthData | None = None) -> list[str]:
    """Tenants with usage in the period, tenants whose commitment binds the period, and tenants
    already invoiced for it."""
    if month is not None:
        with_usage = set(month.usage) | {tenant for tenant, _ in month.ledger.issued}
    else:
        with_usage = set(store.tenants_with_usage(context.client, period))
    committed = {t.tenant for t in context.tenants.tenants if t.commitment_in(period) > 0}
    return sorted(with_usage | committed)


def close(context: Billing, period: str, tenants: list[str] | None = None,
          now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> list[Entry]:
    """Issue every invoice due for ``period`` (every billable tenant, or ``tenants``): a final
    where none was issued, an adjustment where usage arrived since. Returns what this call
    issued, in ledger order; invoices a concurrent close issued are not repeated.

    Invoices are claimed in batches of consecutive positions (one insert, one token): a batch
    lost to another closer is decided again after folding in what that closer issued, on usage
    re-read for the tenants it invoiced.
    """
    if not month_has_ended(period, now()):
        raise MonthOpen(f"{period} has not ended yet: a month is closed once it is over "
                        "(drafts are available any time without --finalize)")
    single = tenants[0] if tenants is not None and len(tenants) == 1 else None
    month = MonthData.load(context.client, period, single, for_issuing=True)
    pending = tenants if tenants is not None else billable_tenants(context, period, month)
    run = uuid.uuid4().hex
    issued: list[Entry] = []
    while pending:
        considered = pending[:CLAIM_BATCH]
        batch = _batch(context, month, considered, period, run, now())
        if batch:
            holders = ledger_store.claim(context.client, batch)
            if holders[0].claim != run:
                # Another closer took these positions: learn everything issued since the view's
                # tail, then decide again on usage read after that.
                folded = ledger_store.catch_up(context.client, month.ledger)
                invoiced = sorted({entry.invoice.tenant for entry in folded})
                fresh = store.usage_lines_by_tenant(context.client, period, invoiced)
                month.usage.update({tenant: fresh.get(tenant, []) for tenant in invoiced})
                continue
            for entry in holders[:len(batch)]:
                month.ledger.add(entry)
            issued += holders[:len(batch)]
        pending = pending[len(considered):]
    return issued


def _batch(context: Billing, month: MonthData, tenants: list[str], period: str, run: str,
           moment: datetime) -> list[Entry]:
    """The invoices due for ``tenants`` as ledger rows at the positions after the view's tail."""
    scratch = month.ledger.copy()
    batch = []
    for tenant in tenants:
        invoice = next_invoice(tenant, period, month.usage.get(tenant, []), context.cards,
                               context.tenants.policy(tenant), scratch, issuing=True)
        if invoice is not None:
            entry = entry_for(invoice, scratch, run, moment)
            scratch.add(entry)
            batch.append(entry)
    return batch


def issue_invoices(settings: Settings, period: str, tenant: str | None, fmt: str, out_dir: Path,
                   finalize: bool = False, paper: Paper = "A4") -> list[Path]:
    """`gpumeter invoice`: each tenant's invoice to hand out now, written to ``out_dir``."""
    with billing(settings, batch=True) as context:
        if finalize:
            close(context, period, [tenant] if tenant else None)
        month = MonthData.load(context.client, period, tenant)
        tenants = [tenant] if tenant else billable_tenants(context, period, month)
        invoices = [invoice_for(context, name, period, prefetched=month) for name in tenants]
        return [write_invoice(invoice, fmt, out_dir, context.cards, paper, context.seller)
                for invoice in invoices]


def close_month(settings: Settings, period: str, fmt: str, out_dir: Path,
                paper: Paper = "A4") -> list[tuple[Entry, Path]]:
    """`gpumeter invoice close`: issue the month's invoices and write each one issued now."""
    with billing(settings, batch=True) as context:
        return [(entry, write_invoice(entry.invoice, fmt, out_dir, context.cards, paper, context.seller))
                for entry in close(context, period)]
