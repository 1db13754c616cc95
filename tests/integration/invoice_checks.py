"""Shared checks of the integration and chaos tests on real Kafka and ClickHouse: publish sample
lines, count rows, produce invoices with the CLI and compare them with the independent reference
(tests/unit/reference_billing.py, Fraction-based, sharing no code with pricing/)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from gpumeter.core import topics
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from testkit.builders import shipped_rate_card_documents, shipped_tenant_documents
from tests.services import run_cli
from tests.unit.reference_billing import reference_invoices


def expected_invoices(samples: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return reference_invoices(samples, shipped_rate_card_documents(), shipped_tenant_documents())


def produced_invoices(
    settings: Settings, periods: set[str], out: Path
) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for period in sorted(periods):
        result = run_cli(settings, "invoice", "--all-tenants", "--period", period, "--format", "json",
                         "--out", str(out))
        assert result.returncode == 0, result.stderr
    for path in out.glob("invoice-*.json"):
        document = json.loads(path.read_text())
        found[(document["tenant"], document["period"])] = document
    return found


def assert_invoices_match(produced: dict[tuple[str, str], dict[str, Any]],
                          expected: dict[tuple[str, str], dict[str, Any]]) -> None:
    for key, document in expected.items():
        assert key in produced, f"no invoice for {key}"
        assert produced[key] == document, f"invoice {key} differs from the reference"
    # --all-tenants also bills tenants whose commitment applies without usage: nothing else.
    for key in set(produced) - set(expected):
        assert produced[key]["lines"] == [], key
        assert produced[key]["subtotal"] == "0.00", key


def assert_invoices_are_the_reference(settings: Settings, samples: list[dict[str, Any]], out: Path) -> None:
    """The CLI's invoices (written to ``out``) for every period of ``samples`` are the reference's."""
    expected = expected_invoices(samples)
    produced = produced_invoices(settings, {p for _, p in expected}, out)
    assert_invoices_match(produced, expected)


def assert_every_sample_stored_once(settings: Settings, samples: list[dict[str, Any]]) -> None:
    stored = count_rows(settings, "SELECT count() FROM rated_usage")
    assert stored == len(samples), f"{stored} rows stored for {len(samples)} samples"
    events = count_rows(settings, "SELECT uniqExact(event_id) FROM rated_usage")
    assert events == len(samples), f"{events} distinct event ids stored for {len(samples)} samples"


def scrape(port: int) -> dict[str, float]:
    """The worker's /metrics as {name{labels}: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines() if line and not line.startswith("#")
    }


def count_rows(settings: Settings, sql: str) -> int:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        return int(clickhouse.scalar(client, sql))
    finally:
        client.close()


def publish_lines(settings: Settings, lines: list[bytes]) -> None:
    producer = kafka.make_producer(settings.kafka)
    topic = settings.kafka.topic(topics.SAMPLES)
    for line in lines:
        producer.send(topic, key=json.loads(line)["tenant"].encode(), value=line)
    producer.flush(timeout=60)
    producer.close()
