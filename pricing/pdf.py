"""The PDF invoice a tenant's finance team receives, laid out with reportlab (platypus).

Seller and tenant blocks, number and dates, the period, one row per line with its unit,
unit-hours, rate card, unit price and amount, tier bands broken out beneath a tiered line,
true-up, credits applied (per source) and remaining, the total in the invoice currency, and the
content hash of an issued invoice. Every figure is the invoice's own (Decimal, formatted by the
same rules as the JSON), so the PDF and the JSON cannot disagree.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4, LETTER
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle
from reportlab.platypus.flowables import Flowable

from gpumeter.core.money import format_money, format_quantity
from gpumeter.core.ratecard import RateCardSet
from gpumeter.core.tenants import MONTHLY_CREDITS
from pricing.invoice import Band, Invoice, bands, rate_of
from pricing.ledger import canonical_json, sha256_hex

PAGE_SIZES = {"A4": A4, "Letter": LETTER}
UNITS = {"gpu": "GPU-hours", "cpu": "core-hours", "memory": "GiB-hours", "storage": "GiB-hours"}
DEFAULT_SELLER = ("gpumeter GPU cluster billing",)
TITLES = {"draft": "DRAFT INVOICE (not issued)", "final": "INVOICE", "adjustment": "ADJUSTMENT INVOICE"}


def invoice_pdf(invoice: Invoice, cards: RateCardSet, paper: str = "A4",
                seller: Sequence[str] = DEFAULT_SELLER) -> bytes:
    return invoices_pdf([invoice], cards, paper, seller)


def invoices_pdf(invoices: Sequence[Invoice], cards: RateCardSet, paper: str = "A4",
                 seller: Sequence[str] = DEFAULT_SELLER) -> bytes:
    """One PDF; each invoice (a month's final and its adjustments) starts on a new page."""
    if paper not in PAGE_SIZES:
        raise ValueError(f"paper must be one of {', '.join(PAGE_SIZES)}, got {paper!r}")
    if not invoices:
        raise ValueError("no invoice to render")
    first = invoices[0]
    buffer = io.BytesIO()
    title = ([TITLES[first.status].title(), first.number, first.tenant, first.period] if len(invoices) == 1
             else ["Invoices", first.tenant, first.period])
    document = SimpleDocTemplate(
        buffer, pagesize=PAGE_SIZES[paper], leftMargin=15 * mm, rightMargin=15 * mm,
        topMargin=15 * mm, bottomMargin=18 * mm, title=" ".join(part for part in title if part),
        author=seller[0] if seller else "", subject=f"GPU usage {first.period}",
    )
    story: list[Flowable] = []
    for index, invoice in enumerate(invoices):
        if index:
            story.append(PageBreak())
        story += _story(invoice, cards, seller)
    document.build(story, onFirstPage=_footer, onLaterPages=_footer)
    return buffer.getvalue()


_STYLES = getSampleStyleSheet()
_SMALL = ParagraphStyle("small", parent=_STYLES["Normal"], fontSize=8, leading=10)
_CELL = ParagraphStyle("cell", parent=_STYLES["Normal"], fontSize=8, leading=9.5)
_HASH = ParagraphStyle("hash", parent=_SMALL, fontName="Courier", fontSize=7.5)


def _story(invoice: Invoice, cards: RateCardSet, seller: Sequence[str]) -> list[Flowable]:
    number = invoice.number or "not issued"
    issued = invoice.issued_at.strftime("%Y-%m-%d") if invoice.issued_at else "not issued"
    facts = [["Invoice number", number], ["Invoice date", issued],
             ["Billing period", f"{invoice.period} (UTC)"], ["Status", invoice.status],
             ["Currency", invoice.currency]]
    if invoice.adjusts:
        facts.append(["Adjusts invoice", invoice.adjusts])
    parties = Table(
        [[_block("From", seller), _block("Bill to", [f"Tenant {invoice.tenant}"]), _facts(facts)]],
        colWidths=["30%", "30%", "40%"],
    )
    parties.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("LEFTPADDING", (0, 0), (-1, -1), 0)]))
    story: list[Flowable] = [
        Paragraph(TITLES[invoice.status], _STYLES["Title"]), parties, Spacer(1, 6 * mm),
        _lines_table(invoice, cards), Spacer(1, 5 * mm), _totals_table(invoice), Spacer(1, 6 * mm),
    ]
    if invoice.status == "adjustment":
        story.append(Paragraph(
            f"Usage of {invoice.period} that arrived after invoice {invoice.adjusts or ''} was issued: each "
            "line is the difference to what was invoiced, priced where the tier bands left off.", _SMALL))
    if invoice.number is not None:
        digest = sha256_hex(canonical_json(invoice.issued_document()))
        story += [Spacer(1, 2 * mm),
                  Paragraph("Content hash (SHA-256 of the canonical JSON invoice):", _SMALL),
                  Paragraph(digest, _HASH)]
    else:
        story.append(Paragraph("A draft is not an invoice: it has no number and may change.", _SMALL))
    story.append(Paragraph("Line amounts are rounded once per line to 0.01 (half-up); "
                           "unit-hours are shown to six places.", _SMALL))
    return story


def _block(title: str, lines: Sequence[str]) -> Paragraph:
    body = "<br/>".join(_escape(line) for line in lines)
    return Paragraph(f"<b>{title}</b><br/>{body}", _STYLES["Normal"])


def _facts(rows: list[list[str]]) -> Table:
    table = Table(rows, colWidths=[32 * mm, None])
    table.setStyle(TableStyle([
        ("FONTSIZE", (0, 0), (-1, -1), 9), ("FONTNAME", (0, 0), (0, -1), "Helvetica-Bold"),
        ("TOPPADDING", (0, 0), (-1, -1), 1), ("BOTTOMPADDING", (0, 0), (-1, -1), 1),
    ]))
    return table


def _lines_table(invoice: Invoice, cards: RateCardSet) -> Table:
    header = ["Rate card", "Resource", "Capacity", "Unit", "Unit-hours", "Unit price", "Amount"]
    rows: list[list[object]] = [list(header)]
    band_rows = []
    for line in invoice.lines:
        rate, multiplier = rate_of(cards, line.key)
        resource = line.kind if line.gpu_model is None else f"{line.kind} {line.gpu_model}"
        if line.mig_profile:
            resource += f" MIG {line.mig_profile}"
        tiered = bool(rate.tiers)
        price = "tiered" if tiered else _price(rate.list_price)
        rows.append([line.rate_card, Paragraph(_escape(resource), _CELL),
                     _capacity(line.capacity_type, multiplier), UNITS.get(line.kind, "unit-hours"),
                     format_quantity(line.quantity), price, format_money(line.amount)])
        if tiered:
            for band_row in _band_rows(invoice, bands(rate, line.quantity), multiplier):
                band_rows.append(len(rows))
                rows.append(band_row)
    if not invoice.lines:
        rows.append(["", "no usage in this period", "", "", "", "", ""])
    table = Table(rows, repeatRows=1, colWidths=[18 * mm, None, 22 * mm, 20 * mm, 28 * mm, 22 * mm, 24 * mm])
    style = [
        ("FONTSIZE", (0, 0), (-1, -1), 8), ("FONTNAME", (0, 0), (-1, 0), "Helvetica-Bold"),
        ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#e8ecf2")),
        ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black),
        ("LINEBELOW", (0, -1), (-1, -1), 0.6, colors.black),
        ("ALIGN", (4, 0), (-1, -1), "RIGHT"), ("VALIGN", (0, 0), (-1, -1), "MIDDLE"),
    ]
    for index in band_rows:
        style += [("TEXTCOLOR", (0, index), (-1, index), colors.HexColor("#444444")),
                  ("FONTSIZE", (0, index), (-1, index), 7)]
    table.setStyle(TableStyle(style))
    return table


def _band_rows(invoice: Invoice, rate_bands: list[Band], multiplier: Decimal) -> list[list[object]]:
    """One row per tier band the line fills. An adjustment's line continues bands from the issued
    quantity, which its own quantity alone does not show: its bands are described, not split."""
    if invoice.status == "adjustment":
        return [["", "  tier bands continue from the invoiced quantity", "", "", "", "", ""]]
    rows: list[list[object]] = []
    for band in rate_bands:
        upper = "and above" if band.upper is None else f"to {_hours(band.upper)}"
        lower = _hours(band.lower)
        amount = band.quantity * band.unit_price * multiplier
        rows.append(["", f"  band {lower} {upper} h", "", "", format_quantity(band.quantity),
                     _price(band.unit_price), format_money(amount)])
    return rows


def _totals_table(invoice: Invoice) -> Table:
    currency = invoice.currency
    rows = [["Subtotal", f"{format_money(invoice.subtotal)} {currency}"],
            ["Commitment true-up", f"{format_money(invoice.commitment_true_up)} {currency}"]]
    # In drawing order: the monthly allowance first, then grants.
    for source, amount in sorted(invoice.credit_draws.items(), key=lambda d: (d[0] != MONTHLY_CREDITS, d[0])):
        label = "monthly credits" if source == MONTHLY_CREDITS else f"credit grant {source}"
        rows.append([f"Credits applied ({label})", f"-{format_money(amount)} {currency}"])
    rows.append(["Credits applied", f"-{format_money(invoice.credits)} {currency}"])
    rows.append(["Total", f"{format_money(invoice.total)} {currency}"])
    rows.append(["Credits remaining", f"{format_money(invoice.credits_remaining)} {currency}"])
    total_row = len(rows) - 2
    table = Table(rows, colWidths=[60 * mm, 40 * mm], hAlign="RIGHT")
    table.setStyle(TableStyle([
        ("FONTSIZE", (0, 0), (-1, -1), 9), ("ALIGN", (1, 0), (1, -1), "RIGHT"),
        ("FONTNAME", (0, total_row), (-1, total_row), "Helvetica-Bold"),
        ("LINEABOVE", (0, total_row), (-1, total_row), 0.8, colors.black),
    ]))
    return table


def _price(unit_price: Decimal) -> str:
    return format_money(unit_price) if unit_price == unit_price.quantize(Decimal("0.01")) else str(unit_price)


def _hours(value: Decimal) -> str:
    """A band edge without trailing zeros: 1000, 12.5."""
    text = format_quantity(value)
    return text.rstrip("0").rstrip(".")


def _capacity(capacity_type: str, multiplier: Decimal) -> str:
    return capacity_type if multiplier == 1 else f"{capacity_type} (x{multiplier.normalize()})"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _footer(canvas: Any, document: Any) -> None:
    canvas.saveState()
    canvas.setFont("Helvetica", 7)
    page = f"{document.title} - page {document.page}"
    canvas.drawRightString(document.pagesize[0] - 15 * mm, 10 * mm, page)
    canvas.restoreState()
