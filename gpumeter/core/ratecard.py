"""Rate cards (contract 2): models, validation and loading of one file or a directory."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpumeter.core.config_files import ConfigError, read_yaml, validation_failure
from gpumeter.core.models import CAPACITY_TYPES, Kind
from gpumeter.core.validation import NonNegativeDecimal, UtcTimestamp


class Tier(BaseModel):
    """A band (previous up_to, up_to] of unit-hours priced at unit_price; up_to None = unbounded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    up_to: NonNegativeDecimal | None
    unit_price: NonNegativeDecimal


class Rate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    gpu_model: Annotated[str, Field(min_length=1)] | None = None
    mig_profile: Annotated[str, Field(min_length=1)] | None = None
    unit_price: NonNegativeDecimal | None = None
    tiers: list[Tier] | None = None

    @model_validator(mode="after")
    def _check(self) -> Rate:
        if self.kind != "gpu" and (self.gpu_model or self.mig_profile):
            raise ValueError(f"{self.kind} rate cannot name a gpu_model or mig_profile")
        if self.mig_profile and not self.gpu_model:
            raise ValueError("a rate with mig_profile must also name its gpu_model")
        if self.tiers is not None:
            self._check_tiers(self.tiers)
            if self.unit_price is not None and self.unit_price != self.tiers[0].unit_price:
                raise ValueError(
                    f"unit_price {self.unit_price} differs from the first tier's price "
                    f"{self.tiers[0].unit_price}"
                )
        elif self.unit_price is None:
            raise ValueError("a rate needs unit_price or tiers")
        return self

    @staticmethod
    def _check_tiers(tiers: list[Tier]) -> None:
        if not tiers:
            raise ValueError("tiers must not be empty")
        previous = Decimal(0)
        for position, tier in enumerate(tiers):
            last = position == len(tiers) - 1
            if tier.up_to is None:
                if not last:
                    raise ValueError("only the last tier may have up_to: null")
                continue
            if tier.up_to <= previous:
                raise ValueError(f"tier bands must ascend: up_to {tier.up_to} after {previous}")
            previous = tier.up_to
        if tiers[-1].up_to is not None:
            raise ValueError("the last tier must have up_to: null so every quantity has a price")

    @property
    def list_price(self) -> Decimal:
        """The streaming price: first band price when tiered (contract 3, step 3)."""
        if self.tiers:
            return self.tiers[0].unit_price
        assert self.unit_price is not None  # guaranteed by _check
        return self.unit_price

    @property
    def selector(self) -> tuple[str, str | None, str | None]:
        return (self.kind, self.gpu_model, self.mig_profile)


class RateCard(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Annotated[str, Field(min_length=1, max_length=64)]
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")]
    effective_from: UtcTimestamp
    capacity_multipliers: dict[str, NonNegativeDecimal]
    rates: list[Rate]

    @model_validator(mode="after")
    def _check(self) -> RateCard:
        missing = [c for c in CAPACITY_TYPES if c not in self.capacity_multipliers]
        unknown = [c for c in self.capacity_multipliers if c not in CAPACITY_TYPES]
        if missing:
            raise ValueError(f"capacity_multipliers is missing {', '.join(missing)}")
        if unknown:
            raise ValueError(f"capacity_multipliers has unknown capacity types {', '.join(unknown)}")
        seen: set[tuple[str, str | None, str | None]] = set()
        for rate in self.rates:
            if rate.selector in seen:
                raise ValueError(f"duplicate rate for {rate.selector}")
            seen.add(rate.selector)
        return self


class RateCardSet(BaseModel):
    """Every card in force over time, sorted by effective_from."""

    model_config = ConfigDict(frozen=True)

    cards: list[RateCard]

    @model_validator(mode="after")
    def _check(self) -> RateCardSet:
        if not self.cards:
            raise ValueError("no rate cards")
        starts = [card.effective_from for card in self.cards]
        if len(set(starts)) != len(starts):
            raise ValueError("two rate cards share one effective_from")
        versions = [card.version for card in self.cards]
        if len(set(versions)) != len(versions):
            raise ValueError("two rate cards share one version")
        object.__setattr__(self, "cards", sorted(self.cards, key=lambda c: c.effective_from))
        return self

    def card_at(self, moment: datetime) -> RateCard | None:
        """The card with the latest effective_from <= moment (contract 3, step 2)."""
        chosen = None
        for card in self.cards:
            if card.effective_from <= moment:
                chosen = card
            else:
                break
        return chosen

    def by_version(self, version: str) -> RateCard:
        for card in self.cards:
            if card.version == version:
                return card
        raise KeyError(version)


def load_rate_card(path: Path) -> RateCard:
    document = read_yaml(path)
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a rate card is a YAML mapping")
    try:
        return RateCard.model_validate(document)
    except ValidationError as exc:
        raise validation_failure(path, exc) from None


def load_rate_cards(path: Path) -> RateCardSet:
    """One YAML file, or every *.yaml / *.yml file in a directory."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        if not files:
            raise ConfigError(f"{path}: no rate card files (*.yaml) in this directory")
    elif path.exists():
        files = [path]
    else:
        raise ConfigError(f"{path}: rate card file or directory not found")
    cards = [load_rate_card(file) for file in files]
    try:
        return RateCardSet(cards=cards)
    except ValidationError as exc:
        raise validation_failure(path, exc) from None
