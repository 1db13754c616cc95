"""Batch writer of rated samples and dead letters into ClickHouse.

A batch is stored exactly once: duplicates inside it and event_ids already in the table are
dropped before the insert, and after an ambiguous failure (timeout, server gone) the retry
starts with that check again, so a batch that did land is not inserted twice. Offsets are
committed by the caller only after ``store_*`` returned.

Failures are of two kinds. A *transient* one (server away, timeout, overload, a missing
table an operator must restore) is raised, and the caller retries the whole batch. A
*permanent* one is a row the client cannot encode or the engine refuses (a value outside
its column): the batch is split in halves until the refused rows stand alone, everything
else is stored, and the refused rows come back in ``StoreResult.rejected`` for the caller
to dead-letter (reason ``unstorable``). One poisoned row costs O(log batch) inserts, not
a wedged partition.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from gpumeter.core import jsonio
from gpumeter.core.models import RatedUsage
from gpumeter.infra import clickhouse
from gpumeter.infra.schema import DEAD_LETTERS, RATED_USAGE
from gpumeter.infra.tables import Table

log = logging.getLogger(__name__)
T = TypeVar("T")

# The anti-join sends every event_id of a batch in the query text.
QUERY_SETTINGS = {"max_query_size": 64 * 1024 * 1024}


Row = tuple[Any, ...]

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
    rejected: list[tuple[Row, str]] = field(default_factory=list)


class BadRecord(ValueError):
    """A record on an internal topic that does not have the shape we wrote."""


def rated_row(rated: RatedUsage) -> Row:
    """A rated sample as a rated_usage row, in the table's insert order."""
    return RATED_USAGE.row_of(rated)


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


class ClickHouseSink:
    """Owns one client (clickhouse-connect clients are not shared across threads)."""

    def __init__(self, connect: Callable[[], Client]) -> None:
        self._connect = connect
        self._client: Client | None = None
        self._lock = threading.Lock()
        self.counters = SinkCounters()

    def _client_or_connect(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client

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
        unique: dict[str, Row] = {}
        for row in rows:
            unique.setdefault(row[0], row)  # first occurrence wins, as in the rating stage
        if not unique:
            return StoreResult()
        tenants = sorted({row[1] for row in unique.values()})
        periods = sorted({row[2] for row in unique.values()})
        stored = client.query(
            "SELECT event_id FROM rated_usage WHERE period IN %(periods)s AND tenant IN %(tenants)s "
            "AND event_id IN %(ids)s",
            parameters={"periods": periods, "tenants": tenants, "ids": list(unique)},
            settings=QUERY_SETTINGS,
        ).result_rows
        for (event_id,) in stored:
            unique.pop(event_id, None)
        self.counters.skipped_duplicates += len(rows) - len(unique)
        result = self._insert_splitting(client, RATED_USAGE, list(unique.values()))
        self.counters.batches += 1
        self.counters.stored += result.stored
        self.counters.unstorable += len(result.rejected)
        return result

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

    def _insert_splitting(self, client: Client, table: Table, rows: list[Row]) -> StoreResult:
        """Insert ``rows``; on a permanent error, halve until the refused rows are isolated.

        Halves that were stored before a later transient error are skipped on the retry by
        the caller's duplicate check, so splitting never stores a row twice.
        """
        if not rows:
            return StoreResult()
        try:
            client.insert(table.name, rows, column_names=list(table.insert_columns))
            return StoreResult(stored=len(rows))
        except Exception as exc:
            if not is_permanent(exc):
                raise
            if len(rows) == 1:
                log.warning("%s: row refused (%s): %s", table.name, rows[0][0], first_line(exc))
                return StoreResult(rejected=[(rows[0], first_line(exc))])
        middle = len(rows) // 2
        left = self._insert_splitting(client, table, rows[:middle])
        right = self._insert_splitting(client, table, rows[middle:])
        return StoreResult(left.stored + right.stored, left.rejected + right.rejected)

    def close(self) -> None:
        with self._lock:
            self._reset()


def connector(dsn: str) -> Callable[[], Client]:
    def connect() -> Client:
        return clickhouse.connect(dsn, create_database=False)

    return connect
