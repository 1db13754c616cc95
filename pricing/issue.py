"""Issuing invoices: read usage from ClickHouse, price it, export it, optionally finalize it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clickhouse_connect.driver.client import Client

from gpumeter.core.ratecard import RateCardSet, load_rate_cards
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantsFile, load_tenants
from gpumeter.infra import clickhouse
from pricing import store
from pricing.exports import write_invoice
from pricing.invoice import Invoice, UsageLine, adjustment, build_invoice


@dataclass(frozen=True)
class Billing:
    """What every invoice of one run needs, loaded once."""

    cards: RateCardSet
    tenants: TenantsFile
    client: Client


@dataclass(frozen=True)
class MonthData:
    """A month's usage lines and issued invoices, per tenant, each read in one query."""

    usage: dict[str, list[UsageLine]]
    issued: dict[str, list[Invoice]]

    @classmethod
    def load(cls, client: Client, period: str, tenant: str | None = None) -> MonthData:
        return cls(store.usage_lines_by_tenant(client, period, tenant),
                   store.finalized_by_tenant(client, period, tenant))


@contextmanager
def billing(settings: Settings) -> Iterator[Billing]:
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        yield Billing(load_rate_cards(settings.rate_cards), load_tenants(settings.tenants), client)
    finally:
        client.close()


def invoice_for(context: Billing, tenant: str, period: str, finalize: bool = False,
                prefetched: MonthData | None = None) -> Invoice:
    """The invoice to hand out now for one tenant-month.

    Nothing finalized yet: the draft (or, with ``finalize``, the final invoice, stored).
    Finalized before: the adjustment for usage that arrived since (stored when finalizing),
    or the last invoice issued, unchanged, when nothing arrived.
    """
    month = prefetched or MonthData.load(context.client, period, tenant)
    usage = month.usage.get(tenant, [])
    current = build_invoice(tenant, period, usage, context.cards, context.tenants.policy(tenant),
                            status="final" if finalize else "draft")
    issued = month.issued.get(tenant, [])
    if not issued:
        if finalize:
            store.record_final(context.client, current, seq=1)
        return current
    delta = adjustment(current, issued)
    if delta is None:
        return issued[-1]
    if finalize:
        store.record_final(context.client, delta, seq=len(issued) + 1)
    return delta


def billable_tenants(context: Billing, period: str, month: MonthData | None = None) -> list[str]:
    """Tenants with usage in the period, plus tenants whose commitment bills them regardless."""
    if month is not None:
        with_usage = set(month.usage)
    else:
        with_usage = set(store.tenants_with_usage(context.client, period))
    committed = {t.tenant for t in context.tenants.tenants if t.commitment}
    return sorted(with_usage | committed)


def issue_invoices(settings: Settings, period: str, tenant: str | None, fmt: str, out_dir: Path,
                   finalize: bool = False) -> list[Path]:
    with billing(settings) as context:
        month = MonthData.load(context.client, period, tenant)
        tenants = [tenant] if tenant else billable_tenants(context, period, month)
        invoices = [invoice_for(context, name, period, finalize, prefetched=month) for name in tenants]
        return [write_invoice(invoice, fmt, out_dir) for invoice in invoices]
