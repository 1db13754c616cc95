"""Victim selection (contract 4): which pods a quota preemption or a spot reclaim evicts.

Eviction order: spot pods first, then lowest priority, then the most recently started
(least work lost); a pod without a start time has not started running yet and counts
as the most recent of all. Ties fall to (namespace, name, uid), so the same cluster state
always yields the same victims. Protected pods (``gpumeter.io/protected: "true"``) and
pods holding no GPU are never chosen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpumeter.core.models import CapacityType
from gpumeter.core.money import exact

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Candidate:
    """A running (or pending) GPU pod that could be evicted."""

    namespace: str
    name: str
    uid: str
    tenant: str
    gpus: Decimal
    capacity_type: CapacityType
    priority: int
    started_at: datetime | None
    protected: bool

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, Decimal):
            raise TypeError("Candidate.gpus must be a Decimal")
        if self.started_at is not None and (
            self.started_at.tzinfo is None or self.started_at.utcoffset() is None
        ):
            raise ValueError(f"Candidate.started_at must be aware, got {self.started_at.isoformat()}")


def eviction_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Evictable candidates (unprotected, holding GPUs) in eviction order."""
    return sorted((c for c in candidates if not c.protected and c.gpus > 0), key=_order_key)


def select_victims(candidates: Iterable[Candidate], held: Decimal, limit: Decimal | None) -> list[Candidate]:
    """Pods of one tenant to evict for a quota preemption.

    ``limit`` None (gpu_hours or spend exceeded: they only grow within a period): every
    evictable GPU pod, in order. With a limit (max_gpus): the shortest prefix of the order
    after which ``held - Σ victims' gpus <= limit``; when even evicting every evictable pod
    does not get there (protected pods hold the rest), all of them.
    """
    ordered = eviction_order(candidates)
    if len({c.tenant for c in ordered}) > 1:
        # Quota victims must belong to the tenant over quota; a mix is a caller's bug.
        raise ValueError("select_victims needs the candidates of one tenant")
    if limit is None:
        return ordered
    victims: list[Candidate] = []
    remaining = held
    with exact():
        for candidate in ordered:
            if remaining <= limit:
                break
            victims.append(candidate)
            remaining -= candidate.gpus
    return victims


def spot_reclaim(spot_candidates: Iterable[Candidate], needed_gpus: Decimal) -> list[Candidate]:
    """Spot pods of one node to evict so that at least ``needed_gpus`` GPUs are freed there.

    Kept simple on purpose: the caller passes one node's pods; unprotected spot pods holding
    GPUs are taken lowest priority first, then most recently started, and the smallest
    prefix of that order freeing enough is returned, or [] when all of them would not.
    Pods of any tenant may be reclaimed: spot capacity is lent, not owned.
    """
    if needed_gpus <= 0:
        return []
    ordered = eviction_order(c for c in spot_candidates if c.capacity_type == "spot")
    victims: list[Candidate] = []
    freed = _ZERO
    with exact():
        for candidate in ordered:
            victims.append(candidate)
            freed += candidate.gpus
            if freed >= needed_gpus:
                return victims
    return []


def _order_key(candidate: Candidate) -> tuple[int, int, int, int, str, str, str]:
    spot_first = 0 if candidate.capacity_type == "spot" else 1
    if candidate.started_at is None:
        not_started_first, newest_first = 0, 0
    else:
        # Integer microseconds, negated: the most recent start sorts first, exactly.
        not_started_first = 1
        newest_first = -((candidate.started_at - _EPOCH) // _MICROSECOND)
    return (spot_first, candidate.priority, not_started_first, newest_first,
            candidate.namespace, candidate.name, candidate.uid)
