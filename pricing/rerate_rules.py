"""Re-rating a stored month (contract 3.2 after a rate-card change): the pure rules.

A stored row carries the rating the worker gave it: rate card version, currency, list price,
capacity multiplier and list cost. When a card is deployed late (a new version in force from a
date already rated) or corrected in place, those figures are stale. Which card applies depends
only on ``window_start``; which rate, only on (kind, gpu_model, mig_profile); the multiplier,
only on capacity_type. So the month splits into *segments* (one card in force each) and every
group of rows sharing segment, selector and stored rating is either wholly stale or wholly
fresh: the store aggregates groups, these rules decide, and only stale rows are read and
rewritten. Nothing here touches I/O (pricing/rerate.py does).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpumeter.core.money import exact
from gpumeter.core.ratecard import RateCard, RateCardSet
from pricing.invoice import ZERO, LineKey, UsageLine
from pricing.rating import find_rate, list_cost

# usage_hourly.samples is UInt64: a compensation row carries -n as 2**64 - n, which sum() and
# the SummingMergeTree merge (both unsigned, wrapping) turn back into exactly -n.
UINT64 = 2**64


class RerateRefused(ValueError):
    """The month cannot be re-rated with these cards (nothing is written)."""


@dataclass(frozen=True)
class Rating:
    """What a card decides for a row; the columns of rated_usage that depend on the card."""

    rate_card: str
    currency: str
    unit_price: Decimal
    capacity_multiplier: Decimal


@dataclass(frozen=True)
class Segment:
    """[start, end) of a month with one card in force (None: before the first card)."""

    start: datetime
    end: datetime
    card: RateCard | None


@dataclass(frozen=True)
class Selector:
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: str


@dataclass(frozen=True)
class Group:
    """Stored rows of one tenant sharing segment, selector and stored rating (FINAL: each id once)."""

    segment: int
    tenant: str
    selector: Selector
    stored: Rating
    rows: int
    unit_seconds: Decimal
    list_cost: Decimal

    @property
    def key(self) -> LineKey:
        return line_key(self.stored, self.selector)


def line_key(rating: Rating, selector: Selector) -> LineKey:
    return LineKey(rating.rate_card, selector.kind, selector.gpu_model, selector.mig_profile,
                   selector.capacity_type)


def month_bounds(period: str) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of a YYYY-MM period, UTC."""
    year, month = (int(part) for part in period.split("-"))
    return datetime(year, month, 1, tzinfo=UTC), datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def segments(cards: RateCardSet, period: str) -> list[Segment]:
    """The month cut at every card's effective_from inside it, each piece with its card."""
    start, end = month_bounds(period)
    cuts = [start, *sorted(c.effective_from for c in cards.cards if start < c.effective_from < end), end]
    return [Segment(a, b, cards.card_at(a)) for a, b in itertools.pairwise(cuts)]


def check_covered(pieces: Sequence[Segment], period: str) -> None:
    if all(piece.card is None for piece in pieces):
        raise RerateRefused(f"no rate card is in force at any time in {period}")


def rating_of(card: RateCard, selector: Selector) -> Rating | None:
    """The card's rating of rows with this selector (contract 3.2), or None: no matching rate."""
    rate = find_rate(card, selector.kind, selector.gpu_model, selector.mig_profile)
    multiplier = card.capacity_multipliers.get(selector.capacity_type)
    if rate is None or multiplier is None:
        return None
    return Rating(card.version, card.currency, rate.list_price, multiplier)


@dataclass
class Plan:
    """What re-rating a month changes, decided from its groups before any row is read."""

    period: str
    groups: list[Group]
    fresh: dict[Group, Rating]  # every group's rating by the cards now loaded
    rows_by_tenant: dict[str, int] = field(default_factory=dict)  # stale rows per tenant

    @property
    def stale(self) -> list[Group]:
        return [group for group in self.groups if self.fresh[group] != group.stored]

    @property
    def stale_rows(self) -> int:
        return sum(group.rows for group in self.stale)

    def lines_before(self) -> dict[str, list[UsageLine]]:
        return _lines((group.tenant, group.key, group.unit_seconds) for group in self.groups)

    def lines_after(self) -> dict[str, list[UsageLine]]:
        return _lines((group.tenant, line_key(self.fresh[group], group.selector), group.unit_seconds)
                      for group in self.groups)

    def list_cost_before(self) -> dict[str, Decimal]:
        totals: dict[str, Decimal] = {}
        for group in self.groups:
            with exact():
                totals[group.tenant] = totals.get(group.tenant, ZERO) + group.list_cost
        return totals


class Rerater:
    """The fresh rating of a stored row: the segment's card by window_start, then the selector."""

    def __init__(self, pieces: Sequence[Segment]) -> None:
        self.pieces = list(pieces)
        self._cache: dict[tuple[int, Selector], Rating | None] = {}

    def segment_of(self, moment: datetime) -> int:
        moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
        for index, piece in enumerate(self.pieces):
            if moment < piece.end:
                return index
        raise RerateRefused(f"window_start {moment.isoformat()} is after the month")

    def rating(self, row: Mapping[str, Any]) -> Rating | None:
        selector = Selector(str(row["kind"]), row["gpu_model"], row["mig_profile"], str(row["capacity_type"]))
        key = (self.segment_of(row["window_start"]), selector)
        if key not in self._cache:
            card = self.pieces[key[0]].card
            self._cache[key] = rating_of(card, selector) if card is not None else None
        return self._cache[key]


def plan(cards: RateCardSet, period: str, groups: Iterable[Group]) -> Plan:
    """Each group's fresh rating; RerateRefused naming the first group the cards cannot rate
    (before the first card, or no rate for its selector): a partial re-rating would leave the
    month priced by two card sets."""
    pieces = segments(cards, period)
    check_covered(pieces, period)
    listed = list(groups)
    fresh: dict[Group, Rating] = {}
    unratable: list[tuple[Group, str]] = []
    for group in listed:
        card = pieces[group.segment].card
        rating = rating_of(card, group.selector) if card is not None else None
        if rating is None:
            why = (f"no rate card in force before {pieces[group.segment].end.isoformat()}" if card is None
                   else f"rate card {card.version} has no rate for kind={group.selector.kind} "
                        f"gpu_model={group.selector.gpu_model} mig_profile={group.selector.mig_profile}")
            unratable.append((group, why))
        else:
            fresh[group] = rating
    if unratable:
        rows = sum(group.rows for group, _ in unratable)
        group, why = unratable[0]
        raise RerateRefused(f"{rows} stored row(s) of {period} cannot be re-rated with these cards "
                            f"(first: tenant {group.tenant}, {why}); nothing was changed")
    result = Plan(period, listed, fresh)
    for group in result.stale:
        result.rows_by_tenant[group.tenant] = result.rows_by_tenant.get(group.tenant, 0) + group.rows
    return result


def _lines(items: Iterable[tuple[str, LineKey, Decimal]]) -> dict[str, list[UsageLine]]:
    sums: dict[str, dict[LineKey, Decimal]] = {}
    for tenant, key, seconds in items:
        bucket = sums.setdefault(tenant, {})
        with exact():
            bucket[key] = bucket.get(key, ZERO) + seconds
    # Lines are sorted again where they are priced; any order will do here.
    return {tenant: [UsageLine(key, seconds) for key, seconds in bucket.items()]
            for tenant, bucket in sums.items()}


# --- rows ------------------------------------------------------------------------------------------

RATING_COLUMNS = ("rate_card", "currency", "unit_price", "capacity_multiplier", "list_cost")


def stored_rating(row: Mapping[str, Any]) -> Rating:
    return Rating(str(row["rate_card"]), str(row["currency"]), Decimal(row["unit_price"]),
                  Decimal(row["capacity_multiplier"]))


def rerated(row: Mapping[str, Any], rating: Rating) -> dict[str, Any]:
    """The row with its card-dependent columns replaced; list cost as the rating stage computes
    it (contract 3.3 on the stored unit-seconds, 18 places)."""
    return {**row, "rate_card": rating.rate_card, "currency": rating.currency,
            "unit_price": rating.unit_price, "capacity_multiplier": rating.capacity_multiplier,
            "list_cost": list_cost(Decimal(row["unit_seconds"]), rating.unit_price,
                                   rating.capacity_multiplier)}


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


HOURLY_COLUMNS = ("period", "hour", "tenant", "rate_card", "kind", "gpu_model", "mig_profile",
                  "capacity_type", "unit_seconds", "list_cost", "samples")


def compensation(rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """usage_hourly rows that take the given stored rows' contributions out of the rollup: the
    materialized view added them when they were stored, and adds the re-rated copies again."""
    sums: dict[tuple[Any, ...], tuple[Decimal, Decimal, int]] = {}
    for row in rows:
        key = (row["period"], hour_of(row["window_start"]), row["tenant"], row["rate_card"], row["kind"],
               row["gpu_model"] or "", row["mig_profile"] or "", row["capacity_type"])
        seconds, cost, count = sums.get(key, (ZERO, ZERO, 0))
        with exact():
            sums[key] = (seconds + Decimal(row["unit_seconds"]), cost + Decimal(row["list_cost"]), count + 1)
    return [(*key, -seconds, -cost, UINT64 - count) for key, (seconds, cost, count) in sorted(sums.items())]


def chunks(rows: Iterable[Mapping[str, Any]], limit: int) -> list[list[Mapping[str, Any]]]:
    """Rows (in sort-key order) cut at every change of tenant-hour and every ``limit`` rows of one
    tenant-hour. A chunk is written as two inserts named by its content, so a run that repeats a
    chunk (after a crash between them, or a second run at once) is dropped by the engine; cutting
    per tenant-hour keeps a chunk's content the same unless rows of that very hour change."""
    result: list[list[Mapping[str, Any]]] = []
    current: list[Mapping[str, Any]] = []
    place: tuple[Any, ...] | None = None
    for row in rows:
        here = (row["tenant"], hour_of(row["window_start"]))
        if current and (here != place or len(current) >= limit):
            result.append(current)
            current = []
        place = here
        current.append(row)
    if current:
        result.append(current)
    return result


def chunk_token(period: str, old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> str:
    """A digest of exactly what a chunk changes: each row's id with its stored and new rating."""
    digest = hashlib.sha256(period.encode())
    for before, after in zip(old, new, strict=True):
        digest.update("\n{}|{}|{}".format(
            before["event_id"], "|".join(str(before[c]) for c in RATING_COLUMNS),
            "|".join(str(after[c]) for c in RATING_COLUMNS)).encode())
    return digest.hexdigest()[:40]
