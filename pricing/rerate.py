"""`gpumeter rerate`: re-rate a stored month with the cards now loaded (contract 3.2).

Invoices are priced when they are read, from ``rated_usage FINAL`` grouped by the rate card
version stored on each row; the row also keeps the list price, multiplier and list cost the
worker gave it, and the hourly rollup sums them per card version. A card deployed late (a new
version in force from a date already rated) or corrected in place leaves those stale. Re-rating:

1. groups the month's rows by (card segment, tenant, selector, stored rating) in one aggregate
   query; pricing/rerate_rules.py decides which groups are stale, and refuses the whole month
   (nothing written) when a row cannot be rated by the cards now loaded;
2. reads only the stale rows, in sort-key order, and per chunk (one tenant-hour at most):
   first inserts into ``usage_hourly`` rows that take the stale rows' contributions back out,
   then re-inserts the rows with the new rating. rated_usage is a ReplacingMergeTree without a
   version column, so the later copy of a sort key is the one ``FINAL`` and merges keep; the
   materialized view adds the new contributions. Both inserts carry a token naming the chunk's
   content, so a repeated chunk (a crash between its two inserts, a second run at the same
   time) is dropped by the engine. Nothing else changes: event_ids, the fingerprint and the
   sort key of every row stay as stored, so the worker's duplicate checks are unaffected;
3. for a tenant whose month has a final invoice, issues through the ledger
   (pricing/issue.py ``close``) the numbered adjustment that brings the month to its re-rated
   total; the final itself is never changed.

Running it twice changes nothing the second time: only rows whose stored rating differs from
the cards' are touched. It is safe beside a running worker, which only adds rows under new
event_ids: rows it rated with the old cards before its watcher reloaded them (seconds) are
stale and picked up by running rerate again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from gpumeter.core.money import exact
from gpumeter.infra.clickhouse import to_decimal
from gpumeter.infra.schema import INSERT_DEDUP_WINDOW, RATED_USAGE, USAGE_HOURLY
from pricing import ledger_store
from pricing.invoice import ZERO, InvoiceError, UsageLine
from pricing.issue import Billing, close
from pricing.ledger import LedgerView, next_invoice
from pricing.rerate_rules import (
    HOURLY_COLUMNS,
    Group,
    Plan,
    Rating,
    Rerater,
    RerateRefused,
    Segment,
    Selector,
    chunk_token,
    chunks,
    compensation,
    hour_of,
    plan,
    rerated,
    segments,
    stored_rating,
)

# Rows per chunk at most (two inserts each). Well inside the tables' insert-token memory
# (INSERT_DEDUP_WINDOW inserts), which a repeated chunk must still be within to be dropped.
CHUNK_ROWS = 5_000
assert CHUNK_ROWS < INSERT_DEDUP_WINDOW
_COLUMNS = RATED_USAGE.insert_columns


@dataclass
class TenantChange:
    """One tenant's month before and after re-rating."""

    tenant: str
    currency: str
    rows: int  # rows re-rated
    invoiced: bool  # the month has a final for the tenant: totals are what is billed
    total_before: Decimal | None  # None: the stored rows name a card no longer loaded
    total_after: Decimal
    list_cost_before: Decimal  # Σ streaming list cost (real-time spend), exact
    list_cost_after: Decimal
    adjustment: str | None = None  # the number of the adjustment issued

    @property
    def difference(self) -> Decimal | None:
        return None if self.total_before is None else self.total_after - self.total_before


@dataclass
class Prepared:
    """A month's plan and its tenants' totals, nothing written yet."""

    period: str
    plan: Plan
    pieces: list[Segment]
    tenants: dict[str, TenantChange]
    ledger: LedgerView
    pending: dict[str, bool] = field(default_factory=dict)  # an adjustment is due after re-rating

    @property
    def rows(self) -> int:
        return self.plan.stale_rows


@dataclass
class Result:
    period: str
    dry_run: bool
    rows: int
    chunks: int
    tenants: list[TenantChange]


def prepare(context: Billing, period: str, tenant: str | None = None) -> Prepared:
    """Decide what re-rating ``period`` changes: RerateRefused for a month the cards do not cover,
    a row they cannot rate, or a tenant with nothing in the month."""
    pieces = segments(context.cards, period)
    ledger = ledger_store.load_view(context.client, {period}, tenant, for_issuing=False)
    month_plan = plan(context.cards, period, load_groups(context.client, period, pieces, tenant))
    names = {group.tenant for group in month_plan.groups} | {t for t, p in ledger.issued if p == period}
    if tenant is not None and tenant not in names:
        raise RerateRefused(f"tenant {tenant} has no stored usage and no invoice in {period}")
    prepared = Prepared(period, month_plan, pieces, {}, ledger)
    before, after = month_plan.lines_before(), month_plan.lines_after()
    list_cost = month_plan.list_cost_before()
    for name in sorted(names):
        prepared.tenants[name] = _change(context, prepared, name, before.get(name, []), after.get(name, []),
                                         list_cost.get(name, ZERO))
    return prepared


def _change(context: Billing, prepared: Prepared, tenant: str, before: list[UsageLine],
            after: list[UsageLine], list_cost: Decimal) -> TenantChange:
    period, policy, view = prepared.period, context.tenants.policy(tenant), prepared.ledger
    issued = [entry.invoice for entry in view.issued_for(tenant, period)]
    pending = next_invoice(tenant, period, after, context.cards, policy, view, issuing=False)
    prepared.pending[tenant] = bool(issued) and pending is not None
    billed = sum((invoice.total for invoice in issued), ZERO)
    total_after = billed + (pending.total if pending is not None else ZERO)
    total_before: Decimal | None = billed
    if not issued:
        try:
            draft = next_invoice(tenant, period, before, context.cards, policy, view, issuing=False)
            total_before = draft.total if draft is not None else ZERO
        except InvoiceError:  # a stored card version that is not loaded any more
            total_before = None
    currency = pending.currency if pending is not None else issued[0].currency
    return TenantChange(tenant, currency, prepared.plan.rows_by_tenant.get(tenant, 0), bool(issued),
                        total_before, total_after, list_cost, list_cost)


def apply(context: Billing, prepared: Prepared, connect: Callable[[], Client], dry_run: bool = False,
          advance: Callable[[int], None] = lambda rows: None, chunk_rows: int = CHUNK_ROWS) -> Result:
    """Rewrite the stale rows (or, with ``dry_run``, only read them) and issue the adjustments due.

    ``connect`` opens the client that writes while ``context.client`` streams the rows.
    """
    period, stale = prepared.period, prepared.plan.stale
    rerater = Rerater(prepared.pieces)
    rows = written = 0
    writer = None if dry_run else connect()
    try:
        for block in _candidate_blocks(context.client, period, prepared.pieces, stale, chunk_rows):
            # Candidates share a stale group's key; one stored with other figures may be fresh.
            fresh = [(row, rating) for row in block
                     if (rating := rerater.rating(row)) is not None and rating != stored_rating(row)]
            by_row = {id(row): rating for row, rating in fresh}
            for chunk in chunks([row for row, _ in fresh], chunk_rows):
                new = [rerated(row, by_row[id(row)]) for row in chunk]
                for before, after in zip(chunk, new, strict=True):
                    change = prepared.tenants[str(before["tenant"])]
                    with exact():
                        change.list_cost_after += after["list_cost"] - to_decimal(before["list_cost"])
                if writer is not None:
                    _write(writer, period, chunk, new)
                rows += len(chunk)
                written += 1
                advance(len(chunk))
    finally:
        if writer is not None:
            writer.close()
    if not dry_run:
        due = [tenant for tenant, pending in sorted(prepared.pending.items()) if pending]
        if due:
            for entry in close(context, period, due):
                prepared.tenants[entry.invoice.tenant].adjustment = entry.number
    return Result(period, dry_run, rows, written, list(prepared.tenants.values()))


def _write(client: Client, period: str, old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
           ) -> None:
    """Compensation first: should the run stop between the two inserts, the rows are still stale,
    and the run that repeats the chunk repeats its compensation token too, which is dropped."""
    token = chunk_token(period, old, new)
    client.insert(USAGE_HOURLY.name, compensation(old), column_names=list(HOURLY_COLUMNS),
                  settings={"insert_deduplication_token": f"rerate-hourly-{token}", "insert_deduplicate": 1})
    client.insert(RATED_USAGE.name, [tuple(row[c] for c in _COLUMNS) for row in new],
                  column_names=list(_COLUMNS),
                  settings={"insert_deduplication_token": f"rerate-{token}", "insert_deduplicate": 1})


# --- queries ---------------------------------------------------------------------------------------


def _moment(value: datetime) -> str:
    """Text with microseconds for toDateTime64(..., 6, 'UTC'): a datetime parameter may be
    rendered to the second."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def segment_sql(pieces: list[Segment]) -> tuple[str, dict[str, str]]:
    """An expression giving a row's segment index from its window_start, and its parameters."""
    if len(pieces) == 1:
        return "toUInt8(0)", {}
    parameters = {f"cut{i}": _moment(piece.end) for i, piece in enumerate(pieces[:-1])}
    branches = ", ".join(f"window_start < toDateTime64(%(cut{i})s, 6, 'UTC'), {i}"
                         for i in range(len(pieces) - 1))
    return f"multiIf({branches}, {len(pieces) - 1})", parameters


def load_groups(client: Client, period: str, pieces: list[Segment], tenant: str | None) -> list[Group]:
    segment, parameters = segment_sql(pieces)
    where = "period = %(period)s" + (" AND tenant = %(tenant)s" if tenant is not None else "")
    rows = client.query(
        f"SELECT {segment} AS segment, tenant, kind, gpu_model, mig_profile, capacity_type, rate_card, "
        "currency, unit_price, capacity_multiplier, count(), sum(unit_seconds), sum(list_cost) "
        f"FROM rated_usage FINAL WHERE {where} GROUP BY segment, tenant, kind, gpu_model, mig_profile, "
        "capacity_type, rate_card, currency, unit_price, capacity_multiplier",
        parameters={**parameters, "period": period, "tenant": tenant},
    ).result_rows
    return [
        Group(int(r[0]), str(r[1]), Selector(str(r[2]), r[3], r[4], str(r[5])),
              Rating(str(r[6]), str(r[7]), to_decimal(r[8]), to_decimal(r[9])), int(r[10]),
              to_decimal(r[11]), to_decimal(r[12]))
        for r in rows
    ]


def _candidate_blocks(client: Client, period: str, pieces: list[Segment], stale: list[Group],
                      chunk_rows: int) -> Iterator[list[dict[str, Any]]]:
    """The rows of the stale groups' keys in sort-key order, as lists that end on a tenant-hour
    edge (so a chunk never spans two lists) or at the end. Prices are not compared in SQL: the
    text of a Decimal differs between client and server, so the caller compares them."""
    if not stale:
        return
    segment, parameters = segment_sql(pieces)
    targets = sorted({(g.segment, g.tenant, g.selector.kind, g.selector.gpu_model or "",
                       g.selector.mig_profile or "", g.selector.capacity_type, g.stored.rate_card)
                      for g in stale})
    query = (
        f"SELECT {', '.join(_COLUMNS)} FROM rated_usage FINAL WHERE period = %(period)s AND "
        f"({segment}, tenant, kind, ifNull(gpu_model, ''), ifNull(mig_profile, ''), capacity_type, "
        "rate_card) IN %(targets)s "
        "ORDER BY tenant, window_start, event_id"
    )
    buffered: list[dict[str, Any]] = []
    with client.query_row_block_stream(query, parameters={**parameters, "period": period,
                                                          "targets": targets}) as stream:
        for block in stream:
            buffered += [_row(values) for values in block]
            if len(buffered) >= chunk_rows:
                # One tenant-hour bigger than a chunk goes out in whole chunks, to bound memory.
                cut = _last_hour_start(buffered) or len(buffered) // chunk_rows * chunk_rows
                yield buffered[:cut]
                buffered = buffered[cut:]
    if buffered:
        yield buffered


def _last_hour_start(rows: list[dict[str, Any]]) -> int:
    """Index of the first row of the last tenant-hour in ``rows`` (kept back: it may go on)."""
    last = (rows[-1]["tenant"], hour_of(rows[-1]["window_start"]))
    index = len(rows)
    while index > 0 and (rows[index - 1]["tenant"], hour_of(rows[index - 1]["window_start"])) == last:
        index -= 1
    return index


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(_COLUMNS, values, strict=True))
    for name in ("window_start", "window_end"):
        # The client returns naive UTC; aware again, so the insert cannot read it as local time.
        moment = row[name]
        row[name] = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return row


__all__ = ["CHUNK_ROWS", "Prepared", "RerateRefused", "Result", "TenantChange", "apply", "prepare"]
