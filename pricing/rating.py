"""Streaming rating (contract 3, steps 1-3): one sample, one list price, no tiers."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from gpumeter.core.models import RatedUsage, SampleRejected, UsageSample, trusted, utc_month
from gpumeter.core.money import per_hour, product, to_store
from gpumeter.core.ratecard import Rate, RateCard, RateCardSet


def find_rate(card: RateCard, kind: str, gpu_model: str | None, mig_profile: str | None) -> Rate | None:
    """Most specific rate: (kind, gpu_model, mig_profile) > (kind, gpu_model) > (kind)."""
    wanted = [(kind, gpu_model, mig_profile), (kind, gpu_model, None), (kind, None, None)]
    by_selector = {rate.selector: rate for rate in card.rates}
    for selector in wanted:
        rate = by_selector.get(selector)
        if rate is not None:
            return rate
    return None


class Rater:
    """Prices samples against a set of effective-dated rate cards, caching rate lookups."""

    def __init__(self, cards: RateCardSet) -> None:
        self.cards = cards
        self._rates: dict[tuple[str, str, str | None, str | None], Rate | None] = {}
        # window_start -> (card in force, UTC instant, invoice month, that card's prices);
        # window_end -> UTC instant. The samples of one window share these, so each is worked
        # out once per window.
        self._starts: dict[datetime, _Start] = {}
        self._ends: dict[datetime, datetime] = {}
        # card version -> (kind, gpu_model, mig_profile, capacity_type) -> price, None = no rate.
        self._prices: dict[str, dict[_Selector, _Price | None]] = {}

    def _start(self, moment: datetime) -> _Start:
        found = self._starts.get(moment)
        if found is None:
            if len(self._starts) >= _MOMENT_CACHE_SIZE:
                self._starts.clear()
            card = self.cards.card_at(moment)
            prices = {} if card is None else self._prices.setdefault(card.version, {})
            found = (card, moment.astimezone(UTC), utc_month(moment), prices)
            self._starts[moment] = found
        return found

    def _end(self, moment: datetime) -> datetime:
        found = self._ends.get(moment)
        if found is None:
            if len(self._ends) >= _MOMENT_CACHE_SIZE:
                self._ends.clear()
            found = self._ends[moment] = moment.astimezone(UTC)
        return found

    def window(self, start: datetime, end: datetime) -> tuple[RateCard | None, datetime, datetime, str]:
        """What rating a sample of this window takes from it: the card in force at ``start``,
        the window in UTC as RatedUsage holds it, and the invoice month."""
        card, window_start, period, _ = self._starts.get(start) or self._start(start)
        return card, window_start, self._ends.get(end) or self._end(end), period

    def rate_for(
        self, card: RateCard, kind: str, gpu_model: str | None, mig_profile: str | None
    ) -> Rate | None:
        key = (card.version, kind, gpu_model, mig_profile)
        if key not in self._rates:
            self._rates[key] = find_rate(card, kind, gpu_model, mig_profile)
        return self._rates[key]

    def _price(self, card: RateCard, selector: _Selector) -> _Price | None:
        """What a card charges for one selector: its most specific rate's list price and the
        capacity multiplier, worked out once per card and selector."""
        kind, gpu_model, mig_profile, capacity_type = selector
        rate = self.rate_for(card, kind, gpu_model, mig_profile)
        if rate is None:
            return None
        return (card.version, card.currency, rate.list_price, card.capacity_multipliers[capacity_type])

    def rate(self, sample: UsageSample, partition: int = -1, offset: int = -1) -> RatedUsage:
        """The sample with its streaming list cost, or SampleRejected(code='no_rate')."""
        # The validated sample's fields, read from its instance dict: one dict lookup each
        # instead of an attribute lookup through the model's class hierarchy.
        fields = sample.__dict__
        start, end = fields["window_start"], fields["window_end"]
        card, window_start, period, prices = self._starts.get(start) or self._start(start)
        if card is None:
            raise SampleRejected(
                f"no rate card in force at {sample.window_start.isoformat()}", code="no_rate"
            )
        kind, gpu_model, mig_profile = fields["kind"], fields["gpu_model"], fields["mig_profile"]
        capacity_type = fields["capacity_type"]
        selector = (kind, gpu_model, mig_profile, capacity_type)
        try:
            price = prices[selector]
        except KeyError:
            price = prices[selector] = self._price(card, selector)
        if price is None:
            raise SampleRejected(
                f"rate card {card.version} has no rate for kind={kind} "
                f"gpu_model={gpu_model} mig_profile={mig_profile}",
                code="no_rate",
            )
        version, currency, unit_price, multiplier = price
        quantity = fields["quantity"]
        unit_seconds = product(quantity, sample.window_seconds)  # as UsageSample.unit_seconds
        # Every field comes from a validated sample, card or exact arithmetic: constructed
        # without re-validation (model_construct's own loop was half the rating stage's time).
        return trusted(RatedUsage, {
            "event_id": fields["event_id"],
            "kind": kind,
            "cluster": fields["cluster"],
            "node": fields["node"],
            "tenant": fields["tenant"],
            "namespace": fields["namespace"],
            "pod": fields["pod"],
            "pod_uid": fields["pod_uid"],
            "window_start": window_start,
            "window_end": self._ends.get(end) or self._end(end),
            "period": period,
            "quantity": quantity,
            "unit_seconds": unit_seconds,
            "gpu_model": gpu_model,
            "mig_profile": mig_profile,
            "capacity_type": capacity_type,
            "priority": fields["priority"],
            "rate_card": version,
            "currency": currency,
            "unit_price": unit_price,
            "capacity_multiplier": multiplier,
            "list_cost": list_cost(unit_seconds, unit_price, multiplier),
            "utilization": fields["utilization"],
            "energy_joules": fields["energy_joules"],
            "labels": fields["labels"],
            "source_partition": partition,
            "source_offset": offset,
        }, _RATED_FIELDS.copy())


_Selector = tuple[str, str | None, str | None, str]  # kind, gpu_model, mig_profile, capacity_type
_Price = tuple[str, str, Decimal, Decimal]  # card version, currency, list price, capacity multiplier
_Start = tuple[RateCard | None, datetime, str, dict[_Selector, _Price | None]]
_RATED_FIELDS = set(RatedUsage.model_fields)  # copied per instance: pydantic may add to its own
_MOMENT_CACHE_SIZE = 4096


def list_cost(unit_seconds: Decimal, unit_price: Decimal, multiplier: Decimal) -> Decimal:
    """unit_hours x unit_price x multiplier, kept at 18 decimal places for real-time spend."""
    return to_store(per_hour(product(unit_seconds, unit_price, multiplier)))
