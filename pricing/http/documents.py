"""The API's response bodies, as they appear in /openapi.json."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class ErrorBody(BaseModel):
    error: str


class _LineKeyDocument(BaseModel):
    """What identifies a line (pricing.invoice.LineKey), first in every line document."""

    rate_card: str
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: str


class LineDocument(_LineKeyDocument):
    quantity: str
    amount: str


class InvoiceDocument(BaseModel):
    """Contract 4b; an issued invoice adds number, issued_at, adjusts, credit_draws,
    credits_remaining and content_sha256."""

    tenant: str
    period: str
    currency: str
    status: Literal["draft", "final", "adjustment"]
    lines: list[LineDocument]
    subtotal: str
    commitment_true_up: str
    credits: str
    total: str
    number: str | None = None
    issued_at: str | None = None
    adjusts: str | None = None
    credit_draws: dict[str, str] | None = None
    credits_remaining: str | None = None
    content_sha256: str | None = None


class MonthDocument(InvoiceDocument):
    """The month's invoice: the draft, or the final with the adjustments issued after it."""

    adjustments: list[InvoiceDocument] | None = None


class UsageLineDocument(_LineKeyDocument):
    quantity: str
    list_cost: str
    samples: int


class UsageDocument(BaseModel):
    tenant: str
    period: str
    as_of: str
    currency: str | None
    lines: list[UsageLineDocument]
    list_cost: str


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "malformed period, format or paper"},
    401: {"model": ErrorBody, "description": "missing or unknown bearer token"},
    404: {"model": ErrorBody, "description": "no such invoice, or another tenant's data"},
    429: {"model": ErrorBody, "description": "over the request rate limit; retry after Retry-After seconds",
          "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}},
}
