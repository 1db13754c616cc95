"""Every table owner's migrations, in dependency order: the one place that knows them all."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from gpumeter.infra import clickhouse
from gpumeter.infra.schema import PIPELINE
from gpumeter.infra.tables import SchemaOwner
from insights.tables import INSIGHTS
from pricing.store import PRICING

OWNERS: tuple[SchemaOwner, ...] = (PIPELINE, PRICING, INSIGHTS)


def migrate(client: Client) -> list[str]:
    """Bring the database to the current schema of every owner; returns the steps applied."""
    return clickhouse.migrate(client, OWNERS)
