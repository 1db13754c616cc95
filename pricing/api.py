"""The tenant invoice API (contract 7) as an ASGI app (FastAPI); `gpumeter api` serves it with
uvicorn.

- Every request but ``/healthz`` carries ``Authorization: Bearer <token>``; a missing or unknown
  token is 401. A tenant token sees its own tenant only: any other tenant's path is 404, the
  same answer as a tenant that does not exist, given before the query is even validated.
- A malformed period, format or paper is 400 with one reason: ``{"error": "..."}``.
- ``/v1/tenants/{tenant}/invoices/{period}`` is the month's draft while nothing is issued; once
  the month is issued, the final invoice with its adjustments (JSON: the final's document with
  an ``adjustments`` list; CSV: their rows in issue order; PDF: one document, one invoice per page).
- ``/metrics`` (any valid token: it holds request counts, no tenant data) and ``/openapi.json``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpumeter.core.money import exact, format_money, format_quantity
from gpumeter.core.tenants import PERIOD_PATTERN
from gpumeter.core.validation import TENANT_PATTERN
from pricing import ledger_store, store
from pricing.api_auth import Caller, Tokens
from pricing.exports import export_document, invoice_csv
from pricing.invoice import Invoice
from pricing.issue import Billing, MonthData, billable_tenants
from pricing.ledger import next_invoice

log = logging.getLogger(__name__)
_TENANT = re.compile(TENANT_PATTERN)

Format = Literal["json", "csv", "pdf"]
PaperName = Literal["A4", "Letter"]
REASONS = {
    "period": "period must be YYYY-MM (e.g. 2026-11)",
    "format": "format must be json, csv or pdf",
    "paper": "paper must be A4 or Letter",
}


class ApiError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class ErrorBody(BaseModel):
    error: str


class LineDocument(BaseModel):
    rate_card: str
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: str
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


class UsageLineDocument(BaseModel):
    rate_card: str
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: str
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
}

PeriodQuery = Annotated[str, Query(pattern=PERIOD_PATTERN, description="YYYY-MM (UTC)", examples=["2026-11"])]
PeriodPath = Annotated[str, Path(pattern=PERIOD_PATTERN, description="YYYY-MM (UTC)", examples=["2026-11"])]
_BEARER = HTTPBearer(auto_error=False, description="a token whose SHA-256 digest is in the tokens file")


def _caller(request: Request,
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> Caller:
    if credentials is None or not credentials.credentials:
        raise ApiError(401, "missing bearer token (Authorization: Bearer <token>)")
    tokens: Tokens = request.app.state.tokens
    found = tokens.caller(credentials.credentials)
    if found is None:
        raise ApiError(401, "unknown bearer token")
    return found


Authorized = Annotated[Caller, Depends(_caller)]


def _tenant_scope(tenant: Annotated[str, Path(description="tenant name", examples=["team-a"])],
                  who: Authorized) -> str:
    # Checked before anything else about the request, so nothing hints at another tenant.
    if not who.may_see(tenant) or not _is_tenant(tenant):
        raise ApiError(404, "not found")
    return tenant


Scoped = Annotated[str, Depends(_tenant_scope)]


def create_app(context: Billing, tokens: Tokens) -> FastAPI:
    app = FastAPI(title="gpumeter invoice API", version="1",
                  description="Tenant invoices and month-to-date usage (DESIGN.md contract 7).",
                  openapi_url=None, docs_url=None, redoc_url=None)
    app.state.tokens = tokens
    registry = CollectorRegistry()
    requests = Counter("gpumeter_api_requests", "API requests by route and status", ["route", "status"],
                       registry=registry)
    latency = Histogram("gpumeter_api_request_seconds", "API request latency by route", ["route"],
                        registry=registry)
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": exc.reason}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _reason(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail).lower()}, status_code=exc.status_code)

    @app.middleware("http")
    async def _measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:  # answered as a 500 by Starlette; counted and logged here
            log.exception("request %s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": "internal error"}, status_code=500)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        requests.labels(route, str(response.status_code)).inc()
        latency.labels(route).observe(time.perf_counter() - started)
        return response

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["service"], responses={200: {"content": {"text/plain": {}}}, 401: ERRORS[401]},
             response_class=Response)
    def metrics(_: Authorized) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", tags=["service"], responses={401: ERRORS[401]}, include_in_schema=True)
    def openapi(_: Authorized) -> dict[str, Any]:
        return app.openapi()

    @app.get("/v1/invoices", tags=["invoices"], response_model=list[InvoiceDocument], responses=ERRORS)
    def list_invoices(who: Authorized, period: PeriodQuery) -> JSONResponse:
        """The caller's invoices of the month (finance: every tenant's): issued ones in issue
        order, or the draft of a tenant with nothing issued."""
        month = MonthData.load(context.client, period, None if who.finance else who.tenant)
        tenants = billable_tenants(context, period, month) if who.finance else [str(who.tenant)]
        documents: list[dict[str, object]] = []
        for tenant in tenants:
            documents += [export_document(i) for i in _month_invoices(context, month, tenant, period)]
        return JSONResponse(documents)

    formats: dict[str, Any] = {"application/json": {}, "text/csv": {}, "application/pdf": {}}
    invoice_responses = {**ERRORS, 200: {"content": formats, "description": "JSON, CSV or PDF"}}

    @app.get("/v1/tenants/{tenant}/invoices/{period}", tags=["invoices"], response_model=MonthDocument,
             responses=invoice_responses)
    def month_invoice(
        tenant: Scoped,
        period: PeriodPath,
        format: Annotated[Format, Query(description="json (default), csv or pdf")] = "json",
        paper: Annotated[PaperName, Query(description="PDF page size")] = "A4",
    ) -> Response:
        # The ledger first: an issued month needs no usage query (one query per request).
        ledger = ledger_store.load_view(context.client, {period}, tenant, for_issuing=False)
        usage = {} if ledger.issued_for(tenant, period) else store.usage_lines_by_tenant(
            context.client, period, tenant)
        invoices = _month_invoices(context, MonthData(usage, ledger), tenant, period)
        if not invoices:
            raise ApiError(404, "not found")
        if format == "csv":
            text = "".join(invoice_csv(i) if n == 0 else invoice_csv(i).split("\n", 1)[1]
                           for n, i in enumerate(invoices))
            headers = _attachment(invoices[0], "csv")
            return Response(text, media_type="text/csv; charset=utf-8", headers=headers)
        if format == "pdf":
            from pricing.pdf import invoices_pdf

            pdf = invoices_pdf(invoices, context.cards, paper, context.seller or ("gpumeter",))
            return Response(pdf, media_type="application/pdf", headers=_attachment(invoices[0], "pdf"))
        document: dict[str, object] = export_document(invoices[0])
        if invoices[0].number is not None:
            document["adjustments"] = [export_document(i) for i in invoices[1:]]
        return JSONResponse(document)

    @app.get("/v1/tenants/{tenant}/usage", tags=["usage"], response_model=UsageDocument, responses=ERRORS)
    def usage(
        tenant: Scoped,
        period: Annotated[str | None, Query(pattern=PERIOD_PATTERN,
                                            description="YYYY-MM (UTC); default: the current month")] = None,
    ) -> JSONResponse:
        """Month-to-date usage per line: unit-hours and streaming list cost (before tiers,
        commitments and credits), each sample once."""
        now = datetime.now(UTC)
        month = period or f"{now.year:04d}-{now.month:02d}"
        lines = store.usage_to_date(context.client, tenant, month)
        total = sum((cost for _, _, cost, _, _ in lines), Decimal(0))
        with exact():
            documents = [{
                "rate_card": key.rate_card, "kind": key.kind, "gpu_model": key.gpu_model,
                "mig_profile": key.mig_profile, "capacity_type": key.capacity_type,
                "quantity": format_quantity(seconds / 3600), "list_cost": format_money(cost),
                "samples": count,
            } for key, seconds, cost, _, count in lines]
        currencies = sorted({currency for *_, currency, _ in lines})
        return JSONResponse({
            "tenant": tenant, "period": month, "as_of": now.isoformat(timespec="seconds"),
            "currency": currencies[0] if len(currencies) == 1 else None, "lines": documents,
            "list_cost": format_money(total),
        })

    return app


def _month_invoices(context: Billing, month: MonthData, tenant: str, period: str) -> list[Invoice]:
    """Issued invoices of the tenant-month in issue order, else its draft; [] when it has none."""
    issued = [entry.invoice for entry in month.ledger.issued_for(tenant, period)]
    if issued:
        return issued
    usage = month.usage.get(tenant, [])
    policy = context.tenants.policy(tenant)
    if not usage and (policy is None or policy.commitment_in(period) == 0):
        return []
    draft = next_invoice(tenant, period, usage, context.cards, policy, month.ledger, issuing=False)
    return [draft] if draft is not None else []


def _attachment(invoice: Invoice, fmt: str) -> dict[str, str]:
    name = f"invoice-{invoice.tenant}-{invoice.period}{'-' + invoice.number if invoice.number else ''}.{fmt}"
    return {"Content-Disposition": f'inline; filename="{name}"'}


def _is_tenant(name: str) -> bool:
    return _TENANT.fullmatch(name) is not None


def _reason(exc: RequestValidationError) -> str:
    """One clear reason for the first invalid parameter."""
    for error in exc.errors():
        location = [str(part) for part in error.get("loc", ())]
        name = location[-1] if location else "request"
        if name in REASONS:
            return REASONS[name]
        return f"{name}: {error.get('msg', 'invalid')}"
    return "invalid request"
