"""Tenants file (contract 4): quotas and billing terms per tenant."""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpumeter.core.config_files import ConfigError, read_yaml, validation_failure
from gpumeter.core.grants import FileGrant
from gpumeter.core.validation import TENANT_PATTERN, DecimalValue, NonNegativeDecimal, non_negative_decimal

# [0-9], not \d: \d matches every Unicode digit (pydantic-core's and Python's regex alike).
PERIOD_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"
# A calendar month, YYYY-MM (UTC): the unit of billing terms. Text compares in month order.
Month = Annotated[str, Field(pattern=PERIOD_PATTERN)]
# The source name of the old per-month ``credits`` allowance in an invoice's credit draws.
MONTHLY_CREDITS = "monthly"
# A per-model limit's key: a GPU model (``H100-SXM-80GB``) or a prefix of one ending in ``-``
# (``A100-``); the longest key that matches a sample's gpu_model owns it.
MODEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def model_key(keys: Iterable[str], gpu_model: str | None) -> str | None:
    """The per-model key that owns ``gpu_model``: the key equal to it, else the longest key
    ending in ``-`` that it starts with; None when none matches (contract 4, "per-model limits")."""
    if gpu_model is None:
        return None
    best: str | None = None
    for key in keys:
        if key == gpu_model:
            return key
        if key.endswith("-") and gpu_model.startswith(key) and (best is None or len(key) > len(best)):
            best = key
    return best


def _model_limits(value: dict[str, Decimal]) -> dict[str, Decimal]:
    for key in value:
        if not re.match(MODEL_KEY_PATTERN, key):
            raise ValueError(f"model key {key!r}: a GPU model (H100-SXM-80GB) or a prefix ending "
                             "in '-' (A100-)")
    return value


class CommitmentTerm(BaseModel):
    """A minimum monthly spend for the months start..end (inclusive; no end = open-ended)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    monthly: non_negative_decimal(2)  # type: ignore[valid-type]
    start: Month
    end: Month | None = None

    @model_validator(mode="after")
    def _ordered(self) -> CommitmentTerm:
        if self.end is not None and self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        return self

    def covers(self, period: str) -> bool:
        return self.start <= period and (self.end is None or period <= self.end)


class CreditGrant(BaseModel):
    """Credits granted once: a balance that invoices of the months start..end draw down.

    ``end`` is the last month whose invoice may draw on it (the grant expires after it);
    no end = it never expires.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    amount: non_negative_decimal(2)  # type: ignore[valid-type]
    start: Month
    end: Month | None = None

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == MONTHLY_CREDITS:
            raise ValueError(f"{MONTHLY_CREDITS!r} names the monthly credits allowance; pick another id")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> CreditGrant:
        if self.end is not None and self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        return self

    def usable_in(self, period: str) -> bool:
        return self.start <= period and (self.end is None or period <= self.end)


class TenantPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: Annotated[str, Field(pattern=TENANT_PATTERN)]
    period: Literal["month", "day"] = "month"
    gpu_hours: NonNegativeDecimal | None = None
    spend: non_negative_decimal(2) | None = None  # type: ignore[valid-type]
    max_gpus: NonNegativeDecimal | None = None
    warn_at: list[DecimalValue] = Field(default_factory=list)
    on_exceed: Literal["preempt", "block", "notify"] = "notify"
    grace_seconds: Annotated[int, Field(ge=0, le=86400)] = 30
    # Minimum spend of every month (no term); for a term use ``commitments`` instead.
    commitment: non_negative_decimal(2) | None = None  # type: ignore[valid-type]
    # Credits applied to every month's invoice, not carried over (a monthly allowance).
    credits: non_negative_decimal(2) | None = None  # type: ignore[valid-type]
    commitments: list[CommitmentTerm] = Field(default_factory=list)
    credit_grants: list[CreditGrant] = Field(default_factory=list)
    # Amendment "grants": GPU-hours or spend added to the period's limit (quota.grants).
    grants: list[FileGrant] = Field(default_factory=list)
    # Amendment "per-model limits": by GPU model key (MODEL_KEY_PATTERN, model_key()).
    gpu_hours_by_model: dict[str, NonNegativeDecimal] = Field(default_factory=dict)
    max_gpus_by_model: dict[str, NonNegativeDecimal] = Field(default_factory=dict)

    @field_validator("gpu_hours_by_model", "max_gpus_by_model")
    @classmethod
    def _model_keys(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        return _model_limits(value)

    @field_validator("grants")
    @classmethod
    def _unique_budget_grants(cls, value: list[FileGrant]) -> list[FileGrant]:
        ids = [grant.id for grant in value]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"grant id listed more than once: {', '.join(duplicates)}")
        return value

    @model_validator(mode="after")
    def _grants_raise_a_limit(self) -> TenantPolicy:
        for index, grant in enumerate(self.grants):
            if getattr(self, grant.metric) is None:
                raise ValueError(f"grants[{index}].metric: tenant {self.tenant} has no {grant.metric} limit "
                                 "for the grant to raise (grants raise a limit, they never create one)")
        return self

    @field_validator("warn_at")
    @classmethod
    def _ascending_fractions(cls, value: list[Decimal]) -> list[Decimal]:
        for fraction in value:
            if not Decimal(0) < fraction < Decimal(1):
                raise ValueError(f"warn_at fractions must be between 0 and 1, got {fraction}")
        if value != sorted(set(value)):
            raise ValueError("warn_at must be strictly ascending")
        return value

    @field_validator("commitments")
    @classmethod
    def _terms_apart(cls, value: list[CommitmentTerm]) -> list[CommitmentTerm]:
        ordered = sorted(value, key=lambda term: term.start)
        for before, after in pairwise(ordered):
            if before.end is None or after.start <= before.end:
                raise ValueError(f"commitment terms starting {before.start} and {after.start} overlap")
        return ordered

    @field_validator("credit_grants")
    @classmethod
    def _unique_grants(cls, value: list[CreditGrant]) -> list[CreditGrant]:
        ids = [grant.id for grant in value]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"credit grant id listed more than once: {', '.join(duplicates)}")
        return value

    @model_validator(mode="after")
    def _one_kind_of_commitment(self) -> TenantPolicy:
        if self.commitment is not None and self.commitments:
            raise ValueError("give either commitment (every month) or commitments (terms), not both")
        return self

    def commitment_in(self, period: str) -> Decimal:
        """The minimum spend that binds month ``period`` (0 when none does)."""
        if self.commitment is not None:
            return self.commitment
        for term in self.commitments:
            if term.covers(period):
                return term.monthly
        return Decimal(0)


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: list[TenantPolicy] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        names = [t.tenant for t in self.tenants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tenant listed more than once: {', '.join(duplicates)}")
        return self

    def policy(self, tenant: str) -> TenantPolicy | None:
        """The tenant's policy, or None: no quota and no commitment, still billed."""
        for entry in self.tenants:
            if entry.tenant == tenant:
                return entry
        return None


def load_tenants(path: Path | None) -> TenantsFile:
    if path is None:
        return TenantsFile()
    document = read_yaml(path)
    if document is None:
        return TenantsFile()
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a tenants file is a YAML mapping with a 'tenants' list")
    try:
        return TenantsFile.model_validate(document)
    except ValidationError as exc:
        raise validation_failure(path, exc) from None
