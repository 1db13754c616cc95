"""Where invoices meet ClickHouse: a month's usage lines in; the pricing schema (the invoice
ledger itself is in pricing/ledger_store.py)."""

from __future__ import annotations

from decimal import Decimal

from clickhouse_connect.driver.client import Client

from gpumeter.infra.clickhouse import to_decimal
from gpumeter.infra.tables import Column, Migration, SchemaOwner, Table
from pricing.invoice import LineKey, UsageLine
from pricing.ledger_store import LEDGER_CURRENT, LEDGER_MIGRATION

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
    owner="pricing",
    migrations=(
        # Superseded by the ledger (migration 2): kept, never read, so old databases still migrate.
        Migration(1, "finalized invoices", (INVOICES.create_sql(),)),
        LEDGER_MIGRATION,
    ),
    current=(INVOICES, LEDGER_CURRENT),
)


def usage_lines(client: Client, tenant: str, period: str) -> list[UsageLine]:
    """Σ unit-seconds per invoice line for one tenant-month, each event_id once (FINAL)."""
    return usage_lines_by_tenant(client, period, tenant).get(tenant, [])


def usage_lines_by_tenant(
    client: Client, period: str, tenant: str | list[str] | None = None
) -> dict[str, list[UsageLine]]:
    """Every tenant's invoice lines of a month in one aggregate query (or one tenant's, or those
    of a list of tenants)."""
    where = "period = %(period)s"
    if isinstance(tenant, list):
        where += " AND tenant IN %(tenant)s"
    elif tenant is not None:
        where += " AND tenant = %(tenant)s"
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


def usage_to_date(
    client: Client, tenant: str, period: str
) -> list[tuple[LineKey, Decimal, Decimal, str, int]]:
    """The real-time view of one tenant-month: per line, (key, Σ unit-seconds, Σ streaming list
    cost, currency, samples), each event_id once."""
    rows = client.query(
        "SELECT rate_card, kind, gpu_model, mig_profile, capacity_type, sum(unit_seconds), sum(list_cost), "
        "any(currency), count() FROM rated_usage FINAL WHERE tenant = %(tenant)s AND period = %(period)s "
        "GROUP BY rate_card, kind, gpu_model, mig_profile, capacity_type "
        "ORDER BY rate_card, kind, gpu_model, mig_profile, capacity_type",
        parameters={"tenant": tenant, "period": period},
    ).result_rows
    return [(LineKey(str(r[0]), str(r[1]), r[2], r[3], str(r[4])), to_decimal(r[5]), to_decimal(r[6]),
             str(r[7]), int(r[8])) for r in rows]
