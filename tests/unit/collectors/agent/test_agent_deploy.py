"""The agent's DaemonSet as the chart renders it (deploy/rendered/gpumeter.yaml, default values):
where it runs, what the NVIDIA runtime gives it (MIG monitoring), how it is probed, and the image
recipe (the root Dockerfile) whose sources exist. (tests/kube/test_agent_manifest.py and
tests/kube/test_agent_daemonset.py put the same objects in front of a real apiserver and
scheduler; tests/kube/test_helm_chart.py checks the rendering is current.)"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.rendered import REPO as ROOT
from tests.support.rendered import find, rendered

pytestmark = pytest.mark.agent


def daemonset() -> dict[str, Any]:
    return find(rendered(), "DaemonSet", "gpumeter-agent")


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = daemonset()["spec"]["template"]["spec"]
    return spec


def agent() -> dict[str, Any]:
    (container,) = pod_spec()["containers"]
    return dict(container)


def env() -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in agent()["env"]}


def test_it_tolerates_every_taint() -> None:
    assert pod_spec()["tolerations"] == [{"operator": "Exists"}]


def gpu_terms() -> list[list[dict[str, Any]]]:
    affinity = pod_spec()["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in affinity["nodeSelectorTerms"]]


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({"nvidia.com/gpu.present": "true"}, id="gpu feature discovery"),
        pytest.param({"feature.node.kubernetes.io/pci-10de.present": "true"}, id="node feature discovery"),
        pytest.param({"cloud.google.com/gke-accelerator": "nvidia-l4"}, id="gke accelerator"),
        pytest.param({"kubernetes.azure.com/accelerator": "nvidia"}, id="aks accelerator"),
        pytest.param({"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia"}, id="eks karpenter"),
        pytest.param({"gpumeter.io/gpu": "true"}, id="labelled by hand"),
    ],
)
def test_any_one_gpu_label_places_it_without_gpu_feature_discovery(labels: dict[str, str]) -> None:
    assert "nodeSelector" not in pod_spec()
    assert any(all(matches(expression, labels) for expression in term) for term in gpu_terms())


def test_a_node_without_gpu_labels_gets_no_agent() -> None:
    cpu_node = {"kubernetes.io/os": "linux", "cloud.google.com/gke-nodepool": "default-pool"}
    assert not any(all(matches(expression, cpu_node) for expression in term) for term in gpu_terms())


def matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    """A node selector requirement against node labels, as the scheduler reads it."""
    key, operator = expression["key"], expression["operator"]
    if operator == "Exists":
        return key in labels
    if operator == "In":
        return labels.get(key) in expression["values"]
    raise AssertionError(f"operator {operator} not expected in the agent's affinity")


def test_no_runtime_class_is_required() -> None:
    assert "runtimeClassName" not in pod_spec()
    # ... and the chart's values say how to add one where it is needed.
    values = (ROOT / "deploy" / "helm" / "gpumeter" / "values.yaml").read_text()
    assert re.search(r'^  runtimeClassName: ""$', values, re.MULTILINE)


def test_mig_devices_are_visible_to_it() -> None:
    values = env()
    assert values["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert values["NVIDIA_VISIBLE_DEVICES"] == "all" and values["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    security = agent()["securityContext"]
    # The runtime grants the MIG monitor capability only with CAP_SYS_ADMIN; nothing else is kept.
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert not security.get("privileged", False)


def test_liveness_is_the_healthz_of_the_metrics_port() -> None:
    container = agent()
    (port,) = container["ports"]
    assert port["containerPort"] == int(env()["GPUMETER_AGENT_METRICS_PORT"])
    probe = container["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": port["name"]}
    # The endpoint fails after 3 windows; the probe must not restart a healthy agent sooner.
    liveness = container["livenessProbe"]
    interval = int(env()["GPUMETER_AGENT_INTERVAL"])
    assert liveness["initialDelaySeconds"] + liveness["periodSeconds"] >= 3 * interval


def test_the_image_recipe_copies_sources_that_exist_and_runs_the_agent() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    sources = [
        source
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    assert sources, "the Dockerfile copies nothing"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    # Every package the distribution installs (pyproject's find.include) is copied.
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[([^\]]*)\]", pyproject)
    assert include is not None
    packages = {p.strip().strip('"').rstrip("*") for p in include.group(1).split(",")}
    assert packages <= {s.rstrip("/") for s in sources}
    assert "native/" in sources  # the worker's rating extension is compiled in the build stage
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert all(f"!{source}" in ignored for source in sources), "the build context leaves a source out"
    assert 'ENTRYPOINT ["gpumeter"]' in dockerfile
    assert re.search(r"^USER \$\{UID\}", dockerfile, re.MULTILINE), "the runtime stage runs as non-root"
    assert agent()["command"] == ["gpumeter", "collect", "--source", "nvml"]
