"""Rendered bytes of issued invoices (JSON, CSV, PDF), kept in memory within a byte budget.

An issued tenant-month changes only by gaining an adjustment, which gives it a new last ledger
position: the key (tenant, period, last position, format, paper) never names stale bytes, so
entries are only ever evicted (least recently used first), never invalidated.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_BYTES = 64 * 1024 * 1024

Key = tuple[str, str, int, str, str]


@dataclass(frozen=True)
class Rendered:
    body: bytes
    media_type: str
    headers: tuple[tuple[str, str], ...] = ()


class RenderedCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[Key, Rendered] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key) -> Rendered | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: Key, rendered: Rendered) -> None:
        size = len(rendered.body)
        if size > self._max_bytes:
            return  # served, not kept
        with self._lock:
            previous = self._items.pop(key, None)
            if previous is not None:
                self._bytes -= len(previous.body)
            self._items[key] = rendered
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted.body)

    @property
    def size(self) -> int:
        return self._bytes
