"""Billing terms in the tenants file (contract 4, extended compatibly): commitment terms, credit
grants, their validation, and the drawing rules of pricing/terms.py."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpumeter.core.config_files import ConfigError
from gpumeter.core.tenants import TenantPolicy, load_tenants
from pricing.terms import CreditSource, credit_sources, draw, release

D = Decimal


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(body)
    return path


def test_terms_load_from_yaml_with_unquoted_months(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
tenants:
  - tenant: team-a
    commitments:
      - {monthly: "1000.00", start: 2026-11, end: 2027-10}
      - {monthly: "1500.00", start: 2027-11}
    credit_grants:
      - {id: launch-2026, amount: "5000.00", start: 2026-11, end: 2027-04}
""",
    )
    policy = load_tenants(path).policy("team-a")
    assert policy is not None
    assert [policy.commitment_in(p) for p in ("2026-10", "2026-11", "2027-10", "2027-11", "2031-01")] == [
        D(0),
        D("1000.00"),
        D("1000.00"),
        D("1500.00"),
        D("1500.00"),
    ]
    (grant,) = policy.credit_grants
    assert (grant.id, grant.amount, grant.usable_in("2027-04"), grant.usable_in("2027-05")) == (
        "launch-2026",
        D("5000.00"),
        True,
        False,
    )


def test_the_old_single_month_fields_keep_their_meaning() -> None:
    policy = TenantPolicy.model_validate({"tenant": "team-a", "commitment": "1000.00", "credits": "250.00"})
    # commitment: every month; credits: a monthly allowance, the same in full every month
    assert policy.commitment_in("1999-01") == policy.commitment_in("2026-11") == D("1000.00")
    for period in ("2026-11", "2026-12"):
        (source,) = credit_sources(policy, period, {}, {})
        assert (source.source, source.available) == ("monthly", D("250.00"))
    (left,) = credit_sources(policy, "2026-11", {}, {"monthly": D("200.00")})
    assert left.available == D("50.00")


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "10.00", start: 2026-11, end: 2026-10}]}',
            "tenants.0.credit_grants.0: end 2026-10 is before start 2026-11",
            id="grant-ending-before-it-starts",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "10.00", start: 2026-13}]}',
            "tenants.0.credit_grants.0.start",
            id="grant-starting-in-month-13",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "-1", start: 2026-11}]}',
            "tenants.0.credit_grants.0.amount: must be >= 0",
            id="negative-grant",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "1.001", start: 2026-11}]}',
            "tenants.0.credit_grants.0.amount: has more than 2 decimal places",
            id="grant-with-fractions-of-a-cent",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: monthly, amount: "1", start: 2026-11}]}',
            "tenants.0.credit_grants.0.id: 'monthly' names the monthly credits allowance",
            id="grant-named-monthly",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "1", start: 2026-11}, '
            '{id: g, amount: "2", start: 2026-12}]}',
            "tenants.0.credit_grants: credit grant id listed more than once: g",
            id="grant-id-listed-twice",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "1"}]}',
            "tenants.0.credit_grants.0.start: Field required",
            id="grant-without-start",
        ),
        pytest.param(
            '{tenant: a, commitments: [{monthly: "1", start: 2026-11, end: 2027-01}, '
            '{monthly: "2", start: 2027-01}]}',
            "tenants.0.commitments: commitment terms starting 2026-11 and 2027-01 overlap",
            id="overlapping-commitment-terms",
        ),
        pytest.param(
            '{tenant: a, commitments: [{monthly: "1", start: 2026-11}, {monthly: "2", start: 2027-01}]}',
            "overlap",
            id="open-ended-term-overlapping-the-next",
        ),
        pytest.param(
            '{tenant: a, commitment: "5.00", commitments: [{monthly: "1", start: 2026-11}]}',
            "tenants.0: give either commitment (every month) or commitments (terms), not both",
            id="commitment-and-commitments-both",
        ),
        pytest.param(
            '{tenant: a, commitments: [{monthly: "1", start: 2026-11, until: 2027-01}]}',
            "tenants.0.commitments.0.until: Extra inputs are not permitted",
            id="unknown-term-field",
        ),
        pytest.param(
            '{tenant: a, credit_grants: [{id: g, amount: "1", start: 2026-11-01}]}',
            "tenants.0.credit_grants.0.start",
            id="grant-start-a-date-not-a-month",
        ),
    ],
)
def test_a_bad_term_is_one_line_naming_the_file_and_the_field(
    tmp_path: Path, entry: str, needle: str
) -> None:
    path = write(tmp_path, f"tenants:\n  - {entry}\n")
    with pytest.raises(ConfigError) as caught:
        load_tenants(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and needle in message
    assert "\n" not in message


def test_draw_takes_sources_in_order_and_stops_at_the_need() -> None:
    sources = [
        CreditSource("monthly", D("10.00"), ("", "", "")),
        CreditSource("a", D("30.00"), ("2026-12", "", "a")),
        CreditSource("b", D("100.00"), ("9999-99", "", "b")),
    ]
    assert draw(D("25.00"), sources) == {"monthly": D("10.00"), "a": D("15.00")}
    assert draw(D("500.00"), sources) == {"monthly": D("10.00"), "a": D("30.00"), "b": D("100.00")}
    assert draw(D("0.00"), sources) == {}


def test_release_gives_back_the_last_drawn_source_first() -> None:
    sources = [CreditSource("monthly", D(0), ("", "", "")), CreditSource("a", D(0), ("2026-12", "", "a"))]
    assert release(D("15.00"), {"monthly": D("10.00"), "a": D("30.00")}, sources) == {"a": D("-15.00")}
    assert release(D("35.00"), {"monthly": D("10.00"), "a": D("30.00")}, sources) == {
        "a": D("-30.00"),
        "monthly": D("-5.00"),
    }
