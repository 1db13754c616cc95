"""Finished pods (Succeeded / Failed) hold nothing after their end, although the kubelet keeps listing
their devices until the pod object is deleted; a GPU reassigned meanwhile is billed once, to the live
pod, with its telemetry."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from collectors.agent.podmeta import pod_info
from collectors.agent.samples import held_fraction
from testkit.cluster_state import pod
from testkit.nvml_standin import GIB, NvmlStandIn, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, PodSpec

from .node_rig import END, GPU, START, finished, gpu_samples, node

pytestmark = pytest.mark.agent


def test_a_reassigned_gpu_bills_only_the_live_pod_and_keeps_its_telemetry() -> None:
    standin = NvmlStandIn(nvswitch_node(2))
    kubelet = [
        # The job finished before the window; the kubelet still lists its device ...
        PodSpec("team-a", "job", [ContainerSpec("main", {GPU: [gpu_uuid(0)]})]),
        # ... which the device plugin has handed to the next pod.
        PodSpec("team-b", "trainer", [ContainerSpec("main", {GPU: [gpu_uuid(0)]})]),
    ]
    api = [
        finished(pod("team-a", "job", "uid-job", gpus=1), "Succeeded", "2026-11-03T10:10:00Z"),
        pod("team-b", "trainer", "uid-trainer", gpus=1, start="2026-11-03T10:12:00Z"),
    ]
    with node(standin, kubelet, api) as rig:
        samples, (record,) = rig.window()
    (trainer,) = gpu_samples(samples)
    assert (trainer.pod, trainer.quantity, trainer.labels["gpu_uuid"]) == ("trainer", 1, gpu_uuid(0))
    # The GPU is the trainer's alone: its whole-GPU telemetry is kept (nvswitch_node: GPU 0 draws
    # 300 W and uses 1 GiB).
    assert trainer.power_watts == Decimal(300) and trainer.memory_used_bytes == GIB
    assert [(a.pod, a.gpu_indices) for a in record.assignments] == [("trainer", [0])]
    assert not [s for s in samples if s.pod == "job"]


def test_a_pod_finishing_inside_the_window_holds_until_its_end() -> None:
    standin = NvmlStandIn(nvswitch_node(1))
    kubelet = [PodSpec("team-a", "job", [ContainerSpec("main", {GPU: [gpu_uuid(0)]})])]
    # Ended 6 s into the 15 s window: it held 6/15 = 0.4 of it.
    api = [finished(pod("team-a", "job", "uid-job", cpu="3", gpus=1), "Failed", "2026-11-03T10:15:06Z")]
    with node(standin, kubelet, api) as rig:
        samples, (record,) = rig.window()
    (gpu,) = gpu_samples(samples)
    assert gpu.quantity == Decimal("0.4")
    (cpu,) = [s for s in samples if s.kind == "cpu"]
    assert cpu.quantity == Decimal("1.2")  # 3 cores for 0.4 of the window
    assert record.assignments == []  # at the window's end the GPU is free


def test_a_finished_pod_without_a_recorded_end_holds_nothing() -> None:
    standin = NvmlStandIn(nvswitch_node(1))
    kubelet = [PodSpec("team-a", "job", [ContainerSpec("main", {GPU: [gpu_uuid(0)]})])]
    api = [finished(pod("team-a", "job", "uid-job", cpu="2", gpus=1), "Succeeded", None)]
    with node(standin, kubelet, api) as rig:
        samples, (record,) = rig.window()
        assert samples == [] and record.assignments == []
        assert rig.collector.builder.stats.finished_holders == 1


def test_held_fraction_is_the_overlap_of_the_pods_life_with_the_window() -> None:
    # Started 3 s in, ended 9 s in: 6 of 15 s.
    api = finished(
        pod("t", "p", "u", start="2026-11-03T10:15:03Z"), "Succeeded", "2026-11-03T10:15:09Z"
    )
    assert held_fraction(pod_info(api), START, END) == Decimal("0.4")
    ended_before = finished(pod("t", "p", "u"), "Failed", "2026-11-03T10:14:59Z")
    assert held_fraction(pod_info(ended_before), START, END) == 0
    ended_after = finished(pod("t", "p", "u"), "Succeeded", "2026-11-03T10:16:00Z")
    assert held_fraction(pod_info(ended_after), START, END) == 1


def test_finish_time_is_the_last_container_end_init_containers_included() -> None:
    api = pod("t", "p", "u")
    api["status"].update(
        phase="Failed",
        initContainerStatuses=[
            {"name": "init", "state": {"terminated": {"finishedAt": "2026-11-03T10:15:11Z"}}}
        ],
        containerStatuses=[
            {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-03T10:15:04Z"}}},
            {"name": "side", "state": {"waiting": {"reason": "PodInitializing"}}},
        ],
    )
    info = pod_info(api)
    assert info.finished and info.finish_time == datetime(2026, 11, 3, 10, 15, 11, tzinfo=UTC)
    running = pod_info(pod("t", "p", "u"))
    assert not running.finished and running.finish_time is None
