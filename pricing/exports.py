"""Invoice exports for tenants: JSON (contract 4b), CSV with the same lines, and PDF.

A draft exports exactly the contract-4b document. An issued invoice (numbered by the ledger)
adds what it carries beyond 4b (number, issue time, the final it adjusts, credits per source,
credits remaining) and its content hash: SHA-256 of the canonical JSON of those fields
(pricing/ledger.py), which a tenant can recompute from the JSON file alone.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from gpumeter.core.ratecard import RateCardSet
from pricing.invoice import Invoice
from pricing.ledger import canonical_json, sha256_hex

FORMATS = ("json", "csv", "pdf")
Paper = Literal["A4", "Letter"]
PAPERS: tuple[Paper, ...] = ("A4", "Letter")

CSV_COLUMNS = (
    "tenant", "period", "currency", "status", "rate_card", "kind", "gpu_model",
    "mig_profile", "capacity_type", "quantity", "amount",
)


def content_sha256(invoice: Invoice) -> str | None:
    """The content hash of an issued invoice; None for a draft."""
    if invoice.number is None:
        return None
    return sha256_hex(canonical_json(invoice.issued_document()))


def export_document(invoice: Invoice) -> dict[str, object]:
    """The JSON document handed out: contract 4b, plus number, terms and hash once issued."""
    if invoice.number is None:
        return invoice.to_document()
    return {**invoice.issued_document(), "content_sha256": content_sha256(invoice)}


def invoice_json(invoice: Invoice) -> str:
    return json.dumps(export_document(invoice), indent=2, ensure_ascii=False) + "\n"


def invoice_csv(invoice: Invoice) -> str:
    """One row per line, then subtotal, true-up, credits and total rows (kind column names them);
    an issued invoice adds rows for its number, the final it adjusts, credits remaining and hash."""
    document = invoice.to_document()
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    head = [document["tenant"], document["period"], document["currency"], document["status"]]
    for line in document["lines"]:  # type: ignore[attr-defined]
        writer.writerow(
            [
                *head, line["rate_card"], line["kind"], line["gpu_model"] or "",
                line["mig_profile"] or "", line["capacity_type"], line["quantity"], line["amount"],
            ]
        )
    for total in ("subtotal", "commitment_true_up", "credits", "total"):
        writer.writerow([*head, "", total, "", "", "", "", document[total]])
    if invoice.number is not None:
        issued = export_document(invoice)
        for name in ("number", "adjusts", "credits_remaining", "content_sha256"):
            writer.writerow([*head, "", name, "", "", "", "", issued[name] or ""])
    return buffer.getvalue()


def file_name(invoice: Invoice, fmt: str) -> str:
    """invoice-<tenant>-<period>[-<number> | -adjustment].<fmt>: each issued invoice its own file."""
    if invoice.number is not None:
        suffix = f"-{invoice.number}"
    else:
        suffix = "-adjustment" if invoice.status == "adjustment" else ""
    return f"invoice-{invoice.tenant}-{invoice.period}{suffix}.{fmt}"


def render(invoice: Invoice, fmt: str, cards: RateCardSet | None = None, paper: Paper = "A4",
           seller: Sequence[str] | None = None) -> bytes:
    if fmt == "json":
        return invoice_json(invoice).encode("utf-8")
    if fmt == "csv":
        return invoice_csv(invoice).encode("utf-8")
    if fmt == "pdf":
        if cards is None:
            raise ValueError("a PDF invoice needs the rate cards (prices and tier bands)")
        from pricing.pdf import DEFAULT_SELLER, invoice_pdf  # reportlab is imported only for PDFs

        return invoice_pdf(invoice, cards, paper, seller or DEFAULT_SELLER)
    raise ValueError(f"unsupported invoice format {fmt!r} ({', '.join(FORMATS)})")


def write_invoice(invoice: Invoice, fmt: str, out_dir: Path, cards: RateCardSet | None = None,
                  paper: Paper = "A4", seller: Sequence[str] | None = None) -> Path:
    data = render(invoice, fmt, cards, paper, seller)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / file_name(invoice, fmt)
    path.write_bytes(data)
    return path
