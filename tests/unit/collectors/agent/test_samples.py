"""Window alignment, event ids and the billing rules of collectors.agent.samples, through NodeCollector."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from collectors.agent.collector import NodeCollector
from collectors.agent.kubelet_stats import NodeStats, parse_summary
from collectors.agent.nvml_source import NvmlSource
from collectors.agent.podmeta import StaticPodMetadata
from collectors.agent.podresources import PodResourcesClient
from collectors.agent.samples import event_id, held_fraction, window_bounds
from gpumeter.core.models import UsageSample, parse_sample
from testkit.cluster_state import pod, pvc
from testkit.nvml_standin import GIB, NvmlStandIn, StandInMig, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, Lister, PodSpec, serve
from tests.unit.collectors.agent import node_rig

pytestmark = pytest.mark.agent

DATA = Path(__file__).parent / "data"
TRAINER = "6f1c1f0a-1111-4a0e-9c1e-000000000001"
NOTEBOOK = "6f1c1f0a-2222-4a0e-9c1e-000000000002"
FRESH = "6f1c1f0a-3333-4a0e-9c1e-000000000003"
START = datetime(2026, 11, 3, 10, 15, 0, tzinfo=UTC)
END = datetime(2026, 11, 3, 10, 15, 15, tzinfo=UTC)


def test_windows_align_to_the_interval() -> None:
    now = datetime(2026, 11, 3, 10, 15, 22, 500000, tzinfo=UTC).timestamp()
    assert window_bounds(now, 15) == (START, END)
    assert window_bounds(END.timestamp(), 15) == (START, END)  # exactly on a boundary: the window just closed
    assert window_bounds(now, 60)[0] == datetime(2026, 11, 3, 10, 14, tzinfo=UTC)


def test_event_ids_are_stable_and_distinct() -> None:
    a = event_id("c", "n", "uid", "gpu", "GPU-1", START)
    assert a == event_id("c", "n", "uid", "gpu", "GPU-1", START.astimezone())  # any offset, same instant
    assert len(a) == 40 and int(a, 16) >= 0
    others = {
        event_id("c2", "n", "uid", "gpu", "GPU-1", START),
        event_id("c", "n2", "uid", "gpu", "GPU-1", START),
        event_id("c", "n", "uid2", "gpu", "GPU-1", START),
        event_id("c", "n", "uid", "cpu", "GPU-1", START),
        event_id("c", "n", "uid", "gpu", "GPU-2", START),
        event_id("c", "n", "uid", "gpu", "GPU-1", END),
    }
    assert a not in others and len(others) == 6


def node_state() -> tuple[NvmlStandIn, list[PodSpec], StaticPodMetadata]:
    gpus = nvswitch_node(2)
    gpus.append(node_rig.a100_in_mig_mode(StandInMig("MIG-1", "1g.5gb", 1, 5 * GIB, memory_used=2 * GIB)))
    standin = NvmlStandIn(gpus)
    podres = [
        PodSpec(
            "team-a", "trainer-0", [ContainerSpec("main", {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(1)]})]
        ),
        PodSpec("team-b", "notebook", [ContainerSpec("jupyter", {"nvidia.com/mig-1g.5gb": ["MIG-1"]})]),
        PodSpec("team-b", "ghost", [ContainerSpec("c", {"nvidia.com/gpu": ["GPU-unknown"]})]),
    ]
    metadata = StaticPodMetadata(
        [
            pod(
                "team-a",
                "trainer-0",
                TRAINER,
                cpu="16",
                memory="64Gi",
                gpus=2,
                priority=100,
                claims=("checkpoints",),
            ),
            pod("team-b", "notebook", NOTEBOOK, cpu="1", memory="8Gi", ephemeral="10Gi"),
            pod("team-b", "just-started", FRESH, cpu="2", memory="1Gi", start="2026-11-03T10:15:10Z"),
            pod("team-b", "done", "uid-done", cpu="4", phase="Succeeded"),
        ],
        namespaces={"team-a": {"gpumeter.io/tenant": "acme"}},
        node_labels={"gpumeter.io/capacity-type": "spot"},
        claims=[pvc("team-a", "checkpoints", "pvc-uid-1", "500Gi")],
    )
    return standin, podres, metadata


class StaticStats:
    def fetch(self) -> NodeStats:
        return parse_summary(json.loads((DATA / "stats_summary.json").read_text()))


def collect(socket_path: Path) -> tuple[list[UsageSample], NodeCollector]:
    standin, podres, metadata = node_state()
    clock = [1000.0]
    nvml = NvmlSource(nvml=standin, clock=lambda: clock[0])
    nvml.start()
    with serve(socket_path, Lister(podres)), PodResourcesClient(str(socket_path)) as client:
        collector = NodeCollector(
            cluster="prod",
            node="gpu-node-1",
            interval=15,
            nvml=nvml,
            allocations=client,
            metadata=metadata,
            stats=StaticStats(),
            proc_root=None,
        )
        nvml.read()  # a previous read, so energy has a delta
        standin.gpus[0].energy_mj += 4_500_000
        clock[0] += 15
        samples = collector.collect(START, END)
    return samples, collector


def by(samples: list[UsageSample], pod_name: str, kind: str) -> list[UsageSample]:
    return [s for s in samples if s.pod == pod_name and s.kind == kind]


def test_samples_follow_the_billing_rules(socket_path: Path) -> None:
    samples, collector = collect(socket_path)
    # every sample is valid contract 1 and survives a JSON round trip
    from gpumeter.core import jsonio

    for sample in samples:
        assert parse_sample(jsonio.dumps(sample.model_dump())) == sample
        assert sample.window_start == START and sample.window_end == END
        assert sample.cluster == "prod" and sample.node == "gpu-node-1"
    assert len({s.event_id for s in samples}) == len(samples)

    gpus = by(samples, "trainer-0", "gpu")
    assert sorted(s.labels["gpu_uuid"] for s in gpus) == [gpu_uuid(0), gpu_uuid(1)]
    first = next(s for s in gpus if s.labels["gpu_uuid"] == gpu_uuid(0))
    assert first.quantity == 1 and first.gpu_model == "H100-SXM-80GB" and first.mig_profile is None
    assert first.tenant == "acme" and first.capacity_type == "spot" and first.priority == 100
    assert first.utilization == Decimal("0.5") and first.energy_joules == Decimal("4500")
    assert first.memory_used_bytes == GIB and first.power_watts == Decimal("300")

    (mig,) = by(samples, "notebook", "gpu")
    assert mig.gpu_model == "A100-SXM-40GB" and mig.mig_profile == "1g.5gb"
    assert mig.quantity == Decimal("0.142857142857")  # 1 of 7 slices
    assert mig.memory_used_bytes == 2 * GIB and mig.power_watts is None and mig.tenant == "team-b"

    # cpu / memory: max(request, usage)
    (cpu,) = by(samples, "trainer-0", "cpu")
    assert cpu.quantity == 16  # request 16 > usage 11.5
    (memory,) = by(samples, "trainer-0", "memory")
    assert memory.quantity == 128  # working set 128 GiB > request 64 GiB
    (nb_cpu,) = by(samples, "notebook", "cpu")
    assert nb_cpu.quantity == 1  # request 1 > usage 0.25
    storage = {s.labels.get("pvc", "ephemeral"): s for s in by(samples, "trainer-0", "storage")}
    assert storage["checkpoints"].quantity == 500
    assert storage["checkpoints"].event_id == event_id("prod", "", "", "storage", "pvc:pvc-uid-1", START)
    assert storage["ephemeral"].quantity == 5  # used 5 GiB, no request
    (nb_storage,) = by(samples, "notebook", "storage")
    assert nb_storage.quantity == 10  # request 10Gi > used 1 GiB

    # a pod that started 10 s into the 15 s window holds for the last 5 s: one third
    (fresh_cpu,) = by(samples, "just-started", "cpu")
    assert fresh_cpu.quantity == Decimal("0.666666")
    assert not [s for s in samples if s.pod == "done"]  # finished pods hold nothing
    assert collector.builder.stats.unattributed == 1  # "ghost" is not in the metadata


def test_restarted_agent_emits_the_same_event_ids(socket_path: Path) -> None:
    first, _ = collect(socket_path)
    second, _ = collect(socket_path)
    assert sorted(s.event_id for s in first) == sorted(s.event_id for s in second)


def test_held_fraction_edges() -> None:
    info = StaticPodMetadata([pod("t", "p", "u", start="2026-11-03T10:16:00Z")]).pods()[0]
    assert held_fraction(info, START, END) == 0
    info = StaticPodMetadata([pod("t", "p", "u", start=None)]).pods()[0]
    assert held_fraction(info, START, END) == 1
