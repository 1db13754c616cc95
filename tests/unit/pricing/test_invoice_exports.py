"""Invoice exports (contract 4b JSON, CSV) and adjustment invoices (contract 3, step 6)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from pricing.exports import CSV_COLUMNS, invoice_csv, invoice_json, write_invoice
from pricing.invoice import Invoice, InvoiceStatus, adjustment, build_invoice
from testkit.builders import A100, CARDS, H100, L4, card_set, sample, tenants_file
from tests.unit import reference_billing as ref
from tests.unit.pricing.billing_harness import aggregate, mixed_samples, run_pipeline

TOP_KEYS = [
    "tenant", "period", "currency", "status", "lines", "subtotal", "commitment_true_up", "credits", "total",
]
LINE_KEYS = ["rate_card", "kind", "gpu_model", "mig_profile", "capacity_type", "quantity", "amount"]
MONEY = re.compile(r"-?\d+\.\d{2}")
QUANTITY = re.compile(r"-?\d+\.\d{6}")


def mixed_invoice() -> Invoice:
    samples = [*mixed_samples(), sample("e7", kind="storage", quantity="1000000")]
    return run_pipeline(samples)[("team-a", "2026-11")]


def as_doc(invoice: Invoice) -> dict[str, Any]:
    return dict(invoice.to_document())


def ordered_pairs(text: str) -> Any:
    return json.loads(text, object_pairs_hook=lambda pairs: pairs)


# --- JSON ----------------------------------------------------------------------------------------


def test_json_has_exactly_the_contract_keys_in_order():
    pairs = ordered_pairs(invoice_json(mixed_invoice()))
    assert [key for key, _ in pairs] == TOP_KEYS
    lines = dict(pairs)["lines"]
    assert len(lines) == 7
    for line in lines:
        assert [key for key, _ in line] == LINE_KEYS


def test_json_money_has_two_decimals_and_quantities_six():
    document = json.loads(invoice_json(mixed_invoice()))
    for key in ("subtotal", "commitment_true_up", "credits", "total"):
        assert isinstance(document[key], str)
        assert MONEY.fullmatch(document[key]), (key, document[key])
    for line in document["lines"]:
        assert isinstance(line["amount"], str) and MONEY.fullmatch(line["amount"]), line
        assert isinstance(line["quantity"], str) and QUANTITY.fullmatch(line["quantity"]), line


def test_json_values_match_hand_arithmetic():
    document = json.loads(invoice_json(mixed_invoice()))
    by_key = {(line["kind"], line["gpu_model"], line["capacity_type"]): line for line in document["lines"]}
    # 1234.5 H100 h -> 3027.63 (see the contract example)
    assert by_key[("gpu", H100, "on-demand")]["amount"] == "3027.63"
    # 10 spot H100 h: 10 x 2.50 x 0.35 = 8.75
    assert by_key[("gpu", H100, "spot")]["amount"] == "8.75"
    # 0.333333 x 7 s = 2.333331 GPU-s = 0.000648147... h; x 0.40 = 0.000259... -> 0.00
    assert by_key[("gpu", A100, "on-demand")] == {
        "rate_card": "2026-11",
        "kind": "gpu",
        "gpu_model": A100,
        "mig_profile": "1g.5gb",
        "capacity_type": "on-demand",
        "quantity": "0.000648",
        "amount": "0.00",
    }
    # L4 reserved: 3 h x 1.80 (fallback) x 0.6 = 3.24
    assert by_key[("gpu", L4, "reserved")]["amount"] == "3.24"
    # 64 cores x 1 s = 64/3600 core-h = 0.017777... -> "0.017778"; x 0.04 = 0.000711 -> 0.00
    assert by_key[("cpu", None, "on-demand")]["quantity"] == "0.017778"
    # 512 GiB-h x 0.005 = 2.56; 1e6 GiB-h x 0.0002 = 200.00
    assert by_key[("memory", None, "on-demand")]["amount"] == "2.56"
    assert by_key[("storage", None, "on-demand")]["amount"] == "200.00"
    # subtotal 3027.63 + 8.75 + 0 + 3.24 + 0 + 2.56 + 200.00 = 3242.18; credits 250 -> 2992.18
    assert document["subtotal"] == "3242.18"
    assert document["commitment_true_up"] == "0.00"
    assert document["credits"] == "250.00"
    assert document["total"] == "2992.18"


def test_json_of_an_invoice_without_usage():
    # team-a has a commitment of 1000.00 and credits of 250.00: a month with no usage.
    invoice = build_invoice("team-a", "2026-11", [], card_set(), tenants_file().policy("team-a"))
    document = json.loads(invoice_json(invoice))
    assert document == {
        "tenant": "team-a",
        "period": "2026-11",
        "currency": "USD",
        "status": "draft",
        "lines": [],
        "subtotal": "0.00",
        "commitment_true_up": "1000.00",
        "credits": "250.00",
        "total": "750.00",
    }


def test_large_amounts_are_not_in_exponent_notation():
    # 999999999 GPUs x 1 h of L4 at 1.80 = 1799999998.20
    samples = [sample("e1", tenant="solo", gpu_model=L4, quantity="999999999")]
    invoice = run_pipeline(samples)[("solo", "2026-11")]
    document = json.loads(invoice_json(invoice))
    assert document["lines"][0]["quantity"] == "999999999.000000"
    assert document["total"] == "1799999998.20"


# --- CSV -----------------------------------------------------------------------------------------


def test_csv_carries_the_same_lines_and_totals():
    invoice = mixed_invoice()
    document = as_doc(invoice)
    rows = list(csv.reader(io.StringIO(invoice_csv(invoice))))
    assert rows[0] == list(CSV_COLUMNS)
    line_rows = rows[1:-4]
    lines: list[Mapping[str, Any]] = document["lines"]
    assert len(line_rows) == len(lines)
    for row, line in zip(line_rows, lines, strict=True):
        record = dict(zip(CSV_COLUMNS, row, strict=True))
        assert record["tenant"] == "team-a"
        assert record["period"] == "2026-11"
        assert record["currency"] == "USD"
        assert record["status"] == "draft"
        for key in LINE_KEYS:
            assert record[key] == (line[key] or ""), key
    totals = {row[CSV_COLUMNS.index("kind")]: row[CSV_COLUMNS.index("amount")] for row in rows[-4:]}
    assert totals == {
        "subtotal": document["subtotal"],
        "commitment_true_up": document["commitment_true_up"],
        "credits": document["credits"],
        "total": document["total"],
    }


def test_write_invoice_files(tmp_path):
    invoice = mixed_invoice()
    json_path = write_invoice(invoice, "json", tmp_path / "out")
    csv_path = write_invoice(invoice, "csv", tmp_path / "out")
    assert json_path.name == "invoice-team-a-2026-11.json"
    assert csv_path.name == "invoice-team-a-2026-11.csv"
    assert json.loads(json_path.read_text()) == json.loads(invoice_json(invoice))
    assert csv_path.read_text() == invoice_csv(invoice)
    with pytest.raises(ValueError):
        write_invoice(invoice, "xml", tmp_path)


# --- adjustments ---------------------------------------------------------------------------------


def invoices_for(samples: list[dict[str, Any]], tenant: str, status: InvoiceStatus = "draft") -> Invoice:
    cards = card_set()
    usage = aggregate(samples, cards).get((tenant, "2026-11"), [])
    return build_invoice(tenant, "2026-11", usage, cards, tenants_file().policy(tenant), status=status)


def expected_line_cents(
    before: list[dict[str, Any]], after: list[dict[str, Any]], tenant: str
) -> dict[Any, int]:
    """Reference: amount(total qty) - amount(finalized qty) per line, in cents."""
    old = ref.aggregate(before, CARDS).lines.get((tenant, "2026-11"), {})
    new = ref.aggregate(after, CARDS).lines[(tenant, "2026-11")]
    result = {}
    for key, quantity in new.items():
        previous = old.get(key, Fraction(0))
        result[key] = ref.line_cents(CARDS, key, quantity) - (
            ref.line_cents(CARDS, key, previous) if key in old else 0
        )
    return result


def check_identity(invoice: Invoice) -> None:
    assert invoice.subtotal == sum((line.amount for line in invoice.lines), Decimal(0))
    assert invoice.subtotal + invoice.commitment_true_up - invoice.credits == invoice.total


def line_key(line: Any) -> tuple[Any, ...]:
    return (line.rate_card, line.kind, line.gpu_model, line.mig_profile, line.capacity_type)


def test_adjustment_continues_tier_bands():
    finalized_samples = [sample("e1", quantity="900")]
    late = [sample("late-1", start="2026-11-29T00:00:00Z", quantity="200")]
    final = invoices_for(finalized_samples, "team-a", status="final")
    # finalized: 900 h x 2.50 = 2250.00; credits 250 -> total 2000.00
    assert (final.subtotal, final.credits, final.total) == (
        Decimal("2250.00"),
        Decimal("250.00"),
        Decimal("2000.00"),
    )
    current = invoices_for(finalized_samples + late, "team-a")
    adj = adjustment(current, [final])
    assert adj is not None
    assert adj.status == "adjustment"
    # 1100 h -> 1000 x 2.50 + 100 x 2.25 = 2725.00; minus 2250.00 = 475.00
    # (= 100 x 2.50 + 100 x 2.25: the late hours continue from 900 h, not from 0 h, which would be 500.00)
    document = as_doc(adj)
    assert document["lines"] == [
        {
            "rate_card": "2026-11",
            "kind": "gpu",
            "gpu_model": H100,
            "mig_profile": None,
            "capacity_type": "on-demand",
            "quantity": "200.000000",
            "amount": "475.00",
        }
    ]
    assert (document["subtotal"], document["commitment_true_up"], document["credits"], document["total"]) == (
        "475.00",
        "0.00",
        "0.00",
        "475.00",
    )
    cents = expected_line_cents(finalized_samples, finalized_samples + late, "team-a")
    assert [Fraction(line.amount) for line in adj.lines] == [Fraction(c, 100) for c in cents.values()]
    check_identity(adj)


def test_adjustment_crossing_the_second_edge():
    before = [sample("e1", tenant="solo", quantity="9990")]
    after = [*before, sample("late", tenant="solo", start="2026-11-20T00:00:00Z", quantity="20")]
    # 9990 h: 2500 + 8990 x 2.25 = 22727.50; 10010 h: 2500 + 20250 + 10 x 2.00 = 22770.00
    # adjustment = 42.50 (= 10 x 2.25 + 10 x 2.00)
    adj = adjustment(invoices_for(after, "solo"), [invoices_for(before, "solo", status="final")])
    assert adj is not None
    assert [line.amount for line in adj.lines] == [Decimal("42.50")]
    assert adj.total == Decimal("42.50")
    cents = expected_line_cents(before, after, "solo")
    assert list(cents.values()) == [4250]


def test_adjustment_reduces_the_true_up():
    # team-a, commitment 1000, credits 250.
    # finalized: 160 h x 2.50 = 400.00, true-up 600.00, credits 250.00 -> total 750.00
    # with 80 late hours: 240 h = 600.00, true-up 400.00, credits 250.00 -> total 750.00
    # adjustment: line +200.00, true-up -200.00, credits 0.00, total 0.00
    before = [sample("e1", quantity="160")]
    after = [*before, sample("late", start="2026-11-30T23:00:00Z", quantity="80")]
    final = invoices_for(before, "team-a", status="final")
    assert (final.commitment_true_up, final.total) == (Decimal("600.00"), Decimal("750.00"))
    adj = adjustment(invoices_for(after, "team-a"), [final])
    assert adj is not None
    document = as_doc(adj)
    assert [line["amount"] for line in document["lines"]] == ["200.00"]
    assert (document["subtotal"], document["commitment_true_up"], document["credits"], document["total"]) == (
        "200.00",
        "-200.00",
        "0.00",
        "0.00",
    )
    check_identity(adj)


def test_adjustment_applies_the_rest_of_the_credits():
    # inference, credits 100. finalized: 16 h = 40.00, credits 40.00, total 0.00.
    # with 40 late hours: 56 h = 140.00, credits 100.00, total 40.00.
    # adjustment: line +100.00, credits +60.00, total 40.00
    before = [sample("e1", tenant="inference", quantity="16")]
    after = [*before, sample("late", tenant="inference", start="2026-11-21T00:00:00Z", quantity="40")]
    adj = adjustment(invoices_for(after, "inference"), [invoices_for(before, "inference", status="final")])
    assert adj is not None
    assert (adj.subtotal, adj.credits, adj.total) == (Decimal("100.00"), Decimal("60.00"), Decimal("40.00"))
    check_identity(adj)


def test_adjustment_with_a_new_line_bills_it_in_full():
    before = [sample("e1", tenant="solo", quantity="10")]
    after = [*before, sample("late", tenant="solo", capacity_type="spot", quantity="10")]
    adj = adjustment(invoices_for(after, "solo"), [invoices_for(before, "solo", status="final")])
    assert adj is not None
    # only the spot line: 10 h x 2.50 x 0.35 = 8.75; the unchanged on-demand line is left out
    assert [(line.capacity_type, line.quantity, line.amount) for line in adj.lines] == [
        ("spot", Decimal(10), Decimal("8.75"))
    ]
    assert adj.total == Decimal("8.75")


def test_adjustment_line_can_be_zero_money_with_late_quantity():
    # cpu 0.125 core-h -> 0.005 -> 0.01 finalized; +0.125 late -> 0.25 core-h -> 0.01; adjustment 0.00
    before = [sample("e1", tenant="solo", kind="cpu", quantity="0.125")]
    late = sample("late", tenant="solo", kind="cpu", start="2026-11-12T00:00:00Z", quantity="0.125")
    after = [*before, late]
    adj = adjustment(invoices_for(after, "solo"), [invoices_for(before, "solo", status="final")])
    assert adj is not None
    document = as_doc(adj)
    assert [(line["quantity"], line["amount"]) for line in document["lines"]] == [
        ("0.125000", "0.00")
    ]
    assert document["total"] == "0.00"
    assert list(expected_line_cents(before, after, "solo").values()) == [0]


def test_adjustment_chain_adds_up_to_the_current_invoice():
    first = [sample("e1", tenant="solo", quantity="700")]
    second = [*first, sample("l1", tenant="solo", start="2026-11-20T00:00:00Z", quantity="700")]
    third = [*second, sample("l2", tenant="solo", start="2026-11-21T00:00:00Z", quantity="9000")]
    final = invoices_for(first, "solo", status="final")  # 700 x 2.50 = 1750.00
    adj1 = adjustment(invoices_for(second, "solo"), [final])
    assert adj1 is not None
    # 1400 h = 2500 + 400 x 2.25 = 3400.00; minus 1750.00 = 1650.00
    assert adj1.total == Decimal("1650.00")
    adj2 = adjustment(invoices_for(third, "solo"), [final, adj1])
    assert adj2 is not None
    # 10400 h = 2500 + 20250 + 400 x 2.00 = 23550.00; minus 3400.00 = 20150.00
    assert adj2.total == Decimal("20150.00")
    assert [line.quantity for line in adj2.lines] == [Decimal(9000)]
    current = invoices_for(third, "solo")
    assert final.total + adj1.total + adj2.total == current.total
    # and nothing more once everything is billed
    assert adjustment(current, [final, adj1, adj2]) is None


def test_adjustment_is_none_when_nothing_changed():
    samples = [sample("e1", quantity="1234.5"), sample("e2", kind="cpu", quantity="3")]
    final = invoices_for(samples, "team-a", status="final")
    assert adjustment(invoices_for(samples, "team-a"), [final]) is None
    # a late duplicate of an already billed event_id changes nothing either
    assert adjustment(invoices_for([*samples, dict(samples[0])], "team-a"), [final]) is None


def test_adjustment_exports_with_suffix_and_signed_money(tmp_path):
    before = [sample("e1", quantity="160")]
    after = [*before, sample("late", quantity="80")]
    adj = adjustment(invoices_for(after, "team-a"), [invoices_for(before, "team-a", status="final")])
    assert adj is not None
    path = write_invoice(adj, "json", tmp_path)
    assert path.name == "invoice-team-a-2026-11-adjustment.json"
    document = json.loads(path.read_text())
    assert document["status"] == "adjustment"
    assert [key for key, _ in ordered_pairs(path.read_text())] == TOP_KEYS
    for key in ("subtotal", "commitment_true_up", "credits", "total"):
        assert MONEY.fullmatch(document[key]), document[key]
    rows = list(csv.reader(io.StringIO(invoice_csv(adj))))
    true_up_row = rows[-3]
    assert true_up_row[CSV_COLUMNS.index("kind")] == "commitment_true_up"
    assert true_up_row[CSV_COLUMNS.index("amount")] == "-200.00"
