"""Grafana dashboards as code: the specs of dashboards/panels.py built with grafana-foundation-sdk.

``python -m dashboards.boards`` (``make dashboards``) writes one JSON file per dashboard under
dashboards/grafana/; ``--check`` exits 1 naming the files that differ from what the code
generates (the unit test does the same), so the committed JSON never drifts from the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models

from dashboards.chquery import SQL, datasource_ref
from dashboards.panels import DASHBOARDS, DashboardSpec, PanelSpec, VariableSpec

OUT_DIR = Path(__file__).resolve().parent / "grafana"

PanelBuilder = timeseries.Panel | table.Panel | stat.Panel | bargauge.Panel


def _panel(spec: PanelSpec, panel_id: int) -> PanelBuilder:
    panel: PanelBuilder
    if spec.kind == "timeseries":
        series = timeseries.Panel().line_width(1).fill_opacity(10)
        if spec.title == "Spend by tenant and day":
            series = (series.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
                      .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL)))
        panel = series
    elif spec.kind == "table":
        # Explicit field defaults (the SDK's decoder fills these in), so the JSON round-trips exactly.
        panel = table.Panel().align(common.FieldTextAlignment.AUTO).inspect(False)
    elif spec.kind == "stat":
        panel = (stat.Panel().graph_mode(common.BigValueGraphMode.NONE)
                 .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    else:
        panel = (bargauge.Panel().display_mode(common.BarGaugeDisplayMode.GRADIENT)
                 .orientation(common.VizOrientation.HORIZONTAL)
                 .reduce_options(common_builders.ReduceDataOptions().values(True).calcs([])))
    panel = (panel.id(panel_id).title(spec.title).datasource(datasource_ref())
             .span(spec.width).height(spec.height)
             .with_target(SQL(spec.sql).ref_id("A").format(spec.fmt)))
    if spec.description:
        panel = panel.description(spec.description)
    if spec.unit:
        panel = panel.unit(spec.unit)
    if spec.min_interval:
        panel = panel.interval(spec.min_interval)
    for column, unit in sorted(spec.column_units.items()):
        panel = panel.override_by_name(column, [models.DynamicConfigValue(id_val="unit", value=unit)])
    return panel


def _variable(spec: VariableSpec) -> QueryVariable:
    variable = (
        QueryVariable(spec.name).label(spec.label).datasource(datasource_ref())
        # The plugin's variable query model (CHVariableSupport): custom SQL in rawSql.
        .query({"refId": spec.name, "queryType": "sql", "rawSql": spec.sql})
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
        .multi(spec.multi).include_all(spec.include_all)
    )
    if spec.include_all:
        variable = variable.current(models.VariableOption(selected=True, text=["All"], value=["$__all"]))
    return variable


def build(spec: DashboardSpec) -> models.Dashboard:
    board = (
        Dashboard(spec.title).uid(spec.uid).description(spec.description).tags(list(spec.tags))
        # Billing periods are UTC months: the dashboards show UTC, whatever the browser's zone.
        .timezone("utc").time(spec.time_from, "now").refresh("5m").editable()
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
    )
    for variable in spec.variables:
        board = board.with_variable(_variable(variable))
    panel_id = 0
    for title, panels in spec.rows:
        panel_id += 1
        board = board.with_row(Row(title).id(panel_id))
        for panel in panels:
            panel_id += 1
            board = board.with_panel(_panel(panel, panel_id))
    return board.build()


def render(spec: DashboardSpec) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build(spec)) + "\n"


def file_name(spec: DashboardSpec) -> str:
    return f"{spec.uid}.json"


def write_all(out_dir: Path = OUT_DIR, specs: Sequence[DashboardSpec] = DASHBOARDS) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        path = out_dir / file_name(spec)
        path.write_text(render(spec), encoding="utf-8")
        written.append(path)
    return written


def stale(out_dir: Path = OUT_DIR, specs: Sequence[DashboardSpec] = DASHBOARDS) -> list[str]:
    """Files under ``out_dir`` that are missing, differ from the code's output, or belong to no spec."""
    expected = {file_name(spec): render(spec) for spec in specs}
    problems = []
    for name, text in sorted(expected.items()):
        path = out_dir / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name}: differs from dashboards/panels.py")
    for path in sorted(out_dir.glob("*.json")):
        if path.name not in expected:
            problems.append(f"{path.name}: no dashboard generates it")
    return problems


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.boards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare the committed JSON with the code")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.out)
        for problem in problems:
            print(f"stale dashboard JSON: {problem} (run `make dashboards`)", file=sys.stderr)
        return 1 if problems else 0
    for path in write_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
