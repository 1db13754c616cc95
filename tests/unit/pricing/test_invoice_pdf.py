"""PDF invoices read back: the text extracted with pypdf carries every line, the tier bands, the
totals, the number and the content hash of the JSON invoice, on A4 and Letter; page 1 rendered
with pdfium is not blank. Expected figures come from tests/unit/reference_billing.py."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pypdfium2 as pdfium
import pytest
from pypdf import PdfReader

from gpumeter.core.tenants import TenantPolicy
from pricing.exports import content_sha256, invoice_json, render
from pricing.invoice import Invoice
from pricing.ledger import LedgerView, entry_for, next_invoice
from testkit.builders import CARDS, card_set, sample
from tests.unit import reference_billing as ref
from tests.unit.pricing.billing_harness import aggregate, mixed_samples

CARDSET = card_set()
SAMPLES = mixed_samples()
TERMS = {
    "tenant": "team-a",
    "credits": "250.00",
    "credit_grants": [{"id": "launch", "amount": "400.00", "start": "2026-11"}],
}


def issued(samples: list[dict[str, Any]] = SAMPLES, view: LedgerView | None = None) -> Invoice:
    view = view if view is not None else LedgerView()
    usage = aggregate(samples, CARDSET).get(("team-a", "2026-11"), [])
    invoice = next_invoice(
        "team-a", "2026-11", usage, CARDSET, TenantPolicy.model_validate(TERMS), view, issuing=True
    )
    assert invoice is not None
    entry = entry_for(invoice, view, "test", datetime(2026, 12, 3, 10, tzinfo=UTC))
    view.add(entry)
    return entry.invoice


def text_of(pdf: bytes) -> str:
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages)


def tokens(text: str) -> list[str]:
    return text.split()


@pytest.mark.parametrize(
    ("paper", "size"),
    [pytest.param("A4", (595.28, 841.89), id="A4"), pytest.param("Letter", (612.0, 792.0), id="Letter")],
)
def test_pdf_carries_every_line_the_totals_the_number_and_the_hash(
    paper: str, size: tuple[float, float]
) -> None:
    invoice = issued()
    pdf = render(invoice, "pdf", CARDSET, paper)  # type: ignore[arg-type]
    reader = PdfReader(io.BytesIO(pdf))
    box = reader.pages[0].mediabox
    assert (round(float(box.width), 2), round(float(box.height), 2)) == size
    words = tokens(text_of(pdf))
    reference = ref.reference_invoices(SAMPLES, CARDS)[("team-a", "2026-11")]
    assert len(reference["lines"]) == 6
    for line in reference["lines"]:
        assert line["quantity"] in words and line["amount"] in words, line
    document = json.loads(invoice_json(invoice))
    assert document["lines"] == reference["lines"]
    # subtotal from the reference; 250.00 monthly + 400.00 of the grant; nothing of the grant remains
    subtotal = Decimal(reference["subtotal"])
    total = subtotal - Decimal("650.00")
    for figure in (reference["subtotal"], "-250.00", "-400.00", "-650.00", f"{total:.2f}", "0.00", "USD"):
        assert figure in words, figure
    assert document["number"] == "GM-2026-000001" and "GM-2026-000001" in words
    assert document["content_sha256"] == content_sha256(invoice) and document["content_sha256"] in words
    for label in (
        "Subtotal",
        "true-up",
        "Credits applied",
        "Credits remaining",
        "2026-11",
        "team-a",
        "2026-12-03",
    ):
        assert label in text_of(pdf), label


def test_tier_bands_are_broken_out_beneath_a_tiered_line() -> None:
    text = text_of(render(issued(), "pdf", CARDSET))
    # 1234.5 h of H100: 1000 h x 2.50 = 2500.00 and 234.5 h x 2.25 = 527625/1000 -> 527.63; line 3027.63
    band_one = ref.money_str(ref.half_up(ref.frac("1000") * ref.frac("2.50"), 2))
    band_two = ref.money_str(ref.half_up(ref.frac("234.5") * ref.frac("2.25"), 2))
    assert re.search(rf"band 0 to 1000 h\s+1000\.000000\s+2\.50\s+{band_one}", text)
    assert re.search(rf"band 1000 to 10000 h\s+234\.500000\s+2\.25\s+{band_two}", text)
    assert "3027.63" in text


def test_page_one_rendered_is_not_blank() -> None:
    pdf = render(issued(), "pdf", CARDSET)
    image = pdfium.PdfDocument(pdf)[0].render(scale=1).to_pil().convert("L")
    histogram = image.histogram()
    dark = sum(histogram[:128])
    # Text and rules cover well over 0.5 % of an A4 page; a blank page has none.
    assert dark > 0.005 * image.width * image.height, dark


def test_many_lines_flow_onto_later_pages_with_every_line_present() -> None:
    samples = [sample(f"m{n}", gpu_model=f"GPU-MODEL-{n:03d}", quantity=str(n + 1)) for n in range(90)]
    pdf = render(issued(samples), "pdf", CARDSET)
    assert len(PdfReader(io.BytesIO(pdf)).pages) >= 2
    words = tokens(text_of(pdf))
    for n in range(90):
        assert f"GPU-MODEL-{n:03d}" in words
        # the fallback gpu rate 1.80 x (n + 1) h
        assert ref.money_str(ref.half_up(ref.frac(n + 1) * ref.frac("1.80"), 2)) in words


def test_an_adjustment_names_its_final_and_a_draft_has_no_number_or_hash() -> None:
    view = LedgerView()
    final = issued(view=view)
    adjustment = issued([*SAMPLES, sample("late", quantity="10", start="2026-11-29T00:00:00Z")], view=view)
    text = text_of(render(adjustment, "pdf", CARDSET))
    assert final.number is not None and adjustment.number is not None
    assert "ADJUSTMENT INVOICE" in text and final.number in text and adjustment.number in text
    # 10 late H100 hours in the 2.25 band: 22.50
    assert "22.50" in tokens(text)
    usage = aggregate(SAMPLES, CARDSET)[("team-a", "2026-11")]
    draft = next_invoice("team-a", "2026-11", usage, CARDSET, None, LedgerView(), issuing=False)
    assert draft is not None
    draft_text = text_of(render(draft, "pdf", CARDSET))
    assert "DRAFT INVOICE" in draft_text and "GM-" not in draft_text and "SHA-256" not in draft_text


def test_pdf_needs_the_rate_cards_and_a_known_paper() -> None:
    with pytest.raises(ValueError, match="rate cards"):
        render(issued(), "pdf", None)
    with pytest.raises(ValueError, match="paper"):
        render(issued(), "pdf", CARDSET, "A3")  # type: ignore[arg-type]
