"""The ledger's rules without ClickHouse: numbering, hashes, what to issue next, credit drawdown
and commitment terms across months. Expected figures are hand arithmetic (see the comments)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core.tenants import TenantPolicy
from pricing.invoice import LineKey, UsageLine
from pricing.ledger import (
    LedgerError,
    LedgerView,
    canonical_json,
    chain_hash,
    entry_for,
    month_has_ended,
    next_invoice,
)
from testkit.builders import H100, card_set

CARDS = card_set()
NOW = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)


def cpu(card: str, core_hours: str) -> list[UsageLine]:
    return [UsageLine(LineKey(card, "cpu", None, None, "on-demand"), Decimal(core_hours) * 3600)]


def h100(hours: str) -> list[UsageLine]:
    return [UsageLine(LineKey("2026-11", "gpu", H100, None, "on-demand"), Decimal(hours) * 3600)]


def policy(**fields: Any) -> TenantPolicy:
    return TenantPolicy.model_validate({"tenant": "team-a", **fields})


def issue(
    view: LedgerView,
    tenant: str,
    period: str,
    usage: list[UsageLine],
    terms: TenantPolicy | None,
    claim: str = "run-1",
) -> Any:
    invoice = next_invoice(tenant, period, usage, CARDS, terms, view, issuing=True)
    if invoice is None:
        return None
    entry = entry_for(invoice, view, claim, NOW)
    view.add(entry)
    return entry


# --- numbers, hashes, months ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "now", "ended"),
    [
        pytest.param(
            "2026-11", datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC), False,
            id="november last microsecond",
        ),
        pytest.param("2026-11", datetime(2026, 12, 1, tzinfo=UTC), True, id="december first instant"),
        pytest.param("2026-12", datetime(2026, 12, 31, 23, 0, tzinfo=UTC), False, id="december last hour"),
        pytest.param("2026-12", datetime(2027, 1, 1, tzinfo=UTC), True, id="january first instant"),
    ],
)
def test_a_month_ends_at_the_first_instant_of_the_next(period: str, now: datetime, ended: bool) -> None:
    assert month_has_ended(period, now) is ended


def test_entries_are_numbered_per_year_hashed_and_chained() -> None:
    view = LedgerView()
    first = issue(view, "team-a", "2026-11", h100("10"), None)
    second = issue(view, "team-b", "2026-11", h100("20"), None)
    assert (first.number, second.number) == ("GM-2026-000001", "GM-2026-000002")
    assert (first.seq, second.seq) == (1, 2)
    for entry in (first, second):
        document = json.loads(entry.document)
        # canonical = sorted keys, no whitespace; the hash is over exactly the stored text
        assert entry.document == json.dumps(document, sort_keys=True, separators=(",", ":"))
        assert entry.content_sha256 == hashlib.sha256(entry.document.encode()).hexdigest()
        assert document["number"] == entry.number
    assert first.chain_sha256 == hashlib.sha256(f":{first.content_sha256}".encode()).hexdigest()
    assert second.chain_sha256 == chain_hash(first.chain_sha256, second.content_sha256)


def test_the_year_of_a_number_never_goes_back() -> None:
    view = LedgerView(last_seq=7, last_chain="x", last_year=2027, year_counts={2026: 5, 2027: 2})
    invoice = next_invoice("team-a", "2026-11", h100("1"), CARDS, None, view, issuing=True)
    assert invoice is not None
    entry = entry_for(invoice, view, "late-clock", datetime(2026, 12, 31, tzinfo=UTC))
    assert (entry.seq, entry.number) == (8, "GM-2027-000003")


def test_the_view_refuses_a_gap_or_a_repeated_number() -> None:
    view = LedgerView()
    entry = issue(LedgerView(), "team-a", "2026-11", h100("1"), None)
    view.add(entry)
    with pytest.raises(LedgerError, match="gap"):
        view.add(entry)  # position 1 again after 1
    skipped = LedgerView(last_seq=1, year_counts={2026: 1}, last_year=2026)
    with pytest.raises(LedgerError, match="gap"):
        skipped.add(issue(LedgerView(last_seq=2, year_counts={2026: 2}), "t", "2026-11", h100("1"), None))


def test_canonical_json_is_key_order_independent() -> None:
    assert (
        canonical_json({"b": "1", "a": [{"d": None, "c": "é"}]})
        == '{"a":[{"c":"é","d":null}],"b":"1"}'.encode()
    )


# --- what to issue next -------------------------------------------------------------------------------


def test_final_then_adjustment_continues_the_tier_bands_and_references_the_final() -> None:
    view = LedgerView()
    final = issue(view, "team-a", "2026-11", h100("900"), policy(credits="250.00"))
    # 900 h x 2.50 = 2250.00 - 250.00 monthly credits
    assert (final.invoice.status, final.invoice.total, final.invoice.credit_draws) == (
        "final",
        Decimal("2250.00") - Decimal("250.00"),
        {"monthly": Decimal("250.00")},
    )
    assert issue(view, "team-a", "2026-11", h100("900"), policy(credits="250.00")) is None
    adjustment = issue(view, "team-a", "2026-11", h100("1100"), policy(credits="250.00"))
    # 1100 h = 1000 x 2.50 + 100 x 2.25 = 2725.00; minus 2250.00 = 475.00; the allowance is used up
    (line,) = adjustment.invoice.lines
    assert (line.quantity, line.amount) == (Decimal(200), Decimal("475.00"))
    assert (adjustment.invoice.status, adjustment.invoice.adjusts) == ("adjustment", final.number)
    assert (adjustment.invoice.credits, adjustment.invoice.total) == (Decimal(0), Decimal("475.00"))
    assert adjustment.number == "GM-2026-000002"


def test_a_draft_is_unnumbered_and_a_pending_adjustment_is_not_issued() -> None:
    view = LedgerView()
    draft = next_invoice("team-a", "2026-11", h100("10"), CARDS, None, view, issuing=False)
    assert draft is not None and (draft.status, draft.number) == ("draft", None)
    final = issue(view, "team-a", "2026-11", h100("10"), None)
    pending = next_invoice("team-a", "2026-11", h100("12"), CARDS, None, view, issuing=False)
    assert pending is not None and (pending.status, pending.number, pending.adjusts) == (
        "adjustment",
        None,
        final.number,
    )
    assert pending.total == Decimal("5.00")  # 2 h x 2.50


def test_credit_grant_is_drawn_down_across_three_months_until_exhausted() -> None:
    # Grant 500.00 from 2026-09; the months bill 180.00, 225.00, 300.00 (cpu at each card's price)
    terms = policy(credit_grants=[{"id": "launch", "amount": "500.00", "start": "2026-09"}])
    view = LedgerView()
    oct_ = issue(view, "team-a", "2026-10", cpu("2026-10", "4000"), terms)  # 4000 h x 0.045 = 180.00
    assert (oct_.invoice.subtotal, oct_.invoice.credits, oct_.invoice.total) == (
        Decimal("180.00"),
        Decimal("180.00"),
        Decimal("0.00"),
    )
    assert oct_.invoice.credits_remaining == Decimal("320.00")
    other = issue(view, "team-b", "2026-10", cpu("2026-10", "100"), None)  # another tenant draws nothing
    assert other.invoice.credits == 0
    nov = issue(view, "team-a", "2026-11", cpu("2026-11", "5625"), terms)  # 5625 h x 0.04 = 225.00
    assert (nov.invoice.credits, nov.invoice.total, nov.invoice.credits_remaining) == (
        Decimal("225.00"),
        Decimal("0.00"),
        Decimal("95.00"),
    )
    dec = issue(view, "team-a", "2026-12", cpu("2026-11", "7500"), terms)  # 300.00
    assert (dec.invoice.credits, dec.invoice.total, dec.invoice.credits_remaining) == (
        Decimal("95.00"),
        Decimal("205.00"),
        Decimal("0.00"),
    )
    assert dec.invoice.credit_draws == {"launch": Decimal("95.00")}
    # Exhausted: the next month draws nothing.
    jan = issue(view, "team-a", "2027-01", cpu("2026-11", "25"), terms)  # 1.00
    assert (jan.invoice.credits, jan.invoice.total) == (Decimal("0.00"), Decimal("1.00"))


def test_grants_expire_and_the_earliest_expiry_is_drawn_first() -> None:
    terms = policy(
        credits="10.00",
        credit_grants=[
            {"id": "open", "amount": "100.00", "start": "2026-11"},
            {"id": "short", "amount": "30.00", "start": "2026-11", "end": "2026-11"},
        ],
    )
    view = LedgerView()
    nov = issue(view, "team-a", "2026-11", cpu("2026-11", "1000"), terms)  # 40.00
    # monthly allowance first (10), then the grant expiring first (30), nothing from 'open'
    assert nov.invoice.credit_draws == {"monthly": Decimal("10.00"), "short": Decimal("30.00")}
    assert nov.invoice.credits_remaining == Decimal("100.00")  # 'short' is spent and ends with November
    dec = issue(view, "team-a", "2026-12", cpu("2026-11", "2000"), terms)  # 80.00
    assert dec.invoice.credit_draws == {"monthly": Decimal("10.00"), "open": Decimal("70.00")}
    assert (dec.invoice.total, dec.invoice.credits_remaining) == (Decimal("0.00"), Decimal("30.00"))


def test_an_expired_grant_is_not_drawn() -> None:
    terms = policy(credit_grants=[{"id": "old", "amount": "100.00", "start": "2026-01", "end": "2026-10"}])
    nov = issue(LedgerView(), "team-a", "2026-11", cpu("2026-11", "100"), terms)  # 4.00
    assert (nov.invoice.credits, nov.invoice.total, nov.invoice.credits_remaining) == (
        Decimal("0.00"),
        Decimal("4.00"),
        Decimal("0.00"),
    )


def test_commitment_applies_only_within_its_term() -> None:
    terms = policy(commitments=[{"monthly": "250.00", "start": "2026-11", "end": "2026-11"}])
    view = LedgerView()
    oct_ = issue(view, "team-a", "2026-10", cpu("2026-10", "1000"), terms)  # 45.00, before the term
    nov = issue(view, "team-a", "2026-11", cpu("2026-11", "1000"), terms)  # 40.00, in the term
    dec = issue(view, "team-a", "2026-12", cpu("2026-11", "1000"), terms)  # 40.00, after it
    assert oct_.invoice.commitment_true_up == dec.invoice.commitment_true_up == Decimal("0")
    assert (nov.invoice.commitment_true_up, nov.invoice.total) == (Decimal("210.00"), Decimal("250.00"))


def test_late_usage_under_a_commitment_lowers_the_true_up_in_the_adjustment() -> None:
    terms = policy(commitment="1000.00")
    view = LedgerView()
    final = issue(view, "team-a", "2026-11", h100("100"), terms)  # 250.00 + 750.00 true-up
    assert (final.invoice.commitment_true_up, final.invoice.total) == (Decimal("750.00"), Decimal("1000.00"))
    adjustment = issue(view, "team-a", "2026-11", h100("500"), terms)  # 1250.00 in full
    # lines +1000.00, true-up -750.00: the month now costs 1250.00, 250.00 more than billed
    assert (adjustment.invoice.subtotal, adjustment.invoice.commitment_true_up, adjustment.invoice.total) == (
        Decimal("1000.00"),
        Decimal("-750.00"),
        Decimal("250.00"),
    )


def test_a_bill_that_shrinks_after_issue_gives_back_the_excess_credit() -> None:
    view = LedgerView()
    final = issue(view, "team-a", "2026-11", h100("40"), policy(commitment="1000.00", credits="250.00"))
    # 40 h x 2.50 = 100.00 + 900.00 true-up = 1000.00; 250.00 monthly credits -> 750.00
    assert (final.invoice.commitment_true_up, final.invoice.credits, final.invoice.total) == (
        Decimal("900.00"),
        Decimal("250.00"),
        Decimal("750.00"),
    )
    # The commitment is lowered to 200.00 after the month was issued: it now costs 200.00, all
    # covered by credits, so the adjustment credits back 750.00 and returns 50.00 of allowance.
    lowered = issue(view, "team-a", "2026-11", h100("40"), policy(commitment="200.00", credits="250.00"))
    invoice = lowered.invoice
    assert (invoice.commitment_true_up, invoice.credits, invoice.total) == (
        Decimal("-800.00"),
        Decimal("-50.00"),
        Decimal("-750.00"),
    )
    assert invoice.credit_draws == {"monthly": Decimal("-50.00")}
    assert final.invoice.total + invoice.total == Decimal("0.00")
