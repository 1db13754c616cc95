"""Property tests: the invoice pipeline agrees with the Fraction reference on random usage."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.builders import A100, CARDS, H100, L4, TENANTS, sample
from tests.unit import reference_billing as ref
from tests.unit.pricing.billing_harness import documents, normalise, run_pipeline

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)

FIRST = datetime(2026, 10, 1, tzinfo=UTC)
LAST = datetime(2027, 1, 1, tzinfo=UTC)
SPAN_SECONDS = int((LAST - FIRST).total_seconds())
OFFSETS = [
    timedelta(0),
    timedelta(hours=8),
    timedelta(hours=-5),
    timedelta(hours=5, minutes=30),
    timedelta(hours=14),
]
# Instants where a card or a month changes, to land near them often.
EDGES = [
    datetime(2026, 11, 1, tzinfo=UTC),
    datetime(2026, 12, 1, tzinfo=UTC),
    datetime(2026, 12, 31, 23, 59, tzinfo=UTC),
]
GPU_MODELS: list[tuple[str, str | None]] = [
    (H100, None),
    (H100, "1g.10gb"),
    (A100, "1g.5gb"),
    (A100, "2g.10gb"),
    (A100, None),
    (L4, None),
]


@st.composite
def window_start(draw: st.DrawFn) -> datetime:
    if draw(st.booleans()):
        base = draw(st.sampled_from(EDGES))
        moment = base + timedelta(microseconds=draw(st.integers(-3_000_000, 3_000_000)))
        moment = max(moment, FIRST)
    else:
        moment = FIRST + timedelta(
            seconds=draw(st.integers(0, SPAN_SECONDS - 1)), microseconds=draw(st.integers(0, 999_999))
        )
    return moment.astimezone(timezone(draw(st.sampled_from(OFFSETS))))


@st.composite
def usage_sample(
    draw: st.DrawFn,
    event_id: str,
    tenants: list[str],
    capacities: list[str],
    models: list[tuple[str, str | None]],
) -> dict[str, Any]:
    kind = draw(st.sampled_from(["gpu", "gpu", "gpu", "cpu", "memory", "storage"]))
    start = draw(window_start())
    length = timedelta(seconds=draw(st.one_of(st.just(3600), st.integers(1, 3600))))
    if length < timedelta(seconds=3600) and draw(st.booleans()):
        length += timedelta(microseconds=draw(st.integers(0, 999_999)))
    # Mostly modest quantities; sometimes big ones so H100 lines cross the 1000 h and 10000 h edges.
    ceiling = draw(st.sampled_from([10, 3000, 15000, 15000, 60000]))
    quantity = draw(st.decimals(min_value=0, max_value=ceiling, places=draw(st.integers(0, 6))))
    as_int = quantity == quantity.to_integral_value() and draw(st.booleans())
    node = draw(st.sampled_from(["n1", "n2"]))
    tenant = draw(st.sampled_from(tenants))
    capacity_type = draw(st.sampled_from(capacities))
    gpu_model, mig_profile = draw(st.sampled_from(models)) if kind == "gpu" else (None, None)
    return sample(
        event_id, kind=kind, node=node, tenant=tenant, pod="p", pod_uid="u", start=start.isoformat(),
        end=(start + length).isoformat(), quantity=int(quantity) if as_int else f"{quantity:f}",
        capacity_type=capacity_type, gpu_model=gpu_model, mig_profile=mig_profile,
    )


@st.composite
def sample_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    # A palette per set, so lines gather enough usage to cross tier edges.
    tenant_names = ["team-a", "inference", "rich", "solo"]
    tenants = draw(st.lists(st.sampled_from(tenant_names), min_size=1, unique=True))
    capacities = draw(st.lists(st.sampled_from(["on-demand", "reserved", "spot"]), min_size=1, unique=True))
    models = draw(st.lists(st.sampled_from(GPU_MODELS), min_size=1, unique=True))
    count = draw(st.integers(1, 30))
    return [draw(usage_sample(f"ev-{i}", tenants, capacities, models)) for i in range(count)]


def reference_docs(samples: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {group: normalise(doc) for group, doc in ref.reference_invoices(samples, CARDS, TENANTS).items()}


@PROPERTY_SETTINGS
@given(sample_sets())
def test_invoices_equal_the_reference(samples):
    actual = documents(run_pipeline(samples))
    expected = reference_docs(samples)
    assert {group: doc["total"] for group, doc in actual.items()} == {
        group: doc["total"] for group, doc in expected.items()
    }
    assert actual == expected


@PROPERTY_SETTINGS
@given(sample_sets())
def test_subtotal_is_the_sum_of_independent_line_amounts(samples):
    invoices = run_pipeline(samples)
    aggregated = ref.aggregate(samples, CARDS)
    assert set(invoices) == set(aggregated.lines)
    for group, invoice in invoices.items():
        lines = aggregated.lines[group]
        cents = {key: ref.line_cents(CARDS, key, quantity) for key, quantity in lines.items()}
        assert Fraction(invoice.subtotal) == Fraction(sum(cents.values()), 100)
        for line in invoice.lines:
            key = (line.rate_card, line.kind, line.gpu_model, line.mig_profile, line.capacity_type)
            assert Fraction(line.amount) == Fraction(cents[key], 100)
            # the carried quantity is unit-hours; within 1e-40 of the exact rational
            assert abs(Fraction(line.quantity) - lines[key]) < Fraction(1, 10**40)
        total = invoice.subtotal + invoice.commitment_true_up - invoice.credits
        assert total == invoice.total >= 0


@PROPERTY_SETTINGS
@given(sample_sets(), st.data())
def test_duplicates_never_change_anything(samples, data):
    baseline = documents(run_pipeline(samples))
    picks = data.draw(st.lists(st.integers(0, len(samples) - 1), min_size=1, max_size=10))
    duplicated = samples + [dict(samples[i]) for i in picks]
    shuffled = data.draw(st.permutations(duplicated))
    assert documents(run_pipeline(shuffled)) == baseline
    assert reference_docs(shuffled) == reference_docs(samples)


@PROPERTY_SETTINGS
@given(sample_sets(), st.data())
def test_order_never_changes_anything(samples, data):
    shuffled = data.draw(st.permutations(samples))
    first = run_pipeline(samples)
    second = run_pipeline(shuffled)
    # Not just equal documents: equal invoices, including line order and unrounded quantities.
    assert second == first
    assert [inv.model_dump() for inv in second.values()] == [first[k].model_dump() for k in second]


@PROPERTY_SETTINGS
@given(sample_sets())
def test_money_and_quantity_formats(samples):
    for doc in documents(run_pipeline(samples)).values():
        for field in ("subtotal", "commitment_true_up", "credits", "total"):
            assert re.fullmatch(r"\d+\.\d{2}", doc[field]), doc[field]
        for line in doc["lines"]:
            assert re.fullmatch(r"\d+\.\d{2}", line["amount"]), line
            assert re.fullmatch(r"\d+\.\d{6}", line["quantity"]), line
