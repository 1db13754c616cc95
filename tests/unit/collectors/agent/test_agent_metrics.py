"""What the agent counts but does not bill reaches /metrics: devices NVML does not report, devices
still listed for finished pods."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from collectors.agent.metrics import AgentMetrics
from testkit.cluster_state import pod
from testkit.nvml_standin import NvmlStandIn, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, PodSpec

from .node_rig import GPU, finished, node

pytestmark = pytest.mark.agent


def scraped(metrics: AgentMetrics, name: str) -> float:
    lines = [
        line
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    assert lines, f"{name} missing from /metrics"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_unknown_and_finished_pod_devices_are_exported() -> None:
    kubelet = [
        # Two devices this node's NVML never reported (a GPU gone from the bus, a stale MIG UUID).
        PodSpec("team-a", "ghost", [ContainerSpec("c", {GPU: ["GPU-not-here", "MIG-not-here"]})]),
        PodSpec("team-a", "done", [ContainerSpec("c", {GPU: [gpu_uuid(0)]})]),
    ]
    api = [
        pod("team-a", "ghost", "uid-ghost"),
        finished(pod("team-a", "done", "uid-done"), "Succeeded", "2026-11-03T10:00:00Z"),
    ]
    with node(NvmlStandIn(nvswitch_node(1)), kubelet, api) as rig:
        metrics = AgentMetrics()
        metrics.collector = rig.collector
        rig.window()
        assert scraped(metrics, "gpumeter_agent_unknown_devices_total") == 2
        assert scraped(metrics, "gpumeter_agent_finished_pod_devices_total") == 1
        rig.window()  # counters: every window adds its own
        assert scraped(metrics, "gpumeter_agent_unknown_devices_total") == 4


def test_a_tenant_label_that_is_no_tenant_id_is_never_folded_into_another_tenant() -> None:
    """Issue 31, point 7: ``TEAM_B`` and ``Team.B`` were folded into ``team-b``, so a namespace
    labelled either way was billed (and counted against quota) as team-b. Such a pod now yields no
    sample at all (billing stays exact), counted on /metrics; its GPU's other holder keeps its share."""
    kubelet = [
        PodSpec("shouting", "p-upper", [ContainerSpec("c", {GPU: [gpu_uuid(0)]})]),
        PodSpec("dotted", "p-dot", [ContainerSpec("c", {GPU: [gpu_uuid(1)]})]),
        PodSpec("proper", "p-lower", [ContainerSpec("c", {GPU: [gpu_uuid(2)]})]),
    ]
    api = [pod("shouting", "p-upper", "uid-upper", cpu="1"), pod("dotted", "p-dot", "uid-dot"),
           pod("proper", "p-lower", "uid-lower", cpu="1")]
    namespaces = {"shouting": {"gpumeter.io/tenant": "TEAM_B"}, "dotted": {"gpumeter.io/tenant": "Team.B"},
                  "proper": {"gpumeter.io/tenant": "team-b"}}
    with node(NvmlStandIn(nvswitch_node(3)), kubelet, api, namespaces=namespaces) as rig:
        metrics = AgentMetrics()
        metrics.collector = rig.collector
        samples, _ = rig.window()
        assert {s.pod for s in samples} == {"p-lower"}
        assert {(s.kind, s.tenant, s.quantity) for s in samples} >= {("gpu", "team-b", 1),
                                                                     ("cpu", "team-b", 1)}
        # p-upper: a gpu and a cpu sample withheld; p-dot: a gpu sample.
        assert scraped(metrics, "gpumeter_agent_invalid_tenant_label_total") == 3
