"""Invoice exports for tenants: JSON (contract 4b) and CSV with the same lines."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pricing.invoice import Invoice

CSV_COLUMNS = (
    "tenant", "period", "currency", "status", "rate_card", "kind", "gpu_model",
    "mig_profile", "capacity_type", "quantity", "amount",
)


def invoice_json(invoice: Invoice) -> str:
    return json.dumps(invoice.to_document(), indent=2) + "\n"


def invoice_csv(invoice: Invoice) -> str:
    """One row per line, then subtotal, true-up, credits and total rows (kind column names them)."""
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
    return buffer.getvalue()


def write_invoice(invoice: Invoice, fmt: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if invoice.status != "adjustment" else "-adjustment"
    path = out_dir / f"invoice-{invoice.tenant}-{invoice.period}{suffix}.{fmt}"
    if fmt == "json":
        path.write_text(invoice_json(invoice), encoding="utf-8")
    elif fmt == "csv":
        path.write_text(invoice_csv(invoice), encoding="utf-8")
    else:
        raise ValueError(f"unsupported invoice format {fmt!r} (json, csv)")
    return path
