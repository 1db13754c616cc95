"""`gpumeter rerate` on the real engine (issue 8 item 5): a rate card deployed late and another
corrected in place for November; after `rerate` the invoices equal a reference computed here with
plain Decimal arithmetic from the samples and the corrected cards; a finalized month keeps its
finals and gets numbered adjustments; a second run changes nothing.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings, settings_env
from gpumeter.infra import clickhouse
from testkit.builders import A100, CARD_NOV, CARDS, H100, big_h100_user, random_samples
from tests.integration.billing_data import configure, ingest_and_drain, ledger_rows, store_rated
from tests.services import REPO, run_cli, wait_until

pytestmark = pytest.mark.integration

PERIOD = "2026-11"

# CARD_NOV corrected in place (same version): cpu was meant to cost 0.05, spot 0.30.
NOV_CORRECTED: dict[str, Any] = {
    **copy.deepcopy(CARD_NOV),
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.30"},
}
NOV_CORRECTED["rates"] = [dict(r, unit_price="0.05") if r["kind"] == "cpu" else r
                          for r in NOV_CORRECTED["rates"]]
# A card in force from 15 November, deployed after the worker had rated the second half of the month.
NOV_B: dict[str, Any] = {
    "version": "2026-11b",
    "currency": "USD",
    "effective_from": "2026-11-15T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.5", "spot": "0.3"},
    "rates": [
        {"kind": "gpu", "gpu_model": H100, "unit_price": "3.10",
         "tiers": [{"up_to": 500, "unit_price": "3.10"}, {"up_to": None, "unit_price": "2.60"}]},
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.42"},
        {"kind": "gpu", "unit_price": "2.05"},
        {"kind": "cpu", "unit_price": "0.047"},
        {"kind": "memory", "unit_price": "0.0061"},
        {"kind": "storage", "unit_price": "0.00025"},
    ],
}
CORRECTED = [CARDS[0], NOV_CORRECTED, NOV_B]


# --- the reference: plain Decimal arithmetic from DESIGN.md contract 3 ------------------------------


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _card(cards: Sequence[Mapping[str, Any]], moment: datetime) -> Mapping[str, Any]:
    in_force = [c for c in cards if _utc(c["effective_from"]) <= moment]
    return max(in_force, key=lambda c: _utc(c["effective_from"]))


def _rate(card: Mapping[str, Any], sample: Mapping[str, Any]) -> Mapping[str, Any]:
    for wanted in ((sample["kind"], sample.get("gpu_model"), sample.get("mig_profile")),
                   (sample["kind"], sample.get("gpu_model"), None), (sample["kind"], None, None)):
        for rate in card["rates"]:
            if (rate["kind"], rate.get("gpu_model"), rate.get("mig_profile")) == wanted:
                return rate
    raise AssertionError(f"no rate for {sample}")


MICROS_PER_HOUR = Decimal(3_600_000_000)


def _unit_micros(sample: Mapping[str, Any]) -> Decimal:
    """quantity x window in microseconds: exact (timestamps have at most microseconds)."""
    length = _utc(sample["window_end"]) - _utc(sample["window_start"])
    micros = length.days * 86_400_000_000 + length.seconds * 1_000_000 + length.microseconds
    return Decimal(str(sample["quantity"])) * micros


def _banded_micros(rate: Mapping[str, Any], micros: Decimal) -> Decimal:
    """Σ over bands (unit-microseconds in band x band price); bands are in unit-hours."""
    if not rate.get("tiers"):
        return micros * Decimal(rate["unit_price"])
    total, lower = Decimal(0), Decimal(0)
    for tier in rate["tiers"]:
        upper = None if tier["up_to"] is None else Decimal(str(tier["up_to"])) * MICROS_PER_HOUR
        top = micros if upper is None else min(micros, upper)
        if top > lower:
            total += (top - lower) * Decimal(tier["unit_price"])
        if upper is None or micros <= upper:
            break
        lower = upper
    return total


def reference(samples: Sequence[Mapping[str, Any]], cards: Sequence[Mapping[str, Any]],
              priced_by: Sequence[Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Per tenant of PERIOD: lines {key: (quantity 6 places, amount)}, total, Σ list cost (18 places
    per sample, as stored). Sums stay in unit-microseconds (exact) and are divided once per line.
    ``priced_by``: lines keyed by ``cards`` but priced by these cards' content of the same versions
    (what an invoice reads when a card was corrected and the rows were not re-rated yet).
    No commitments or credits in these tests: total = Σ line amounts."""
    with localcontext() as context:
        context.prec = 80
        context.rounding = ROUND_HALF_UP
        micros: dict[str, dict[tuple[Any, ...], Decimal]] = {}
        list_cost: dict[str, Decimal] = {}
        for sample in samples:
            start = _utc(sample["window_start"])
            if start.strftime("%Y-%m") != PERIOD:
                continue
            card = _card(cards, start)
            rate = _rate(card, sample)
            capacity = sample.get("capacity_type", "on-demand")
            key = (card["version"], sample["kind"], sample.get("gpu_model"), sample.get("mig_profile"),
                   capacity)
            tenant = sample["tenant"]
            bucket = micros.setdefault(tenant, {})
            bucket[key] = bucket.get(key, Decimal(0)) + _unit_micros(sample)
            first = Decimal(rate["tiers"][0]["unit_price"] if rate.get("tiers") else rate["unit_price"])
            multiplier = Decimal(card["capacity_multipliers"][capacity])
            cost = _unit_micros(sample) * first * multiplier / MICROS_PER_HOUR
            list_cost[tenant] = list_cost.get(tenant, Decimal(0)) + cost.quantize(Decimal("1e-18"))
        result: dict[str, dict[str, Any]] = {}
        for tenant, bucket in micros.items():
            lines = {}
            for key, used in bucket.items():
                card = next(c for c in priced_by or cards if c["version"] == key[0])
                rate = _rate(card, {"kind": key[1], "gpu_model": key[2], "mig_profile": key[3]})
                multiplier = Decimal(card["capacity_multipliers"][key[4]])
                amount = _banded_micros(rate, used) * multiplier / MICROS_PER_HOUR
                lines[key] = (str((used / MICROS_PER_HOUR).quantize(Decimal("0.000001"))),
                              amount.quantize(Decimal("0.01")))
            result[tenant] = {"lines": lines, "total": sum((a for _, a in lines.values()), Decimal(0)),
                              "list_cost": list_cost[tenant]}
        return result


# --- helpers ---------------------------------------------------------------------------------------


def deploy(settings: Settings, cards: Sequence[Mapping[str, Any]]) -> None:
    """Replace the rate card directory's files (what an operator does on a running system)."""
    for old in settings.rate_cards.glob("*.yaml"):
        old.unlink()
    for card in cards:
        text = yaml.safe_dump(dict(card), sort_keys=False)
        (settings.rate_cards / f"{card['version']}.yaml").write_text(text)


def query(settings: Settings, sql: str) -> list[tuple[Any, ...]]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        return [tuple(row) for row in client.query(sql).result_rows]
    finally:
        client.close()


STORED = ("SELECT event_id, period, rate_card, currency, unit_price, capacity_multiplier, list_cost, "
          "unit_seconds, window_start FROM rated_usage FINAL ORDER BY event_id")


def hourly_by_hour(settings: Settings) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    base = query(settings, "SELECT toStartOfHour(window_start) AS h, tenant, rate_card, kind, "
                           "ifNull(gpu_model, ''), ifNull(mig_profile, ''), capacity_type, "
                           "sum(unit_seconds), sum(list_cost), count() FROM rated_usage FINAL "
                           "GROUP BY ALL ORDER BY ALL")
    rollup = query(settings, "SELECT hour, tenant, rate_card, kind, gpu_model, mig_profile, capacity_type, "
                             "sum(unit_seconds), sum(list_cost), sum(samples) FROM usage_hourly GROUP BY ALL "
                             "HAVING sum(samples) != 0 OR sum(unit_seconds) != 0 ORDER BY ALL")
    return base, rollup


def invoices(settings: Settings, out: Path) -> dict[str, dict[str, Any]]:
    done = run_cli(settings, "invoice", "--all-tenants", "--period", PERIOD, "--format", "json",
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    documents = [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]
    return {document["tenant"]: document for document in documents}


def assert_equals_reference(documents: Mapping[str, Mapping[str, Any]],
                            expected: dict[str, dict[str, Any]]) -> None:
    assert sorted(documents) == sorted(expected)
    for tenant, want in expected.items():
        lines = {(line["rate_card"], line["kind"], line["gpu_model"], line["mig_profile"],
                  line["capacity_type"]): (line["quantity"], Decimal(line["amount"]))
                 for line in documents[tenant]["lines"]}
        assert lines == want["lines"], tenant
        assert Decimal(documents[tenant]["total"]) == want["total"], tenant


def samples_of_november() -> list[dict[str, Any]]:
    # Mixed tenants, kinds, capacity types and offsets across late October and November, plus
    # team-a's 8 H100s from 5 November for 300 h: across the 15 November card and the tier edges.
    return random_samples(seed=88, count=500) + big_h100_user(seed=88, windows=300)


def cents(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def rerate(settings: Settings, *extra: str) -> Any:
    return run_cli(settings, "rerate", "--period", PERIOD, *extra)


def table_row(output: str, tenant: str) -> list[str]:
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) > 2 and cells[1] == tenant:
            return cells[1:-1]
    raise AssertionError(f"no row for {tenant} in:\n{output}")


# --- tests -----------------------------------------------------------------------------------------


def test_a_card_deployed_late_and_one_corrected_are_applied_by_rerate(
    settings: Settings, tmp_path: Path
) -> None:
    configure(settings, tmp_path, [])
    samples = samples_of_november()
    store_rated(settings, samples)
    before = reference(samples, CARDS)
    assert_equals_reference(invoices(settings, tmp_path / "before"), before)  # the baseline holds
    october = [row for row in query(settings, STORED) if row[1] == "2026-10"]

    deploy(settings, CORRECTED)
    after = reference(samples, CORRECTED)
    as_read = reference(samples, CARDS, priced_by=CORRECTED)
    assert_equals_reference(invoices(settings, tmp_path / "as-read"), as_read)
    stored_before = query(settings, STORED)
    dry = rerate(settings, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert query(settings, STORED) == stored_before
    assert query(settings, "SELECT count() FROM rated_usage")[0][0] == len(stored_before)  # no copy at all

    done = rerate(settings)
    assert done.returncode == 0, done.stderr
    # Per tenant: total before, after, difference, list cost after, as the reference says.
    for tenant, want in after.items():
        row = table_row(done.stdout, tenant)
        assert row[:9] == table_row(dry.stdout, tenant)[:9]  # the dry run printed the same figures
        # Before: the invoice as it read before rerate, its rows keyed by the card they were rated
        # with (the in-place correction already applies when an invoice is read).
        old, new = as_read[tenant]["total"], want["total"]
        assert row[4:7] == [str(old), str(new), f"{new - old:+}"], row
        assert row[7:9] == [cents(before[tenant]["list_cost"]), cents(want["list_cost"])], row
    assert_equals_reference(invoices(settings, tmp_path / "after"), after)
    # The stored list cost per tenant is the corrected cards' streaming cost, to the last place.
    stored_cost = dict(query(settings, f"SELECT tenant, sum(list_cost) FROM rated_usage FINAL "
                                       f"WHERE period = '{PERIOD}' GROUP BY tenant"))
    assert stored_cost == {tenant: want["list_cost"] for tenant, want in after.items()}
    # The rollup equals the deduplicated base table, hour by hour; October is untouched.
    base, rollup = hourly_by_hour(settings)
    assert rollup == base
    assert [row for row in query(settings, STORED) if row[1] == "2026-10"] == october
    reconciled = run_cli(settings, "reconcile", "--period", PERIOD)
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr

    # Twice: nothing left to re-rate, zero difference, nothing written.
    stored, raw_rows, hourly = query(settings, STORED), query(settings, "SELECT count() FROM rated_usage"), \
        query(settings, "SELECT count(), sum(samples), sum(unit_seconds) FROM usage_hourly")
    again = rerate(settings)
    assert again.returncode == 0, again.stderr
    assert f"re-rated {PERIOD}: 0 row(s) in 0 chunk(s)" in again.stdout
    for tenant, want in after.items():
        row = table_row(again.stdout, tenant)
        assert row[1] == "0" and row[4:7] == [str(want["total"]), str(want["total"]), "+0.00"], row
    assert query(settings, STORED) == stored
    assert query(settings, "SELECT count() FROM rated_usage") == raw_rows
    assert query(settings, "SELECT count(), sum(samples), sum(unit_seconds) FROM usage_hourly") == hourly


def test_a_finalized_month_gets_adjustments_and_keeps_its_finals(settings: Settings, tmp_path: Path) -> None:
    configure(settings, tmp_path, [])
    samples = samples_of_november()
    store_rated(settings, samples)
    closed = run_cli(settings, "invoice", "close", "--period", PERIOD, "--out", str(tmp_path / "finals"))
    assert closed.returncode == 0, closed.stderr
    finals = ledger_rows(settings)
    before, after = reference(samples, CARDS), reference(samples, CORRECTED)
    assert sorted(row["tenant"] for row in finals) == sorted(before)

    deploy(settings, CORRECTED)
    done = rerate(settings)
    assert done.returncode == 0, done.stderr
    rows = ledger_rows(settings)
    assert rows[:len(finals)] == finals  # every final as issued: document, hashes, number
    adjustments = {row["tenant"]: row for row in rows[len(finals):]}
    changed = sorted(t for t in after if after[t]["total"] != before[t]["total"]
                     or after[t]["lines"] != before[t]["lines"])
    assert sorted(adjustments) == changed and changed  # one adjustment per tenant whose month changed
    final_numbers = {row["tenant"]: row["number"] for row in finals}
    for tenant, row in adjustments.items():
        document = json.loads(row["document"])
        assert row["status"] == "adjustment" and document["adjusts"] == final_numbers[tenant]
        # The final plus its adjustment is the month priced with the corrected cards.
        final = json.loads(next(r["document"] for r in finals if r["tenant"] == tenant))
        assert Decimal(final["total"]) + Decimal(document["total"]) == after[tenant]["total"]
        cells = table_row(done.stdout, tenant)
        assert cells[2] == "billed" and cells[9] == row["number"]
        assert cells[6] == f"{after[tenant]['total'] - before[tenant]['total']:+}"
    reconciled = run_cli(settings, "reconcile", "--period", PERIOD)
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr

    again = rerate(settings)
    assert again.returncode == 0, again.stderr
    assert ledger_rows(settings) == rows
    assert "0 adjustment(s) issued" in again.stdout


def test_rerate_beside_a_running_worker_that_keeps_storing(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The worker rates with the old cards, picks up the corrected ones, and goes on storing new
    samples of the same month while rerate rewrites the old ones: in the end every sample is priced
    by the corrected cards, once, and the hourly rollup equals the base table."""
    configure(settings, tmp_path, [])
    settings.worker.rate_card_reload_seconds = 0.5
    worker = worker_factory(settings)
    first = random_samples(seed=91, count=300) + big_h100_user(seed=91, windows=200)
    ingest_and_drain(settings, first, tmp_path / "first.jsonl")

    deploy(settings, CORRECTED)
    wait_until(lambda: "rate cards reloaded" in worker.log_tail(200), 60, "the worker to load the cards")
    second = random_samples(seed=92, count=600)
    (tmp_path / "second.jsonl").write_text("".join(json.dumps(s) + "\n" for s in second))
    command = [sys.executable, "-m", "gpumeter.app.cli", "ingest", str(tmp_path / "second.jsonl")]
    ingesting = subprocess.Popen(command, env=settings_env(settings), cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    done = rerate(settings)
    _, errors = ingesting.communicate(timeout=300)
    assert done.returncode == 0, done.stderr
    assert ingesting.returncode == 0, errors
    drained = run_cli(settings, "drain", "--timeout", "180")
    assert drained.returncode == 0, drained.stderr

    assert_equals_reference(invoices(settings, tmp_path / "after"), reference(first + second, CORRECTED))
    base, rollup = hourly_by_hour(settings)
    assert rollup == base
    reconciled = run_cli(settings, "reconcile", "--period", PERIOD)
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    assert worker.alive()


class CrashBeforeRows:
    """A real client that stops the run (as a crash would) at the first re-insert of rated rows:
    that chunk's compensation is stored, its rows are not."""

    def __init__(self, settings: Settings) -> None:
        self.client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)

    def insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        if table == "rated_usage":
            raise ConnectionError("killed between the two inserts of a chunk")
        return self.client.insert(table, *args, **kwargs)

    def close(self) -> None:
        self.client.close()


def test_a_run_stopped_between_a_chunks_two_inserts_is_completed_by_the_next(
    settings: Settings, tmp_path: Path
) -> None:
    from pricing.issue import billing
    from pricing.rerate import apply, prepare

    configure(settings, tmp_path, [])
    samples = samples_of_november()
    store_rated(settings, samples)
    deploy(settings, CORRECTED)
    with billing(settings) as context, pytest.raises(ConnectionError):
        apply(context, prepare(context, PERIOD), lambda: CrashBeforeRows(settings))  # type: ignore[arg-type,return-value]
    base, rollup = hourly_by_hour(settings)
    assert rollup != base  # one chunk's old contributions are out of the rollup, its rows unchanged

    done = rerate(settings)
    assert done.returncode == 0, done.stderr
    base, rollup = hourly_by_hour(settings)
    assert rollup == base  # the repeated compensation was dropped by its token
    assert_equals_reference(invoices(settings, tmp_path / "after"), reference(samples, CORRECTED))


def test_bad_arguments_are_one_line_and_exit_2(settings: Settings, tmp_path: Path) -> None:
    configure(settings, tmp_path, [])
    store_rated(settings, samples_of_november()[:50])
    cases = {
        ("--period", "2026-13"): "period must be YYYY-MM",
        ("--period", "2025-01"): "no rate card is in force at any time in 2025-01",
        ("--period", PERIOD, "--tenant", "nobody"):
            "tenant nobody has no stored usage and no invoice in 2026-11",
    }
    for args, message in cases.items():
        done = run_cli(settings, "rerate", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    # Cards that cannot rate every stored row: refused whole, nothing written.
    deploy(settings, [dict(CARD_NOV, rates=[r for r in CARD_NOV["rates"] if r["kind"] != "cpu"])])
    stored = query(settings, STORED)
    done = run_cli(settings, "rerate", "--period", PERIOD)
    assert done.returncode == 2 and "cannot be re-rated with these cards" in done.stderr, done.stderr
    assert query(settings, STORED) == stored
