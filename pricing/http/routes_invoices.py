"""``/v1/invoices`` and ``/v1/tenants/{tenant}/invoices/{period}``.

The month's invoice is its draft while nothing is issued; once the month is issued, the final
invoice with its adjustments (JSON: the final's document with an ``adjustments`` list; CSV: their
rows in issue order; PDF: one document, one invoice per page).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from pricing import ledger_store, store
from pricing.exports import export_document, invoice_csv
from pricing.http.access import Authorized, PeriodPath, PeriodQuery, Scoped
from pricing.http.documents import ERRORS, InvoiceDocument, MonthDocument
from pricing.http.errors import ApiError
from pricing.invoice import Invoice
from pricing.issue import Billing, MonthData, billable_tenants
from pricing.ledger import next_invoice

Format = Literal["json", "csv", "pdf"]
PaperName = Literal["A4", "Letter"]


def invoice_routes(context: Billing) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/invoices", tags=["invoices"], response_model=list[InvoiceDocument], responses=ERRORS)
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

    @router.get("/v1/tenants/{tenant}/invoices/{period}", tags=["invoices"], response_model=MonthDocument,
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

    return router


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
