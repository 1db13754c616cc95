"""`gpumeter demo` end to end, on its own local services (free ports, temporary data dir):
the main job of `make demo` keeps working, and what it reports is what an independent
computation over the samples it actually published says.

The expected figures never come from the demo's own counters: the test reads back every
line the demo put on its samples topic, and the reference implementation of contract 3
(tests/unit/reference_billing.py, Fraction-based, sharing no code with pricing/) turns them
into invoices, distinct event_ids and duplicates. The demo's invoices pass through the
product's rating stage, ClickHouse sink and `FINAL` reads, so its deduplication is what is
checked here, not the test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from gpumeter.app.demo import DEMO_DATABASE, DEMO_PREFIX
from gpumeter.core import topics
from gpumeter.core.records import split
from gpumeter.infra import clickhouse
from testkit.builders import shipped_rate_card_documents, shipped_tenant_documents
from tests.e2e.demo_services import demo_environment
from tests.integration.invoice_checks import assert_invoices_match
from tests.services import REPO
from tests.unit import reference_billing as ref

pytestmark = pytest.mark.integration

KINDS = {"gpu", "cpu", "memory", "storage"}
REQUIRED = ("event_id", "kind", "cluster", "node", "tenant", "namespace", "pod", "pod_uid", "window_start",
            "window_end", "quantity")


def published_lines(bootstrap: str) -> list[bytes]:
    """Every sample line on the demo's samples topic, from the start of each partition to its end."""
    topic = DEMO_PREFIX + topics.SAMPLES
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert partitions, f"no topic {topic}"
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        lines: list[bytes] = []
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    lines.extend(split(record.value))
        return lines
    finally:
        consumer.close()


def billable_shape(line: bytes) -> dict[str, Any] | None:
    """The sample when the line has contract 1's shape (the demo's injected bad input has not)."""
    try:
        document = json.loads(line)
    except ValueError:
        return None
    if not isinstance(document, dict) or any(field not in document for field in REQUIRED):
        return None
    if document["kind"] not in KINDS or (document["kind"] == "gpu" and not document.get("gpu_model")):
        return None
    return document


def test_demo_runs_and_bills_exactly_what_it_published(tmp_path: Path) -> None:
    env, bootstrap, http_port = demo_environment(tmp_path)
    run = [sys.executable, "-m", "gpumeter.app.cli"]
    try:
        demo = subprocess.run([*run, "demo", "--seconds", "15"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert demo.returncode == 0, demo.stderr[-2000:]
        # Read back while the demo's services still run: the topic and the stored rows.
        lines = published_lines(bootstrap)
        client = clickhouse.connect(f"http://127.0.0.1:{http_port}/{DEMO_DATABASE}", create_database=False)
        try:
            rows, distinct_ids = client.query(
                "SELECT count(), uniqExact(event_id) FROM rated_usage").result_rows[0]
        finally:
            client.close()
    finally:
        subprocess.run([*run, "down"], cwd=REPO, env=env, capture_output=True, timeout=120, check=False)

    samples = [s for s in (billable_shape(line) for line in lines) if s is not None]
    malformed = len(lines) - len(samples)
    ids = {s["event_id"] for s in samples}
    cards = shipped_rate_card_documents()
    no_rate = ref.aggregate(samples, cards).rejected
    assert malformed > 0 and len(samples) > len(ids), "the demo injected no bad input or no duplicate"

    out = tmp_path / "gpumeter-out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_published"] == len(lines)
    # Each event_id is one stored row: no copy reached the table, even unmerged.
    assert rows == distinct_ids == summary["samples_stored"] == len(ids) - len(no_rate)
    assert summary["dead_letters"] == malformed + len(no_rate)
    assert summary["duplicates_dropped"] == len(samples) - len(ids)

    # The invoices the demo wrote are the reference's, to the cent and the sixth decimal.
    invoices = sorted((out / "invoices").glob("*.json"))
    produced = {}
    for path in invoices:
        document = json.loads(path.read_text())
        produced[(document["tenant"], document["period"])] = document
        assert (out / "invoices" / path.name.replace(".json", ".csv")).exists()
        assert Decimal(document["total"]) >= 0
    assert_invoices_match(produced, ref.reference_invoices(samples, cards, shipped_tenant_documents()))
    assert len(invoices) == len(summary["invoices"])

    report = (out / "finance-report.html").read_text()
    assert "<svg" in report and all(doc["tenant"] in report for doc in summary["invoices"])
