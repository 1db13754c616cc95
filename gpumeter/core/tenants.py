"""Tenants file (contract 4): quotas and billing terms per tenant."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpumeter.core.config_files import ConfigError, read_yaml, validation_failure
from gpumeter.core.validation import TENANT_PATTERN, DecimalValue, NonNegativeDecimal, non_negative_decimal


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
    commitment: non_negative_decimal(2) | None = None  # type: ignore[valid-type]
    credits: non_negative_decimal(2) | None = None  # type: ignore[valid-type]

    @field_validator("warn_at")
    @classmethod
    def _ascending_fractions(cls, value: list[Decimal]) -> list[Decimal]:
        for fraction in value:
            if not Decimal(0) < fraction < Decimal(1):
                raise ValueError(f"warn_at fractions must be between 0 and 1, got {fraction}")
        if value != sorted(set(value)):
            raise ValueError("warn_at must be strictly ascending")
        return value


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
