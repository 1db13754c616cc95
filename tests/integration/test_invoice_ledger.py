"""The invoice ledger on the real engine: `gpumeter invoice close` numbers, hashes and stores a
month's invoices once; late usage becomes a numbered adjustment; two closes at once issue one set.

Expected figures come from tests/unit/reference_billing.py (Fractions, written from DESIGN.md)
or from hand arithmetic in the comments; hashes are recomputed here from the JSON files.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings, settings_env
from gpumeter.infra import clickhouse
from pricing import store
from pricing.issue import close_month
from testkit.builders import CARDS, L4, big_h100_user, sample
from tests.integration.billing_data import configure, ingest_and_drain, ledger_rows, store_rated
from tests.services import REPO, run_cli
from tests.unit import reference_billing as ref

pytestmark = pytest.mark.integration

TENANTS = [
    {"tenant": "team-a", "commitment": "1000.00", "credits": "250.00"},
    {"tenant": "research", "commitment": "15000.00"},
]
NUMBER = r"GM-\d{4}-\d{6}"


def canonical_sha256(document: dict[str, Any]) -> str:
    """The hash a tenant recomputes: the JSON file without its hash field, keys sorted, compact."""
    body = {k: v for k, v in document.items() if k != "content_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def close(
    settings: Settings, out: Path, period: str = "2026-11", *extra: str
) -> subprocess.CompletedProcess[str]:
    return run_cli(settings, "invoice", "close", "--period", period, "--out", str(out), *extra)


def issued_files(out: Path) -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


def solo_samples(prefix: str, hours: int) -> list[dict[str, Any]]:
    """'solo' (not in the tenants file) on 2 L4s (fallback rate 1.80) for ``hours`` hours."""
    start = datetime(2026, 11, 20, tzinfo=UTC)
    return [
        sample(
            f"{prefix}-{i}",
            tenant="solo",
            gpu_model=L4,
            quantity="2",
            start=start + timedelta(hours=i),
            seconds=3600,
        )
        for i in range(hours)
    ]


def test_close_issues_numbered_hashed_finals_then_a_late_adjustment(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    configure(settings, tmp_path, TENANTS)
    worker_factory(settings)
    h100 = big_h100_user(seed=21, windows=130)
    on_time, late = h100[:120] + solo_samples("solo", 5), h100[120:]
    ingest_and_drain(settings, on_time, tmp_path / "on-time.jsonl")

    first = close(settings, tmp_path / "first")
    assert first.returncode == 0, first.stderr
    files = issued_files(tmp_path / "first")
    by_tenant = {doc["tenant"]: doc for doc in files.values()}
    # research has a commitment and no usage: billed its commitment in full.
    assert sorted(by_tenant) == ["research", "solo", "team-a"]
    expected = ref.reference_invoices(on_time, CARDS, TENANTS)
    for tenant in ("team-a", "solo"):
        document = by_tenant[tenant]
        reference = expected[(tenant, "2026-11")]
        for key in ("lines", "subtotal", "commitment_true_up", "credits", "total", "currency"):
            assert document[key] == reference[key], (tenant, key)
        assert document["status"] == "final" and document["adjusts"] is None
    # 960 h x 2.50 = 2400.00 - 250.00 credits; 2 x 5 h x 1.80 = 18.00; research 0 + 15000.00 true-up
    assert by_tenant["team-a"]["total"] == "2150.00" and by_tenant["solo"]["total"] == "18.00"
    assert (by_tenant["research"]["commitment_true_up"], by_tenant["research"]["total"]) == (
        "15000.00",
        "15000.00",
    )

    # Numbers: one series per year, gap-free, in ledger order; each file named by its number.
    rows = ledger_rows(settings)
    year = datetime.now(UTC).year
    assert [r["number"] for r in rows] == [f"GM-{year}-{n:06d}" for n in (1, 2, 3)]
    assert [r["seq"] for r in rows] == [1, 2, 3]
    for row in rows:
        document = files[f"invoice-{row['tenant']}-2026-11-{row['number']}.json"]
        assert document["number"] == row["number"]
        assert document["content_sha256"] == canonical_sha256(document) == row["content_sha256"]
        assert hashlib.sha256(row["document"].encode()).hexdigest() == row["content_sha256"]
    assert [line.split()[0] for line in first.stdout.splitlines()[:3]] == [r["number"] for r in rows]

    # Nothing new: a second close issues nothing and changes nothing.
    again = close(settings, tmp_path / "again")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith("0 invoice(s) issued by this run")
    assert ledger_rows(settings) == rows

    # Late usage for the closed month: one adjustment for team-a with exactly the late amount.
    ingest_and_drain(settings, late, tmp_path / "late.jsonl")
    third = close(settings, tmp_path / "third")
    assert third.returncode == 0, third.stderr
    (adjustment,) = issued_files(tmp_path / "third").values()
    after = ledger_rows(settings)
    assert after[:3] == rows  # the finals are untouched, document and hash
    assert after[3]["number"] == f"GM-{year}-000004" and after[3]["status"] == "adjustment"
    team_a_final = next(r for r in rows if r["tenant"] == "team-a")
    assert adjustment["adjusts"] == team_a_final["number"] and adjustment["number"] == after[3]["number"]
    h100_line: ref.RefLineKey = ("2026-11", "gpu", "H100-SXM-80GB", None, "on-demand")
    before_q, after_q = Fraction(960), Fraction(1040)
    late_cents = ref.line_cents(CARDS, h100_line, after_q) - ref.line_cents(CARDS, h100_line, before_q)
    assert late_cents == 19000  # 1000 x 2.50 + 40 x 2.25 = 2590.00, minus 2400.00
    (line,) = adjustment["lines"]
    assert line["quantity"] == "80.000000" and line["amount"] == ref.money_str(late_cents)
    # The monthly credits were used up by the final; the commitment was met.
    assert (adjustment["credits"], adjustment["commitment_true_up"], adjustment["total"]) == (
        "0.00",
        "0.00",
        "190.00",
    )
    assert adjustment["content_sha256"] == canonical_sha256(adjustment)
    # Its own file, beside the final's.
    assert (tmp_path / "third" / f"invoice-team-a-2026-11-{after[3]['number']}.json").exists()


def test_closing_a_month_that_has_not_ended_exits_2(settings: Settings, tmp_path: Path) -> None:
    configure(settings, tmp_path, TENANTS)
    now = datetime.now(UTC)
    result = close(settings, tmp_path / "out", f"{now.year:04d}-{now.month:02d}")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "has not ended" in result.stderr
    finalize = run_cli(
        settings,
        "invoice",
        "--tenant",
        "team-a",
        "--period",
        f"{now.year + 1:04d}-01",
        "--finalize",
        "--out",
        str(tmp_path / "out"),
    )
    assert finalize.returncode == 2 and "has not ended" in finalize.stderr
    assert ledger_rows(settings) == []


def test_close_rejects_per_tenant_options(settings: Settings, tmp_path: Path) -> None:
    result = run_cli(settings, "invoice", "close", "--tenant", "team-a", "--period", "2026-11")
    assert result.returncode == 2 and "drop --tenant" in result.stderr


def _close_after_barrier(env: dict[str, str], barrier: Any, out: str, queue: Any, reverse: bool) -> None:
    """One closer process: wait until both are ready, then close 2026-11 through the CLI entry point.

    Claims of 7 invoices (200 by default), and one closer walking the tenants backwards, make the
    two meet in the middle and contend for the same positions and the same tenants.
    """
    import contextlib
    import io
    import os

    os.environ.clear()
    os.environ.update(env)
    import pricing.issue
    from gpumeter.app.cli import main

    pricing.issue.CLAIM_BATCH = 7
    if reverse:
        in_order = pricing.issue.billable_tenants
        pricing.issue.billable_tenants = lambda *a, **k: in_order(*a, **k)[::-1]

    barrier.wait()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["invoice", "close", "--period", "2026-11", "--out", out])
    queue.put((code, stdout.getvalue()))


def test_two_concurrent_closes_issue_one_set(settings: Settings, tmp_path: Path) -> None:
    tenants = [f"t{n:03d}" for n in range(120)]
    configure(settings, tmp_path, [{"tenant": "t000", "commitment": "50.00"}])
    store_rated(settings, [sample(f"u-{t}", tenant=t, gpu_model=L4, quantity="1") for t in tenants])
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(2), context.Queue()
    env = settings_env(settings)
    closers = [
        context.Process(
            target=_close_after_barrier, args=(env, barrier, str(tmp_path / f"out{i}"), queue, i == 1)
        )
        for i in range(2)
    ]
    for process in closers:
        process.start()
    results = [queue.get(timeout=300) for _ in closers]
    for process in closers:
        process.join(timeout=60)
    assert [code for code, _ in results] == [0, 0], results
    rows = ledger_rows(settings)
    # One final per tenant, positions and numbers without gap or repeat.
    assert sorted(r["tenant"] for r in rows) == tenants
    assert all(r["status"] == "final" for r in rows)
    assert [r["seq"] for r in rows] == list(range(1, len(tenants) + 1))
    assert [r["year_seq"] for r in rows] == list(range(1, len(tenants) + 1))
    # Each invoice was reported (and written) by exactly one of the two closers.
    reported = [line.split()[0] for _, out in results for line in out.splitlines() if line.startswith("GM-")]
    assert sorted(reported) == sorted(r["number"] for r in rows)
    written = [p.name for i in range(2) for p in (tmp_path / f"out{i}").glob("*.json")]
    assert len(written) == len(set(written)) == len(tenants)
    # The hash chain links every row to the one before it.
    previous = ""
    for row in rows:
        link = hashlib.sha256(f"{previous}:{row['content_sha256']}".encode()).hexdigest()
        assert row["chain_sha256"] == link
        previous = link
    counts = [sum(line.startswith("GM-") for line in out.splitlines()) for _, out in results]
    print(f"closer A issued {counts[0]}, closer B {counts[1]}")  # information, not asserted


def test_two_cli_closes_started_together_issue_one_set(settings: Settings, tmp_path: Path) -> None:
    tenants = [f"c{n:02d}" for n in range(40)]
    configure(settings, tmp_path, [])
    store_rated(settings, [sample(f"v-{t}", tenant=t, kind="cpu", quantity="4") for t in tenants])
    command = [sys.executable, "-m", "gpumeter.app.cli", "invoice", "close", "--period", "2026-11", "--out"]
    env = settings_env(settings)
    processes = [
        subprocess.Popen(
            [*command, str(tmp_path / f"cli{i}")],
            env=env,
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    rows = ledger_rows(settings)
    assert sorted(r["tenant"] for r in rows) == tenants
    assert [r["seq"] for r in rows] == list(range(1, 41))
    # 4 cores x 1 h x 0.04 = 0.16 each
    assert {json.loads(r["document"])["total"] for r in rows} == {"0.16"}


CARD_JAN = {
    "version": "2026-01",
    "currency": "USD",
    "effective_from": "2026-01-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.35"},
    "rates": [{"kind": "gpu", "unit_price": "2.00"}, {"kind": "cpu", "unit_price": "0.05"}],
}


def test_credits_drawn_down_across_three_closed_months_and_a_commitment_term(
    settings: Settings, tmp_path: Path
) -> None:
    cards = [CARD_JAN, *CARDS]
    tenants = [
        {
            "tenant": "team-a",
            "credit_grants": [{"id": "launch", "amount": "500.00", "start": "2026-09"}],
            "commitments": [{"monthly": "250.00", "start": "2026-10", "end": "2026-10"}],
        }
    ]
    configure(settings, tmp_path, tenants, cards)
    store_rated(
        settings,
        [
            sample("sep", kind="cpu", quantity="4000", start="2026-09-10T00:00:00Z"),  # x 0.05 = 200.00
            sample("oct", kind="cpu", quantity="5000", start="2026-10-10T00:00:00Z"),  # x 0.045 = 225.00
            sample("nov", kind="cpu", quantity="7500", start="2026-11-10T00:00:00Z"),  # x 0.04 = 300.00
        ],
        cards,
    )
    documents = {}
    for period in ("2026-09", "2026-10", "2026-11"):
        result = close(settings, tmp_path / period, period)
        assert result.returncode == 0, result.stderr
        (documents[period],) = issued_files(tmp_path / period).values()
    figures = {
        p: tuple(d[k] for k in ("subtotal", "commitment_true_up", "credits", "total", "credits_remaining"))
        for p, d in documents.items()
    }
    assert figures == {
        # before the commitment term: 200.00 all paid by credits, 300.00 left
        "2026-09": ("200.00", "0.00", "200.00", "0.00", "300.00"),
        # in the term: 225.00 + 25.00 true-up = 250.00, paid by credits, 50.00 left
        "2026-10": ("225.00", "25.00", "250.00", "0.00", "50.00"),
        # after it: no true-up; the last 50.00 of credits, 250.00 to pay, nothing left
        "2026-11": ("300.00", "0.00", "50.00", "250.00", "0.00"),
    }
    assert [d["credit_draws"] for d in documents.values()] == [
        {"launch": "200.00"},
        {"launch": "250.00"},
        {"launch": "50.00"},
    ]


def test_close_writes_pdf_invoices_named_by_number(settings: Settings, tmp_path: Path) -> None:
    import io

    from pypdf import PdfReader

    configure(settings, tmp_path, [])
    store_rated(
        settings,
        [
            sample("p1", tenant="pdf-a", kind="cpu", quantity="10"),
            sample("p2", tenant="pdf-b", kind="cpu", quantity="20"),
        ],
    )
    result = close(settings, tmp_path / "pdf", "2026-11", "--format", "pdf", "--paper", "Letter")
    assert result.returncode == 0, result.stderr
    rows = {r["tenant"]: r for r in ledger_rows(settings)}
    # 10 and 20 core-hours x 0.04
    for tenant, total in (("pdf-a", "0.40"), ("pdf-b", "0.80")):
        path = tmp_path / "pdf" / f"invoice-{tenant}-2026-11-{rows[tenant]['number']}.pdf"
        reader = PdfReader(io.BytesIO(path.read_bytes()))
        assert float(reader.pages[0].mediabox.width) == 612.0  # Letter
        text = reader.pages[0].extract_text()
        assert (
            rows[tenant]["number"] in text
            and f"{total} USD" in text
            and rows[tenant]["content_sha256"] in text
        )


def test_a_ledger_position_is_held_by_the_first_insert_only(settings: Settings) -> None:
    from decimal import Decimal

    from gpumeter.infra import clickhouse
    from pricing import ledger_store
    from pricing.invoice import LineKey, UsageLine
    from pricing.ledger import LedgerView, entry_for, next_invoice
    from testkit.builders import card_set

    usage = [UsageLine(LineKey("2026-11", "cpu", None, None, "on-demand"), Decimal(3600))]
    entries = []
    for tenant, run in (("first", "run-a"), ("second", "run-b")):
        invoice = next_invoice(tenant, "2026-11", usage, card_set(), None, LedgerView(), issuing=True)
        assert invoice is not None
        entries.append(entry_for(invoice, LedgerView(), run, datetime(2026, 12, 3, tzinfo=UTC)))
    first, second = entries
    assert first.seq == second.seq == 1
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        assert [e.claim for e in ledger_store.claim(client, [first])] == ["run-a"]
        # A racer that passed the free-position check inserts with the same token: the engine drops it.
        client.insert(
            ledger_store.LEDGER.name,
            [ledger_store.row_of(second)],
            column_names=list(ledger_store.LEDGER.insert_columns),
            settings={"insert_deduplication_token": "gpumeter-ledger-1", "insert_deduplicate": 1},
        )
        assert [e.claim for e in ledger_store.claim(client, [second])] == ["run-a"]
    finally:
        client.close()
    assert [(r["seq"], r["tenant"]) for r in ledger_rows(settings)] == [(1, "first")]


def test_close_waits_for_a_month_read_longer_than_the_interactive_timeout(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At fleet scale the close's one read of the month takes minutes (docs/capacity.md); the
    workers' and the API's client gives up after RECEIVE_TIMEOUT_S. The month read is made slower
    than that timeout (shrunk to 1 s here) and the close still issues the invoices; a client of
    the interactive kind gives up on the same wait."""
    configure(settings, tmp_path, TENANTS)
    store_rated(settings, solo_samples("solo", 2))
    monkeypatch.setattr(clickhouse, "RECEIVE_TIMEOUT_S", 1.0)
    slow = "SELECT sleepEachRow(1) FROM numbers(2)"  # 2 s, past the shrunk timeout
    interactive = clickhouse.connect(settings.clickhouse.connection_dsn())
    try:
        with pytest.raises(OperationalError):
            interactive.query(slow)
    finally:
        interactive.close()
    reads = store.usage_lines_by_tenant

    def slow_read(client: Any, period: str, tenant: str | list[str] | None = None) -> Any:
        client.query(slow)
        return reads(client, period, tenant)

    monkeypatch.setattr(store, "usage_lines_by_tenant", slow_read)
    issued = close_month(settings, "2026-11", "json", tmp_path / "out")
    assert sorted(entry.invoice.tenant for entry, _ in issued) == ["research", "solo", "team-a"]
