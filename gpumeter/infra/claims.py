"""Claims without a lock server: a position in a log table taken by insert deduplication.

ClickHouse has no transactions. A table that remembers recent insert tokens (a MergeTree with
``non_replicated_deduplication_window``; a Replicated* table through Keeper) lands one block
per ``insert_deduplication_token`` and silently drops a repeat: the engine checks and records
the token under its parts lock. So two writers that both want position k insert their rows
with the token of k; exactly one block lands, and each writer reads position k back to learn
whose rows hold it. The invoice ledger numbers invoices this way (pricing/ledger_store.py) and
``gpumeter migrate`` takes its lock this way (gpumeter/infra/migrations.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from gpumeter.infra.tables import Table

T = TypeVar("T")


def claim(client: Client, table: Table, rows: Sequence[tuple[Any, ...]], token: str,
          holders: Callable[[], list[T]]) -> list[T]:
    """Insert ``rows`` as one block under ``token`` unless the position is held already; return
    what holds it afterwards (``holders()``: the rows at the claimed position, read back).

    The position is checked first so the deduplication window only has to cover the inserts
    between that check and this insert, milliseconds apart, not the table's whole history.
    """
    held = holders()
    if held:
        return held
    client.insert(table.name, list(rows), column_names=list(table.insert_columns),
                  settings={"insert_deduplication_token": token, "insert_deduplicate": 1, "async_insert": 0})
    return holders()
