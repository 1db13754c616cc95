"""Issuing invoices: read usage from ClickHouse, price it, export it, optionally finalize it."""

from __future__ import annotations

from pathlib import Path

from gpumeter import clickhouse
from gpumeter.ratecard import load_rate_cards
from gpumeter.settings import Settings
from gpumeter.tenants import load_tenants
from pricing import store
from pricing.exports import write_invoice
from pricing.invoice import Invoice, adjustment, build_invoice


def invoice_for(settings: Settings, tenant: str, period: str, finalize: bool = False) -> Invoice | None:
    """The invoice to hand out now for one tenant-month.

    Nothing finalized yet: the draft (or, with ``finalize``, the final invoice, stored).
    Finalized before: the adjustment for usage that arrived since (stored when finalizing),
    or the last finalized invoice unchanged when nothing arrived.
    """
    cards = load_rate_cards(settings.rate_cards)
    policy = load_tenants(settings.tenants).policy(tenant)
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        usage = store.usage_lines(client, tenant, period)
        current = build_invoice(tenant, period, usage, cards, policy,
                                status="final" if finalize else "draft")
        issued = store.finalized_invoices(client, tenant, period)
        if not issued:
            if finalize:
                store.record_final(client, current, seq=1)
            return current
        delta = adjustment(current, issued)
        if delta is None:
            return issued[-1]
        if finalize:
            store.record_final(client, delta, seq=len(issued) + 1)
        return delta
    finally:
        client.close()


def billable_tenants(settings: Settings, period: str) -> list[str]:
    """Tenants with usage in the period, plus tenants whose commitment bills them regardless."""
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        with_usage = set(store.tenants_with_usage(client, period))
    finally:
        client.close()
    committed = {t.tenant for t in load_tenants(settings.tenants).tenants if t.commitment}
    return sorted(with_usage | committed)


def issue_invoices(settings: Settings, period: str, tenant: str | None, fmt: str, out_dir: Path,
                   finalize: bool = False) -> list[Path]:
    tenants = [tenant] if tenant else billable_tenants(settings, period)
    written = []
    for name in tenants:
        invoice = invoice_for(settings, name, period, finalize=finalize)
        if invoice is not None:
            written.append(write_invoice(invoice, fmt, out_dir))
    return written
