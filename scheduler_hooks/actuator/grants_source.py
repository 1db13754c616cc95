"""quota_grants as the actuator reads it: kept in memory, read again when old or when asked.

The trust check compares a quota event's limit with the policy's, and with grants the policy's
limit is the base plus the grants (quota.grants). A worker's ``recovered`` caused by a new
grant can reach the actuator before its last read of the table shows that grant: so an event
whose limit disagrees is checked once more against a fresh read before it is ignored
(service.Actuator.handle), and no recovered is lost to that race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from gpumeter.core.grants import Grant
from gpumeter.infra.grants import GrantsReader
from scheduler_hooks.actuator.refreshing_cache import RefreshingCache

Grants = Mapping[str, Sequence[Grant]]


class GrantsSource:
    """The folded grants per tenant; a failed read keeps the last (nothing before the first)."""

    def __init__(self, reader: GrantsReader[dict[str, list[Grant]]], max_age: float,
                 spawn: Callable[[Awaitable[Any]], None]) -> None:
        self._reader = reader
        self._last: Grants = {}
        self._cache: RefreshingCache[Grants] = RefreshingCache(self._load, max_age, spawn,
                                                               what="quota_grants")

    async def get(self, fresh: bool = False) -> Grants:
        return await self._cache.get(fresh=fresh)

    async def _load(self) -> Grants:
        read = await asyncio.to_thread(self._reader.read)
        if read is not None:
            self._last = read
        return self._last

    def close(self) -> None:
        self._reader.close()
