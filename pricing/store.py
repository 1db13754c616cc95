"""Where invoices meet ClickHouse: usage lines in, finalized invoices in and out."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from gpumeter.core import jsonio
from gpumeter.infra.clickhouse import to_decimal
from gpumeter.infra.tables import Column, Migration, SchemaOwner, Table
from pricing.invoice import Invoice, InvoiceLine, LineKey, UsageLine

INVOICES = Table(
    name="invoices",
    columns=(
        Column("tenant", "LowCardinality(String)"),
        Column("period", "LowCardinality(String)"),
        Column("seq", "UInt32"),
        Column("status", "LowCardinality(String)"),
        Column("document", "String"),
        # Unrounded line quantities, so an adjustment's deltas are exact.
        Column("exact_quantities", "String"),
        Column("finalized_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="MergeTree",
    order_by="(tenant, period, seq)",
)

PRICING = SchemaOwner(
    owner="pricing", migrations=(Migration(1, "finalized invoices", (INVOICES.create_sql(),)),)
)


def usage_lines(client: Client, tenant: str, period: str) -> list[UsageLine]:
    """Σ unit-seconds per invoice line for one tenant-month, each event_id once (FINAL)."""
    return usage_lines_by_tenant(client, period, tenant).get(tenant, [])


def usage_lines_by_tenant(
    client: Client, period: str, tenant: str | None = None
) -> dict[str, list[UsageLine]]:
    """Every tenant's invoice lines of a month in one aggregate query (or one tenant's)."""
    where = "period = %(period)s" + (" AND tenant = %(tenant)s" if tenant is not None else "")
    rows = client.query(
        "SELECT tenant, rate_card, kind, gpu_model, mig_profile, capacity_type, sum(unit_seconds) "
        f"FROM rated_usage FINAL WHERE {where} "
        "GROUP BY tenant, rate_card, kind, gpu_model, mig_profile, capacity_type",
        parameters={"tenant": tenant, "period": period},
    ).result_rows
    lines: dict[str, list[UsageLine]] = {}
    for r in rows:
        lines.setdefault(str(r[0]), []).append(
            UsageLine(LineKey(str(r[1]), str(r[2]), r[3], r[4], str(r[5])), to_decimal(r[6])))
    return lines


def tenants_with_usage(client: Client, period: str) -> list[str]:
    rows = client.query(
        "SELECT DISTINCT tenant FROM rated_usage WHERE period = %(period)s ORDER BY tenant",
        parameters={"period": period},
    ).result_rows
    return [str(row[0]) for row in rows]


def finalized_invoices(client: Client, tenant: str, period: str) -> list[Invoice]:
    return finalized_by_tenant(client, period, tenant).get(tenant, [])


def finalized_by_tenant(client: Client, period: str, tenant: str | None = None) -> dict[str, list[Invoice]]:
    """Issued invoices of a month per tenant, in issue order (one query)."""
    where = "period = %(period)s" + (" AND tenant = %(tenant)s" if tenant is not None else "")
    rows = client.query(
        f"SELECT tenant, document, exact_quantities FROM invoices WHERE {where} ORDER BY tenant, seq",
        parameters={"tenant": tenant, "period": period},
    ).result_rows
    issued: dict[str, list[Invoice]] = {}
    for row in rows:
        document, quantities = jsonio.loads(row[1]), jsonio.loads(row[2])
        issued.setdefault(str(row[0]), []).append(invoice_from_document(document, quantities))
    return issued


def record_final(client: Client, invoice: Invoice, seq: int) -> None:
    """Store an invoice as issued; it is never changed afterwards."""
    row = INVOICES.row_from({
        "tenant": invoice.tenant, "period": invoice.period, "seq": seq, "status": invoice.status,
        "document": jsonio.dumps(invoice.to_document()),
        "exact_quantities": jsonio.dumps([str(line.quantity) for line in invoice.lines]),
    })
    client.insert(INVOICES.name, [row], column_names=list(INVOICES.insert_columns))


def invoice_from_document(document: dict[str, Any], exact_quantities: list[str]) -> Invoice:
    """Read back a stored invoice: its contract-4b document and its unrounded quantities."""
    lines = [
        InvoiceLine(
            rate_card=line["rate_card"], kind=line["kind"], gpu_model=line["gpu_model"],
            mig_profile=line["mig_profile"], capacity_type=line["capacity_type"],
            quantity=Decimal(quantity), amount=Decimal(line["amount"]),
        )
        for line, quantity in zip(document["lines"], exact_quantities, strict=True)
    ]
    return Invoice(
        tenant=str(document["tenant"]), period=str(document["period"]),
        currency=str(document["currency"]), status=document["status"],
        lines=lines, subtotal=Decimal(str(document["subtotal"])),
        commitment_true_up=Decimal(str(document["commitment_true_up"])),
        credits=Decimal(str(document["credits"])), total=Decimal(str(document["total"])),
    )
