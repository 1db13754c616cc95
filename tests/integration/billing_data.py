"""Shared set-up for the invoice integration tests (ledger, reconcile, API): rate cards and a
tenants file written where the settings point, usage through the real pipeline or stored as the
sink stores it, and ledger rows read back from ClickHouse."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpumeter.core.models import parse_sample
from gpumeter.core.ratecard import RateCard, RateCardSet
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from gpumeter.infra.schema import RATED_USAGE
from pricing.rating import Rater
from testkit.builders import CARDS
from tests.services import run_cli


def configure(
    settings: Settings,
    tmp_path: Path,
    tenants: Sequence[Mapping[str, Any]],
    cards_documents: Sequence[Mapping[str, Any]] = CARDS,
) -> Settings:
    """Point the settings at rate cards (the testkit's by default) and at ``tenants``, written to files."""
    cards = tmp_path / "ratecards"
    cards.mkdir(exist_ok=True)
    for card in cards_documents:
        (cards / f"{card['version']}.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    tenants_path = tmp_path / "tenants.yaml"
    tenants_path.write_text(yaml.safe_dump({"tenants": [dict(t) for t in tenants]}, sort_keys=False))
    settings.rate_cards = cards
    settings.tenants = tenants_path
    return settings


def ingest_and_drain(settings: Settings, samples: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Through the real pipeline: `gpumeter ingest` to Kafka, a running worker, `gpumeter drain`."""
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    ingested = run_cli(settings, "ingest", str(path))
    assert ingested.returncode in (0, 2), ingested.stderr  # 2: some lines rejected on purpose
    drained = run_cli(settings, "drain", "--timeout", "180")
    assert drained.returncode == 0, drained.stderr


def store_rated(
    settings: Settings,
    samples: Sequence[Mapping[str, Any]],
    cards_documents: Sequence[Mapping[str, Any]] = CARDS,
) -> None:
    """Rate samples with pricing's rater and insert the rows as the sink does (the real engine, no
    Kafka): for tests that need many tenants' usage quickly."""
    rater = Rater(RateCardSet(cards=[RateCard.model_validate(card) for card in cards_documents]))
    rows = [RATED_USAGE.row_of(rater.rate(parse_sample(dict(s)))) for s in samples]
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        client.insert(RATED_USAGE.name, rows, column_names=list(RATED_USAGE.insert_columns))
    finally:
        client.close()


def ledger_rows(settings: Settings) -> list[dict[str, Any]]:
    client = clickhouse.connect(settings.clickhouse.dsn)
    try:
        result = client.query(
            "SELECT seq, year, year_seq, number, tenant, period, status, adjusts, document, "
            "content_sha256, chain_sha256 FROM invoice_ledger ORDER BY seq, inserted_at"
        )
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    finally:
        client.close()
