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


# The rollup (gpumeter/infra/schema.py USAGE_HOURLY): one row per tenant-hour-line, fed by a
# materialized view from every insert into rated_usage, so a month's draft and its
# month-to-date usage read ~720 rows per line instead of every sample. It stores a missing
# gpu_model or mig_profile as '' (a sort-key column cannot be Nullable): read back as None.
# It sums what was inserted: an exact duplicate that two racing sinks both stored (folded by
# rated_usage FINAL) counts twice here, which is why closing a month reads rated_usage FINAL.
def rollup_lines_by_tenant(
    client: Client, period: str, tenant: str | None = None
) -> dict[str, list[UsageLine]]:
    """Every tenant's (or one tenant's) invoice lines of a month from the hourly rollup."""
    return {name: [UsageLine(key, seconds) for key, seconds, *_ in lines]
            for name, lines in _rollup(client, period, tenant).items()}


def rollup_usage_to_date(
    client: Client, tenant: str, period: str
) -> list[tuple[LineKey, Decimal, Decimal, int]]:
    """The real-time view of one tenant-month from the hourly rollup: per line, (key,
    Σ unit-seconds, Σ streaming list cost, samples), in line order."""
    return _rollup(client, period, tenant).get(tenant, [])


def _rollup(client: Client, period: str,
            tenant: str | None) -> dict[str, list[tuple[LineKey, Decimal, Decimal, int]]]:
    where = "period = %(period)s" + ("" if tenant is None else " AND tenant = %(tenant)s")
    rows = client.query(
        "SELECT tenant, rate_card, kind, gpu_model, mig_profile, capacity_type, sum(unit_seconds), "
        f"sum(list_cost), sum(samples) FROM usage_hourly WHERE {where} "
        "GROUP BY tenant, rate_card, kind, gpu_model, mig_profile, capacity_type "
        # rerate's compensation rows can leave a line at zero: no usage, no line.
        "HAVING sum(samples) != 0 OR sum(unit_seconds) != 0",
        parameters={"tenant": tenant, "period": period},
    ).result_rows
    lines: dict[str, list[tuple[LineKey, Decimal, Decimal, int]]] = {}
    for r in rows:
        key = LineKey(str(r[1]), str(r[2]), str(r[3]) or None, str(r[4]) or None, str(r[5]))
        lines.setdefault(str(r[0]), []).append((key, to_decimal(r[6]), to_decimal(r[7]), int(r[8])))
    for tenant_lines in lines.values():
        tenant_lines.sort(key=lambda line: _line_order(line[0]))
    return lines


def _line_order(key: LineKey) -> tuple[str, str, bool, str, bool, str, str]:
    """ORDER BY rate_card, kind, gpu_model, mig_profile, capacity_type over rated_usage, whose
    missing gpu_model and mig_profile sort last (NULLS LAST)."""
    return (key.rate_card, key.kind, key.gpu_model is None, key.gpu_model or "", key.mig_profile is None,
            key.mig_profile or "", key.capacity_type)
