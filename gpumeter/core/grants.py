"""Budget grants (contract 4, amendment "grants"): GPU-hours or spend added to a tenant's limit.

A grant comes from the tenants file (a ``grants:`` list per tenant, each with an ``id``) or from
``gpumeter budget grant`` (a numbered row of ClickHouse ``quota_grants``, append-only: never
edited, a correction is a new negative grant naming the one it corrects). What a grant adds to
which period is ``quota.grants``; this module only says what a well-formed grant is.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpumeter.core.validation import TENANT_PATTERN, DecimalValue, UtcTimestamp

GrantMetric = Literal["gpu_hours", "spend"]
GRANT_METRICS: tuple[GrantMetric, ...] = ("gpu_hours", "spend")
# Places a grant's amount may carry: money to the cent, hours as quota events show them.
AMOUNT_PLACES: dict[GrantMetric, int] = {"gpu_hours": 6, "spend": 2}
FILE_GRANT_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class GrantTerms(BaseModel):
    """What every grant says: metric, amount and when it counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: GrantMetric
    amount: DecimalValue
    effective_at: UtcTimestamp
    expires_at: UtcTimestamp | None = None  # None: never expires
    rollover: bool = False

    @model_validator(mode="after")
    def _well_formed(self) -> GrantTerms:
        places = AMOUNT_PLACES[self.metric]
        if not self.amount.is_finite() or self.amount != round(self.amount, places):
            raise ValueError(f"amount: {self.amount} has more than {places} decimal places for {self.metric}")
        if self.expires_at is not None and self.expires_at <= self.effective_at:
            raise ValueError(f"expires_at: {self.expires_at.isoformat()} is not after effective_at "
                             f"{self.effective_at.isoformat()}: an empty effective range")
        return self

    def in_force(self, moment: datetime) -> bool:
        """effective_at <= moment < expires_at."""
        return self.effective_at <= moment and (self.expires_at is None or moment < self.expires_at)


class FileGrant(GrantTerms):
    """A grant in the tenants file: named by ``id``, positive, changed only by editing the file."""

    id: Annotated[str, Field(pattern=FILE_GRANT_ID)]

    @field_validator("amount")
    @classmethod
    def _positive(cls, value: Decimal) -> Decimal:
        if value <= 0:
            raise ValueError("amount: a grant in the tenants file must be positive "
                             "(edit the file to take one back)")
        return value


class GrantRecord(GrantTerms):
    """One row of ``quota_grants``: numbered per database, never edited.

    A correction has a negative ``amount`` and ``corrects`` = the number of the grant it takes
    from; it counts as part of that grant (same metric, range and rollover), and the grant plus
    its corrections never goes below zero.
    """

    number: Annotated[int, Field(ge=1)]
    tenant: Annotated[str, Field(pattern=TENANT_PATTERN)]
    corrects: Annotated[int, Field(ge=1)] | None = None
    note: Annotated[str, Field(max_length=1000)] = ""
    granted_at: UtcTimestamp

    @model_validator(mode="after")
    def _sign(self) -> GrantRecord:
        if self.corrects is None and self.amount <= 0:
            raise ValueError("amount: a grant adds a positive amount; a correction is negative and names "
                             "the grant it corrects")
        if self.corrects is not None and self.amount >= 0:
            raise ValueError("amount: a correction takes back a positive amount, so it is negative")
        return self


class Grant(GrantTerms):
    """A grant as the limit arithmetic sees it: its corrections folded in, named by ``key``
    (``file:<id>`` for the tenants file, ``#<number>`` for ``quota_grants``)."""

    key: str
