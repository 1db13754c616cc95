"""The Grafana ClickHouse plugin's query model (``grafana-clickhouse-datasource`` v4), for the SDK.

grafana-foundation-sdk ships query types for Grafana's core datasources only; a third-party
plugin's query is declared as a ``Dataquery`` variant plus a builder (the SDK's documented
extension point). Only the raw-SQL editor is modelled: every panel of ours is hand-written
SQL that the tests run (tests/integration/test_dashboard_sql.py). Field names and values are
the plugin's (src/types/sql.ts): ``editorType: "sql"``, ``rawSql``, and the numeric ``format``
of the backend (sqlutil.FormatQueryOption: 0 time series, 1 table).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models.dashboard import DataSourceRef

PLUGIN_ID = "grafana-clickhouse-datasource"
# The datasource the provisioning file declares (dashboards/provisioning/datasources/).
DATASOURCE_UID = "gpumeter-clickhouse"
# The plugin version whose macro semantics the SQL tests reproduce (tests/support/grafana_macros.py);
# saved in each query as the plugin's editor does.
PLUGIN_VERSION = "4.3.2"


class Format(IntEnum):
    TIME_SERIES = 0
    TABLE = 1


def datasource_ref() -> DataSourceRef:
    return DataSourceRef(type_val=PLUGIN_ID, uid=DATASOURCE_UID)


class ClickHouseQuery(cogvariants.Dataquery):
    """One raw-SQL target of the ClickHouse plugin."""

    def __init__(self, raw_sql: str = "", ref_id: str | None = None, fmt: Format = Format.TABLE,
                 hide: bool | None = None, datasource: DataSourceRef | None = None) -> None:
        self.raw_sql = raw_sql
        self.ref_id = ref_id
        self.format = fmt
        self.hide = hide
        self.datasource = datasource

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "editorType": "sql",
            "format": int(self.format),
            "pluginVersion": PLUGIN_VERSION,
            # queryType is only read by Explore; kept in step with the format as the editor does.
            "queryType": "timeseries" if self.format == Format.TIME_SERIES else "table",
            "rawSql": self.raw_sql,
        }
        if self.ref_id is not None:
            payload["refId"] = self.ref_id
        if self.hide is not None:
            payload["hide"] = self.hide
        if self.datasource is not None:
            payload["datasource"] = self.datasource.to_json()
        return payload

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        if data.get("editorType", "sql") != "sql":
            raise ValueError(f"only raw-SQL ClickHouse queries are modelled, got {data.get('editorType')!r}")
        source = data.get("datasource")
        return cls(
            raw_sql=str(data.get("rawSql", "")),
            ref_id=data.get("refId"),
            fmt=Format(int(data.get("format", Format.TABLE))),
            hide=data.get("hide"),
            datasource=DataSourceRef.from_json(source) if isinstance(source, dict) else None,
        )


def variant_config() -> cogruntime.DataqueryConfig:
    return cogruntime.DataqueryConfig(identifier=PLUGIN_ID, from_json_hook=ClickHouseQuery.from_json)


def register() -> None:
    """Teach the SDK's decoder our query type (so dashboards round-trip through its models)."""
    from grafana_foundation_sdk.cog.plugins import register_default_plugins

    register_default_plugins()
    cogruntime.register_dataquery_variant(variant_config())


class SQL(cogbuilder.Builder[ClickHouseQuery]):
    """Builder: ``SQL("SELECT ...").format(Format.TIME_SERIES)``."""

    def __init__(self, raw_sql: str) -> None:
        self._internal = ClickHouseQuery(raw_sql=raw_sql, datasource=datasource_ref())

    def build(self) -> ClickHouseQuery:
        return self._internal

    def ref_id(self, ref_id: str) -> Self:
        self._internal.ref_id = ref_id
        return self

    def format(self, fmt: Format) -> Self:
        self._internal.format = fmt
        return self
