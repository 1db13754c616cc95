"""``quota_grants``: the numbered, append-only budget grants (contract 4, amendment "grants").

One row per grant or correction, never updated or deleted. Numbers are positions 1, 2, 3, ...
claimed without a lock server (gpumeter/infra/claims.py): the row for number n is inserted
with ``insert_deduplication_token = gpumeter-grant-<n>``; two writers wanting n land one
block, and the loser, reading n back with another writer's ``claim``, takes n + 1 after
checking its grant again against everything before it. So grant n was checked against
exactly the grants 1..n-1, and a number is held by one row.

Readers (the quota worker, the actuator, the extender, ``gpumeter budget``) read the whole
table: it holds one row per operator action, so it stays small.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from clickhouse_connect.driver.client import Client

from gpumeter.core.grants import GrantRecord
from gpumeter.infra import claims, clickhouse
from gpumeter.infra.clickhouse import to_decimal
from gpumeter.infra.schema import GRANTS

MAX_ATTEMPTS = 20
log = logging.getLogger("gpumeter.grants")

_COLUMNS = ", ".join(column for column in GRANTS.insert_columns if column != "claim")


T = TypeVar("T")


class GrantsReader(Generic[T]):
    """The whole of ``quota_grants``, read again on demand and turned into ``fold``'s value
    (the quota worker, the actuator and the extender fold it with ``quota.grants.fold``).

    A read that fails (ClickHouse away, rows ``fold`` refuses) returns None, so the caller keeps
    what it read last; each kind of failure is logged once, and the recovery once.
    """

    def __init__(self, dsn: str, fold: Callable[[list[GrantRecord]], T], what: str = "quota_grants") -> None:
        self._dsn = dsn
        self._fold = fold
        self._what = what
        self._client: Client | None = None
        self._failing: str | None = None

    def read(self) -> T | None:
        try:
            if self._client is None:
                self._client = clickhouse.connect(self._dsn, create_database=False)
            records = read(self._client)
        except Exception as exc:  # ClickHouse away or the table missing: try again next time
            self._close()
            self._failed(f"reading {self._what} failed: {_first_line(exc)}")
            return None
        try:
            folded = self._fold(records)
        except ValueError as exc:
            self._failed(f"{self._what} does not add up: {_first_line(exc)}")
            return None
        if self._failing is not None:
            log.warning("%s read again", self._what)
            self._failing = None
        return folded

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _failed(self, message: str) -> None:
        if message != self._failing:
            log.error("%s; the grants read last stay in force", message)
            self._failing = message


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


class GrantConflict(RuntimeError):
    """No free number after MAX_ATTEMPTS tries: writers keep racing."""


def read(client: Client, tenant: str | None = None) -> list[GrantRecord]:
    """Every grant row (or one tenant's), by number; a number held twice is read once."""
    where, parameters = ("tenant = %(tenant)s", {"tenant": tenant}) if tenant is not None else ("1", {})
    result = client.query(f"SELECT {_COLUMNS} FROM {GRANTS.name} WHERE {where} ORDER BY number, inserted_at",
                          parameters=parameters)
    records: dict[int, GrantRecord] = {}
    for row in result.result_rows:
        record = _record(dict(zip(result.column_names, row, strict=True)))
        records.setdefault(record.number, record)
    return list(records.values())


def append(client: Client, draft: GrantRecord, check: Callable[[GrantRecord, Sequence[GrantRecord]], None]
           ) -> GrantRecord:
    """Store ``draft`` under the next free number; ``check(candidate, before)`` raises to refuse
    it against the grants before its number (called again whenever another writer took it)."""
    token = uuid.uuid4().hex
    for _ in range(MAX_ATTEMPTS):
        before = read(client)
        number = max((record.number for record in before), default=0) + 1
        candidate = draft.model_copy(update={"number": number})
        check(candidate, before)
        held = claims.claim(client, GRANTS, [_row(candidate, token)], f"gpumeter-grant-{number}",
                            functools.partial(_claims_at, client, number))
        if held and held[0] == token:
            return candidate
    raise GrantConflict(f"no free grant number after {MAX_ATTEMPTS} attempts: other writers keep taking them")


def _claims_at(client: Client, number: int) -> list[str]:
    rows = client.query(f"SELECT claim FROM {GRANTS.name} WHERE number = %(n)s ORDER BY inserted_at",
                        parameters={"n": number}).result_rows
    return [str(row[0]) for row in rows]


def _row(record: GrantRecord, token: str) -> tuple[Any, ...]:
    values = {**record.model_dump(), "claim": token}
    return GRANTS.row_from(values)


def _record(row: dict[str, Any]) -> GrantRecord:
    return GrantRecord(
        number=int(row["number"]), tenant=str(row["tenant"]), metric=row["metric"],
        amount=to_decimal(row["amount"]),
        effective_at=_utc(row["effective_at"]), expires_at=_utc(row["expires_at"]),
        rollover=bool(row["rollover"]), corrects=None if row["corrects"] is None else int(row["corrects"]),
        note=str(row["note"]), granted_at=_utc(row["granted_at"]))


def _utc(value: datetime | None) -> Any:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

