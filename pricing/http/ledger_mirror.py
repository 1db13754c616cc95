"""What the API process knows of the invoice ledger, so that an issued invoice is served without
a query.

An issued invoice never changes (contract 3, step 6) and the ledger only grows, at positions
1, 2, 3, ... without gaps (pricing/ledger_store.py). So the API keeps:

- an index of every ledger row: per tenant-month the positions of its issued invoices (the
  final, then its adjustments) and per tenant the credit drawn per source. It reads the rows
  after the last position it holds at most once per ``max_age`` seconds (one range read of
  the ledger's sort key), in the request that finds the index older than that; requests
  meanwhile use the index as it is. An invoice issued by a close therefore shows in the API
  within ``max_age`` seconds. The index advances only through consecutive positions, so a
  row that becomes visible late (a replica catching up) is read on a later refresh;
- the issued invoices themselves, by position, read on first use and kept in a bounded
  least-recently-used map (a position's row never changes, so nothing is ever invalidated).

The index holds three small values per issued invoice (a year of 1,000 tenants is 12,000
rows); the documents are bounded by ``entries``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from decimal import Decimal

from clickhouse_connect.driver.client import Client

from gpumeter.core import jsonio
from pricing import ledger_store
from pricing.ledger import Entry, LedgerError, LedgerView

log = logging.getLogger(__name__)

MAX_AGE_SECONDS = 1.0
ENTRIES = 4096


class LedgerMirror:
    def __init__(self, client: Client, max_age: float = MAX_AGE_SECONDS, entries: int = ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._max_age = max_age
        self._capacity = entries
        self._clock = clock
        self._lock = threading.Lock()  # one refresh at a time
        self._entries_lock = threading.Lock()
        self._checked: float | None = None  # when the index last caught up; None: never
        self._last_seq = 0
        self._positions: dict[tuple[str, str], tuple[int, ...]] = {}
        self._drawn: dict[str, dict[str, Decimal]] = {}
        self._entries: OrderedDict[int, Entry] = OrderedDict()

    # ------------------------------------------------------------------ index (refresh() first)

    def due(self) -> bool:
        """The index is older than max_age (or was never read): refresh() before reading it."""
        return self._checked is None or self._clock() - self._checked >= self._max_age

    def positions(self, tenant: str, period: str) -> tuple[int, ...]:
        """The ledger positions of the tenant-month's issued invoices, in issue order."""
        return self._positions.get((tenant, period), ())

    def issued_in(self, period: str) -> set[str]:
        """Tenants with an invoice issued for ``period``."""
        return {tenant for tenant, month in list(self._positions) if month == period}

    def view_for_draft(self, tenant: str) -> LedgerView:
        """A read-only ledger view for pricing a tenant's draft: the credit it drew so far (a draft
        exists only while nothing is issued for its month)."""
        view = LedgerView(readonly=True)
        view.note_draws(tenant, dict(self._drawn.get(tenant, {})))
        return view

    def refresh(self, force: bool = False) -> None:
        """Read the rows after the last position held, when the index is older than max_age.

        The first load blocks every request until it is done; later refreshes are made by one
        request while the others use the index as it is. A failed later refresh is logged and
        retried by the next request: the issued invoices already known stay servable.
        """
        if not force and not self.due():
            return
        if not self._lock.acquire(blocking=self._checked is None or force):
            return  # another request is refreshing it
        try:
            if not force and not self.due():
                return
            started = self._clock()
            try:
                self._catch_up()
            except Exception:
                if self._checked is None:
                    raise
                log.warning("ledger index refresh failed; serving the index as of %d", self._last_seq,
                            exc_info=True)
                return
            self._checked = started
        finally:
            self._lock.release()

    def _catch_up(self) -> None:
        rows = self._client.query(
            f"SELECT seq, tenant, period, credit_draws FROM {ledger_store.LEDGER.name} "
            "WHERE seq > %(after)s ORDER BY seq", parameters={"after": self._last_seq}).result_rows
        for seq, tenant, period, draws in rows:
            seq = int(seq)
            if seq <= self._last_seq:
                continue  # a repeated position: reconciliation reports it; the first row stands
            if seq != self._last_seq + 1:
                break  # not visible yet: read from here next time
            key = (str(tenant), str(period))
            self._positions[key] = (*self._positions.get(key, ()), seq)
            drawn = self._drawn.setdefault(key[0], {})
            for source, amount in jsonio.loads(draws or "{}").items():
                drawn[source] = drawn.get(source, Decimal(0)) + Decimal(amount)
            self._last_seq = seq

    # ------------------------------------------------------------------ documents

    def entries(self, positions: tuple[int, ...]) -> list[Entry]:
        """The issued invoices at ``positions``, read once and kept while recently used."""
        with self._entries_lock:
            found = {seq: self._entries[seq] for seq in positions if seq in self._entries}
            for seq in found:
                self._entries.move_to_end(seq)
        missing = [seq for seq in positions if seq not in found]
        if missing:
            for row in ledger_store.rows(self._client, "seq IN %(seqs)s", {"seqs": missing}):
                entry = ledger_store.entry_of(row)
                found.setdefault(entry.seq, entry)
            with self._entries_lock:
                for seq in missing:
                    if seq in found:
                        self._entries[seq] = found[seq]
                while len(self._entries) > self._capacity:
                    self._entries.popitem(last=False)
        if len(found) != len(set(positions)):
            unreadable = sorted(set(positions) - set(found))
            raise LedgerError(f"ledger positions {unreadable} are indexed but unreadable")
        return [found[seq] for seq in positions]
