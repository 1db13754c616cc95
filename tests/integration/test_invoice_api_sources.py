"""Where the invoice API's figures come from (contract 7, issue 34): drafts and month-to-date
usage from the hourly rollup, issued invoices from what the close stored in the ledger.

The rollup's figures must be the samples' figures: every expected value here is computed from
the samples themselves with tests/unit/reference_billing.py (exact fractions, its own card
selection and tier arithmetic), never from the code under test. The samples (seeded, varied:
four tenants, GPU models with and without MIG profiles, three capacity types, non-UTC offsets
across a month edge, windows of 1 to 60 minutes) are stored in several inserts, so the rollup
holds several parts per tenant-hour-line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import httpx
import pytest

from gpumeter.app import schema
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from pricing import store
from testkit.builders import CARDS, random_samples
from tests.integration.billing_data import configure, ledger_rows, store_rated
from tests.services import Endpoints, free_port, isolated_settings, run_cli, running_api, wait_until
from tests.unit import reference_billing as ref

pytestmark = pytest.mark.integration

TOKEN = "tok-finance-sources"
TENANTS = [{"tenant": "team-a", "commitment": "5000.00", "credits": "100.00"},
           {"tenant": "research", "credits": "40.00"}]


@dataclass
class Served:
    url: str
    settings: Settings
    samples: list[dict[str, Any]]

    def get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, params=params,
                         timeout=60)


@pytest.fixture(scope="module")
def served(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("sources")
    configured = isolated_settings(endpoints, tmp / "data")
    client = clickhouse.connect(configured.clickhouse.dsn)
    schema.migrate(client)
    client.close()
    configure(configured, tmp, TENANTS)
    samples = [s for s in random_samples(seed=34, count=900) if ref.rate_sample(s, CARDS) is not None]
    for chunk in range(0, len(samples), 250):
        store_rated(configured, samples[chunk:chunk + 250])
    tokens = tmp / "tokens.yaml"
    tokens.write_text(json.dumps({"tokens": [{"sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
                                              "role": "finance"}]}))
    configured.api.tokens = tokens
    configured.api.listen = f"127.0.0.1:{free_port()}"
    try:
        with running_api(configured, tmp / "api.log") as url:
            yield Served(url, configured, samples)
    finally:
        clickhouse.drop_database(configured.clickhouse.dsn)


def months(samples: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(s["tenant"], ref.utc_month(s)) for s in samples}


def test_the_rollup_holds_the_samples_figures_to_the_last_digit(served: Served) -> None:
    expected = ref.aggregate(served.samples, CARDS).lines
    client = clickhouse.connect(served.settings.clickhouse.dsn)
    try:
        for period in ("2026-10", "2026-11"):
            rollup = store.rollup_lines_by_tenant(client, period)
            raw = store.usage_lines_by_tenant(client, period)
            assert set(rollup) == {tenant for tenant, month in expected if month == period}
            for tenant, lines in rollup.items():
                # Σ unit-seconds per line, exactly the samples' quantity x window (Fractions).
                found = {(k.rate_card, k.kind, k.gpu_model, k.mig_profile, k.capacity_type):
                         Fraction(line.unit_seconds) / 3600 for line in lines for k in [line.key]}
                assert found == expected[(tenant, period)], (tenant, period)
                # ... and the same Decimals as the raw rows' aggregate (rated_usage FINAL).
                assert {u.key: u.unit_seconds for u in lines} == {u.key: u.unit_seconds for u in raw[tenant]}
                assert len(lines) == len(raw[tenant])
    finally:
        client.close()


def test_drafts_read_from_the_rollup_are_the_reference_invoices(served: Served) -> None:
    reference = ref.reference_invoices(served.samples, CARDS, TENANTS)
    assert len(reference) >= 8  # four tenants, two months
    for (tenant, period), document in reference.items():
        served_json = served.get(f"/v1/tenants/{tenant}/invoices/{period}").json()
        assert served_json == document, (tenant, period)


def test_usage_read_from_the_rollup_is_the_samples_usage(served: Served) -> None:
    for tenant, period in sorted(months(served.samples)):
        mine = [s for s in served.samples if (s["tenant"], ref.utc_month(s)) == (tenant, period)]
        per_line: dict[ref.RefLineKey, list[Fraction]] = {}
        for s in mine:
            card, _ = ref.rate_sample(s, CARDS) or ({}, {})
            key = (str(card["version"]), s["kind"], s.get("gpu_model"), s.get("mig_profile"),
                   s.get("capacity_type", "on-demand"))
            hours, cost, count = per_line.setdefault(key, [Fraction(0), Fraction(0), Fraction(0)])
            per_line[key] = [hours + ref.unit_hours(s), cost + (ref.list_cost(s, CARDS) or 0), count + 1]
        usage = served.get(f"/v1/tenants/{tenant}/usage", period=period).json()
        found = {(line["rate_card"], line["kind"], line["gpu_model"], line["mig_profile"],
                  line["capacity_type"]): (line["quantity"], line["list_cost"], line["samples"])
                 for line in usage["lines"]}
        assert found == {key: (ref.quantity_str(h), ref.money_str(ref.half_up(c, 2)), int(n))
                         for key, (h, c, n) in per_line.items()}, (tenant, period)
        total = sum((cost for _, cost, _ in per_line.values()), Fraction(0))
        assert usage["list_cost"] == ref.money_str(ref.half_up(total, 2))
        assert usage["currency"] == "USD"


def test_a_month_closed_while_the_api_runs_is_served_from_the_ledger_within_a_second(served: Served) -> None:
    before = served.get("/v1/tenants/research/invoices/2026-10").json()
    assert before["status"] == "draft"
    closed = run_cli(served.settings, "invoice", "close", "--period", "2026-10", "--out",
                     str(served.settings.data_dir / "out"))
    assert closed.returncode == 0, closed.stderr
    wait_until(lambda: served.get("/v1/tenants/research/invoices/2026-10").json()["status"] == "final",
               10, "the final shows in the API")
    stored = {row["tenant"]: json.loads(row["document"]) for row in ledger_rows(served.settings)
              if row["period"] == "2026-10"}
    assert set(stored) == {tenant for tenant, month in months(served.samples) if month == "2026-10"}
    for tenant, document in stored.items():
        served_json = served.get(f"/v1/tenants/{tenant}/invoices/2026-10").json()
        issued = {k: v for k, v in served_json.items() if k not in ("content_sha256", "adjustments")}
        assert issued == document
        assert served_json["adjustments"] == []
        # The final is the draft it replaced, numbered.
        draft = ref.reference_invoices(served.samples, CARDS, TENANTS)[(tenant, "2026-10")]
        assert {k: document[k] for k in draft if k != "status"} == {k: v for k, v in draft.items()
                                                                     if k != "status"}
        csv_text = served.get(f"/v1/tenants/{tenant}/invoices/2026-10", format="csv").text
        assert f",total,,,,,{document['total']}" in csv_text and document["number"] in csv_text
    assert Decimal(stored["research"]["credits"]) <= Decimal("40.00")
