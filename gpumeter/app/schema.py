"""Every table owner's migrations, in dependency order: the one place that knows them all."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from gpumeter.core.settings import ClickHouseSettings
from gpumeter.infra import migrations
from gpumeter.infra.schema import PIPELINE
from gpumeter.infra.tables import SINGLE_NODE, SchemaOwner, Topology
from insights.tables import INSIGHTS
from pricing.store import PRICING

OWNERS: tuple[SchemaOwner, ...] = (PIPELINE, PRICING, INSIGHTS)


def topology(settings: ClickHouseSettings) -> Topology:
    return Topology(settings.cluster, settings.replicated, settings.sharded)


def migrate(client: Client, topology: Topology = SINGLE_NODE,
            lock_timeout: float = migrations.LOCK_TIMEOUT_SECONDS) -> list[str]:
    """Bring the database to the current schema of every owner under the schema lock; returns
    the steps applied."""
    return migrations.migrate(client, OWNERS, topology, lock_timeout=lock_timeout)


def require_current(client: Client, where: str) -> None:
    """Refuse, in one line, a database whose schema is behind this code's, or ahead of it: a
    release older than the one that migrated it would write by rules the schema has left
    (since pipeline migration 13, claims without their hashes)."""
    newer = migrations.unknown(client, OWNERS)
    if newer:
        raise migrations.SchemaError(
            f"the ClickHouse schema at {where} is newer than this gpumeter ({', '.join(newer)} applied, "
            "which this release does not know): run the release that applied it")
    missing = migrations.pending(client, OWNERS)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise migrations.SchemaError(
            f"the ClickHouse schema at {where} is behind ({missing[0]}{more} not applied): "
            "run `gpumeter migrate`")
