"""Which quota-event offsets the actuator may commit when events finish out of order.

Events of different tenants are handled side by side, so a later offset can be done before an
earlier one; committing it would skip the earlier event after a crash. An offset is committed
once every event up to it is handled. (Replays that do get through are folded by the guard in
service.py: ClickHouse remembers which events were planned.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")


class OffsetTracker(Generic[K]):
    """Which offsets may be committed when events finish out of order.

    Offsets are added in fetch order per partition; ``add`` returns the callback marking that
    one handled; ``committable`` gives, per partition, the offset after the longest handled
    prefix (Kafka's "next offset to read"), once per advance.
    """

    @dataclass
    class _Entry:
        offset: int
        handled: bool = False

    def __init__(self) -> None:
        self._pending: dict[K, deque[OffsetTracker._Entry]] = {}  # per partition, in fetch order
        self._unhandled = 0

    @property
    def in_flight(self) -> int:
        """Events added and not handled yet. Handled ones waiting for ``committable`` do not
        count: the consumer's back-pressure waits on this number, and only its own loop calls
        ``committable``, so counting them would wait for ever once the limit is reached."""
        return self._unhandled

    def add(self, partition: K, offset: int) -> Callable[[], None]:
        entry = OffsetTracker._Entry(offset)
        self._pending.setdefault(partition, deque()).append(entry)
        self._unhandled += 1

        def done() -> None:
            if not entry.handled:
                entry.handled = True
                self._unhandled -= 1

        return done

    def committable(self) -> dict[K, int]:
        out: dict[K, int] = {}
        for partition, entries in self._pending.items():
            while entries and entries[0].handled:
                out[partition] = entries.popleft().offset + 1
        return out

    def forget(self, partitions: set[K]) -> None:
        """Partitions no longer ours (a rebalance): their next owner reads them again."""
        for partition in partitions:
            dropped = self._pending.pop(partition, None) or ()
            self._unhandled -= sum(1 for entry in dropped if not entry.handled)
