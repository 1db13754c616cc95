"""The chart rendered with its default values (deploy/rendered/gpumeter.yaml, `make manifests`):
what tests read where they need the manifests but not helm. tests/kube/test_helm_chart.py fails
while the committed rendering differs from `helm template`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RENDERED = REPO / "deploy" / "rendered" / "gpumeter.yaml"
# The release and namespace `make manifests` renders with.
RELEASE = "gpumeter"
NAMESPACE = "gpumeter-system"


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def rendered() -> list[dict[str, Any]]:
    return documents(RENDERED.read_text())


def find(docs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name."""
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec of a Deployment, DaemonSet, Job or CronJob."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: dict[str, Any] = spec["template"]["spec"]
    return result
