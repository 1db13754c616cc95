"""End-to-end invoice arithmetic (contract 3 / 4b) against the Fraction reference and hand arithmetic."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gpumeter.core.config_files import read_yaml
from gpumeter.core.models import SampleRejected, parse_sample
from gpumeter.core.ratecard import load_rate_cards
from pricing.invoice import build_invoice
from pricing.rating import Rater
from testkit.builders import A100, CARD_NOV, CARD_OCT, CARDS, H100, L4, TENANTS, card_set, sample
from tests.unit import reference_billing as ref
from tests.unit.pricing.billing_harness import aggregate, documents, normalise, run_pipeline


def check(
    samples: list[dict[str, Any]],
    cards: Sequence[Mapping[str, Any]] = CARDS,
    tenants: Sequence[Mapping[str, Any]] | None = TENANTS,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Run the pipeline, assert it equals the reference document for document, return it."""
    actual = documents(run_pipeline(samples, cards, tenants))
    reference = ref.reference_invoices(samples, cards, tenants)
    expected = {group: normalise(doc) for group, doc in reference.items()}
    assert actual == expected
    return actual


def one(docs: dict[tuple[str, str], dict[str, Any]], tenant: str, period: str) -> dict[str, Any]:
    assert (tenant, period) in docs, sorted(docs)
    return docs[(tenant, period)]


def amounts(doc: dict[str, Any]) -> dict[tuple[Any, ...], str]:
    return {
        (line["rate_card"], line["gpu_model"], line["mig_profile"], line["capacity_type"]): line["amount"]
        for line in doc["lines"]
    }


# --- the contract's own example ------------------------------------------------------------------


def test_contract_4b_example_1234_5_h100_hours():
    # 1234.5 H100 on-demand hours on card 2026-11:
    #   1000 x 2.50 + 234.5 x 2.25 = 2500 + 527.625 = 3027.625 -> 3027.63 (half-up)
    # team-a: commitment 1000.00 (subtotal above it: no true-up), credits 250.00
    #   total = 3027.63 - 250.00 = 2777.63
    docs = check([sample("e1", quantity="1234.5")])
    doc = one(docs, "team-a", "2026-11")
    assert doc == {
        "tenant": "team-a",
        "period": "2026-11",
        "currency": "USD",
        "status": "draft",
        "lines": [
            {
                "rate_card": "2026-11",
                "kind": "gpu",
                "gpu_model": H100,
                "mig_profile": None,
                "capacity_type": "on-demand",
                "quantity": "1234.500000",
                "amount": "3027.63",
            }
        ],
        "subtotal": "3027.63",
        "commitment_true_up": "0.00",
        "credits": "250.00",
        "total": "2777.63",
    }


# --- tier bands ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "amount"),
    [
        # 999.999999 x 2.50 = 2499.9999975 -> 2500.00
        pytest.param("999.999999", "2500.00", id="just-below-the-first-edge"),
        # exactly at the edge: all in the first band, 1000 x 2.50
        pytest.param("1000", "2500.00", id="at-the-first-edge"),
        # 2500 + 0.000001 x 2.25 = 2500.00000225 -> 2500.00
        pytest.param("1000.000001", "2500.00", id="just-past-the-first-edge"),
        # 2500 + 1 x 2.25 (not 2502.50: the extra hour is in band 2)
        pytest.param("1001", "2502.25", id="one-hour-into-band-2"),
        # 2500 + 9000 x 2.25 = 2500 + 20250 = 22750
        pytest.param("10000", "22750.00", id="at-the-second-edge"),
        # 22750 + 1 x 2.00
        pytest.param("10001", "22752.00", id="one-hour-into-band-3"),
        # 2500 + 20250 + 500 x 2.00 = 23750 (crosses two edges)
        pytest.param("10500", "23750.00", id="across-two-edges"),
    ],
)
def test_tier_band_edges(quantity, amount):
    docs = check([sample("e1", tenant="solo", quantity=quantity)])
    doc = one(docs, "solo", "2026-11")
    assert doc["lines"][0]["amount"] == amount
    assert doc["total"] == amount  # no policy for solo


def test_tiers_fill_on_the_line_sum_across_samples():
    # Three samples of 3500 GPUs x 1 h = 10500 h on one line -> 23750.00 as above.
    # Pricing each sample on its own would give 3 x (2500 + 2500 x 2.25) = 3 x 8125 = 24375.
    samples = [
        sample(f"e{i}", tenant="solo", start=f"2026-11-0{i}T00:00:00Z", quantity="3500") for i in (1, 2, 3)
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert doc["lines"][0]["quantity"] == "10500.000000"
    assert doc["subtotal"] == "23750.00"


def test_tiers_with_a_window_shorter_than_an_hour():
    # 2000 GPUs for 1800 s = 1000 h exactly, + 4 GPUs for 900 s = 1 h -> 1001 h
    # = 1000 x 2.50 + 1 x 2.25 = 2502.25
    samples = [
        sample("e1", tenant="solo", seconds=1800, quantity="2000"),
        sample("e2", tenant="solo", start="2026-11-11T00:00:00Z", seconds=900, quantity="4"),
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert doc["lines"][0]["quantity"] == "1001.000000"
    assert doc["subtotal"] == "2502.25"


def test_spot_line_crossing_two_bands_is_multiplied_after_banding():
    # 10500 spot H100 hours: (2500 + 20250 + 1000) x 0.35 = 23750 x 0.35 = 8312.50
    doc = one(check([sample("e1", tenant="solo", capacity_type="spot", quantity="10500")]), "solo", "2026-11")
    assert doc["subtotal"] == "8312.50"


def test_bands_restart_per_line_key():
    # H100 600 h without MIG and 600 h as MIG 1g.10gb (which prices at the H100 model rate):
    # two lines, each 600 x 2.50 = 1500.00 -- bands are filled on each line's own quantity,
    # so neither reaches the 1000 h edge. Subtotal 3000.00 (not 2500 + 200 x 2.25 = 2950).
    samples = [
        sample("e1", tenant="solo", quantity="600"),
        sample("e2", tenant="solo", mig_profile="1g.10gb", quantity="600"),
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert amounts(doc) == {
        ("2026-11", H100, None, "on-demand"): "1500.00",
        ("2026-11", H100, "1g.10gb", "on-demand"): "1500.00",
    }
    assert doc["subtotal"] == "3000.00"


def test_capacity_types_are_separate_lines_with_their_multipliers():
    # 1234.5 h each: on-demand 3027.625 -> 3027.63; reserved 3027.625 x 0.6 = 1816.575 -> 1816.58
    # (exact half cent, rounded up); spot 3027.625 x 0.35 = 1059.66875 -> 1059.67.
    # Subtotal 3027.63 + 1816.58 + 1059.67 = 5903.88
    samples = [
        sample("e1", tenant="solo", quantity="1234.5"),
        sample("e2", tenant="solo", capacity_type="reserved", quantity="1234.5"),
        sample("e3", tenant="solo", capacity_type="spot", quantity="1234.5"),
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert amounts(doc) == {
        ("2026-11", H100, None, "on-demand"): "3027.63",
        ("2026-11", H100, None, "reserved"): "1816.58",
        ("2026-11", H100, None, "spot"): "1059.67",
    }
    assert doc["subtotal"] == "5903.88"


# --- most specific rate --------------------------------------------------------------------------

SPECIFIC_CARD: dict[str, Any] = {
    "version": "spec",
    "currency": "USD",
    "effective_from": "2026-01-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.5", "spot": "0.25"},
    "rates": [
        {"kind": "gpu", "unit_price": "1.80"},
        {"kind": "gpu", "gpu_model": A100, "unit_price": "1.20"},
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.40"},
        {"kind": "cpu", "unit_price": "0.04"},
    ],
}


def test_most_specific_rate_wins():
    # 10 h each (10 units x 1 h):
    #   A100 + 1g.5gb  -> profile rate 0.40 -> 4.00
    #   A100 + 2g.10gb -> no profile rate, model rate 1.20 -> 12.00
    #   A100, no MIG   -> model rate 1.20 -> 12.00
    #   L4             -> fallback 1.80 -> 18.00, line keyed by the sample's own model "L4-24GB"
    #   cpu            -> 0.04 -> 0.40
    # subtotal 4 + 12 + 12 + 18 + 0.40 = 46.40
    samples = [
        sample("e1", tenant="solo", gpu_model=A100, mig_profile="1g.5gb", quantity="10"),
        sample("e2", tenant="solo", gpu_model=A100, mig_profile="2g.10gb", quantity="10"),
        sample("e3", tenant="solo", gpu_model=A100, quantity="10"),
        sample("e4", tenant="solo", gpu_model=L4, quantity="10"),
        sample("e5", tenant="solo", kind="cpu", quantity="10"),
    ]
    doc = one(check(samples, cards=[SPECIFIC_CARD]), "solo", "2026-11")
    assert amounts(doc) == {
        ("spec", A100, "1g.5gb", "on-demand"): "4.00",
        ("spec", A100, "2g.10gb", "on-demand"): "12.00",
        ("spec", A100, None, "on-demand"): "12.00",
        ("spec", L4, None, "on-demand"): "18.00",
        ("spec", None, None, "on-demand"): "0.40",
    }
    assert doc["subtotal"] == "46.40"


def test_fallback_lines_are_kept_apart_per_sample_model():
    # Two unknown models both priced by the fallback 1.80: still two lines (keyed by own model).
    samples = [
        sample("e1", tenant="solo", gpu_model=L4, quantity="1"),
        sample("e2", tenant="solo", gpu_model="T4-16GB", quantity="1"),
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert sorted(line["gpu_model"] for line in doc["lines"]) == [L4, "T4-16GB"]
    assert [line["amount"] for line in doc["lines"]] == ["1.80", "1.80"]


def test_no_rate_is_rejected_with_code_no_rate():
    cards = card_set([SPECIFIC_CARD])
    rater = Rater(cards)
    storage = parse_sample(sample("e1", kind="storage", quantity="1"))
    with pytest.raises(SampleRejected) as caught:
        rater.rate(storage)
    assert caught.value.code == "no_rate"
    assert ref.rate_sample(sample("e1", kind="storage", quantity="1"), [SPECIFIC_CARD]) is None


def test_no_card_yet_is_rejected_with_code_no_rate():
    rater = Rater(card_set())
    early = parse_sample(sample("e1", start="2026-09-30T23:59:59.999999Z"))
    with pytest.raises(SampleRejected) as caught:
        rater.rate(early)
    assert caught.value.code == "no_rate"


# --- card switch at effective_from ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "period", "card", "amount"),
    [
        # exactly at the boundary: card 2026-11, 1 H100 hour x 2.50
        pytest.param("2026-11-01T00:00:00Z", "2026-11", "2026-11", "2.50", id="at-switch-z"),
        pytest.param("2026-11-01T00:00:00+00:00", "2026-11", "2026-11", "2.50", id="at-switch-utc-offset"),
        pytest.param("2026-11-01T08:00:00+08:00", "2026-11", "2026-11", "2.50", id="at-switch-plus8"),
        pytest.param("2026-10-31T19:00:00-05:00", "2026-11", "2026-11", "2.50", id="at-switch-minus5"),
        # one microsecond before: card 2026-10 (2.75) and October
        pytest.param("2026-10-31T23:59:59.999999Z", "2026-10", "2026-10", "2.75", id="1us-before-z"),
        pytest.param("2026-11-01T07:59:59.999999+08:00", "2026-10", "2026-10", "2.75", id="1us-before-plus8"),
        pytest.param("2026-10-31T18:59:59.999999-05:00", "2026-10", "2026-10", "2.75",
                     id="1us-before-minus5"),
    ],
)
def test_card_switch_at_effective_from(start, period, card, amount):
    doc = one(check([sample("e1", tenant="solo", start=start)]), "solo", period)
    assert [(line["rate_card"], line["amount"]) for line in doc["lines"]] == [(card, amount)]


def test_window_straddling_the_switch_uses_the_card_at_window_start():
    # 23:30Z-00:30Z: card at window_start (2026-10), all of it in October: 1 h x 2.75
    doc = one(check([sample("e1", tenant="solo", start="2026-10-31T23:30:00Z")]), "solo", "2026-10")
    assert doc["lines"][0]["rate_card"] == "2026-10"
    assert doc["total"] == "2.75"


def test_two_cards_in_one_month_give_two_lines_with_their_own_bands():
    # A mid-month card (effective 2026-11-15T12:00+05:00 = 07:00Z) with the H100 first band at 3.00.
    mid = copy.deepcopy(CARD_NOV)
    mid["version"] = "2026-11b"
    mid["effective_from"] = "2026-11-15T12:00:00+05:00"
    mid["rates"][0] = {
        "kind": "gpu",
        "gpu_model": H100,
        "tiers": [{"up_to": 1000, "unit_price": "3.00"}, {"up_to": None, "unit_price": "2.00"}],
    }
    cards = [CARD_OCT, CARD_NOV, mid]
    # 900 h before (1 µs before the switch) and 900 h from the switch on:
    #   2026-11  : 900 x 2.50 = 2250.00
    #   2026-11b : 900 x 3.00 = 2700.00 (bands restart: the line has its own 900 h)
    samples = [
        sample("e1", tenant="solo", start="2026-11-15T06:59:59.999999Z", quantity="900"),
        sample("e2", tenant="solo", start="2026-11-15T07:00:00Z", quantity="900"),
    ]
    doc = one(check(samples, cards=cards), "solo", "2026-11")
    assert amounts(doc) == {
        ("2026-11", H100, None, "on-demand"): "2250.00",
        ("2026-11b", H100, None, "on-demand"): "2700.00",
    }
    assert doc["subtotal"] == "4950.00"


def test_cards_given_out_of_order_are_selected_by_effective_from():
    doc = one(check([sample("e1", tenant="solo")], cards=[CARD_NOV, CARD_OCT]), "solo", "2026-11")
    assert doc["lines"][0]["rate_card"] == "2026-11"


# --- UTC month attribution -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "period"),
    [
        # = 2026-11-30T21:00Z
        pytest.param("2026-12-01T05:00:00+08:00", "2026-11", id="plus8-local-december-utc-november"),
        pytest.param("2026-12-01T07:59:59.999999+08:00", "2026-11", id="plus8-1us-before-december-utc"),
        # = 2026-12-01T00:00Z
        pytest.param("2026-12-01T08:00:00+08:00", "2026-12", id="plus8-first-instant-of-december-utc"),
        # = 2026-12-01T01:00Z
        pytest.param("2026-11-30T20:00:00-05:00", "2026-12", id="minus5-local-november-utc-december"),
        pytest.param("2026-11-30T18:59:59.999999-05:00", "2026-11", id="minus5-1us-before-december-utc"),
        # straddles midnight: month of window_start
        pytest.param("2026-11-30T23:30:00Z", "2026-11", id="window-straddling-midnight"),
        # = 2027-01-01T04:30Z, still card 2026-11
        pytest.param("2026-12-31T23:30:00-05:00", "2027-01", id="minus5-new-year-utc"),
        # = 2026-12-31T19:30Z
        pytest.param("2027-01-01T01:00:00+05:30", "2026-12", id="plus5h30-new-year-local-only"),
    ],
)
def test_utc_month_attribution(start, period):
    docs = check([sample("e1", tenant="solo", start=start)])
    assert list(docs) == [("solo", period)]
    assert docs[("solo", period)]["period"] == period


def test_one_tenant_split_over_months_gives_one_invoice_per_month():
    samples = [
        sample("e1", tenant="solo", start="2026-10-15T00:00:00Z"),
        sample("e2", tenant="solo", start="2026-11-15T00:00:00+08:00"),
        sample("e3", tenant="solo", start="2026-12-15T00:00:00-05:00"),
    ]
    docs = check(samples)
    assert sorted(docs) == [("solo", "2026-10"), ("solo", "2026-11"), ("solo", "2026-12")]
    assert [docs[k]["total"] for k in sorted(docs)] == ["2.75", "2.50", "2.50"]


# --- rounding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "quantity", "seconds", "amount"),
    [
        # 0.125 core-h x 0.04 = 0.005 -> 0.01 (half-even would give 0.00)
        pytest.param("cpu", "0.125", 3600, "0.01", id="cpu-eighth-core-hour"),
        # 5 GiB-h x 0.005 = 0.025 -> 0.03 (half-even: 0.02)
        pytest.param("memory", "5", 3600, "0.03", id="memory-5-gib-hours"),
        # 0.005 -> 0.01
        pytest.param("memory", "1", 3600, "0.01", id="memory-1-gib-hour"),
        # 0.004999995 -> 0.00
        pytest.param("memory", "0.999999", 3600, "0.00", id="memory-just-below-half-a-cent"),
        # 25 x 0.0002 = 0.005 -> 0.01
        pytest.param("storage", "25", 3600, "0.01", id="storage-25-gib-hours"),
        # 0.0049998 -> 0.00
        pytest.param("storage", "24.999", 3600, "0.00", id="storage-just-below-half-a-cent"),
        # 0.125 core-h x 0.04 = 0.005 -> 0.01
        pytest.param("cpu", "1", 450, "0.01", id="cpu-one-core-for-450-seconds"),
    ],
)
def test_round_half_up_at_half_a_cent(kind, quantity, seconds, amount):
    doc = one(
        check([sample("e1", tenant="solo", kind=kind, gpu_model=None, quantity=quantity, seconds=seconds)]),
        "solo",
        "2026-11",
    )
    assert doc["lines"][0]["amount"] == amount


def test_each_line_is_rounded_once_not_each_sample():
    # Ten samples of 1 core x 360 s = 0.1 core-h each, 0.004 each at 0.04.
    # Rounding per sample would give 10 x 0.00 = 0.00; once per line: 1 core-h x 0.04 = 0.04.
    samples = [
        sample(f"e{i}", tenant="solo", kind="cpu", start=f"2026-11-10T0{i}:00:00Z", seconds=360)
        for i in range(10)
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert doc["lines"][0]["quantity"] == "1.000000"
    assert doc["subtotal"] == "0.04"


def test_subtotal_is_the_sum_of_rounded_lines():
    # cpu 0.125 core-h -> 0.005 -> 0.01; memory 1 GiB-h -> 0.005 -> 0.01; subtotal 0.02
    # (rounding the unrounded sum 0.010 would give 0.01).
    samples = [
        sample("e1", tenant="solo", kind="cpu", gpu_model=None, quantity="0.125"),
        sample("e2", tenant="solo", kind="memory", gpu_model=None, quantity="1"),
    ]
    doc = one(check(samples), "solo", "2026-11")
    assert doc["subtotal"] == "0.02"


def test_quantity_is_unit_hours_with_six_decimals():
    # 1 core for 1 s = 1/3600 core-h = 0.000277... -> "0.000278"
    doc = one(check([sample("e1", tenant="solo", kind="cpu", gpu_model=None, seconds=1)]), "solo", "2026-11")
    assert doc["lines"][0]["quantity"] == "0.000278"
    assert doc["lines"][0]["amount"] == "0.00"


# --- commitment, credits, tenants without a policy -----------------------------------------------


def test_commitment_true_up_below_commitment():
    # team-a: 40 H100 h x 2.50 = 100.00; commitment 1000.00 -> true-up 900.00;
    # credits 250.00 -> total 1000.00 - 250.00 = 750.00
    doc = one(check([sample("e1", quantity="40")]), "team-a", "2026-11")
    assert (doc["subtotal"], doc["commitment_true_up"], doc["credits"], doc["total"]) == (
        "100.00",
        "900.00",
        "250.00",
        "750.00",
    )


def test_commitment_without_credits():
    # research: commitment 15000.00; 1234.5 h -> 3027.63, true-up 11972.37, total 15000.00
    doc = one(check([sample("e1", tenant="research", quantity="1234.5")]), "research", "2026-11")
    assert (doc["subtotal"], doc["commitment_true_up"], doc["credits"], doc["total"]) == (
        "3027.63",
        "11972.37",
        "0.00",
        "15000.00",
    )


def test_subtotal_exactly_at_commitment_has_no_true_up():
    # 400 h x 2.50 = 1000.00 = commitment; credits 250 -> 750.00
    doc = one(check([sample("e1", quantity="400")]), "team-a", "2026-11")
    assert (doc["commitment_true_up"], doc["total"]) == ("0.00", "750.00")


def test_credits_larger_than_the_bill_floor_at_zero():
    # inference: credits 100.00; 16 H100 h x 2.50 = 40.00 -> credits applied 40.00, total 0.00
    doc = one(check([sample("e1", tenant="inference", quantity="16")]), "inference", "2026-11")
    assert (doc["subtotal"], doc["commitment_true_up"], doc["credits"], doc["total"]) == (
        "40.00",
        "0.00",
        "40.00",
        "0.00",
    )


def test_credits_exactly_the_bill():
    # inference: 40 H100 h x 2.50 = 100.00 = credits -> total 0.00
    doc = one(check([sample("e1", tenant="inference", quantity="40")]), "inference", "2026-11")
    assert (doc["credits"], doc["total"]) == ("100.00", "0.00")


def test_tenant_without_policy_is_billed_plainly():
    # nobody is not in the tenants file: no true-up, no credits, total = subtotal = 2.50
    doc = one(check([sample("e1", tenant="nobody")]), "nobody", "2026-11")
    assert (doc["subtotal"], doc["commitment_true_up"], doc["credits"], doc["total"]) == (
        "2.50",
        "0.00",
        "0.00",
        "2.50",
    )


def test_no_tenants_file_at_all():
    doc = one(check([sample("e1", quantity="40")], tenants=None), "team-a", "2026-11")
    assert (doc["commitment_true_up"], doc["credits"], doc["total"]) == ("0.00", "0.00", "100.00")


def test_invoice_identity_subtotal_plus_true_up_minus_credits():
    samples = [
        sample("e1", tenant="team-a", quantity="3"),
        sample("e2", tenant="research", quantity="3"),
        sample("e3", tenant="inference", quantity="300"),
        sample("e4", tenant="rich", quantity="300"),
        sample("e5", tenant="nobody", quantity="3"),
    ]
    for doc in check(samples).values():
        subtotal, true_up = Decimal(doc["subtotal"]), Decimal(doc["commitment_true_up"])
        assert subtotal + true_up - Decimal(doc["credits"]) == Decimal(doc["total"])
        assert Decimal(doc["total"]) >= 0


# --- duplicates and tenant separation ------------------------------------------------------------


def test_duplicate_event_ids_count_once():
    # e1 three times: 1 h x 2.50 once, not 7.50
    samples = [sample("e1", tenant="solo")] * 3
    doc = one(check(samples), "solo", "2026-11")
    assert doc["subtotal"] == "2.50"


def test_tenants_are_invoiced_separately():
    samples = [sample("e1", tenant="solo", quantity="600"), sample("e2", tenant="other", quantity="600")]
    docs = check(samples)
    # 600 h each: 1500.00 each, no band sharing across tenants
    assert docs[("solo", "2026-11")]["total"] == "1500.00"
    assert docs[("other", "2026-11")]["total"] == "1500.00"


def test_fractional_quantities_and_microsecond_windows():
    # 0.5 GPU (shared) x 1800.5 s = 900.25 GPU-s = 0.250069444... h x 2.50 = 0.62517... -> 0.63
    doc = one(check([sample("e1", tenant="solo", quantity="0.5", seconds="1800.5")]), "solo", "2026-11")
    assert doc["lines"][0]["quantity"] == "0.250069"
    assert doc["subtotal"] == "0.63"


def test_shipped_default_cards_match_the_reference():
    """The shipped default cards, loaded by load_rate_cards, price like the reference does."""
    folder = Path(__file__).resolve().parents[3] / "gpumeter" / "defaults" / "ratecards"
    loaded = load_rate_cards(folder)
    # The same files as plain dicts (read without floats, as the project reads YAML).
    plain = [read_yaml(path) for path in sorted(folder.glob("*.yaml"))]
    samples = [
        sample("e1", tenant="solo", start="2026-10-20T00:00:00Z", quantity="1234.5"),
        sample("e2", tenant="solo", quantity="1234.5", capacity_type="spot"),
        sample("e3", tenant="solo", gpu_model=A100, mig_profile="1g.5gb", quantity="7"),
    ]
    actual = {
        group: normalise(build_invoice(group[0], group[1], usage, loaded, None).to_document())
        for group, usage in aggregate(samples, loaded).items()
    }
    expected = {g: normalise(d) for g, d in ref.reference_invoices(samples, plain, None).items()}
    assert actual == expected


# --- streaming list cost (step 3) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        # tiered: first band price 2.50, no tiers applied
        pytest.param(sample("e1", quantity="1234.5"), id="h100-tiered-first-band"),
        pytest.param(sample("e2", quantity="20000", capacity_type="spot"), id="h100-spot-past-two-edges"),
        pytest.param(sample("e3", gpu_model=A100, mig_profile="1g.5gb", quantity="0.333333", seconds=7),
                     id="a100-mig-7-seconds"),
        pytest.param(
            sample("e4", kind="storage", gpu_model=None, quantity="1000.000001", seconds="3599.999999"),
            id="storage-microsecond-window",
        ),
        pytest.param(
            sample("e5", start="2026-10-31T23:59:59.999999Z", capacity_type="reserved", quantity="3"),
            id="reserved-last-microsecond-of-october",
        ),
    ],
)
def test_streaming_list_cost_uses_first_band_price(doc):
    rated = Rater(card_set()).rate(parse_sample(doc))
    expected = ref.list_cost(doc, CARDS)
    assert expected is not None
    # stored at 18 decimal places, half-up
    assert Fraction(rated.list_cost) == Fraction(ref.half_up(expected, 18), 10**18)
    found = ref.rate_sample(doc, CARDS)
    assert found is not None
    assert Fraction(rated.unit_price) == ref.first_price(found[1])


def test_streaming_list_cost_hand_computed():
    # 1234.5 H100 h: 1234.5 x 2.50 (first band, no tiers) = 3086.25
    rated = Rater(card_set()).rate(parse_sample(sample("e1", quantity="1234.5")))
    assert rated.list_cost == Decimal("3086.25")
    assert rated.unit_price == Decimal("2.50")
    assert rated.rate_card == "2026-11"
    assert rated.period == "2026-11"


def test_unit_seconds_are_exact_at_the_extremes():
    """Contract: quantity (≤12 places, <1e9) x window seconds (µs) is carried exactly."""
    doc = sample("e1", kind="cpu", gpu_model=None, quantity="999999999.999999999999", seconds="3599.999999")
    parsed = parse_sample(doc)
    exact_product = Fraction(Decimal("999999999.999999999999")) * Fraction(Decimal("3599.999999"))
    # = 3599999998999.999999996400000001
    assert Fraction(parsed.unit_seconds) == exact_product
    rated = Rater(card_set()).rate(parsed)
    assert Fraction(rated.unit_seconds) == exact_product


def test_money_rounding_helper_sanity():
    # guard the reference itself: half-up, not half-even
    assert ref.half_up(Fraction(5, 1000), 2) == 1
    assert ref.half_up(Fraction(25, 1000), 2) == 3
    assert ref.half_up(Fraction(-25, 1000), 2) == -3
    assert ref.money_str(-5) == "-0.05"
    assert Decimal("0.025").quantize(Decimal("0.01"), ROUND_HALF_UP) == Decimal("0.03")
