"""insert_rows (declared types, Decimals as text) stores what the client's own encoding stores,
and rated rows sent as their JSON lines store what their values store.

Real ClickHouse: the same rows go into rated_usage through ``insert_rows`` and into a twin
table through clickhouse-connect's plain ``insert`` of Decimal objects (types described by
the server), and every stored column is compared as text. Values beyond their column are
refused before anything is sent, where the server would store NULL.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core import jsonio
from gpumeter.core.models import RatedUsage
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from gpumeter.infra.insert import insert_rows
from gpumeter.infra.rows import rated_row
from gpumeter.infra.schema import EVENT_IDS, RATED_USAGE, USAGE_HOURLY
from gpumeter.infra.tables import Topology
from streams.sink import ClickHouseSink, connector
from streams.stage import RatingStage, encode_rated
from testkit import builders

START = datetime(2026, 11, 1, tzinfo=UTC)


def rated(index: int, **changes: Any) -> tuple[Any, ...]:
    values: dict[str, Any] = dict(
        event_id=f"e{index}", tenant="team-a", period="2026-11", kind="gpu", cluster="c1", node="n1",
        namespace="ns", pod="p", pod_uid="uid", window_start=START + timedelta(seconds=index),
        window_end=START + timedelta(seconds=index + 60), quantity=Decimal("0.142857142857"),
        unit_seconds=Decimal("8.57142857142"), gpu_model="H100-SXM-80GB", mig_profile="1g.10gb",
        capacity_type="spot", priority=-5, rate_card="2026-11", currency="USD", unit_price=Decimal("2.75"),
        capacity_multiplier=Decimal("0.35"), list_cost=Decimal("0.002291666666666667"),
        utilization=Decimal("0.5"), energy_joules=None, labels={"team": "ml"}, source_partition=1,
        source_offset=index)
    values.update(changes)
    return tuple(values[name] for name in RATED_USAGE.insert_columns)


# Edge values per Decimal column: zero, integers, exponent notation, the largest that fits,
# digits beyond the scale (truncated by both, also where rounding would carry to the next unit).
EDGES: list[dict[str, Any]] = [
    {"quantity": Decimal(0), "unit_seconds": Decimal("0E-30"), "list_cost": Decimal(0),
     "utilization": Decimal(0)},
    {"quantity": Decimal("1E+3"), "unit_seconds": Decimal("3.6E+6"), "energy_joules": Decimal("1E-7")},
    {"quantity": Decimal("999999999.999999999999"),
     "unit_seconds": Decimal("99999999999999999.999999999999999999999"),
     "utilization": Decimal("999999999999.999999"), "energy_joules": Decimal("9" * 32 + ".999999")},
    {"quantity": Decimal("1.1234567890129"), "list_cost": Decimal("0.1234567890123456789012"),
     "utilization": Decimal("0.99999999999999999999"), "energy_joules": Decimal("12.3456789")},
    {"unit_price": Decimal("-2.5"), "capacity_multiplier": Decimal("1.000000000000"), "utilization": None},
]


def stored(client: Any, table: str) -> list[tuple[str, ...]]:
    columns = ", ".join(f"toString({name})" for name in RATED_USAGE.insert_columns)
    return [tuple(r) for r in client.query(f"SELECT {columns} FROM {table} ORDER BY event_id").result_rows]


def test_the_same_values_as_the_clients_own_encoding(settings: Settings) -> None:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        client.command("CREATE TABLE reference_rated AS rated_usage ENGINE = MergeTree ORDER BY event_id")
        rows = [rated(i) for i in range(50)] + [rated(100 + i, **edge) for i, edge in enumerate(EDGES)]
        insert_rows(client, RATED_USAGE, rows)
        client.insert("reference_rated", rows, column_names=list(RATED_USAGE.insert_columns))
        ours, reference = stored(client, "rated_usage"), stored(client, "reference_rated")
        assert len(ours) == len(rows)
        assert ours == reference
        # Spot checks computed by hand: truncation beyond the scale, never a carry.
        by_id = {r[0]: dict(zip(RATED_USAGE.insert_columns, r, strict=True)) for r in ours}
        assert by_id["e103"]["quantity"] == "1.123456789012"
        assert by_id["e103"]["utilization"] == "0.999999"
        assert by_id["e103"]["energy_joules"] == "12.345678"
        assert by_id["e101"]["energy_joules"] == "0"  # 1E-7 at 6 places
    finally:
        client.close()


@pytest.mark.parametrize(
    "changes",
    [{"utilization": Decimal(10) ** 12}, {"energy_joules": Decimal(10) ** 32},
     {"quantity": Decimal(10) ** 26}],
    ids=["utilization", "energy", "quantity"],
)
def test_a_value_beyond_its_column_is_refused_never_stored_as_null(settings: Settings,
                                                                    changes: dict[str, Any]) -> None:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        with pytest.raises(OverflowError):
            insert_rows(client, RATED_USAGE, [rated(1), rated(2, **changes)])
        assert clickhouse.scalar(client, "SELECT count() FROM rated_usage") == 0
    finally:
        client.close()


class CountingClient:
    """A real client that counts the inserts it sends as lines (raw_insert) and as values."""

    def __init__(self, client: Any, counts: dict[str, int]) -> None:
        self._client = client
        self._counts = counts

    def raw_insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        self._counts[f"lines:{table}"] = self._counts.get(f"lines:{table}", 0) + 1
        return self._client.raw_insert(table, *args, **kwargs)

    def insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        self._counts[f"values:{table}"] = self._counts.get(f"values:{table}", 0) + 1
        return self._client.insert(table, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


# Validated samples at the edges of what a line carries: nanosecond windows, every kind, text
# that JSON escapes, the int32 ends of priority, telemetry beyond its scale and at its limit.
EDGE_SAMPLES: list[dict[str, Any]] = [
    builders.sample("edge-nanos", start="2026-11-03T05:30:00.123456789+05:30", seconds=61,
                    quantity="0.142857142857", gpu_model="A100-SXM-40GB", mig_profile="1g.5gb",
                    capacity_type="spot", priority=-2147483648, utilization="0.1234567",
                    energy_joules="99999999999999999999999999999999.999999"),
    builders.sample("edge-text", pod='pod "quoted"\\back', labels={"tab\tkey": "line\nbreak", "é": "ünï 😀"},
                    priority=2147483647, utilization="999999999999.999999", energy_joules="1e3"),
    builders.sample("edge-cpu", kind="cpu", quantity="999999999.999999999999", seconds=3600),
    builders.sample("edge-storage", kind="storage", quantity="0.000000000001", seconds=1),
    builders.sample("edge-memory", kind="memory", quantity="1E+2", start="2026-11-30T23:59:59.999999999Z",
                    seconds=1),
]


def stored_text(client: Any, table: str, columns: Sequence[str], prefix: str) -> dict[tuple[str, ...], int]:
    """The rows of one copy (its tenants start with ``prefix``), every column as text, the copy's
    prefix taken off ids and tenants, counted (a multiset: rows must match one for one)."""
    names = ", ".join(f"toString({name})" for name in columns)
    rows = client.query(f"SELECT {names} FROM {table} WHERE startsWith(tenant, %(p)s)",
                        parameters={"p": prefix}).result_rows
    renamed = {index for index, name in enumerate(columns) if name in ("event_id", "tenant")}
    counted: dict[tuple[str, ...], int] = {}
    for row in rows:
        key = tuple("<NULL>" if value is None else value.removeprefix(prefix) if index in renamed else value
                    for index, value in enumerate(row))
        counted[key] = counted.get(key, 0) + 1
    return counted


def test_rated_lines_store_what_their_values_store(settings: Settings) -> None:
    """The worker's rows carry their rated JSON, which the sink sends instead of the values.

    The same rated samples are stored twice, as lines and as values (under tenants and ids of
    their own), and every column of rated_usage, event_ids and the hourly rollup is compared as
    the server stores it.
    """
    stage = RatingStage(builders.card_set(), "samples")
    documents = builders.random_samples(seed=21, count=300) + EDGE_SAMPLES
    rated = []
    for offset, document in enumerate(documents):
        outcome = stage.process(jsonio.dumpb(document), 3, offset)
        assert outcome.rated is not None, outcome.dead
        rated.append(outcome.rated)

    def copy(usage: RatedUsage, prefix: str) -> RatedUsage:
        return usage.model_copy(update={"tenant": prefix + usage.tenant, "event_id": prefix + usage.event_id})

    as_lines = [rated_row(usage, encode_rated(usage)) for usage in (copy(u, "l-") for u in rated)]
    as_values = [rated_row(copy(usage, "v-")) for usage in rated]
    counts: dict[str, int] = {}
    def connect() -> Any:
        return CountingClient(clickhouse.connect(settings.clickhouse.dsn, create_database=False), counts)

    sink = ClickHouseSink(connect)
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        for start in range(0, len(rated), 100):
            assert sink.store_rated(as_lines[start:start + 100]).stored == len(as_lines[start:start + 100])
            assert sink.store_rated(as_values[start:start + 100]).stored == len(as_values[start:start + 100])
        batches = -(-len(rated) // 100)
        # event_ids gets each batch's claims before its rows, the same way (streams/sink.py)
        assert counts == {"lines:rated_usage": batches, "values:rated_usage": batches,
                          "lines:event_ids": batches, "values:event_ids": batches}
        rated_columns = list(RATED_USAGE.insert_columns)
        ids_columns = list(EVENT_IDS.insert_columns)
        hourly = "(SELECT period, hour, tenant, rate_card, kind, gpu_model, mig_profile, capacity_type, " \
                 "sum(unit_seconds) AS unit_seconds, sum(list_cost) AS list_cost, sum(samples) AS samples " \
                 "FROM usage_hourly GROUP BY ALL)"
        for table, columns in (("rated_usage", rated_columns), ("event_ids", ids_columns),
                               (hourly, [column.name for column in USAGE_HOURLY.columns])):
            lines = stored_text(client, table, columns, "l-")
            values = stored_text(client, table, columns, "v-")
            assert sum(values.values()) > 0
            assert lines == values, table
        # Computed by hand: the nanosecond window stored to the microsecond, escapes kept,
        # telemetry beyond its scale truncated as the values path truncates it.
        edge = client.query("SELECT toString(window_start), labels, pod, utilization, priority "
                            "FROM rated_usage WHERE event_id IN ('l-edge-nanos', 'l-edge-text') "
                            "ORDER BY event_id").result_rows
        assert edge[0][0] == "2026-11-03 00:00:00.123456" and edge[0][3] == Decimal("0.123456")
        assert edge[0][4] == -2147483648 and edge[1][4] == 2147483647
        assert edge[1][1] == {"tab\tkey": "line\nbreak", "é": "ünï 😀"} and edge[1][2] == 'pod "quoted"\\back'
    finally:
        sink.close()
        client.close()


def test_a_line_beyond_its_column_is_refused_alone_and_the_rest_stored(settings: Settings) -> None:
    """Lines come only from validated samples; behind that, the server refuses a value beyond
    its column (never NULL), and the sink dead-letters that row alone (permanent error, split)."""
    stage = RatingStage(builders.card_set(), "samples")
    rated = [outcome.rated for offset, document in enumerate(builders.random_samples(seed=22, count=9))
             if (outcome := stage.process(jsonio.dumpb(document), 0, offset)).rated is not None]
    poisoned = rated[4].model_copy(update={"utilization": Decimal(10) ** 12})  # Decimal(18, 6) holds < 10^12
    rows = [rated_row(usage, encode_rated(usage)) for usage in [*rated[:4], poisoned, *rated[5:]]]
    sink = ClickHouseSink(connector(settings.clickhouse.dsn), Topology.of(settings.clickhouse))
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        result = sink.store_rated(rows)
        assert result.stored == len(rated) - 1
        assert [row[0] for row, _ in result.rejected] == [poisoned.event_id]
        assert "69" in result.rejected[0][1] or "too big" in result.rejected[0][1].lower()
        stored_ids = {row[0] for row in client.query("SELECT event_id FROM rated_usage").result_rows}
        assert stored_ids == {usage.event_id for usage in rated} - {poisoned.event_id}
        assert clickhouse.scalar(client, "SELECT countIf(utilization IS NULL) FROM rated_usage") == sum(
            1 for usage in rated if usage.utilization is None and usage.event_id != poisoned.event_id)
    finally:
        sink.close()
        client.close()
