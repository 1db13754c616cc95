"""The limit of a quota period with grants (contract 4, amendment "grants"): pure.

The limit of ``gpu_hours`` or ``spend`` at an instant t of period P is

    base + Σ amount(g)  over grants g of home period P in force at t
         + Σ carry(g)   over rollover grants g of home period P−1 in force at t

where the *home period* of a grant is the quota period (the tenant's ``period``: UTC month or
day) holding its ``effective_at``, *in force at t* means ``effective_at <= t < expires_at`` (no
``expires_at``: for ever) and P−1 is the period before P. A tenant with no base limit for the
metric has no limit: grants raise a limit, they never create one.

``carry(g)`` is the unused part of g at the end of its home period Q, carried once into the
next period (a carried part is not carried again). Usage of Q beyond the base limit is
attributed to Q's own grants in this order: grants without rollover first (they vanish at the
end of Q anyway), then rollover grants by ``expires_at`` (none last), then key. So with U the
usage of Q, B the base limit, N the Σ of Q's grants without rollover and R_g the Σ of Q's
rollover grants before g in that order:

    carry(g) = min(amount(g), max(0, B + N + R_g + amount(g) − U))

Carried amounts raise the next period's limit but are not attributed usage there (so the next
period's own rollover grants are used before them): this keeps carry(g) a function of the
home period alone. All arithmetic is exact Decimal in the metric's unit (hours or money).

Corrections: a ``quota_grants`` row with ``corrects = n`` is folded into grant n (same
metric, range and rollover); a number seen twice (a row read twice) counts once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from gpumeter.core.grants import FileGrant, Grant, GrantMetric, GrantRecord
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy
from quota.periods import PeriodKind, period_end, period_key, period_start

_ZERO = Decimal(0)
_INSTANT = timedelta(microseconds=1)


class GrantError(ValueError):
    """Grants that cannot be folded (a correction of an unknown grant, a negative balance)."""


@dataclass(frozen=True)
class LimitBounds:
    """A period's limit as one who does not know the usage can tell it: ``low`` counts no
    carried amount, ``high`` every candidate carry in full. Equal when nothing may carry."""

    low: Decimal
    high: Decimal

    def admits(self, limit: Decimal) -> bool:
        return self.low <= limit <= self.high


def fold(records: Iterable[GrantRecord]) -> dict[str, list[Grant]]:
    """Table rows -> grants per tenant, corrections folded in, each number once.

    Raises GrantError for a correction of a number that is not a grant of the same tenant,
    or a grant whose corrections take it below zero (``check_new`` refuses both on write).
    """
    by_number: dict[int, GrantRecord] = {}
    for record in records:
        by_number.setdefault(record.number, record)
    amounts: dict[int, Decimal] = {}
    with exact():
        for record in sorted(by_number.values(), key=lambda r: r.number):
            if record.corrects is None:
                amounts[record.number] = record.amount
                continue
            target = by_number.get(record.corrects)
            if target is None or target.corrects is not None or target.tenant != record.tenant:
                raise GrantError(f"grant #{record.number} corrects #{record.corrects}, which is not a grant "
                                 f"of tenant {record.tenant}")
            amounts[target.number] = amounts.get(target.number, target.amount) + record.amount
    result: dict[str, list[Grant]] = {}
    for number, amount in sorted(amounts.items()):
        record = by_number[number]
        if amount < 0:
            raise GrantError(f"grant #{number} of tenant {record.tenant}: its corrections leave {amount}")
        result.setdefault(record.tenant, []).append(_grant(f"#{number}", record, amount))
    return result


def of_file(grants: Iterable[FileGrant]) -> list[Grant]:
    return [_grant(f"file:{grant.id}", grant, grant.amount) for grant in grants]


def previous_period(key: str) -> str:
    """The period just before ``key`` (same granularity)."""
    kind: PeriodKind = "month" if len(key) == 7 else "day"
    return period_key(period_start(key) - _INSTANT, kind)


def home(grant: Grant, kind: PeriodKind) -> str:
    return period_key(grant.effective_at, kind)


def carries(base: Decimal, grants: Sequence[Grant], metric: GrantMetric, kind: PeriodKind, period: str,
            used: Decimal) -> dict[str, Decimal]:
    """carry(g) of each rollover grant of home ``period`` whose usage was ``used`` (module doc)."""
    own = [g for g in grants if g.metric == metric and home(g, kind) == period]
    result: dict[str, Decimal] = {}
    with exact():
        available = base + sum((g.amount for g in own if not g.rollover), _ZERO)
        for grant in sorted((g for g in own if g.rollover), key=_attribution_order):
            available += grant.amount
            result[grant.key] = min(grant.amount, max(_ZERO, available - used))
    return result


def limit_at(base: Decimal | None, grants: Sequence[Grant], metric: GrantMetric, kind: PeriodKind,
             now: datetime, used_before: Decimal) -> Decimal | None:
    """The limit at ``now`` (module doc); ``used_before``: the usage of the period before now's."""
    if base is None:
        return None
    current = period_key(now, kind)
    previous = previous_period(current)
    carried = carries(base, grants, metric, kind, previous, used_before)
    with exact():
        total = base
        for grant in grants:
            if grant.metric != metric or not grant.in_force(now):
                continue
            start = home(grant, kind)
            if start == current:
                total += grant.amount
            elif start == previous and grant.key in carried:
                total += carried[grant.key]
        return total


def bounds(base: Decimal | None, grants: Sequence[Grant], metric: GrantMetric, kind: PeriodKind,
           period: str, now: datetime) -> LimitBounds | None:
    """The limit of ``period`` as of ``now`` (its last instant if it is over), without its usage:
    a carried part lies between nothing and the whole grant. For the trust check."""
    if base is None:
        return None
    at = min(now, period_end(period) - _INSTANT)
    previous = previous_period(period)
    low = high = base
    with exact():
        for grant in grants:
            if grant.metric != metric or not grant.in_force(at):
                continue
            start = home(grant, kind)
            if start == period:
                low += grant.amount
                high += grant.amount
            elif start == previous and grant.rollover:
                high += grant.amount
    return LimitBounds(low, high)


def active(grants: Sequence[Grant], metric: GrantMetric, kind: PeriodKind, now: datetime) -> list[Grant]:
    """The grants that count at ``now`` in full or as a carry (for display)."""
    current = period_key(now, kind)
    previous = previous_period(current)
    return [g for g in grants if g.metric == metric and g.in_force(now)
            and (home(g, kind) == current or (g.rollover and home(g, kind) == previous))]


def _attribution_order(grant: Grant) -> tuple[bool, datetime, str]:
    expires = grant.expires_at
    return (expires is None, expires if expires is not None else grant.effective_at, grant.key)


def _grant(key: str, terms: FileGrant | GrantRecord, amount: Decimal) -> Grant:
    return Grant(key=key, metric=terms.metric, amount=amount, effective_at=terms.effective_at,
                 expires_at=terms.expires_at, rollover=terms.rollover)


def check_new(candidate: GrantRecord, before: Sequence[GrantRecord], policy: TenantPolicy | None,
              now: datetime) -> None:
    """Refuse a grant or correction that cannot be stored, naming the field (GrantError).

    - the tenant must be in the tenants file, and its policy must set the metric's limit
      (a grant raises a limit, it never creates one);
    - ``expires_at`` must be after ``effective_at`` (GrantTerms) and not already past;
    - a correction names an earlier grant (not a correction) of the same tenant, takes from
      it over its own range (a correction cannot overlap another range: it has the grant's),
      and leaves the grant with a remaining balance of at least zero.
    """
    if policy is None or policy.tenant != candidate.tenant:
        raise GrantError(f"tenant: {candidate.tenant} is not in the tenants file")
    if getattr(policy, candidate.metric) is None:
        raise GrantError(f"metric: tenant {candidate.tenant} has no {candidate.metric} limit for a grant to "
                         "raise (grants raise a limit, they never create one)")
    if candidate.expires_at is not None and candidate.expires_at <= now:
        raise GrantError(f"expires_at: {candidate.expires_at.isoformat()} is already past")
    if candidate.corrects is None:
        return
    target = next((r for r in before if r.number == candidate.corrects), None)
    if target is None or target.corrects is not None or target.tenant != candidate.tenant:
        raise GrantError(f"corrects: #{candidate.corrects} is not a grant of tenant {candidate.tenant}")
    same_terms = (target.metric, target.effective_at, target.expires_at, target.rollover) == (
        candidate.metric, candidate.effective_at, candidate.expires_at, candidate.rollover)
    if not same_terms:
        raise GrantError(f"effective_at: a correction counts over the range of grant #{target.number} "
                         f"({target.metric}, {target.effective_at.isoformat()} .. "
                         f"{target.expires_at.isoformat() if target.expires_at else 'no expiry'}); "
                         "it cannot have another")
    with exact():
        remaining = target.amount + sum((r.amount for r in before if r.corrects == target.number), _ZERO)
        if remaining + candidate.amount < 0:
            raise GrantError(f"amount: grant #{target.number} has {remaining} left; taking "
                             f"{-candidate.amount} would leave a negative remaining balance")
