"""Reconciliation of one month: invoices = deduplicated rated usage = the rating of the stored
samples, nothing both billed and dead-lettered, and the ledger exactly as issued.

Per tenant and invoice line, three figures of unit-hours must agree:
- invoiced: Σ over the tenant-month's issued invoices (final and adjustments) of the exact line
  quantities stored with them;
- rated: Σ unit_seconds / 3600 of ``rated_usage FINAL`` (each event_id once), the query invoices
  are priced from;
- re-rated: every stored row rated again here with pricing's rater (card by window_start, most
  specific rate, unit-seconds = quantity x window), independent of what the rating stage wrote.
The hourly rollup behind drafts, month-to-date usage and the dashboards must agree with the
rated figure too.
Amounts must agree too: the invoiced amounts of a line add up to the price of its invoiced
quantity (tier bands continue across adjustments). A tenant-month with nothing issued yet is
compared as its draft, so only rated and re-rated figures can differ there.

The ledger: each row's content hash is the SHA-256 of its stored document, the document is
canonical, the chain links every row to the one before, positions and per-year numbers have no
gap, each tenant-month has one final and its adjustments reference it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from gpumeter.core.models import SampleRejected, UsageSample
from gpumeter.core.money import exact, format_money, format_quantity
from gpumeter.core.ratecard import RateCardSet
from gpumeter.infra.clickhouse import to_decimal
from pricing import ledger_store, store
from pricing.invoice import LineKey, UsageLine, line_amount
from pricing.ledger import Entry, LedgerError, canonical_json, chain_hash, invoice_number, sha256_hex
from pricing.rating import Rater, list_cost

ZERO = Decimal(0)
# Stored windows keep microseconds; a sample sent with nanoseconds (RFC3339Nano) was rated on
# its exact window, so re-rating the stored window may differ by < 1 µs x quantity per row.
WINDOW_TOLERANCE_SECONDS = Decimal("0.000001")
# Quantities are compared far below the six places an invoice shows, above 60-digit noise.
QUANTITY_TOLERANCE = Decimal("1e-18")
# Copies of a billed event_id that differ are dead letters by design (contract 1).
BY_DESIGN = ("duplicate_conflict",)


def line_label(key: LineKey) -> str:
    return f"{key.rate_card}/{key.kind}/{key.gpu_model or '-'}/{key.mig_profile or '-'}/{key.capacity_type}"


@dataclass(frozen=True)
class Difference:
    tenant: str
    line: str  # a line label, an invoice number or an event id
    what: str  # which two figures differ
    expected: str
    found: str

    def __str__(self) -> str:
        return f"tenant {self.tenant} line {self.line}: {self.what}: {self.expected} vs {self.found}"


@dataclass
class TenantSummary:
    tenant: str
    lines: int = 0
    samples: int = 0
    invoiced: Decimal = ZERO  # unit-hours
    rated: Decimal = ZERO
    rerated: Decimal = ZERO
    amount: Decimal = ZERO  # invoiced (or draft) amount of the lines
    invoices: list[str] = field(default_factory=list)
    differences: int = 0


@dataclass
class Report:
    period: str
    tenants: list[TenantSummary]
    differences: list[Difference]
    ledger_rows: int
    samples: int

    @property
    def ok(self) -> bool:
        return not self.differences


def reconcile(client: Client, cards: RateCardSet, period: str) -> Report:
    differences: list[Difference] = []
    entries: list[Entry] = []
    for row in ledger_store.rows(client):
        try:
            entries.append(ledger_store.entry_of(row))
        except LedgerError as exc:
            differences.append(Difference(str(row["tenant"]), f"invoice {row['number']}",
                                          "stored invoice readable", "readable", str(exc)))
    differences += check_ledger(entries)
    issued = [entry for entry in entries if entry.invoice.period == period]
    rated = store.usage_lines_by_tenant(client, period)
    rollup = store.rollup_lines_by_tenant(client, period)
    rerated, samples, row_differences = rerate(client, cards, period)
    summaries: dict[str, TenantSummary] = {}
    invoiced = _invoiced_lines(issued)
    for tenant in sorted(set(rated) | set(rerated) | set(invoiced)):
        summary = summaries.setdefault(tenant, TenantSummary(tenant))
        summary.invoices = [e.number for e in issued if e.invoice.tenant == tenant]
        summary.samples = samples.get(tenant, 0)
        differences += _compare_tenant(cards, tenant, summary, invoiced.get(tenant), rated.get(tenant, []),
                                       rerated.get(tenant, {}))
        differences += _compare_rollup(tenant, rollup.get(tenant, []), rated.get(tenant, []))
    # Line figures first, then what explains them: the rows whose stored rating is off.
    differences += billed_and_dead(client, period)
    differences += row_differences
    for difference in differences:
        if difference.tenant in summaries:
            summaries[difference.tenant].differences += 1
    return Report(period, list(summaries.values()), differences, len(entries), sum(samples.values()))


def _invoiced_lines(issued: list[Entry]) -> dict[str, dict[LineKey, tuple[Decimal, Decimal]]]:
    """Per tenant and line: (Σ exact quantity, Σ amount) over the month's issued invoices."""
    lines: dict[str, dict[LineKey, tuple[Decimal, Decimal]]] = {}
    for entry in issued:
        bucket = lines.setdefault(entry.invoice.tenant, {})
        for line in entry.invoice.lines:
            quantity, amount = bucket.get(line.key, (ZERO, ZERO))
            with exact():
                bucket[line.key] = (quantity + line.quantity, amount + line.amount)
    return lines


def _compare_tenant(
    cards: RateCardSet, tenant: str, summary: TenantSummary,
    invoiced: dict[LineKey, tuple[Decimal, Decimal]] | None, rated: list[UsageLine],
    rerated: dict[LineKey, Decimal],
) -> list[Difference]:
    found: list[Difference] = []
    rated_hours = {u.key: _hours(u.unit_seconds) for u in rated}
    rerated_hours = {key: _hours(seconds) for key, seconds in rerated.items()}
    keys = sorted(set(rated_hours) | set(rerated_hours) | set(invoiced or {}), key=line_label)
    summary.lines = len(keys)
    for key in keys:
        label = line_label(key)
        rated_q, rerated_q = rated_hours.get(key, ZERO), rerated_hours.get(key, ZERO)
        summary.rated += rated_q
        summary.rerated += rerated_q
        if invoiced is None:  # nothing issued: the draft is priced from the rated figure
            summary.invoiced += rated_q
            summary.amount += _price(cards, key, rated_q) if rated_q else ZERO
        else:
            invoiced_q, invoiced_amount = invoiced.get(key, (ZERO, ZERO))
            summary.invoiced += invoiced_q
            summary.amount += invoiced_amount
            if not _same(invoiced_q, rated_q):
                found.append(Difference(tenant, label, "invoiced vs rated unit-hours",
                                        format_quantity(invoiced_q), format_quantity(rated_q)))
            repriced = _price(cards, key, invoiced_q) if invoiced_q else ZERO
            if invoiced_amount != repriced:
                found.append(Difference(tenant, label, "invoiced amount vs price of the invoiced quantity",
                                        format_money(invoiced_amount), format_money(repriced)))
        if not _same(rated_q, rerated_q):
            found.append(Difference(tenant, label, "rated vs re-rated from stored samples",
                                    format_quantity(rated_q), format_quantity(rerated_q)))
    return found


def _compare_rollup(tenant: str, rollup: list[UsageLine], rated: list[UsageLine]) -> list[Difference]:
    """The hourly rollup (drafts, month-to-date usage, dashboards) against ``rated_usage FINAL``:
    it sums every insert, so a row two racing sinks both stored counts twice there."""
    rollup_hours = {u.key: _hours(u.unit_seconds) for u in rollup}
    rated_hours = {u.key: _hours(u.unit_seconds) for u in rated}
    found = []
    for key in sorted(set(rollup_hours) | set(rated_hours), key=line_label):
        summed, folded = rollup_hours.get(key, ZERO), rated_hours.get(key, ZERO)
        if not _same(summed, folded):
            found.append(Difference(tenant, line_label(key), "hourly rollup vs rated unit-hours",
                                    format_quantity(summed), format_quantity(folded)))
    return found


def _hours(unit_seconds: Decimal) -> Decimal:
    with exact():
        return unit_seconds / 3600


def _same(a: Decimal, b: Decimal) -> bool:
    with exact():
        return abs(a - b) <= QUANTITY_TOLERANCE


def _price(cards: RateCardSet, key: LineKey, unit_hours: Decimal) -> Decimal:
    with exact():
        return line_amount(cards, UsageLine(key, unit_hours * 3600))[1]


_ROW_COLUMNS = ("event_id", "tenant", "period", "kind", "cluster", "node", "namespace", "pod", "pod_uid",
                "window_start", "window_end", "quantity", "unit_seconds", "gpu_model", "mig_profile",
                "capacity_type", "priority", "rate_card", "currency", "unit_price", "capacity_multiplier",
                "list_cost")


def rerate(client: Client, cards: RateCardSet, period: str
           ) -> tuple[dict[str, dict[LineKey, Decimal]], dict[str, int], list[Difference]]:
    """Rate every stored row of the month again: per tenant, Σ unit-seconds per line as re-rated;
    rows per tenant; and each row whose stored rating differs from its re-rating."""
    rater = Rater(cards)
    lines: dict[str, dict[LineKey, Decimal]] = {}
    counts: dict[str, int] = {}
    differences: list[Difference] = []
    query = (f"SELECT {', '.join(_ROW_COLUMNS)} FROM rated_usage FINAL WHERE period = %(period)s")
    with client.query_row_block_stream(query, parameters={"period": period}) as stream:
        for block in stream:
            for values in block:
                row = dict(zip(_ROW_COLUMNS, values, strict=True))
                tenant = str(row["tenant"])
                counts[tenant] = counts.get(tenant, 0) + 1
                key, seconds, problem = rerate_row(rater, row)
                if problem is not None:
                    differences.append(Difference(tenant, f"event {row['event_id']}", problem[0], problem[1],
                                                  problem[2]))
                if key is not None:
                    bucket = lines.setdefault(tenant, {})
                    with exact():
                        bucket[key] = bucket.get(key, ZERO) + seconds
    return lines, counts, differences


def rerate_row(rater: Rater, row: dict[str, Any]
               ) -> tuple[LineKey | None, Decimal, tuple[str, str, str] | None]:
    """(line key, unit-seconds, problem) of one stored row rated again."""
    start, end = _utc(row["window_start"]), _utc(row["window_end"])
    sample = UsageSample.model_construct(
        event_id=row["event_id"], kind=row["kind"], cluster=row["cluster"], node=row["node"],
        tenant=row["tenant"], namespace=row["namespace"], pod=row["pod"], pod_uid=row["pod_uid"],
        window_start=start, window_end=end, quantity=to_decimal(row["quantity"]),
        gpu_model=row["gpu_model"], mig_profile=row["mig_profile"], capacity_type=row["capacity_type"],
        priority=row["priority"], labels={},
    )
    stored_seconds = to_decimal(row["unit_seconds"])
    try:
        again = rater.rate(sample)
    except SampleRejected as exc:
        return None, ZERO, ("stored row cannot be rated", "a rate", str(exc))
    seconds = again.unit_seconds
    with exact():
        within = abs(stored_seconds - seconds) <= sample.quantity * WINDOW_TOLERANCE_SECONDS
    if within:
        seconds = stored_seconds  # the exact figure of a nanosecond window
    key = LineKey(again.rate_card, again.kind, again.gpu_model, again.mig_profile, again.capacity_type)
    stored = (row["period"], row["rate_card"], to_decimal(row["unit_price"]),
              to_decimal(row["capacity_multiplier"]))
    fresh = (again.period, again.rate_card, again.unit_price, again.capacity_multiplier)
    if not within:
        return key, seconds, ("stored vs re-rated unit-seconds", _plain(stored_seconds), _plain(seconds))
    if stored != fresh:
        return key, seconds, ("stored vs re-rated (period, rate card, price, multiplier)",
                              "/".join(str(v) for v in stored), "/".join(str(v) for v in fresh))
    cost = list_cost(seconds, again.unit_price, again.capacity_multiplier)
    if to_decimal(row["list_cost"]) != cost:
        return key, seconds, ("stored vs re-rated list cost", str(to_decimal(row["list_cost"])), str(cost))
    return key, seconds, None


def _plain(value: Decimal) -> str:
    """A Decimal without trailing zeros or exponent: 28800, 0.5."""
    return format(value.normalize(), "f")


def _utc(moment: datetime) -> datetime:
    # clickhouse-connect returns DateTime64(6, 'UTC') as naive datetimes in UTC
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def billed_and_dead(client: Client, period: str) -> list[Difference]:
    """Samples of the month that are both in rated_usage and dead-lettered (other than as a
    conflicting duplicate copy, which contract 1 dead-letters while the first copy is billed)."""
    rows = client.query(
        "SELECT r.tenant, r.event_id, d.reason_code FROM dead_letters AS d "
        "GLOBAL INNER JOIN (SELECT tenant, event_id FROM rated_usage FINAL WHERE period = %(period)s) AS r "
        "ON d.event_id = r.event_id WHERE d.reason_code NOT IN %(by_design)s ORDER BY r.tenant, r.event_id",
        parameters={"period": period, "by_design": list(BY_DESIGN)},
    ).result_rows
    return [Difference(str(t), f"event {e}", "billed and dead-lettered", "billed", f"dead letter ({code})")
            for t, e, code in rows]


def check_ledger(entries: Iterable[Entry]) -> list[Difference]:
    """Every row as issued: hash, canonical document, chain, gap-free positions and numbers, one
    final per tenant-month, adjustments referencing it."""
    found: list[Difference] = []
    previous_chain, expected_seq, year_counts = "", 1, dict[int, int]()
    finals: dict[tuple[str, str], str] = {}
    for entry in entries:
        invoice = entry.invoice
        tenant, number = invoice.tenant, entry.number

        def differ(what: str, expected: str, actual: str, tenant: str = tenant, number: str = number) -> None:
            found.append(Difference(tenant, f"invoice {number}", what, expected, actual))

        if entry.seq != expected_seq:
            differ("ledger position", str(expected_seq), str(entry.seq))
        expected_seq = entry.seq + 1
        year_counts[entry.year] = year_counts.get(entry.year, 0) + 1
        if number != invoice_number(entry.year, year_counts[entry.year]):
            differ("number", invoice_number(entry.year, year_counts[entry.year]), number)
        digest = sha256_hex(entry.document.encode("utf-8"))
        if digest != entry.content_sha256:
            differ("stored content hash vs hash of the stored document", entry.content_sha256, digest)
        canonical = canonical_json(invoice.issued_document()).decode("utf-8")
        if canonical != entry.document:
            differ("stored document vs its canonical form", "canonical", "not canonical")
        link = chain_hash(previous_chain, entry.content_sha256)
        if link != entry.chain_sha256:
            differ("chain hash", link, entry.chain_sha256)
        previous_chain = entry.chain_sha256
        if invoice.number != number:
            differ("number in the document", number, str(invoice.number))
        for line, quantity in zip(invoice.lines, entry.exact_quantities, strict=True):
            if format_quantity(quantity) != format_quantity(line.quantity):
                differ("exact vs shown quantity", format_quantity(quantity), format_quantity(line.quantity))
        month = (tenant, invoice.period)
        if invoice.status == "final":
            if month in finals:
                differ("second final for the month", finals[month], number)
            finals.setdefault(month, number)
        elif invoice.adjusts != finals.get(month):
            differ("adjustment references", str(finals.get(month)), str(invoice.adjusts))
    return found
