"""Batch writer of rated samples and dead letters into ClickHouse.

A batch is stored exactly once, and each event_id is billed once whatever differs between
its copies (contract 1):

1. inside the batch the first copy of an id wins; a later copy with the same billing fields
   is a duplicate, one with other fields a conflict;
2. the ids are looked up in ``event_ids``, the claims on every id (any tenant, any month;
   ordered by a hash of the id, so one small granule per id; its hashes alone are probed
   first in ``event_id_hashes``, and the server returns each id's first claim, nothing for a
   new id). The first claim of an id decides: its
   own copy again (same source position: a replay after a crash) is stored if it is not yet;
   the same fields from elsewhere, a duplicate; other fields, a conflict, returned in
   ``StoreResult.conflicts`` for the caller to dead-letter (reason ``duplicate_conflict``);
3. the ids nobody claimed yet are claimed: their hashes inserted into ``event_id_hashes``,
   then their billing fields and source position into ``event_ids``, *before* their rows go
   to rated_usage. Two sinks (two workers, the copies of one id under two tenants on two
   partitions) may claim one id at once: each then probes the hashes of its ids again, reads
   the claims of those held twice, and the claim the server made visible first wins.
   MergeTree numbers an insert's part when it
   commits it (``_block_number``, kept through merges by ``enable_block_number_column``), so
   a claim with a lower number than one's own is always visible to a read made after one's
   own insert returned: both sinks agree on the winner without talking to each other.
   On one node with plain MergeTree (``_commit_ordered``) that second probe reads only the
   parts of event_id_hashes whose highest block is above the table's highest block read
   before the lookup (the *horizon*): a rival's hash the lookup did not see committed after
   that read, so it sits in such a part, and a merge only raises a part's highest block. A
   rival's hash the lookup did see without its claim (the claim came later, or failed) makes
   the probe read every part, as it does on clusters, where block numbers are per shard or
   allocated before commit;
4. the winners' rows are checked against rated_usage on its time-local key (rows of this very
   batch inserted before an ambiguous failure) and inserted.

After an ambiguous failure (timeout, server gone) the retry starts again at 1, so a batch
that did land is not inserted twice. Behind those checks, each insert into rated_usage
carries an ``insert_deduplication_token`` naming exactly its rows: the engine drops a repeat
of the same rows (a retry the lookups could not see yet, the same batch from a second sink
after a rebalance), in rated_usage and in the hourly rollup its view feeds. Offsets are
committed by the caller only after ``store_*`` returned.

Failures are of two kinds. A *transient* one (server away, timeout, overload, a missing
table an operator must restore) is raised, and the caller retries the whole batch. A
*permanent* one is a row the client cannot encode or the engine refuses (a value outside
its column): the batch is split in halves until the refused rows stand alone, everything
else is stored, and the refused rows come back in ``StoreResult.rejected`` for the caller
to dead-letter (reason ``unstorable``). One poisoned row costs O(log batch) inserts, not
a wedged partition.

The worker's rated rows carry their rated JSON (``rated_row(rated, line)``, gpumeter/infra/rows.py):
when every row of a batch does, the rated_usage insert sends those lines (JSONEachRow) and the
server parses them, instead of clickhouse-connect encoding the values in the worker
(gpumeter/infra/insert.py).
"""

from __future__ import annotations

import hashlib
import logging
import re
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError
from clickhouse_connect.driver.external import ExternalData

from gpumeter.core import jsonio
from gpumeter.infra import clickhouse
from gpumeter.infra.insert import insert_lines, insert_rows
from gpumeter.infra.rows import Row, have_lines
from gpumeter.infra.schema import DEAD_LETTERS, EVENT_ID_HASHES, EVENT_IDS, FINGERPRINT_COLUMNS, RATED_USAGE
from gpumeter.infra.tables import SINGLE_NODE, Table, Topology

log = logging.getLogger(__name__)
T = TypeVar("T")

# A batch's event_ids travel as an external table, not as literals in the query text: the
# server parses 5,000 literals about four times slower than it reads the same ids as data.
IDS_TABLE = "batch_ids"
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def ids_table(ids: Sequence[str]) -> ExternalData:
    """The ids as a one-column TabSeparated external table named IDS_TABLE."""
    text = "\n".join(ids) + "\n"
    # Escaping id by id costs ~1 µs a row; ids almost never hold a character to escape.
    if text.count("\n") != len(ids) or "\t" in text or "\\" in text or "\r" in text:
        text = "".join(event_id.translate(_TSV_ESCAPES) + "\n" for event_id in ids)
    return ExternalData(file_name=IDS_TABLE, data=text.encode(), fmt="TabSeparated",
                        structure=["event_id String"])


# Server error codes that mean "this data does not fit", not "try again later".
PERMANENT_SERVER_CODES = frozenset({
    6,  # CANNOT_PARSE_TEXT
    27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    41,  # CANNOT_PARSE_DATETIME
    53,  # TYPE_MISMATCH
    69,  # ARGUMENT_OUT_OF_BOUND
    70,  # CANNOT_CONVERT_TYPE
    72,  # CANNOT_PARSE_NUMBER
    117,  # INCORRECT_DATA
    131,  # TOO_LARGE_STRING_SIZE
    321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    407,  # DECIMAL_OVERFLOW
})
_SERVER_CODE = re.compile(r"Code: (\d+)")


def is_permanent(exc: BaseException) -> bool:
    """True when retrying the same rows cannot succeed: the rows themselves are refused."""
    if isinstance(exc, OperationalError):
        return False
    if isinstance(exc, DataError | OverflowError | struct.error | TypeError | ValueError):
        return True  # the client could not encode a value into its column
    if isinstance(exc, DatabaseError):
        match = _SERVER_CODE.search(str(exc))
        return match is not None and int(match.group(1)) in PERMANENT_SERVER_CODES
    return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:500]


@dataclass
class StoreResult:
    stored: int = 0
    # Rows the engine refuses (dead letter ``unstorable``), with the reason.
    rejected: list[tuple[Row, str]] = field(default_factory=list)
    # Later copies of a billed event_id that differ from it (dead letter ``duplicate_conflict``).
    conflicts: list[tuple[Row, str]] = field(default_factory=list)


_ID = RATED_USAGE.insert_columns.index("event_id")
_TENANT = RATED_USAGE.insert_columns.index("tenant")
_PERIOD = RATED_USAGE.insert_columns.index("period")
_WINDOW_START = RATED_USAGE.insert_columns.index("window_start")
_PARTITION = RATED_USAGE.insert_columns.index("source_partition")
_OFFSET = RATED_USAGE.insert_columns.index("source_offset")
_FINGERPRINT = tuple(RATED_USAGE.insert_columns.index(name) for name in FINGERPRINT_COLUMNS)


def _utc_naive(value: Any) -> Any:
    """Datetimes compared by their UTC instant, whatever tz-awareness the client gave them."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def fingerprint(values: Sequence[Any]) -> tuple[Any, ...]:
    """Billing fields of a rated row (or of an event_ids row without its id and period)."""
    return tuple(_utc_naive(value) for value in values)


def row_fingerprint(row: Row) -> tuple[Any, ...]:
    return fingerprint([row[i] for i in _FINGERPRINT])


def insert_token(rows: Sequence[Row]) -> str:
    """An insert_deduplication_token naming exactly these rows (source position and id of each).

    Derived from the rows' source positions, yet not just the batch's offset range: a split
    half, or a retry the lookups have already thinned, inserts another set of rows from the
    same range, and the engine must not take it for a repeat and drop it.
    """
    text = "\n".join(f"{row[_PARTITION]}:{row[_OFFSET]}:{row[_ID]}" for row in rows)
    return "rated-" + hashlib.sha256(text.encode()).hexdigest()[:40]


# A batch's rows in rated_usage: its periods, tenants and span of windows (the table's key
# prefix), and its ids, sent as the IDS_TABLE external table.
_IN_BATCH = ("period IN %(periods)s AND tenant IN %(tenants)s AND window_start BETWEEN "
             "toDateTime64(%(first)s, 6, 'UTC') AND toDateTime64(%(last)s, 6, 'UTC') "
             f"AND event_id IN {IDS_TABLE}")


def _batch_scope(rows: Sequence[Row]) -> dict[str, Any]:
    """The parameters of _IN_BATCH for these rows."""
    starts = [row[_WINDOW_START] for row in rows]
    try:  # aware datetimes order by instant: convert only the two ends, not every row
        starts = [_utc_naive(min(starts)), _utc_naive(max(starts))]
    except TypeError:  # aware and naive mixed
        starts = [_utc_naive(start) for start in starts]
    return {
        "periods": sorted({row[_PERIOD] for row in rows}),
        "tenants": sorted({row[_TENANT] for row in rows}),
        # Text with microseconds: a datetime parameter may be rendered to the second.
        "first": min(starts).isoformat(sep=" ", timespec="microseconds"),
        "last": max(starts).isoformat(sep=" ", timespec="microseconds"),
    }


def conflict_reason(event_id: str, first: Sequence[Any], later: Sequence[Any]) -> str:
    differing = [name for name, a, b in zip(FINGERPRINT_COLUMNS, first, later, strict=True) if a != b]
    return f"event_id {event_id} was already billed with different {', '.join(differing)}"


@dataclass(frozen=True)
class Claim:
    """A copy of an event_id recorded in event_ids: its billing fields and where it was read."""

    fields: tuple[Any, ...]
    position: tuple[int, int]  # (source_partition, source_offset); (-1, -1) before migration 8


# The hashes of the batch's ids (IDS_TABLE), as event_ids and event_id_hashes key them.
_BATCH_HASHES = f"SELECT sipHash64(event_id) FROM {IDS_TABLE}"
# The hashes of the batch's ids that event_id_hashes holds.
_HASHES_FOUND = f"SELECT id_hash FROM {EVENT_ID_HASHES.name} WHERE id_hash IN ({_BATCH_HASHES})"
# The highest block number of a part, from its name (``<partition>_<min>_<max>_<level>[_<mutation>]``);
# a name of another shape counts as the newest part: reading a part too many costs time, one
# too few would miss a rival's claim.
_PART_MAX_BLOCK = "ifNull(toUInt64OrNull(extract(_part, '^[^_]+_[0-9]+_([0-9]+)_')), 18446744073709551615)"
_HIGHEST_HASH_BLOCK = ("SELECT max(max_block_number) FROM system.parts WHERE database = currentDatabase() "
                       f"AND table = '{EVENT_ID_HASHES.name}' AND active")
_HASHES_ENGINE = ("SELECT engine FROM system.tables WHERE database = currentDatabase() "
                  f"AND name = '{EVENT_ID_HASHES.name}'")
_CLAIM_COLUMNS = ", ".join((*FINGERPRINT_COLUMNS, "source_partition", "source_offset"))
_CLAIM_VALUES = tuple(RATED_USAGE.insert_columns.index(name) for name in EVENT_IDS.insert_columns)


class BadRecord(ValueError):
    """A record on an internal topic that does not have the shape we wrote."""


def dead_row(payload: bytes) -> Row:
    try:
        document = jsonio.loads(payload)
        document["rejected_at"] = datetime.fromisoformat(document["rejected_at"])
        return DEAD_LETTERS.row_from(document)
    except (jsonio.JSONInputError, AttributeError, TypeError, ValueError) as exc:
        raise BadRecord(f"unreadable dead-letter record: {exc}") from None


@dataclass
class SinkCounters:
    batches: int = 0
    stored: int = 0
    skipped_duplicates: int = 0
    failures: int = 0
    unstorable: int = 0
    conflicts: int = 0


class ClickHouseSink:
    """Owns one client (clickhouse-connect clients are not shared across threads)."""

    def __init__(self, connect: Callable[[], Client], topology: Topology = SINGLE_NODE) -> None:
        self._connect = connect
        # Where a claim is withdrawn: event_ids itself, or on a sharded cluster each shard's
        # event_ids_local (a Distributed table takes no DELETE).
        self._claims_table = EVENT_IDS.local_name(topology) + topology.on_cluster
        self._client: Client | None = None
        # Whether event_id_hashes numbers its parts in commit order (``_commit_ordered``); asked
        # once a connection.
        self._ordered: bool | None = None
        self._lock = threading.Lock()
        self.counters = SinkCounters()

    def _client_or_connect(self) -> Client:
        if self._client is None:
            self._client = self._connect()
            self._ordered = None
        return self._client

    def _commit_ordered(self, client: Client) -> bool:
        """True when event_id_hashes is a plain MergeTree on this node: one block counter for
        the table, a number taken as a part commits, so a part committed later has a higher
        one. Not so for a Distributed table (a counter per shard), Replicated* (numbers
        allocated in Keeper before the commit) or ClickHouse Cloud's SharedMergeTree."""
        if self._ordered is None:
            self._ordered = clickhouse.scalar(client, _HASHES_ENGINE) == "MergeTree"
        return self._ordered

    def _reset(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # closing a broken client must not mask the real error
                log.debug("closing a failed ClickHouse client", exc_info=True)
        self._client = None

    def store_rated(self, rows: Sequence[Row]) -> StoreResult:
        """Insert rows whose event_id is not stored yet; refused rows come back, not stored."""
        with self._lock:
            try:
                return self._store_rated(rows)
            except Exception:
                self.counters.failures += 1
                self._reset()
                raise

    def _store_rated(self, rows: Sequence[Row]) -> StoreResult:
        client = self._client_or_connect()
        result = StoreResult()
        unique: dict[str, Row] = {}
        for row in rows:
            first = unique.setdefault(row[_ID], row)  # first occurrence wins, as in the rating stage
            if first is not row and row_fingerprint(first) != row_fingerprint(row):
                result.conflicts.append(
                    (row, conflict_reason(row[_ID], row_fingerprint(first), row_fingerprint(row))))
        if not unique:
            return result
        horizon = self._horizon(client)
        claimed, unclaimed_hash = self._first_claims(client, list(unique))
        ours = self._judge(unique, claimed, result)  # replays of our own claims: stored below
        unclaimed = [row for event_id, row in unique.items() if event_id not in claimed]
        self._claim(client, unclaimed)
        # A hash seen without its claim: a rival's claim under way (or failed) since before the
        # horizon, which only a probe of every part finds again.
        contested = self._contested(client, [row[_ID] for row in unclaimed],
                                    None if unclaimed_hash else horizon)
        won = self._judge({row[_ID]: row for row in unclaimed}, contested, result)
        won += [row for row in unclaimed if row[_ID] not in contested]
        candidates = ours + won
        # One scope for the read of rated_usage and the insert's token.
        scope = _batch_scope(candidates) if candidates else {}
        already = self._already_inserted(client, candidates, scope)
        fresh = [row for row in candidates if row[_ID] not in already]
        as_lines = have_lines(RATED_USAGE, rows)
        inserted = self._insert_splitting(client, RATED_USAGE, fresh, named=True, as_lines=as_lines)
        self._release(client, [row for row, _ in inserted.rejected])
        result.stored = inserted.stored
        result.rejected = inserted.rejected
        self.counters.skipped_duplicates += len(rows) - len(fresh) - len(result.conflicts)
        self.counters.conflicts += len(result.conflicts)
        self.counters.batches += 1
        self.counters.stored += inserted.stored
        self.counters.unstorable += len(inserted.rejected)
        return result

    @staticmethod
    def _judge(rows: dict[str, Row], first_claims: dict[str, Claim], result: StoreResult) -> list[Row]:
        """The rows whose id's first claim is their own (same source position and fields); the
        others are duplicates (same fields: dropped) or conflicts (added to ``result``)."""
        own: list[Row] = []
        for event_id, claim in first_claims.items():
            row = rows.get(event_id)
            if row is None:
                continue
            fields = row_fingerprint(row)
            if claim.fields != fields:
                result.conflicts.append((row, conflict_reason(event_id, claim.fields, fields)))
            elif claim.position == (row[_PARTITION], row[_OFFSET]):
                own.append(row)
        return own

    def _horizon(self, client: Client) -> int | None:
        """event_id_hashes' highest block number now, read before the lookup: every part the
        lookup cannot see has a higher one (``_commit_ordered``). None where that does not hold."""
        if not self._commit_ordered(client):
            return None
        return int(clickhouse.scalar(client, _HIGHEST_HASH_BLOCK) or 0)

    def _first_claims(self, client: Client, ids: list[str]) -> tuple[dict[str, Claim], bool]:
        """The first claim on each of these ids that has any (``_claims_of``, for the ids
        ``_hashed`` found; nothing for the ids nobody claimed yet), and whether the hash of
        one of them was found without its claim."""
        hashed = self._hashed(client, ids)
        claims = self._claims_of(client, hashed, contested_only=False)
        return claims, any(event_id not in claims for event_id in hashed)

    @staticmethod
    def _hashed(client: Client, ids: list[str]) -> list[str]:
        """The ids whose hash event_id_hashes holds: claimed, being claimed, or whose claim
        failed after its hash was stored (and, rarely, another id's hash). For new ids, none.
        On a sharded cluster event_id_hashes is Distributed: each shard probes its own."""
        found = client.query(
            f"SELECT event_id FROM {IDS_TABLE} WHERE sipHash64(event_id) IN ({_HASHES_FOUND})",
            external_data=ids_table(ids)).result_rows
        return [event_id for (event_id,) in found]

    @staticmethod
    def _claims_of(client: Client, ids: list[str], contested_only: bool,
                   horizon: int | None = None) -> dict[str, Claim]:
        """Each id's first claim, computed by the server: the claim with the lowest
        ``_block_number`` (``argMin`` of the claim as one tuple: argMin skips NULLs in a
        Nullable argument, a tuple of them is never NULL). With ``contested_only``, only the
        ids whose hash event_id_hashes holds more than once (counting, with a ``horizon``, only
        the parts whose highest block is above it) and that more than one claim names.

        event_ids is read on its sort key for the hashes asked about: the ids' own (the lookup,
        given the ids ``_hashed`` found), or those event_id_hashes holds twice (the contest:
        one granule of bare hashes per id and part; for ids nobody else claimed, event_ids is
        not read at all). The sink writes an id's hash before its claim (``_claim``), so every
        claim visible in event_ids has its hash visible there. On a sharded cluster both are
        Distributed tables: GLOBAL IN computes the hashes once, on the node asking, and sends
        them to every shard (a plain IN would have each shard read event_id_hashes of every
        shard, which the server refuses: distributed_product_mode); an id's claims all sit on
        the shard of its hash, so the order of their ``_block_number`` is that shard's commit
        order, and the shards' partial aggregates merge on the node asking.
        """
        if not ids:
            return {}
        hashes = _BATCH_HASHES
        several = ""
        if contested_only:
            # indexHint: the engine drops the older parts before reading (a virtual column's
            # condition) and never filters a row by it, so a part it keeps is read whole.
            newer = "" if horizon is None else f" AND indexHint({_PART_MAX_BLOCK} > {int(horizon)})"
            hashes = f"{_HASHES_FOUND}{newer} GROUP BY id_hash HAVING count() > 1"
            several = " HAVING claims > 1"
        found = client.query(
            f"SELECT event_id, argMin(({_CLAIM_COLUMNS}), _block_number), count() AS claims "
            f"FROM {EVENT_IDS.name} PREWHERE id_hash GLOBAL IN ({hashes}) "
            f"WHERE event_id IN {IDS_TABLE} GROUP BY event_id{several}",
            external_data=ids_table(ids),
        ).result_rows
        return {event_id: Claim(fingerprint(first[:-2]), (int(first[-2]), int(first[-1])))
                for event_id, first, _ in found}

    def _claim(self, client: Client, rows: list[Row]) -> None:
        """Claim these rows' ids: their hashes into event_id_hashes, then their billing fields
        and source position into event_ids. The hashes go first, and each insert returns only
        once it is stored (on a cluster, synchronously on its shard): so a claim that another
        sink can see in event_ids always has its hash visible too, and ``_contested``, which
        finds rival claims through the hashes, cannot miss one committed before ours (migration
        13 dropped the view that wrote the hashes as part of the claim's insert, after it).
        Rows that carry their rated lines send those, and the server takes the claim's fields
        from them (encoding the values in the worker cost it ~13 µs a row)."""
        if not rows:
            return
        client.command(f"INSERT INTO {EVENT_ID_HASHES.name} (id_hash) SELECT * FROM ({_BATCH_HASHES})",
                       external_data=ids_table([row[_ID] for row in rows]))
        if have_lines(RATED_USAGE, rows):
            insert_lines(client, EVENT_IDS, rows, project=True)
        else:
            insert_rows(client, EVENT_IDS, [tuple(row[i] for i in _CLAIM_VALUES) for row in rows], None)

    def _release(self, client: Client, rows: list[Row]) -> None:
        """Withdraw the claims of rows the engine refused: they were never stored, so a later,
        storable copy of the id must not be taken for a duplicate of them. Rare (validation
        keeps unstorable values out), so one lightweight delete per refused row is fine."""
        for row in rows:
            client.command(
                f"DELETE FROM {self._claims_table} WHERE id_hash = sipHash64(%(id)s) AND event_id = %(id)s "
                "AND source_partition = %(partition)s AND source_offset = %(offset)s",
                parameters={"id": row[_ID], "partition": row[_PARTITION], "offset": row[_OFFSET]})

    def _contested(self, client: Client, ids: list[str], horizon: int | None) -> dict[str, Claim]:
        """The first claim on each of these just-claimed ids that more than one claim names.
        Read after our own claims were inserted: a rival claim that committed before ours has
        a lower block number, and its hash, written before it, is visible to this probe; with
        a ``horizon`` (no hash of these ids was seen before it), in a part numbered above it."""
        return self._claims_of(client, ids, contested_only=True, horizon=horizon)

    def _already_inserted(self, client: Client, rows: list[Row], scope: dict[str, Any]) -> set[str]:
        """Ids of these rows already in rated_usage (inserted before an ambiguous failure or a
        crash). Asked for every batch and almost always empty; the (tenant, window_start) key
        prefix keeps it inside the batch's own windows (``scope``: ``_batch_scope`` of these
        rows or of a batch holding them)."""
        if not rows:
            return set()
        found = client.query(f"SELECT event_id FROM rated_usage WHERE {_IN_BATCH}",
                             parameters=scope,
                             external_data=ids_table([row[_ID] for row in rows])).result_rows
        return {event_id for (event_id,) in found}

    def store_dead(self, rows: Sequence[Row]) -> StoreResult:
        """Dead letters are keyed by source position; the table's engine folds replays."""
        return self.store_folded(DEAD_LETTERS, rows)

    def store_folded(self, table: Table, rows: Sequence[Row]) -> StoreResult:
        """Rows of a table whose engine folds a replayed row by its key (dead letters, quota events)."""
        with self._lock:
            try:
                client = self._client_or_connect()
                result = self._insert_splitting(client, table, list(rows))
            except Exception:
                self.counters.failures += 1
                self._reset()
                raise
            self.counters.unstorable += len(result.rejected)
            return result

    def _insert_splitting(self, client: Client, table: Table, rows: list[Row],
                          named: bool = False, as_lines: bool = False) -> StoreResult:
        """Insert ``rows``; on a permanent error, halve until the refused rows are isolated.

        Halves that were stored before a later transient error are skipped on the retry by
        the caller's duplicate check, so splitting never stores a row twice. ``named``: each
        insert (each half too) carries the insert_token of its own rows. ``as_lines``: the
        rows carry their lines (``have_lines``): send those.
        """
        if not rows:
            return StoreResult()
        settings = {"insert_deduplication_token": insert_token(rows)} if named else None
        try:
            # Declared types, Decimals as text: no DESCRIBE per insert, no per-value Decimal
            # encoding in Python; a value beyond its column is refused (permanent), never NULL.
            if as_lines:
                insert_lines(client, table, rows, settings)
            else:
                insert_rows(client, table, rows, settings)
            return StoreResult(stored=len(rows))
        except Exception as exc:
            if not is_permanent(exc):
                raise
            if len(rows) == 1:
                log.warning("%s: row refused (%s): %s", table.name, rows[0][0], first_line(exc))
                return StoreResult(rejected=[(rows[0], first_line(exc))])
        middle = len(rows) // 2
        left = self._insert_splitting(client, table, rows[:middle], named, as_lines)
        right = self._insert_splitting(client, table, rows[middle:], named, as_lines)
        return StoreResult(left.stored + right.stored, left.rejected + right.rejected)

    def close(self) -> None:
        with self._lock:
            self._reset()


def connector(dsn: str) -> Callable[[], Client]:
    def connect() -> Client:
        return clickhouse.connect(dsn, create_database=False)

    return connect
