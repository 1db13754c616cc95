"""insert_rows (declared types, Decimals as text) stores what the client's own encoding stores.

Real ClickHouse: the same rows go into rated_usage through ``insert_rows`` and into a twin
table through clickhouse-connect's plain ``insert`` of Decimal objects (types described by
the server), and every stored column is compared as text. Values beyond their column are
refused before anything is sent, where the server would store NULL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from gpumeter.infra.insert import insert_rows
from gpumeter.infra.schema import RATED_USAGE

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
# digits beyond the scale (truncated by both), a rounding carry (client's rounding kept).
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
        # Spot checks computed by hand: truncation beyond the scale, the client's carry.
        by_id = {r[0]: dict(zip(RATED_USAGE.insert_columns, r, strict=True)) for r in ours}
        assert by_id["e103"]["quantity"] == "1.123456789012"
        assert by_id["e103"]["utilization"] == "1"
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
