"""The invoice ledger in ClickHouse: one row per issued invoice, positions claimed without a lock
server.

ClickHouse has no transactions, so two closers are kept apart by insert deduplication
(gpumeter/infra/claims.py): the row for position k is inserted with
``insert_deduplication_token = gpumeter-ledger-<k>`` into a MergeTree that remembers recent
tokens (``non_replicated_deduplication_window``; a replicated table deduplicates through Keeper
the same way), so of two inserts for one position exactly one lands. Each closer reads position
k back and knows whether its row won. The window (10,000 inserts) only has to cover the inserts
between the free-position check and the insert; a position claimed twice anyway is reported as
a ledger error, never resolved silently (plain MergeTree: nothing is merged away).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from gpumeter.core import jsonio
from gpumeter.infra import claims
from gpumeter.infra.tables import Column, Migration, Table
from pricing.invoice import Invoice, InvoiceLine
from pricing.ledger import Entry, LedgerError, LedgerView

DEDUP_WINDOW = 10_000

LEDGER = Table(
    name="invoice_ledger",
    columns=(
        Column("seq", "UInt64", comment="global position, 1, 2, 3, ... without gaps"),
        Column("year", "UInt16"),
        Column("year_seq", "UInt32", comment="number within the year: GM-<year>-<year_seq>"),
        Column("number", "String"),
        Column("tenant", "LowCardinality(String)"),
        Column("period", "LowCardinality(String)"),
        Column("status", "LowCardinality(String)", comment="final | adjustment"),
        Column("adjusts", "String", comment="an adjustment's final; empty for a final"),
        Column("document", "String", comment="canonical JSON of the issued invoice"),
        Column("content_sha256", "String"),
        Column("chain_sha256", "String", comment="sha256(previous chain_sha256 ':' content_sha256)"),
        Column("exact_quantities", "String", comment="unrounded line quantities, JSON list"),
        Column("credit_draws", "String", comment="credits applied per source, JSON object"),
        Column("claim", "String", comment="the close run that wrote the row"),
        Column("issued_at", "DateTime64(3, 'UTC')"),
        Column("inserted_at", "DateTime64(3, 'UTC')", default="now64(3)"),
    ),
    engine="MergeTree",
    order_by="seq",
)

LEDGER_MIGRATION = Migration(
    2, "numbered invoice ledger",
    (LEDGER.create_sql() + f"\nSETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}",),
)

# The ledger as migration 2 left it; never sharded: one replica set on a cluster (contract 9).
LEDGER_CURRENT = replace(LEDGER, dedup_window=DEDUP_WINDOW)

_COLUMNS = ", ".join(LEDGER.insert_columns)


def claim(client: Client, batch: Sequence[Entry]) -> list[Entry]:
    """Insert ``batch`` (consecutive positions from the view's tail + 1, one closer's) as one
    block; return the rows that hold those positions afterwards, in order: ``batch`` itself
    when this insert won, the other closer's rows when it lost.

    One block is all or nothing and its token is its first position, so every landed block
    starts right after another ends, and a block from a stale view carries the token of the
    block that already took its first position: deduplicated.
    """
    first = batch[0].seq
    if [entry.seq for entry in batch] != list(range(first, first + len(batch))):
        raise LedgerError("a claim is a run of consecutive positions")
    # A position already taken is not inserted at all: deduplication only remembers the last
    # DEDUP_WINDOW tokens, and a closer whose view went stale meanwhile must not rely on it.
    taken = claims.claim(client, LEDGER, [row_of(entry) for entry in batch], f"gpumeter-ledger-{first}",
                         lambda: _entries(client, "seq >= %(first)s", {"first": first}))
    positions = [entry.seq for entry in taken]
    if len(set(positions)) != len(positions) or positions[:1] != [first]:
        raise LedgerError(f"ledger positions from {first} are not held once each: {positions[:10]}")
    return taken


def load_view(client: Client, periods: set[str] | None, tenant: str | None = None,
              for_issuing: bool = True) -> LedgerView:
    """The ledger as far as it concerns ``periods`` (None: every period) and ``tenant`` (None:
    every tenant): their issued invoices and the credit each tenant drew.

    ``for_issuing`` also reads the tail and the per-year counters (a consistent snapshot up to
    the tail) that numbering needs; without it the view only reads, in one query for a tenant.
    """
    view = LedgerView(periods=frozenset(periods) if periods is not None else None, readonly=not for_issuing)
    bound, parameters = "1", dict[str, Any]()
    if for_issuing:
        tail = client.query(f"SELECT seq, chain_sha256 FROM {LEDGER.name} ORDER BY seq DESC LIMIT 1"
                            ).result_rows
        if not tail:
            return view
        view.last_seq, view.last_chain = int(tail[0][0]), str(tail[0][1])
        bound, parameters["upto"] = "seq <= %(upto)s", view.last_seq
        counts = client.query(f"SELECT year, max(year_seq), count() FROM {LEDGER.name} WHERE {bound} "
                              "GROUP BY year", parameters=parameters).result_rows
        for year, top, count in counts:
            if int(top) != int(count):
                raise LedgerError(f"the numbers of {year} have a gap or a repeat "
                                  f"({count} invoices, last {top})")
            view.year_counts[int(year)] = int(top)
        view.last_year = max(view.year_counts)
        if sum(view.year_counts.values()) != view.last_seq:
            raise LedgerError(f"the ledger holds {sum(view.year_counts.values())} invoices up to "
                              f"position {view.last_seq}")
    if tenant is not None:
        # A tenant's invoices are few (a dozen a year): one query gives its draws and its months.
        for entry in _entries(client, f"{bound} AND tenant = %(tenant)s", {**parameters, "tenant": tenant}):
            view.note_draws(tenant, entry.invoice.credit_draws)
            if periods is None or entry.invoice.period in periods:
                view.issued.setdefault((tenant, entry.invoice.period), []).append(entry)
        return view
    for row in client.query(f"SELECT tenant, credit_draws FROM {LEDGER.name} WHERE {bound} "
                            "AND credit_draws != '{}'", parameters=parameters).result_rows:
        view.note_draws(str(row[0]), {k: Decimal(v) for k, v in jsonio.loads(row[1]).items()})
    where = bound
    if periods is not None:
        where += " AND period IN %(periods)s"
        parameters["periods"] = sorted(periods)
    for entry in _entries(client, where, parameters):
        view.issued.setdefault((entry.invoice.tenant, entry.invoice.period), []).append(entry)
    return view


def catch_up(client: Client, view: LedgerView) -> list[Entry]:
    """Fold every row written after the view's tail into it (other closers'); returns them."""
    folded = _entries(client, "seq > %(after)s", {"after": view.last_seq})
    for entry in folded:
        view.add(entry)
    return folded


def entries(client: Client, period: str | None = None, tenant: str | None = None) -> list[Entry]:
    """Issued invoices in position order, optionally of one period and/or tenant."""
    clauses, parameters = [], {}
    if period is not None:
        clauses.append("period = %(period)s")
        parameters["period"] = period
    if tenant is not None:
        clauses.append("tenant = %(tenant)s")
        parameters["tenant"] = tenant
    return _entries(client, " AND ".join(clauses) or "1", parameters)


def _entries(client: Client, where: str, parameters: dict[str, Any]) -> list[Entry]:
    return [entry_of(row) for row in rows(client, where, parameters)]


def rows(client: Client, where: str = "1", parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Stored rows as mappings, in position order (reconciliation parses them one by one)."""
    result = client.query(f"SELECT {_COLUMNS} FROM {LEDGER.name} WHERE {where} ORDER BY seq",
                          parameters=parameters or {}).result_rows
    return [LEDGER.as_mapping(row) for row in result]


def row_of(entry: Entry) -> tuple[Any, ...]:
    invoice = entry.invoice
    return LEDGER.row_from({
        "seq": entry.seq, "year": entry.year, "year_seq": entry.year_seq, "number": entry.number,
        "tenant": invoice.tenant, "period": invoice.period, "status": invoice.status,
        "adjusts": invoice.adjusts or "", "document": entry.document,
        "content_sha256": entry.content_sha256, "chain_sha256": entry.chain_sha256,
        "exact_quantities": jsonio.dumps([str(q) for q in entry.exact_quantities]),
        "credit_draws": jsonio.dumps({k: str(v) for k, v in sorted(invoice.credit_draws.items())}),
        "claim": entry.claim, "issued_at": invoice.issued_at,
    })


def entry_of(row: dict[str, Any]) -> Entry:
    """A stored row back as an Entry; the invoice comes from the stored document (what was
    hashed), with its unrounded quantities restored. LedgerError when the row cannot be read."""
    try:
        return _entry_of(row)
    except (jsonio.JSONInputError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
        where = f"ledger row {row.get('seq')} ({row.get('number')})"
        raise LedgerError(f"{where} cannot be read: {exc}") from None


def _entry_of(row: dict[str, Any]) -> Entry:
    quantities = tuple(Decimal(q) for q in jsonio.loads(row["exact_quantities"]))
    return Entry(
        seq=int(row["seq"]), year=int(row["year"]), year_seq=int(row["year_seq"]),
        invoice=invoice_of(jsonio.loads(row["document"]), quantities), document=str(row["document"]),
        content_sha256=str(row["content_sha256"]), chain_sha256=str(row["chain_sha256"]),
        claim=str(row["claim"]), exact_quantities=quantities,
    )


def invoice_of(document: dict[str, Any], quantities: tuple[Decimal, ...]) -> Invoice:
    """An issued document (Invoice.issued_document) back as an Invoice."""
    lines = [
        InvoiceLine(rate_card=line["rate_card"], kind=line["kind"], gpu_model=line["gpu_model"],
                    mig_profile=line["mig_profile"], capacity_type=line["capacity_type"],
                    quantity=quantity, amount=Decimal(line["amount"]))
        for line, quantity in zip(document["lines"], quantities, strict=True)
    ]
    return Invoice(
        tenant=str(document["tenant"]), period=str(document["period"]), currency=str(document["currency"]),
        status=document["status"], lines=lines, subtotal=Decimal(document["subtotal"]),
        commitment_true_up=Decimal(document["commitment_true_up"]), credits=Decimal(document["credits"]),
        total=Decimal(document["total"]), number=document.get("number"),
        issued_at=document.get("issued_at"), adjusts=document.get("adjusts"),
        credit_draws={k: Decimal(v) for k, v in (document.get("credit_draws") or {}).items()},
        credits_remaining=Decimal(document.get("credits_remaining") or "0"),
    )
