"""Every panel's SQL, expanded the way Grafana and the ClickHouse plugin expand it, runs on the
real ClickHouse engine against the real schema and seeded rows, and returns the columns its
panel reads; the key panels (spend by tenant, GPU-hours, idle GPUs, ...) equal values computed
here from the seeded samples with Decimal arithmetic and a hand-written price list."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.budget_report import budgets
from dashboards.insights_job import evaluate, read_grants, store, store_budgets
from dashboards.panels import DASHBOARDS, FINANCE, OPERATIONS, TENANT_DASHBOARD, DashboardSpec, PanelSpec
from gpumeter.app import schema
from gpumeter.core.models import DeadLetter, UsageSample
from gpumeter.core.tenants import TenantsFile
from gpumeter.infra import clickhouse
from gpumeter.infra.schema import DEAD_LETTERS, GRANTS, PREEMPTIONS, QUOTA_EVENTS, RATED_USAGE
from gpumeter.infra.tables import Table
from insights.idle import IdleRule
from insights.tables import FORECASTS
from pricing.rating import Rater
from testkit.builders import card_set, sample, shipped_rate_card_documents
from tests.services import Endpoints, isolated_settings
from tests.support.grafana_macros import ALL, Request, Variable, expand

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 2, tzinfo=UTC)
# The dashboards' time range: inclusive at both ends, as $__timeFilter is.
RANGE_FROM = datetime(2026, 11, 2, 6, tzinfo=UTC)
RANGE_TO = datetime(2026, 11, 3, 6, tzinfo=UTC)
WINDOW = 600
TENANTS = ("research", "team-a", "team-b")

# Written by hand from gpumeter/defaults/ratecards/2026-{10,11}.yaml (list price = first band).
PRICE = {
    ("gpu", "H100-SXM-80GB", None): Decimal("2.50"),
    ("gpu", "A100-SXM-40GB", "1g.5gb"): Decimal("0.40"),
    ("gpu", "L40S-48GB", None): Decimal("1.80"),
    ("cpu", None, None): Decimal("0.04"),
}
MULTIPLIER = {"on-demand": Decimal(1), "reserved": Decimal("0.6"), "spot": Decimal("0.35")}
PRECISION = Decimal("1e-9")


@dataclass(frozen=True)
class Pod:
    tenant: str
    pod: str
    node: str
    kind: str
    gpu_model: str | None
    mig_profile: str | None
    quantity: str
    capacity_type: str
    start: datetime
    windows: int
    utilization: str | None


PODS = (
    # Spans the range's start and end, and the 2026-10 / 2026-11 boundary for the month panels.
    Pod("team-a", "train-a1", "h100-node-00", "gpu", "H100-SXM-80GB", None, "2", "on-demand",
        datetime(2026, 10, 31, 22, tzinfo=UTC), 6 * 60, "0.91"),
    Pod("team-a", "notebook-a2", "a100-node-00", "gpu", "A100-SXM-40GB", "1g.5gb", "0.142857142857", "spot",
        T0 + timedelta(hours=5, minutes=50), 30, None),
    Pod("team-b", "infer-b1", "l40s-node-00", "gpu", "L40S-48GB", None, "1", "reserved",
        T0 + timedelta(hours=20), 18, "0.02"),
    Pod("team-b", "infer-b2", "l40s-node-00", "gpu", "L40S-48GB", None, "4", "spot",
        T0 + timedelta(hours=1), 40, "0.55"),
    # Idle at the first insights run, gone (stale) by the second.
    Pod("team-a", "notebook-a3", "h100-node-01", "gpu", "H100-SXM-80GB", None, "1", "on-demand",
        T0 + timedelta(hours=20), 12, "0.01"),
    Pod("research", "cpu-r1", "h100-node-00", "cpu", None, None, "16", "on-demand",
        T0 + timedelta(hours=12), 12, None),
)


def sample_documents() -> list[dict[str, Any]]:
    documents = []
    for pod in PODS:
        for index in range(pod.windows):
            start = pod.start + timedelta(seconds=WINDOW * index)
            extra: dict[str, Any] = {}
            if pod.kind == "gpu":
                extra = {"gpu_model": pod.gpu_model, "mig_profile": pod.mig_profile}
                if pod.utilization is not None:
                    extra["utilization"] = pod.utilization
            documents.append(sample(
                f"{pod.pod}-{index}", kind=pod.kind, node=pod.node, tenant=pod.tenant, namespace=pod.tenant,
                pod=pod.pod, pod_uid=f"uid-{pod.pod}", start=start, seconds=WINDOW, quantity=pod.quantity,
                capacity_type=pod.capacity_type, **extra))
    return documents


def price_of(document: dict[str, Any]) -> Decimal:
    if document["kind"] == "cpu":
        return PRICE[("cpu", None, None)]
    return PRICE[("gpu", document["gpu_model"], document["mig_profile"])]


def unit_hours(document: dict[str, Any]) -> Decimal:
    seconds = Decimal(int((datetime.fromisoformat(document["window_end"])
                           - datetime.fromisoformat(document["window_start"])).total_seconds()))
    return Decimal(document["quantity"]) * seconds / 3600


def list_cost(document: dict[str, Any]) -> Decimal:
    return unit_hours(document) * price_of(document) * MULTIPLIER[document["capacity_type"]]


def start_of(document: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(document["window_start"]).astimezone(UTC)


def hour_of(document: dict[str, Any]) -> datetime:
    return start_of(document).replace(minute=0, second=0, microsecond=0)


def in_hour_range(document: dict[str, Any]) -> bool:
    return RANGE_FROM <= hour_of(document) <= RANGE_TO


def in_window_range(document: dict[str, Any]) -> bool:
    return RANGE_FROM <= start_of(document) <= RANGE_TO


def insert(client: Any, table: Table, rows: list[tuple[Any, ...]]) -> None:
    client.insert(table.name, rows, column_names=list(table.insert_columns))


DEAD = [
    ("invalid", datetime(2026, 11, 2, 7, tzinfo=UTC)),
    ("invalid", datetime(2026, 11, 2, 8, tzinfo=UTC)),
    ("no_rate", datetime(2026, 11, 2, 9, tzinfo=UTC)),
    ("invalid", datetime(2026, 11, 4, 9, tzinfo=UTC)),  # outside the range
]
RUN_OLD = T0 + timedelta(hours=22)
RUN_NEW = T0 + timedelta(hours=23)

# The budget lines the insights job stores (budget_lines), at RUN_NEW with these limits; at
# RUN_OLD team-a had an L40S- key since dropped. team-a's October rollover grant carries its
# unused part, #7 (quota_grants, 9) counts in full; team-b's quota is daily.
BUDGET_TENANTS = """\
tenants:
  - tenant: team-a
    gpu_hours: 3
    gpu_hours_by_model: {H100-SXM-80GB: 500, "A100-": 2}
    grants:
      - {id: oct, metric: gpu_hours, amount: 10, effective_at: "2026-10-05T00:00:00Z", rollover: true}
  - tenant: team-b
    period: day
    gpu_hours: 400
  - tenant: research
    spend: "5.00"
"""
BUDGET_TENANTS_OLD = """\
tenants:
  - tenant: team-a
    gpu_hours: 3
    gpu_hours_by_model: {L40S-: 7}
"""


def seed(client: Any) -> list[dict[str, Any]]:
    documents = sample_documents()
    rater = Rater(card_set(shipped_rate_card_documents()))
    rated = [rater.rate(UsageSample.model_validate(d)) for d in documents]
    insert(client, RATED_USAGE, [RATED_USAGE.row_of(r) for r in rated])
    insert(client, DEAD_LETTERS, [DEAD_LETTERS.row_of(DeadLetter(
        reason_code=code, reason=f"{code} input", raw="{}", source_topic="t", source_partition=0,
        source_offset=i, rejected_at=at)) for i, (code, at) in enumerate(DEAD)])
    crossings = [("warning", "0.9"), ("exceeded", "1")]
    insert(client, QUOTA_EVENTS, [QUOTA_EVENTS.row_from({
        "event_id": f"q{i}", "tenant": "team-b", "metric": "gpu_hours", "level": level,
        "threshold": Decimal(threshold), "used": Decimal("360"), "limit": Decimal("400"),
        "period": "2026-11-02", "at": T0 + timedelta(hours=10 + i)})
        for i, (level, threshold) in enumerate(crossings)])
    insert(client, PREEMPTIONS, [PREEMPTIONS.row_from({
        "record_id": "p1", "tenant": "team-b", "namespace": "team-b", "pod": "infer-b2",
        "pod_uid": "uid-infer-b2", "node": "l40s-node-00", "gpus": Decimal(4), "capacity_type": "spot",
        "priority": 0, "cause": "q1", "metric": "gpu_hours", "action": "evicted", "detail": "",
        "at": T0 + timedelta(hours=11, minutes=1)})])
    forecast = {
        "period": "2026-11", "computed_at": RUN_NEW, "model": "holt-winters", "reason": "test",
        "interval_level": Decimal("0.8"), "exhaust_probability": Decimal(0), "backtest_folds": 8,
        "backtest_wape_model": 0.05, "backtest_wape_baseline": 0.09, "exhaust_at": None,
        "exhaust_early": None, "exhaust_late": None, "quota_period": "month", "commitment": None,
    }
    team_a = {**forecast, "tenant": "team-a", "metric": "spend"}
    insert(client, FORECASTS, [
        FORECASTS.row_from({**team_a, "month_to_date": Decimal(100), "month_end": Decimal(900),
                            "month_end_low": Decimal(800), "month_end_high": Decimal(1000),
                            "quota_limit": Decimal(20000), "quota_used": Decimal(100),
                            "commitment": Decimal(1000)}),
        FORECASTS.row_from({**forecast, "tenant": "team-b", "metric": "gpu_hours",
                            "month_to_date": Decimal(50), "month_end": Decimal(700),
                            "month_end_low": Decimal(600), "month_end_high": Decimal(800),
                            "quota_period": "day", "quota_limit": Decimal(400), "quota_used": Decimal(410),
                            "exhaust_at": T0 + timedelta(hours=10), "exhaust_probability": Decimal(1)}),
        # Another month's forecast never shows in this range.
        FORECASTS.row_from({**team_a, "period": "2026-10", "month_to_date": Decimal(5),
                            "month_end": Decimal(5), "month_end_low": Decimal(5),
                            "month_end_high": Decimal(5), "quota_limit": None, "quota_used": None,
                            "commitment": Decimal(1000)}),
    ])
    insert(client, FORECASTS, [
        # Budget runway by the forecast: Holt-Winters, made this month, reached Nov 10 12:00.
        FORECASTS.row_from({**team_a, "metric": "gpu_hours", "month_to_date": Decimal(60),
                            "month_end": Decimal(120), "month_end_low": Decimal(110),
                            "month_end_high": Decimal(130), "quota_limit": Decimal(1000),
                            "quota_used": Decimal(60), "exhaust_at": datetime(2026, 11, 10, 12, tzinfo=UTC),
                            "exhaust_probability": Decimal("0.9")}),
        # Budget runway at the period's run rate: the forecast's own model is the run rate.
        FORECASTS.row_from({**forecast, "tenant": "research", "metric": "spend", "model": "run-rate",
                            "month_to_date": Decimal(1), "month_end": Decimal(2),
                            "month_end_low": Decimal(1), "month_end_high": Decimal(3),
                            "quota_limit": Decimal(5), "quota_used": Decimal(1)}),
    ])
    seed_grants(client)
    # The idle-GPU panels show what the insights job stores (two runs: the later one counts).
    policies = TenantsFile()
    rule = IdleRule()
    for at in (RUN_OLD, RUN_NEW):
        store(client, evaluate(client, policies, at, rule, forecasts=False))
    seed_budget_lines(client)
    return documents


def seed_budget_lines(client: Any) -> None:
    """What the insights job stores (dashboards.budget_report.budgets, no forecasts: the run rate)."""
    grants = read_grants(client)
    for at, text in ((RUN_OLD, BUDGET_TENANTS_OLD), (RUN_NEW, BUDGET_TENANTS)):
        store_budgets(client, budgets(client, tenants_file(text), grants, at))


def tenants_file(text: str) -> TenantsFile:
    return TenantsFile.model_validate(yaml.safe_load(text))


def seed_grants(client: Any) -> None:
    grant = {"tenant": "team-b", "metric": "gpu_hours", "rollover": False, "corrects": None, "note": "",
             "expires_at": None, "granted_at": T0, "claim": "test"}
    rows = [
        {**grant, "number": 1, "amount": Decimal(50), "effective_at": datetime(2026, 11, 1, tzinfo=UTC),
         "note": "top-up"},
        {**grant, "number": 2, "amount": Decimal(-10), "corrects": 1,
         "effective_at": datetime(2026, 11, 1, tzinfo=UTC)},
        # October's rollover grant: may carry into November.
        {**grant, "number": 3, "metric": "spend", "amount": Decimal(100), "rollover": True,
         "effective_at": datetime(2026, 10, 5, tzinfo=UTC)},
        # Expired, not yet effective, counting in no period any more, another tenant's: not shown.
        {**grant, "number": 4, "amount": Decimal(30), "effective_at": datetime(2026, 9, 1, tzinfo=UTC),
         "expires_at": datetime(2026, 10, 1, tzinfo=UTC)},
        {**grant, "number": 5, "amount": Decimal(20), "effective_at": datetime(2026, 11, 5, tzinfo=UTC)},
        {**grant, "number": 6, "metric": "spend", "amount": Decimal(5),
         "effective_at": datetime(2026, 8, 1, tzinfo=UTC)},
        {**grant, "number": 7, "tenant": "team-a", "amount": Decimal(9),
         "effective_at": datetime(2026, 11, 1, tzinfo=UTC)},
    ]
    insert(client, GRANTS, [GRANTS.row_from(row) for row in rows])
    # A second row for number 1 (a writer that lost the claim): read once, the first one.
    insert(client, GRANTS, [GRANTS.row_from({**rows[0], "amount": Decimal(999), "claim": "loser"})])


@pytest.fixture(scope="module")
def seeded(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list]]:
    settings = isolated_settings(endpoints, Path(tmp_path_factory.mktemp("dash")))
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client, schema.topology(settings.clickhouse))
    documents = seed(client)
    yield client, documents
    client.close()
    clickhouse.drop_database(settings.clickhouse.dsn, settings.clickhouse.cluster)


def range_for(sql: str) -> tuple[datetime, datetime]:
    """Panels on insertion time (pipeline lag, throughput) look at the wall clock of the seeding."""
    if "$__timeFilter(inserted_at)" in sql:
        now = datetime.now(UTC)
        return now - timedelta(hours=1), now + timedelta(hours=1)
    return RANGE_FROM, RANGE_TO


def request_for(spec: DashboardSpec, sql: str, **selected: list[str]) -> Request:
    variables = {}
    for variable in spec.variables:
        current = selected.get(variable.name, [ALL] if variable.include_all else ["team-b"])
        variables[variable.name] = Variable(current=current, options=list(TENANTS), multi=variable.multi)
    # Hourly panels never go below 1 h (their min interval): the interval Grafana would send.
    return Request(*range_for(sql), timedelta(hours=1), variables)


def run(client: Any, spec: DashboardSpec, title: str, **selected: list[str]) -> tuple[list[str], list[tuple]]:
    [panel] = [p for p in spec.panels() if p.title == title]
    result = client.query(expand(panel.sql, request_for(spec, panel.sql, **selected)))
    return list(result.column_names), [tuple(row) for row in result.result_rows]


def q(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(PRECISION)


ALL_PANELS = [(spec, panel) for spec in DASHBOARDS for panel in spec.panels()]


@pytest.mark.parametrize(("spec", "panel"), ALL_PANELS, ids=[f"{s.uid}:{p.title}" for s, p in ALL_PANELS])
def test_panel_sql_runs_and_returns_the_columns_its_panel_reads(
    seeded: tuple[Any, list], spec: DashboardSpec, panel: PanelSpec
) -> None:
    client, _ = seeded
    result = client.query(expand(panel.sql, request_for(spec, panel.sql)))
    assert list(result.column_names) == list(panel.columns)
    assert result.result_rows, f"{panel.title}: the seeded data should show in every panel"


@pytest.mark.parametrize("spec", DASHBOARDS, ids=[s.uid for s in DASHBOARDS])
def test_variable_queries_list_the_tenants(seeded: tuple[Any, list], spec: DashboardSpec) -> None:
    client, _ = seeded
    for variable in spec.variables:
        rows = client.query(expand(variable.sql, request_for(spec, variable.sql))).result_rows
        assert [row[0] for row in rows] == sorted(TENANTS)


def test_spend_by_tenant_equals_the_samples_priced_by_hand(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    spend: dict[str, Decimal] = defaultdict(Decimal)
    gpu_hours: dict[str, Decimal] = defaultdict(Decimal)
    for document in filter(in_hour_range, documents):
        spend[document["tenant"]] += list_cost(document)
        if document["kind"] == "gpu":
            gpu_hours[document["tenant"]] += unit_hours(document)
    _, rows = run(client, FINANCE, "Spend by tenant")
    assert {row[0]: (q(row[1]), q(row[2])) for row in rows} == {
        tenant: (q(spend[tenant]), q(gpu_hours[tenant])) for tenant in spend}
    assert [row[0] for row in rows] == sorted(spend, key=lambda t: (-spend[t], t))
    # A tenant selection narrows it (and $__conditionalAll keeps the condition).
    _, only = run(client, FINANCE, "Spend by tenant", tenant=["team-a"])
    assert [(row[0], q(row[1])) for row in only] == [("team-a", q(spend["team-a"]))]


def test_spend_by_tenant_and_day_buckets_utc_days(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    expected: dict[tuple[datetime, str], Decimal] = defaultdict(Decimal)
    for document in filter(in_hour_range, documents):
        day = hour_of(document).replace(hour=0)
        expected[(day, document["tenant"])] += list_cost(document)
    _, rows = run(client, FINANCE, "Spend by tenant and day")
    got = {(row[0].replace(tzinfo=UTC), row[1]): q(row[2]) for row in rows}
    assert got == {key: q(value) for key, value in expected.items()}


def test_month_to_date_spend_stops_at_the_range_end_and_the_month_start(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    expected = sum((list_cost(d) for d in documents
                    if d["window_start"] >= "2026-11-01" and hour_of(d) <= RANGE_TO), Decimal(0))
    _, [(spend,)] = run(client, FINANCE, "Month-to-date list spend")
    assert q(spend) == q(expected)


def test_savings_are_the_on_demand_list_price_minus_the_spend(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    on_demand: dict[str, Decimal] = defaultdict(Decimal)
    spend: dict[str, Decimal] = defaultdict(Decimal)
    for document in filter(in_window_range, documents):
        on_demand[document["capacity_type"]] += unit_hours(document) * price_of(document)
        spend[document["capacity_type"]] += list_cost(document)
    _, rows = run(client, FINANCE, "Spot and reserved savings against on-demand list price")
    assert {row[0]: (q(row[1]), q(row[2]), q(row[3])) for row in rows} == {
        kind: (q(spend[kind]), q(on_demand[kind]), q(on_demand[kind] - spend[kind])) for kind in spend}
    assert q(dict((row[0], row[3]) for row in rows)["on-demand"]) == 0


def test_gpu_hours_of_one_tenant_in_total_and_per_hour(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    per_hour: dict[datetime, Decimal] = defaultdict(Decimal)
    for document in documents:
        if document["tenant"] == "team-b" and document["kind"] == "gpu" and in_hour_range(document):
            per_hour[hour_of(document)] += unit_hours(document)
    _, [(total,)] = run(client, TENANT_DASHBOARD, "GPU-hours in range", tenant=["team-b"])
    assert q(total) == q(sum(per_hour.values(), Decimal(0))) and total > 0
    _, rows = run(client, TENANT_DASHBOARD, "GPU-hours", tenant=["team-b"])
    assert {row[0].replace(tzinfo=UTC): q(row[1]) for row in rows} == {h: q(v) for h, v in per_hour.items()}


def test_allocated_and_busy_gpus_are_gpu_time_over_the_interval(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    allocated: dict[datetime, Decimal] = defaultdict(Decimal)
    busy: dict[datetime, Decimal] = defaultdict(Decimal)
    for document in documents:
        if document["tenant"] == "team-b" and document["kind"] == "gpu" and in_window_range(document):
            gpu_seconds = unit_hours(document) * 3600
            allocated[hour_of(document)] += gpu_seconds / 3600
            busy[hour_of(document)] += gpu_seconds * Decimal(document["utilization"]) / 3600
    _, rows = run(client, TENANT_DASHBOARD, "Allocated vs used GPUs", tenant=["team-b"])
    got = {row[0].replace(tzinfo=UTC): (round(row[1], 6), round(row[2], 6)) for row in rows}
    assert got == {h: (round(float(allocated[h]), 6), round(float(busy[h]), 6)) for h in allocated}


def test_samples_per_node_count_each_sample_in_the_range(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    counts: dict[str, int] = defaultdict(int)
    for document in filter(in_window_range, documents):
        counts[document["node"]] += 1
    _, rows = run(client, OPERATIONS, "Samples per node")
    assert {row[1]: row[2] for row in rows} == counts


def test_dead_letters_by_reason_in_the_range(seeded: tuple[Any, list]) -> None:
    client, _ = seeded
    _, rows = run(client, OPERATIONS, "Dead letters, totals")
    assert [(row[0], row[1]) for row in rows] == [("invalid", 2), ("no_rate", 1)]


def test_idle_gpus_are_the_idle_pods_of_the_latest_insights_run(seeded: tuple[Any, list]) -> None:
    """infer-b1 (1 reserved L40S) is under 5 % from T0+20h to T0+23h; notebook-a3 (1 H100) was idle
    at the first run but has not reported for an hour at the second; the rest are busy or have no
    telemetry. Cost per day at list price by hand: 1 GPU x 1.80 x 0.6 x 24 = 25.92."""
    client, _ = seeded
    _, [(gpus, cost)] = run(client, OPERATIONS, "Idle GPUs now")
    assert (gpus, cost) == (Decimal(1), Decimal("25.92"))
    _, rows = run(client, OPERATIONS, "Idle GPUs")
    assert [(row[0], row[2], row[6], row[7].replace(tzinfo=UTC), row[8]) for row in rows] == [
        ("team-b", "infer-b1", Decimal(1), T0 + timedelta(hours=20), Decimal(3))]
    # wasted so far: 18 windows x 1/6 h x 1.80 x 0.6
    assert q(rows[0][11]) == q(18 * Decimal("1.80") * Decimal("0.6") / 6)
    _, tenant_rows = run(client, TENANT_DASHBOARD, "Idle GPUs", tenant=["team-a"])
    assert tenant_rows == []
    # The first run advised both pods; infer-b1's advice was replaced by the second run's word.
    runs = client.query("SELECT run_at, idle_pods FROM insight_runs ORDER BY run_at").result_rows
    assert [(at.replace(tzinfo=UTC), pods) for at, pods in runs] == [(RUN_OLD, 2), (RUN_NEW, 1)]
    older = client.query("SELECT pod FROM advice FINAL WHERE detected_at = %(at)s ORDER BY pod",
                         parameters={"at": RUN_OLD}).result_rows
    assert older == [("notebook-a3",)]


def test_forecast_panels_show_the_month_of_the_range_end(seeded: tuple[Any, list]) -> None:
    client, _ = seeded
    _, rows = run(client, FINANCE, "Commitments against actual")
    assert [(row[0], row[1], row[4]) for row in rows] == [("team-a", Decimal(1000), Decimal(100))]
    _, burn = run(client, TENANT_DASHBOARD, "Quota burn-down", tenant=["team-b"])
    assert [(row[0], row[1], row[4]) for row in burn] == [("gpu_hours", "day", pytest.approx(410 / 400))]


def test_quota_events_and_preemptions_of_the_tenant(seeded: tuple[Any, list]) -> None:
    client, _ = seeded
    _, events = run(client, TENANT_DASHBOARD, "Quota events", tenant=["team-b"])
    assert [(row[2], row[5]) for row in events] == [("exceeded", Decimal(400)), ("warning", Decimal(400))]
    _, suffered = run(client, TENANT_DASHBOARD, "Preemptions suffered", tenant=["team-a"])
    assert suffered == []
    _, evictions = run(client, OPERATIONS, "Evictions")
    assert [(row[1], row[3], row[6]) for row in evictions] == [("team-b", "infer-b2", "evicted")]


def test_budget_grants_are_those_in_force_each_number_once_with_corrections(seeded: tuple[Any, list]) -> None:
    client, _ = seeded
    _, rows = run(client, TENANT_DASHBOARD, "Budget grants", tenant=["team-b"])
    # #1: 50 - 10 (its correction #2), its second row (999) ignored; #3 October's rollover grant.
    assert [(row[0], row[1], row[2], row[5], row[6], row[7]) for row in rows] == [
        ("#1", "gpu_hours", Decimal(40), False, "2026-11", "top-up"),
        ("#3", "spend", Decimal(100), True, "2026-10", "")]


def test_budget_lines_of_the_latest_run_with_grants_carry_and_per_model_keys(
    seeded: tuple[Any, list]
) -> None:
    client, _ = seeded
    title = "Budget: limit, grants, used and runway"

    def utc(moment: datetime | None) -> datetime | None:
        return None if moment is None else moment.replace(tzinfo=UTC)

    def line(row: tuple) -> tuple:
        return (*row[:8], row[9], utc(row[10]), row[11], utc(row[12]))

    # team-a, November up to the 23:00 hour of Nov 2 (the rollup's hours up to the run, its last
    # one whole): train-a1 2 GPUs x 48 h = 96 H100 GPU-hours, notebook-a3 1 x 2 h = 2 more,
    # notebook-a2 0.142857142857 x 5 h = 0.714285714285 A100 GPU-hours; October: train-a1 2 x 2 h = 4.
    # Tenant-wide: base 3; October's rollover grant of 10 carries min(10, 3 + 10 - 4) = 9; #7 adds 9:
    # limit 21 of which 18 granted; 98.714285714285 used, so exhausted (runway 0, until the run).
    # H100-SXM-80GB: 402 left at 98 per 47 h = 402 x 47 / 98 h = 192.7959... h (192.8), until
    # 694065.306122 s after the run. A100-: 1.285714285715 left at 0.714285714285 per 47 h =
    # 84.6000000001 h (84.6), until 304560.000000 s after. Per-model keys take no grants.
    # The L40S- key of the older run is not shown.
    _, rows = run(client, TENANT_DASHBOARD, title, tenant=["team-a"])
    assert [line(row) for row in rows] == [
        ("gpu_hours", "all", "2026-11", Decimal(3), Decimal(18), Decimal(21), Decimal("98.714285714285"),
         Decimal("-77.714285714285"), Decimal(0), RUN_NEW, "run-rate", RUN_NEW),
        ("gpu_hours", "A100-", "2026-11", Decimal(2), Decimal(0), Decimal(2), Decimal("0.714285714285"),
         Decimal("1.285714285715"), Decimal("84.6"), RUN_NEW + timedelta(seconds=304560), "run-rate",
         RUN_NEW),
        ("gpu_hours", "H100-SXM-80GB", "2026-11", Decimal(500), Decimal(0), Decimal(500), Decimal(98),
         Decimal(402), Decimal("192.8"), RUN_NEW + timedelta(seconds=694065, microseconds=306122),
         "run-rate", RUN_NEW),
    ]
    assert rows[0][8] == pytest.approx(98.714285714285 / 21)

    # team-b, a daily quota, Nov 2 up to its 23:00 hour: infer-b2 4 GPUs x 40 x 10 min = 96000 s,
    # infer-b1 1 x 18 x 10 min = 10800 s: 106800 s = 29.666... h (stored at 12 places). #1 (40
    # after its correction) is of Nov 1, the day before, and no rollover: no grant counts. 370.33
    # left at 29.67 per 23 h lasts beyond the day's last hour: no runway.
    _, rows = run(client, TENANT_DASHBOARD, title, tenant=["team-b"])
    assert [line(row) for row in rows] == [
        ("gpu_hours", "all", "2026-11-02", Decimal(400), Decimal(0), Decimal(400), Decimal("29.666666666667"),
         Decimal("370.333333333333"), None, None, "run-rate", RUN_NEW)]

    # research: 16 CPUs x 2 h x 0.04 = 1.28 of 5.00; 3.72 left at 1.28 per 47 h: 3.72 x 47 / 1.28 =
    # 136.59375 h (136.6), until 491737.5 s after the run.
    _, rows = run(client, TENANT_DASHBOARD, title, tenant=["research"])
    assert [line(row) for row in rows] == [
        ("spend", "all", "2026-11", Decimal(5), Decimal(0), Decimal(5), Decimal("1.28"), Decimal("3.72"),
         Decimal("136.6"), RUN_NEW + timedelta(seconds=491737, microseconds=500000), "run-rate", RUN_NEW)]


def test_gpu_hours_by_model_this_month(seeded: tuple[Any, list]) -> None:
    client, documents = seeded
    expected: dict[str, Decimal] = defaultdict(Decimal)
    for d in documents:
        november = start_of(d) >= datetime(2026, 11, 1, tzinfo=UTC)
        if d["tenant"] == "team-a" and d["kind"] == "gpu" and november and hour_of(d) <= RANGE_TO:
            expected[d["gpu_model"]] += unit_hours(d)
    _, rows = run(client, TENANT_DASHBOARD, "GPU-hours by GPU model this month", tenant=["team-a"])
    assert {row[0]: q(row[1]) for row in rows} == {model: q(v) for model, v in expected.items()}
    assert set(expected) == {"H100-SXM-80GB", "A100-SXM-40GB"}
