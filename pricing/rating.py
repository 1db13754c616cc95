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
        # window_start -> (card in force, UTC instant, invoice month); window_end -> UTC instant.
        # The samples of one window share these, so each is worked out once per window.
        self._starts: dict[datetime, tuple[RateCard | None, datetime, str]] = {}
        self._ends: dict[datetime, datetime] = {}

    def _start(self, moment: datetime) -> tuple[RateCard | None, datetime, str]:
        found = self._starts.get(moment)
        if found is None:
            if len(self._starts) >= _MOMENT_CACHE_SIZE:
                self._starts.clear()
            found = (self.cards.card_at(moment), moment.astimezone(UTC), utc_month(moment))
            self._starts[moment] = found
        return found

    def _end(self, moment: datetime) -> datetime:
        found = self._ends.get(moment)
        if found is None:
            if len(self._ends) >= _MOMENT_CACHE_SIZE:
                self._ends.clear()
            found = self._ends[moment] = moment.astimezone(UTC)
        return found

    def rate_for(
        self, card: RateCard, kind: str, gpu_model: str | None, mig_profile: str | None
    ) -> Rate | None:
        key = (card.version, kind, gpu_model, mig_profile)
        if key not in self._rates:
            self._rates[key] = find_rate(card, kind, gpu_model, mig_profile)
        return self._rates[key]

    def rate(self, sample: UsageSample, partition: int = -1, offset: int = -1) -> RatedUsage:
        """The sample with its streaming list cost, or SampleRejected(code='no_rate')."""
        card, window_start, period = self._start(sample.window_start)
        if card is None:
            raise SampleRejected(
                f"no rate card in force at {sample.window_start.isoformat()}", code="no_rate"
            )
        rate = self.rate_for(card, sample.kind, sample.gpu_model, sample.mig_profile)
        if rate is None:
            raise SampleRejected(
                f"rate card {card.version} has no rate for kind={sample.kind} "
                f"gpu_model={sample.gpu_model} mig_profile={sample.mig_profile}",
                code="no_rate",
            )
        multiplier = card.capacity_multipliers[sample.capacity_type]
        unit_seconds = sample.unit_seconds
        # Every field comes from a validated sample, card or exact arithmetic: constructed
        # without re-validation (model_construct's own loop was half the rating stage's time).
        return trusted(RatedUsage, {
            "event_id": sample.event_id,
            "kind": sample.kind,
            "cluster": sample.cluster,
            "node": sample.node,
            "tenant": sample.tenant,
            "namespace": sample.namespace,
            "pod": sample.pod,
            "pod_uid": sample.pod_uid,
            "window_start": window_start,
            "window_end": self._end(sample.window_end),
            "period": period,
            "quantity": sample.quantity,
            "unit_seconds": unit_seconds,
            "gpu_model": sample.gpu_model,
            "mig_profile": sample.mig_profile,
            "capacity_type": sample.capacity_type,
            "priority": sample.priority,
            "rate_card": card.version,
            "currency": card.currency,
            "unit_price": rate.list_price,
            "capacity_multiplier": multiplier,
            "list_cost": list_cost(unit_seconds, rate.list_price, multiplier),
            "utilization": sample.utilization,
            "energy_joules": sample.energy_joules,
            "labels": sample.labels,
            "source_partition": partition,
            "source_offset": offset,
        }, set(_RATED_FIELDS))


_RATED_FIELDS = frozenset(RatedUsage.model_fields)
_MOMENT_CACHE_SIZE = 4096


def list_cost(unit_seconds: Decimal, unit_price: Decimal, multiplier: Decimal) -> Decimal:
    """unit_hours x unit_price x multiplier, kept at 18 decimal places for real-time spend."""
    return to_store(per_hour(product(unit_seconds, unit_price, multiplier)))
