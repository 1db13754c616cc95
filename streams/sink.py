"""Batch writer of rated samples and dead letters into ClickHouse.

A batch is stored exactly once: duplicates inside it and event_ids already in the table are
dropped before the insert, and after an ambiguous failure (timeout, server gone) the retry
starts with that check again, so a batch that did land is not inserted twice. Offsets are
committed by the caller only after ``store_*`` returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from gpumeter import clickhouse, jsonio
from gpumeter.models import RatedUsage

log = logging.getLogger(__name__)
T = TypeVar("T")

RATED_COLUMNS = (
    "event_id", "tenant", "period", "kind", "cluster", "node", "namespace", "pod", "pod_uid",
    "window_start", "window_end", "quantity", "unit_seconds", "gpu_model", "mig_profile",
    "capacity_type", "priority", "rate_card", "currency", "unit_price", "capacity_multiplier",
    "list_cost", "utilization", "energy_joules", "labels", "source_partition", "source_offset",
)
DEAD_COLUMNS = (
    "reason_code", "reason", "raw", "source_topic", "source_partition", "source_offset", "source_index",
    "event_id", "tenant", "rejected_at",
)
# The anti-join sends every event_id of a batch in the query text.
QUERY_SETTINGS = {"max_query_size": 64 * 1024 * 1024}


class BadRecord(ValueError):
    """A record on an internal topic that does not have the shape we wrote."""


def rated_row(rated: RatedUsage) -> tuple[Any, ...]:
    """A rated sample as a rated_usage row, in RATED_COLUMNS order."""
    return (
        rated.event_id, rated.tenant, rated.period, rated.kind, rated.cluster, rated.node,
        rated.namespace, rated.pod, rated.pod_uid, rated.window_start, rated.window_end,
        rated.quantity, rated.unit_seconds, rated.gpu_model, rated.mig_profile, rated.capacity_type,
        rated.priority, rated.rate_card, rated.currency, rated.unit_price, rated.capacity_multiplier,
        rated.list_cost, rated.utilization, rated.energy_joules, rated.labels, rated.source_partition,
        rated.source_offset,
    )


def dead_row(payload: bytes) -> tuple[Any, ...]:
    try:
        document = jsonio.loads(payload)
        row = [document.get(column) for column in DEAD_COLUMNS]
        row[-1] = datetime.fromisoformat(row[-1])
        return tuple(row)
    except (jsonio.JSONInputError, AttributeError, TypeError, ValueError) as exc:
        raise BadRecord(f"unreadable dead-letter record: {exc}") from None


@dataclass
class SinkCounters:
    batches: int = 0
    stored: int = 0
    skipped_duplicates: int = 0
    failures: int = 0


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

    def store_rated(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """Insert rows whose event_id is not stored yet; returns how many were inserted."""
        with self._lock:
            try:
                return self._store_rated(rows)
            except Exception:
                self.counters.failures += 1
                self._reset()
                raise

    def _store_rated(self, rows: Sequence[tuple[Any, ...]]) -> int:
        client = self._client_or_connect()
        unique: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            unique.setdefault(row[0], row)  # first occurrence wins, as in the rating stage
        if not unique:
            return 0
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
        if unique:
            client.insert("rated_usage", list(unique.values()), column_names=list(RATED_COLUMNS))
        self.counters.batches += 1
        self.counters.stored += len(unique)
        return len(unique)

    def store_dead(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """Dead letters are keyed by source position; the table's engine folds replays."""
        with self._lock:
            try:
                client = self._client_or_connect()
                if rows:
                    client.insert("dead_letters", list(rows), column_names=list(DEAD_COLUMNS))
                return len(rows)
            except Exception:
                self.counters.failures += 1
                self._reset()
                raise

    def close(self) -> None:
        with self._lock:
            self._reset()


def connector(dsn: str) -> Callable[[], Client]:
    def connect() -> Client:
        return clickhouse.connect(dsn, create_database=False)

    return connect
