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
