"""gpumeter.core.kube: the Kubernetes names and rules the agent, extender and actuator share."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpumeter.core.kube import (
    capacity_type_of,
    capacity_type_of_node,
    declared_capacity_type,
    effective_requests,
    gpu_request,
    invalid_tenant_label,
    parse_quantity,
    schedulable_units,
    tenant_of_namespace,
)
from gpumeter.core.models import GpuDevice, NodeTopology
from gpumeter.core.validation import TENANT_PATTERN

GPU = "nvidia.com/gpu"


# -- quantities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2", "2", id="plain"),
        pytest.param("500m", "0.5", id="milli"),
        pytest.param("100m", "0.1", id="tenth"),
        pytest.param("1Ki", "1024", id="binary-suffix"),
        pytest.param("1.5Gi", str(1536 * 1024**2), id="fractional-binary"),
        pytest.param("1k", "1000", id="decimal-suffix"),
        pytest.param("500M", "500000000", id="mega"),
        pytest.param("1e3", "1000", id="exponent"),
        pytest.param(3, "3", id="json-number"),
    ],
)
def test_parse_quantity(text: Any, expected: str) -> None:
    assert parse_quantity(text) == Decimal(expected)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty"),
        pytest.param("1.2.3", id="two-points"),
        pytest.param("five", id="word"),
        pytest.param("1Q", id="unknown-suffix"),
        pytest.param(True, id="boolean"),
    ],
)
def test_parse_quantity_refuses(bad: Any) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(bad)


# -- tenant -------------------------------------------------------------------------------------


@given(st.text(max_size=300), st.text(max_size=70))
def test_a_tenant_is_the_label_or_the_name_as_written_or_none(text: str, name: str) -> None:
    """Never folded: a value that is not a tenant id is no tenant (None), whatever it resembles."""
    tenant = tenant_of_namespace("ns", {"gpumeter.io/tenant": text})
    if text == "":
        assert tenant == "ns"
    elif re.fullmatch(TENANT_PATTERN.strip("^$"), text):
        assert tenant == text
    else:
        assert tenant is None and invalid_tenant_label({"gpumeter.io/tenant": text}) == text
    assert tenant_of_namespace(name) in (name, None)


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        pytest.param("ml-research", None, "ml-research", id="no-labels-the-name"),
        pytest.param("ml-research", {"team": "x"}, "ml-research", id="other-labels-the-name"),
        pytest.param("ml-research", {"gpumeter.io/tenant": "team-a"}, "team-a", id="label-wins"),
        pytest.param("ns", {"gpumeter.io/tenant": "Team_A"}, None, id="upper-and-underscore-no-tenant"),
        pytest.param("ns", {"gpumeter.io/tenant": "Team.B"}, None, id="a-dot-no-tenant"),
        pytest.param("ns", {"gpumeter.io/tenant": "--Data Science!!"}, None, id="punctuation-no-tenant"),
        pytest.param("ns", {"gpumeter.io/tenant": ""}, "ns", id="empty-label-the-name"),
        pytest.param("ns", {"gpumeter.io/tenant": "  "}, None, id="blank-label-no-tenant"),
        pytest.param("ns", {"gpumeter.io/tenant": "a" * 63}, "a" * 63, id="63-characters"),
        pytest.param("ns", {"gpumeter.io/tenant": "a" * 64}, None, id="64-characters-no-tenant"),
    ],
)
def test_tenant_of_namespace(name: str, labels: dict[str, str] | None, expected: str | None) -> None:
    assert tenant_of_namespace(name, labels) == expected


def test_team_b_written_two_ways_is_never_team_b() -> None:
    """Issue 31, point 7: ``TEAM_B`` and ``Team.B`` were both folded into ``team-b``."""
    tenants = {tenant_of_namespace(ns, {"gpumeter.io/tenant": label})
               for ns, label in (("a", "TEAM_B"), ("b", "Team.B"), ("c", "team-b"))}
    assert tenants == {None, "team-b"}


# -- capacity type ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({}, None, id="silent"),
        pytest.param(None, None, id="no-labels"),
        pytest.param({"gpumeter.io/capacity-type": "reserved"}, "reserved", id="ours"),
        pytest.param({"gpumeter.io/capacity-type": "free"}, None, id="ours-unknown-value-ignored"),
        pytest.param(
            {"gpumeter.io/capacity-type": "reserved", "karpenter.sh/capacity-type": "spot"},
            "reserved",
            id="ours-wins-over-cloud-spot",
        ),
        pytest.param(
            {"gpumeter.io/capacity-type": "free", "karpenter.sh/capacity-type": "spot"},
            "spot",
            id="cloud-when-ours-unreadable",
        ),
        pytest.param({"karpenter.sh/capacity-type": "spot"}, "spot", id="karpenter-spot"),
        pytest.param({"karpenter.sh/capacity-type": "reserved"}, "reserved", id="karpenter-reserved"),
        pytest.param({"karpenter.sh/capacity-type": "on-demand"}, "on-demand", id="karpenter-on-demand"),
        pytest.param({"eks.amazonaws.com/capacityType": "SPOT"}, "spot", id="eks-spot"),
        pytest.param({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "on-demand", id="eks-on-demand"),
        pytest.param({"cloud.google.com/gke-spot": "true"}, "spot", id="gke-spot"),
        pytest.param({"cloud.google.com/gke-spot": "false"}, None, id="gke-not-spot-says-nothing"),
        pytest.param({"cloud.google.com/gke-preemptible": "true"}, "spot", id="gke-preemptible"),
        pytest.param({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot", id="aks-spot"),
        pytest.param({"kubernetes.azure.com/scalesetpriority": "regular"}, None, id="aks-regular"),
        pytest.param(
            {"karpenter.sh/capacity-type": "on-demand", "cloud.google.com/gke-spot": "true"},
            "on-demand",
            id="first-cloud-label-decides",
        ),
    ],
)
def test_capacity_type_of_node(labels: dict[str, str] | None, expected: str | None) -> None:
    assert capacity_type_of_node(labels) == expected


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param({}, None, id="silent"),
        pytest.param({"labels": {"gpumeter.io/capacity-type": "spot"}}, "spot", id="label"),
        pytest.param({"annotations": {"gpumeter.io/capacity-type": "reserved"}}, "reserved", id="annotation"),
        pytest.param(
            {
                "labels": {"gpumeter.io/capacity-type": "spot"},
                "annotations": {"gpumeter.io/capacity-type": "reserved"},
            },
            "spot",
            id="label-before-annotation",
        ),
        pytest.param(
            {
                "labels": {"gpumeter.io/capacity-type": "free"},
                "annotations": {"gpumeter.io/capacity-type": "reserved"},
            },
            "reserved",
            id="unreadable-label-then-annotation",
        ),
    ],
)
def test_declared_capacity_type(metadata: dict[str, Any], expected: str | None) -> None:
    assert declared_capacity_type(metadata) == expected


@pytest.mark.parametrize(
    ("metadata", "node_labels", "expected"),
    [
        pytest.param(
            {"labels": {"gpumeter.io/capacity-type": "spot"}},
            {"gpumeter.io/capacity-type": "reserved"},
            "reserved",
            id="the-node-wins",
        ),
        pytest.param(
            {"labels": {"gpumeter.io/capacity-type": "spot"}}, {}, "spot", id="declared-if-node-silent"
        ),
        pytest.param({}, None, "on-demand", id="nothing-known"),
    ],
)
def test_capacity_type_of_a_pod(
    metadata: dict[str, Any], node_labels: dict[str, str] | None, expected: str
) -> None:
    assert capacity_type_of(metadata, node_labels) == expected


# -- effective request --------------------------------------------------------------------------


def _c(
    requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, sidecar: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "resources": {}}
    if requests is not None:
        container["resources"]["requests"] = requests
    if limits is not None:
        container["resources"]["limits"] = limits
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, {}, id="empty-pod"),
        pytest.param(
            {"containers": [_c({"cpu": "1", "memory": "1Gi"}), _c({"cpu": "500m"})]},
            {"cpu": "1.5", "memory": str(1024**3)},
            id="app-containers-add",
        ),
        pytest.param({"containers": [_c(limits={GPU: "2"})]}, {GPU: "2"}, id="limit-stands-in-for-request"),
        pytest.param(
            {"containers": [_c({"cpu": "1"}, limits={"cpu": "4"})]},
            {"cpu": "1"},
            id="request-wins-over-limit",
        ),
        pytest.param(  # app 2 + sidecar 1 run together; no regular init container
            {"containers": [_c({GPU: "2"})], "initContainers": [_c({GPU: "1"}, sidecar=True)]},
            {GPU: "3"},
            id="sidecar-beside-app",
        ),
        pytest.param(  # init 4 runs alone (nothing started before it): max(4, 1) = 4
            {"containers": [_c({GPU: "1"})], "initContainers": [_c({GPU: "4"})]},
            {GPU: "4"},
            id="larger-init-container",
        ),
        pytest.param(  # sidecar 1 is up while init 3 runs: max(1 + 3, 1 + 1) = 4
            {
                "containers": [_c({GPU: "1"})],
                "initContainers": [_c({GPU: "1"}, sidecar=True), _c({GPU: "3"})],
            },
            {GPU: "4"},
            id="sidecar-before-init-adds-to-it",
        ),
        pytest.param(  # sidecar starts after init 3: max(3, 2 + 1) = 3
            {
                "containers": [_c({GPU: "2"})],
                "initContainers": [_c({GPU: "3"}), _c({GPU: "1"}, sidecar=True)],
            },
            {GPU: "3"},
            id="sidecar-after-init-does-not",
        ),
        pytest.param(  # two sidecars before init 1: max(2 + 1, 0 + 2) with app 0 -> 3
            {
                "containers": [_c({"cpu": "100m"})],
                "initContainers": [
                    _c({GPU: "1"}, sidecar=True),
                    _c({GPU: "1"}, sidecar=True),
                    _c({GPU: "1"}),
                ],
            },
            {GPU: "3", "cpu": "0.1"},
            id="sidecars-accumulate",
        ),
        pytest.param(  # per resource: cpu peaks in init (8), memory in the apps (4Gi + 1Gi)
            {
                "containers": [
                    _c({"cpu": "2", "memory": "4Gi"}),
                    _c(limits={"cpu": "500m", "memory": "1Gi"}),
                ],
                "initContainers": [_c({"cpu": "8", "memory": "1Gi"}), _c({"cpu": "250m"}, sidecar=True)],
                "overhead": {"cpu": "100m"},
            },
            {"cpu": "8.1", "memory": str(5 * 1024**3)},
            id="each-resource-alone-plus-overhead",
        ),
        pytest.param(
            {"containers": [_c({GPU: "1"})], "overhead": {GPU: "1"}}, {GPU: "2"}, id="overhead-added"
        ),
        pytest.param(
            {"containers": [_c({GPU: "banana", "cpu": "1"})]}, {"cpu": "1"}, id="unreadable-quantity-left-out"
        ),
    ],
)
def test_effective_requests(spec: dict[str, Any], expected: dict[str, str]) -> None:
    assert effective_requests(spec) == {name: Decimal(v) for name, v in expected.items()}


def test_effective_requests_of_chosen_resources_only() -> None:
    spec = {"containers": [_c({GPU: "1", "cpu": "2", "memory": "1Gi"})]}
    assert effective_requests(spec, ("cpu",)) == {"cpu": Decimal(2)}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {
                "containers": [
                    {"resources": {"requests": {"nvidia.com/gpu": "2"}}},
                    {"resources": {"requests": {"nvidia.com/gpu": "1"}}},
                ]
            },
            "3",
            id="app-containers-add",
        ),
        pytest.param(
            {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            "4",
            id="limit-without-request-counts",
        ),
        pytest.param(
            {
                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}],
            },
            "2",
            id="larger-init-container-wins",
        ),
        pytest.param(
            {
                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "3"}}}],
                "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}],
            },
            "3",
            id="app-sum-wins-over-smaller-init",
        ),
        pytest.param({"containers": [{"resources": {"requests": {"cpu": "2"}}}]}, "0", id="no-gpu"),
        pytest.param(
            {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "banana"}}}]},
            "0",
            id="unreadable-quantity-is-zero",
        ),
    ],
)
def test_gpu_request(spec: dict[str, Any], expected: str) -> None:
    assert gpu_request(spec) == Decimal(expected)


# -- GPU sharing --------------------------------------------------------------------------------


def _gpu(**fields: Any) -> GpuDevice:
    return GpuDevice(index=0, uuid="GPU-0", model="NVIDIA L4", **fields)


@pytest.mark.parametrize(
    ("gpu", "units"),
    [
        pytest.param(_gpu(), 1, id="whole"),
        pytest.param(_gpu(replicas=4), 4, id="time-sliced-4"),
        pytest.param(_gpu(mig_enabled=True), 0, id="mig-mode"),
        pytest.param(_gpu(mig_enabled=True, replicas=2), 0, id="mig-mode-replicas-are-mig-devices"),
    ],
)
def test_schedulable_units(gpu: GpuDevice, units: int) -> None:
    assert schedulable_units(gpu) == units


def test_replicas_below_one_are_refused() -> None:
    with pytest.raises(ValidationError):
        _gpu(replicas=0)


def test_a_topology_record_from_before_replicas_still_parses() -> None:
    old = (
        '{"cluster": "c", "node": "n", "at": "2026-11-05T12:00:00Z", "links": {},'
        ' "gpus": [{"index": 0, "uuid": "GPU-0", "model": "NVIDIA L4", "mig_enabled": false}]}'
    )
    topology = NodeTopology.model_validate_json(old)
    assert topology.gpus[0].replicas == 1
