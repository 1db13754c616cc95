"""Hourly usage histories (insights.forecast.History) from the simulated fleet, for the forecast
backtests in tests and benchmarks/insights_benchmark.py.

The fleet runs with hour-long windows (fast: four months in a few seconds) and its daily and
weekly rhythm and growth (collectors/sim/rhythm.py). Spend is the streaming list cost of every
sample (contract 3.3) priced with the shipped rate cards; GPU-hours the gpu samples' unit-hours.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.core.ratecard import RateCardSet
from insights.forecast import HOUR, History
from pricing.rating import find_rate
from testkit.builders import card_set, shipped_rate_card_documents

# A Monday, after the 2026-11 card took effect.
START = datetime(2026, 11, 2, tzinfo=UTC)


def fleet_config(weeks: int, seed: int, start: datetime = START) -> FleetConfig:
    """A fleet with room to grow: demand stays under capacity, so usage follows the rhythm."""
    return FleetConfig(seed=seed, window_seconds=3600, start=start, end=start + timedelta(weeks=weeks),
                       nodes={"H100-SXM-80GB": 24, "A100-SXM-40GB": 8, "L40S-48GB": 12})


def fleet_histories(weeks: int = 16, seed: int = 11, start: datetime = START,
                    cards: RateCardSet | None = None) -> list[History]:
    """Per tenant, hourly spend and GPU-hours of a simulated fleet (both metrics, tenants sorted)."""
    cards = cards or card_set(shipped_rate_card_documents())
    fleet = SimulatedFleet(fleet_config(weeks, seed, start))
    hours = weeks * 7 * 24
    # Quantities summed per (tenant, hour, priced line) first, priced once per line: the same
    # Decimal arithmetic as pricing each sample (a sum of products with one price), much faster.
    held: dict[tuple[str, int, tuple[str, str, str | None, str | None, str]], Decimal] = defaultdict(Decimal)
    parsed: dict[str, Decimal] = {}
    for window_start, samples in fleet.windows_dicts():
        index = (window_start - start) // HOUR
        card = cards.card_at(window_start)
        assert card is not None, f"no rate card at {window_start}"
        for sample in samples:
            text = sample["quantity"]
            quantity = parsed.get(text)
            if quantity is None:
                quantity = parsed[text] = Decimal(text)
            line = (card.version, sample["kind"], sample["gpu_model"], sample["mig_profile"],
                    sample["capacity_type"])
            held[(sample["tenant"], index, line)] += quantity  # one-hour windows: unit-hours = quantity
    prices: dict[tuple[str, str, str | None, str | None, str], Decimal] = {}
    spend: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * hours)
    gpu_hours: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * hours)
    for (tenant, index, line), quantity in held.items():
        if line not in prices:
            card = cards.by_version(line[0])
            rate = find_rate(card, line[1], line[2], line[3])
            assert rate is not None, f"no rate for {line}"
            prices[line] = rate.list_price * card.capacity_multipliers[line[4]]
        spend[tenant][index] += quantity * prices[line]
        if line[1] == "gpu":
            gpu_hours[tenant][index] += quantity
    histories = []
    for tenant in sorted(spend):
        histories.append(History(tenant, "spend", start, tuple(spend[tenant])))
        histories.append(History(tenant, "gpu_hours", start, tuple(gpu_hours[tenant])))
    return histories
