"""`gpumeter insights` on the real engines: it reads sixteen simulated weeks from ClickHouse, stores
the forecasts the pure rules give for exactly that history, advises on the one idle pod (advice
event on Kafka, row in ClickHouse), prints the backtest comparison, and with --no-publish writes
nothing."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from kafka import KafkaConsumer

from gpumeter.core import jsonio, topics
from gpumeter.core.models import UsageSample
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import load_tenants
from gpumeter.infra import clickhouse
from gpumeter.infra.schema import RATED_USAGE, USAGE_HOURLY
from insights.forecast import History, forecast_tenant
from pricing.rating import Rater
from testkit.builders import card_set, sample, shipped_rate_card_documents
from testkit.usage_history import fleet_histories
from tests.services import run_cli

pytestmark = pytest.mark.integration


def hourly_rows(histories: list[History]) -> list[tuple[Any, ...]]:
    """The histories as rollup rows: one gpu line per tenant-hour carrying the hour's spend."""
    spend = {h.tenant: h for h in histories if h.metric == "spend"}
    rows = []
    for history in histories:
        if history.metric != "gpu_hours":
            continue
        for index, gpu_hours in enumerate(history.values):
            hour = history.start + timedelta(hours=index)
            cost = spend[history.tenant].values[index]
            if gpu_hours or cost:
                rows.append(USAGE_HOURLY.row_from({
                    "period": f"{hour:%Y-%m}", "hour": hour, "tenant": history.tenant, "rate_card": "2026-11",
                    "kind": "gpu", "gpu_model": "H100-SXM-80GB", "mig_profile": "",
                    "capacity_type": "on-demand",
                    "unit_seconds": gpu_hours * 3600, "list_cost": cost, "samples": 1}))
    return rows


def consume_advice(settings: Settings, timeout: float = 30) -> list[tuple[bytes, dict[str, Any]]]:
    consumer = KafkaConsumer(settings.kafka.topic(topics.ADVICE), bootstrap_servers=settings.kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False, group_id=None,
                             consumer_timeout_ms=2000)
    got: list[tuple[bytes, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not got:
            got.extend((message.key, jsonio.loads(message.value)) for message in consumer)
    finally:
        consumer.close()
    return got


def test_insights_forecasts_the_stored_history_and_advises_on_the_idle_pod(settings: Settings) -> None:
    histories = fleet_histories(16, seed=5)
    end = histories[0].end
    client = clickhouse.connect(settings.clickhouse.dsn)
    client.insert(USAGE_HOURLY.name, hourly_rows(histories), column_names=list(USAGE_HOURLY.insert_columns))
    # One pod idle for the last two hours of the history: 4 spot H100s (2.50 x 0.35), 1 % busy.
    rater = Rater(card_set(shipped_rate_card_documents()))
    idle = [rater.rate(UsageSample.model_validate(sample(
        f"idle-{i}", tenant="team-a", namespace="team-a", pod="stuck-0", pod_uid="uid-stuck",
        node="h100-node-07",
        start=end - timedelta(minutes=10 * (12 - i)), seconds=600, quantity="4", capacity_type="spot",
        utilization="0.01"))) for i in range(12)]
    client.insert(RATED_USAGE.name, [RATED_USAGE.row_of(r) for r in idle],
                  column_names=list(RATED_USAGE.insert_columns))

    dry = run_cli(settings, "insights", "--no-publish", timeout=600)
    assert dry.returncode == 0, dry.stderr
    assert "stuck-0" in dry.stdout and "backtest" in dry.stdout
    assert clickhouse.scalar(client, "SELECT count() FROM forecasts") == 0
    assert clickhouse.scalar(client, "SELECT count() FROM advice") == 0

    published = run_cli(settings, "insights", timeout=600)
    assert published.returncode == 0, published.stderr
    assert "published 1 advice event" in published.stdout

    # The stored forecasts are the pure rule's answers for the history the job read back: the
    # seeded hours plus the idle pod's (the rollup is fed by the materialized view).
    policies = load_tenants(settings.tenants)
    stored = {(r[0], r[1]): r[2:] for r in client.query(
        "SELECT tenant, metric, model, month_to_date, month_end, month_end_low, month_end_high, quota_limit, "
        "backtest_folds FROM forecasts FINAL").result_rows}
    assert len(stored) == 2 * len({h.tenant for h in histories})
    origin = end  # the idle pod's last window ends at the end of the history
    team_b = next(h for h in histories if h.tenant == "team-b" and h.metric == "gpu_hours")
    policy = policies.policy("team-b")
    assert policy is not None and policy.gpu_hours is not None
    from insights.forecast import QuotaLimit

    expected = forecast_tenant(team_b, origin, quota=QuotaLimit(policy.period, policy.gpu_hours))
    model, mtd, month_end, low, high, limit, folds = stored[("team-b", "gpu_hours")]
    assert (model, mtd, month_end, low, high, limit, folds) == (
        expected.model, expected.month_to_date, expected.month_end, expected.month_end_low,
        expected.month_end_high, policy.gpu_hours, 8)

    [(key, event)] = consume_advice(settings)
    assert key == b"team-a" and event["pod"] == "stuck-0" and event["kind"] == "idle_gpu"
    # 4 GPUs x 2.50 x 0.35 x 24 h
    assert Decimal(event["cost_per_day"]) == Decimal("84") and Decimal(event["gpus"]) == 4
    assert clickhouse.scalar(client, "SELECT count() FROM advice FINAL") == 1
    assert clickhouse.scalar(client, "SELECT idle_pods FROM insight_runs") == 1
    client.close()
