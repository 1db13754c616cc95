"""``/v1/invoices`` and ``/v1/tenants/{tenant}/invoices/{period}``.

The month's invoice is its draft while nothing is issued; once the month is issued, the final
invoice with its adjustments (JSON: the final's document with an ``adjustments`` list; CSV: their
rows in issue order; PDF: one document, one invoice per page).

Where each comes from (nothing here reads rated usage row by row):
- issued invoices: the documents the close stored in the ledger, found through the process's
  ledger index (ledger_mirror.py, at most a second behind) and served as bytes rendered once
  per format (rendered.py): no query once a tenant-month has been served;
- a draft: the hourly rollup's lines of the month, priced as the close would price them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from pricing import store
from pricing.exports import export_document, invoice_csv
from pricing.http.access import Authorized, PeriodPath, PeriodQuery, Scoped
from pricing.http.documents import ERRORS, InvoiceDocument, MonthDocument
from pricing.http.errors import ApiError
from pricing.http.ledger_mirror import LedgerMirror
from pricing.http.rendered import Rendered, RenderedCache
from pricing.invoice import Invoice, UsageLine
from pricing.issue import Billing
from pricing.ledger import next_invoice

Format = Literal["json", "csv", "pdf"]
PaperName = Literal["A4", "Letter"]
MEDIA = {"json": "application/json", "csv": "text/csv; charset=utf-8", "pdf": "application/pdf"}


def invoice_routes(context: Billing, mirror: LedgerMirror, rendered: RenderedCache) -> APIRouter:
    router = APIRouter()

    def month_invoices(tenant: str, period: str, usage: dict[str, list[UsageLine]] | None) -> list[Invoice]:
        """Issued invoices of the tenant-month in issue order, else its draft; [] when it has none."""
        positions = mirror.positions(tenant, period)
        if positions:
            return [entry.invoice for entry in mirror.entries(positions)]
        lines = (store.rollup_lines_by_tenant(context.client, period, tenant) if usage is None
                 else usage).get(tenant, [])
        policy = context.tenants.policy(tenant)
        if not lines and (policy is None or policy.commitment_in(period) == 0):
            return []
        draft = next_invoice(tenant, period, lines, context.cards, policy, mirror.view_for_draft(tenant),
                             issuing=False)
        return [draft] if draft is not None else []

    def render(invoices: list[Invoice], fmt: str, paper: PaperName) -> Rendered:
        headers = (("Content-Disposition", _disposition(invoices[0], fmt)),) if fmt != "json" else ()
        if fmt == "csv":
            text = "".join(invoice_csv(i) if n == 0 else invoice_csv(i).split("\n", 1)[1]
                           for n, i in enumerate(invoices))
            return Rendered(text.encode("utf-8"), MEDIA["csv"], headers)
        if fmt == "pdf":
            from pricing.pdf import invoices_pdf

            pdf = invoices_pdf(invoices, context.cards, paper, context.seller or ("gpumeter",))
            return Rendered(pdf, MEDIA["pdf"], headers)
        document: dict[str, object] = export_document(invoices[0])
        if invoices[0].number is not None:
            document["adjustments"] = [export_document(i) for i in invoices[1:]]
        # As JSONResponse renders it.
        body = json.dumps(document, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
        return Rendered(body.encode("utf-8"), MEDIA["json"])

    def answer(found: Rendered) -> Response:
        return Response(found.body, media_type=found.media_type, headers=dict(found.headers))

    @router.get("/v1/invoices", tags=["invoices"], response_model=list[InvoiceDocument], responses=ERRORS)
    def list_invoices(who: Authorized, period: PeriodQuery) -> JSONResponse:
        """The caller's invoices of the month (finance: every tenant's): issued ones in issue
        order, or the draft of a tenant with nothing issued."""
        mirror.refresh()
        usage = store.rollup_lines_by_tenant(context.client, period, None if who.finance else who.tenant)
        if who.finance:
            committed = {t.tenant for t in context.tenants.tenants if t.commitment_in(period) > 0}
            tenants = sorted(set(usage) | mirror.issued_in(period) | committed)
        else:
            tenants = [str(who.tenant)]
        documents: list[dict[str, object]] = []
        for tenant in tenants:
            documents += [export_document(i) for i in month_invoices(tenant, period, usage)]
        return JSONResponse(documents)

    formats: dict[str, Any] = {"application/json": {}, "text/csv": {}, "application/pdf": {}}
    invoice_responses = {**ERRORS, 200: {"content": formats, "description": "JSON, CSV or PDF"}}

    @router.get("/v1/tenants/{tenant}/invoices/{period}", tags=["invoices"], response_model=MonthDocument,
                responses=invoice_responses)
    async def month_invoice(
        tenant: Scoped,
        period: PeriodPath,
        format: Annotated[Format, Query(description="json (default), csv or pdf")] = "json",
        paper: Annotated[PaperName, Query(description="PDF page size")] = "A4",
    ) -> Response:
        # On the event loop while nothing blocks (an issued month already rendered: a dict
        # look-up); queries and rendering go to the thread pool.
        if mirror.due():
            await run_in_threadpool(mirror.refresh)
        positions = mirror.positions(tenant, period)
        if positions:
            key = (tenant, period, positions[-1], format, paper if format == "pdf" else "")
            found = rendered.get(key)
            if found is None:
                found = await run_in_threadpool(
                    lambda: render([e.invoice for e in mirror.entries(positions)], format, paper))
                rendered.put(key, found)
            return answer(found)
        invoices = await run_in_threadpool(month_invoices, tenant, period, None)
        if not invoices:
            raise ApiError(404, "not found")
        if format == "json":
            return answer(render(invoices, format, paper))
        return answer(await run_in_threadpool(render, invoices, format, paper))

    return router


def _disposition(invoice: Invoice, fmt: str) -> str:
    name = f"invoice-{invoice.tenant}-{invoice.period}{'-' + invoice.number if invoice.number else ''}.{fmt}"
    return f'inline; filename="{name}"'
