"""Dashboards as code: the committed JSON is what the code generates, round-trips through the
SDK's types, and every panel is a ClickHouse query on the provisioned datasource."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

from dashboards import boards, chquery
from dashboards.panels import DASHBOARDS

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "dashboards" / "grafana"
PROVISIONING = REPO / "dashboards" / "provisioning"


def committed() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, boards.load(path)) for path in sorted(COMMITTED.glob("*.json"))]


def visual_panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in document["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def test_committed_json_is_what_the_code_generates() -> None:
    assert boards.stale(COMMITTED) == [], "run `make dashboards` and commit dashboards/grafana/"
    assert {name for name, _ in committed()} == {boards.file_name(spec) for spec in DASHBOARDS}


def test_staleness_check_names_a_changed_missing_or_orphaned_file(tmp_path: Path) -> None:
    out = tmp_path / "grafana"
    shutil.copytree(COMMITTED, out)
    finance = out / "gpumeter-finance.json"
    document = json.loads(finance.read_text())
    document["panels"][1]["targets"][0]["rawSql"] += " LIMIT 1"
    finance.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (out / "gpumeter-operations.json").unlink()
    (out / "hand-made.json").write_text("{}\n")
    assert boards.stale(out) == [
        "gpumeter-finance.json: differs from dashboards/panels.py",
        "gpumeter-operations.json: missing",
        "hand-made.json: no dashboard generates it",
    ]
    assert boards.main(["--check", "--out", str(out)]) == 1
    assert boards.main(["--out", str(out)]) == 0
    assert boards.stale(out) == ["hand-made.json: no dashboard generates it"]


@pytest.mark.parametrize(("name", "document"), committed(), ids=[name for name, _ in committed()])
def test_dashboard_round_trips_through_the_sdk_types(name: str, document: dict[str, Any]) -> None:
    chquery.register()
    model = DashboardModel.from_json(document)
    assert json.loads(JSONEncoder(sort_keys=True).encode(model)) == document
    for panel in visual_panels(document):
        assert panel["targets"], f"{name}: panel {panel['title']!r} has no query"
    targets = [target for panel in model.panels or [] for target in getattr(panel, "targets", None) or []]
    assert targets and all(isinstance(target, chquery.ClickHouseQuery) for target in targets)


@pytest.mark.parametrize(("name", "document"), committed(), ids=[name for name, _ in committed()])
def test_panel_ids_are_unique_and_every_panel_queries_the_provisioned_clickhouse(
    name: str, document: dict[str, Any]
) -> None:
    ids = [panel["id"] for panel in document["panels"]]
    ids += [inner["id"] for panel in document["panels"] for inner in panel.get("panels", [])]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    expected_source = {"type": chquery.PLUGIN_ID, "uid": chquery.DATASOURCE_UID}
    for panel in visual_panels(document):
        assert panel["datasource"] == expected_source, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == expected_source
            assert target["editorType"] == "sql" and target["rawSql"].strip().upper().startswith("SELECT")
            assert target["format"] in (0, 1)
    for variable in document.get("templating", {}).get("list", []):
        assert variable["datasource"] == expected_source
        assert variable["query"]["rawSql"].strip().upper().startswith("SELECT")


def test_every_query_in_the_json_is_a_spec_the_sql_tests_run() -> None:
    """tests/integration/test_dashboard_sql.py runs the specs: no JSON query may escape it."""
    in_json = {
        (document["uid"], panel["title"], target["rawSql"])
        for _, document in committed() for panel in visual_panels(document) for target in panel["targets"]
    }
    in_specs = {(spec.uid, panel.title, panel.sql) for spec in DASHBOARDS for panel in spec.panels()}
    assert in_json == in_specs
    uids = [spec.uid for spec in DASHBOARDS]
    assert len(uids) == len(set(uids))


def test_time_series_panels_return_a_time_column_sorted_by_time() -> None:
    """The plugin turns long frames into series only when time comes first and rows are in order."""
    for spec in DASHBOARDS:
        for panel in spec.panels():
            if panel.fmt == chquery.Format.TIME_SERIES:
                assert panel.columns[0] == "time", panel.title
                assert "ORDER BY time" in panel.sql or "ORDER BY hour" in panel.sql, panel.title


def test_provisioning_files_declare_the_datasource_and_the_dashboard_folder() -> None:
    sources = yaml.safe_load((PROVISIONING / "datasources" / "gpumeter-clickhouse.yaml").read_text())
    assert sources["apiVersion"] == 1
    [source] = sources["datasources"]
    assert (source["type"], source["uid"]) == (chquery.PLUGIN_ID, chquery.DATASOURCE_UID)
    assert source["jsonData"]["protocol"] in ("http", "native")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpumeter.yaml").read_text())
    [provider] = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    readme = (REPO / "README.md").read_text()
    assert provider["options"]["path"] in readme, "the README says where the JSON goes"
