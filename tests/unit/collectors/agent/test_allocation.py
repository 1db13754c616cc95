"""The node's allocation record (contract 8): built from the kubelet's PodResources list (a real
gRPC server from testkit), GPU indices from NVML (the stand-in), and published on its own lane
of the publisher (Kafka, or its spool while Kafka is away)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from collectors.agent.collector import AgentConfig, NodeCollector, run_agent
from collectors.agent.nvml_source import NvmlSource
from collectors.agent.podmeta import StaticPodMetadata
from collectors.agent.publisher import ALLOCATION_SPOOL, Publisher, decode_message
from collectors.agent.spool import Spool
from gpumeter.core import jsonio
from gpumeter.core.models import GpuAssignment, NodeAllocation, UsageSample, parse_sample
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.infra.kafka import KafkaUnavailable
from testkit.cluster_state import pod
from testkit.nvml_standin import GIB, NvmlStandIn, StandInMig, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, Lister, PodSpec, serve
from tests.unit.collectors.agent import node_rig
from tests.unit.collectors.agent.fake_kafka import Broker

pytestmark = pytest.mark.agent

START = datetime(2026, 11, 3, 10, 15, 0, tzinfo=UTC)
END = START + timedelta(seconds=15)
GPU = "nvidia.com/gpu"


def board() -> NvmlStandIn:
    """GPUs 0-2 whole (NVSwitch board); GPU 3 an A100 in MIG mode with two 1g.5gb devices."""
    gpus = nvswitch_node(3)
    migs = [StandInMig("MIG-a", "1g.5gb", 1, 5 * GIB), StandInMig("MIG-b", "1g.5gb", 1, 5 * GIB)]
    gpus.append(node_rig.a100_in_mig_mode(*migs))
    return NvmlStandIn(gpus)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def collector_for(
    socket_path: Path, metadata: StaticPodMetadata, clock: Clock | None = None
) -> NodeCollector:
    nvml = NvmlSource(nvml=board())
    nvml.start()
    return node_rig.collector_over(nvml, socket_path, metadata, clock=clock or Clock())


def window(
    collector: NodeCollector, start: datetime = START
) -> tuple[list[UsageSample], list[NodeAllocation]]:
    samples = collector.collect(start, start + timedelta(seconds=15))
    return samples, collector.node_allocations()


def test_pods_devices_map_to_their_nvml_indices(socket_path: Path) -> None:
    podres = [
        # Two containers of one pod; the device ids arrive in the kubelet's order, not sorted.
        PodSpec(
            "team-a",
            "trainer",
            [
                ContainerSpec("main", {GPU: [gpu_uuid(2), gpu_uuid(0)]}),
                ContainerSpec("helper", {GPU: [gpu_uuid(1)]}),
            ],
        ),
        # Two MIG devices of the A100 at index 3: both pods hold index 3.
        PodSpec("team-b", "notebook-1", [ContainerSpec("jupyter", {"nvidia.com/mig-1g.5gb": ["MIG-a"]})]),
        PodSpec("team-b", "notebook-2", [ContainerSpec("jupyter", {"nvidia.com/mig-1g.5gb": ["MIG-b"]})]),
        # The kubelet lists it, the metadata cache does not know it yet: its GPU is taken all the same.
        PodSpec("team-c", "unknown-to-metadata", [ContainerSpec("c", {GPU: ["GPU-a100"]})]),
        # A device NVML never reported has no index.
        PodSpec("team-c", "ghost", [ContainerSpec("c", {GPU: ["GPU-not-on-this-node"]})]),
    ]
    metadata = StaticPodMetadata(
        [
            pod("team-a", "trainer", "uid-trainer", gpus=3),
            pod("team-b", "notebook-1", "uid-nb-1"),
            pod("team-b", "notebook-2", "uid-nb-2"),
            pod("team-c", "ghost", "uid-ghost"),
        ],
        namespaces={"team-a": {"gpumeter.io/tenant": "acme"}},
    )
    with serve(socket_path, Lister(podres)):
        collector = collector_for(socket_path, metadata)
        _, records = window(collector)
    (record,) = records
    assert (record.cluster, record.node, record.at) == ("prod", "gpu-node-1", END)
    assert [(a.namespace, a.pod, a.pod_uid, a.container, a.gpu_indices) for a in record.assignments] == [
        ("team-a", "trainer", "uid-trainer", "helper", [1]),
        ("team-a", "trainer", "uid-trainer", "main", [0, 2]),
        ("team-b", "notebook-1", "uid-nb-1", "jupyter", [3]),
        ("team-b", "notebook-2", "uid-nb-2", "jupyter", [3]),
        ("team-c", "unknown-to-metadata", "", "c", [3]),
    ]
    stats = collector.allocation_builder.stats
    assert (stats.unknown_devices, stats.unknown_pods) == (1, 1)
    # The record is contract 8 on the wire: it survives a JSON round trip as the model.
    assert NodeAllocation.model_validate(jsonio.loads(jsonio.dumpb(record.model_dump()))) == record


def test_time_sliced_replicas_hold_their_gpus_index(socket_path: Path) -> None:
    replicas = [f"{gpu_uuid(1)}::{n}" for n in range(4)]
    podres = [
        PodSpec("team-a", "a", [ContainerSpec("c", {"nvidia.com/gpu.shared": [replicas[0]]})]),
        PodSpec("team-b", "b", [ContainerSpec("c", {"nvidia.com/gpu.shared": [replicas[3]]})]),
    ]
    metadata = StaticPodMetadata([pod("team-a", "a", "uid-a"), pod("team-b", "b", "uid-b")])
    with serve(socket_path, Lister(podres, allocatable={"nvidia.com/gpu.shared": replicas})):
        _, (record,) = window(collector_for(socket_path, metadata))
    assert [(a.pod, a.gpu_indices) for a in record.assignments] == [("a", [1]), ("b", [1])]


def test_no_gpu_allocated_is_an_empty_list_not_silence(socket_path: Path) -> None:
    # A CPU-only pod lists no device: nothing is assigned, and the record says so.
    metadata = StaticPodMetadata([pod("team-a", "web", "uid-web", cpu="2")])
    with serve(socket_path, Lister([PodSpec("team-a", "web", [ContainerSpec("app", {})])])):
        _, records = window(collector_for(socket_path, metadata))
    assert [(r.node, r.assignments) for r in records] == [("gpu-node-1", [])]


def test_finished_pods_are_allocated_exactly_as_long_as_they_are_billed(socket_path: Path) -> None:
    """The kubelet keeps listing a finished pod's devices until the pod object is deleted, and the
    device plugin may hand them to the next pod meanwhile: from its end on, the pod is neither
    billed (samples.py) nor shown holding the GPU."""
    job = PodSpec("team-a", "job", [ContainerSpec("main", {GPU: [gpu_uuid(2)]})])
    with serve(socket_path, Lister([job])):
        running = pod("team-a", "job", "uid-job", gpus=1)
        collector = collector_for(socket_path, StaticPodMetadata([running]))
        samples, (record,) = window(collector)
        billed = [(s.pod, s.labels["gpu_index"]) for s in samples if s.kind == "gpu"]
        assert billed == [("job", "2")]
        assert [(a.pod, a.gpu_indices) for a in record.assignments] == [("job", [2])]
        done = pod("team-a", "job", "uid-job", phase="Succeeded", gpus=1)
        done["status"]["containerStatuses"] = [
            {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": END.isoformat()}}}
        ]
        collector.metadata = StaticPodMetadata([done])  # ended as the first window closed
        samples, (record,) = window(collector, END)  # the kubelet still lists its device
    assert [s for s in samples if s.kind == "gpu"] == []
    assert record.assignments == [] and record.at == END + timedelta(seconds=15)


def test_assignments_agree_with_the_gpu_samples_of_the_window(socket_path: Path) -> None:
    podres = [
        PodSpec("team-a", "trainer", [ContainerSpec("main", {GPU: [gpu_uuid(0), gpu_uuid(2)]})]),
        PodSpec("team-b", "notebook", [ContainerSpec("jupyter", {"nvidia.com/mig-1g.5gb": ["MIG-b"]})]),
    ]
    metadata = StaticPodMetadata(
        [pod("team-a", "trainer", "uid-t", gpus=2), pod("team-b", "notebook", "uid-n")]
    )
    with serve(socket_path, Lister(podres)):
        samples, (record,) = window(collector_for(socket_path, metadata))
    from_samples: dict[tuple[str, str], set[int]] = {}
    for sample in samples:
        if sample.kind == "gpu":
            from_samples.setdefault((sample.pod_uid, sample.labels["container"]), set()).add(
                int(sample.labels["gpu_index"])
            )
    from_record = {(a.pod_uid, a.container): set(a.gpu_indices) for a in record.assignments}
    assert from_record == from_samples == {("uid-t", "main"): {0, 2}, ("uid-n", "jupyter"): {3}}


def test_podresources_outage_reuses_the_last_list_then_publishes_nothing(socket_path: Path) -> None:
    podres = [PodSpec("team-a", "trainer", [ContainerSpec("main", {GPU: [gpu_uuid(1)]})])]
    metadata = StaticPodMetadata([pod("team-a", "trainer", "uid-t", gpus=1)])
    clock = Clock()
    lister = Lister(podres)
    with serve(socket_path, lister):
        collector = collector_for(socket_path, metadata, clock)
        _, (first,) = window(collector)
        lister.fail_list = grpc.StatusCode.UNAVAILABLE
        clock.now += 30  # within three 15 s intervals: the last good list stands
        _, (stale,) = window(collector, END)
        clock.now += 30  # 60 s since the last good list: unknown
        _, unknown = window(collector, END + timedelta(seconds=15))
        lister.fail_list = None
        clock.now += 15
        _, (back,) = window(collector, END + timedelta(seconds=30))
    assert stale.assignments == first.assignments == [
        GpuAssignment(namespace="team-a", pod="trainer", pod_uid="uid-t", container="main", gpu_indices=[1])
    ]
    assert stale.at == END + timedelta(seconds=15)
    # Unknown is not "all free": no record, so the last published one stands on the compacted topic.
    assert unknown == []
    assert back.assignments == first.assignments
    assert collector.source_errors["podresources"] == 2


def test_nothing_is_published_before_the_first_window() -> None:
    nvml = NvmlSource(nvml=board())
    nvml.start()
    collector = NodeCollector(
        cluster="prod",
        node="gpu-node-1",
        interval=15,
        nvml=nvml,
        allocations=Lister([]),  # never asked: no window collected yet
        metadata=StaticPodMetadata([]),
        proc_root=None,
    )
    assert collector.node_allocations() == []


# -- the publisher's allocation lane ------------------------------------------------------------------


def allocation(n: int, node: str = "gpu-node-1") -> NodeAllocation:
    """Window n of a node where pod p<n> holds GPU n % 8."""
    return NodeAllocation(
        cluster="prod",
        node=node,
        assignments=[GpuAssignment(namespace="t", pod=f"p{n}", pod_uid=f"u{n}", gpu_indices=[n % 8])],
        at=END + timedelta(seconds=15 * n),
    )


def publisher_for(broker: Broker, spool_dir: Path, clock: Clock) -> Publisher:
    return Publisher(
        KafkaSettings(topic_prefix="t."),
        Spool(spool_dir),
        producer_factory=broker.factory,
        send_timeout=0.1,
        retry_seconds=5.0,
        clock=clock,
    )


def test_allocations_go_to_their_topic_keyed_by_node_one_record_per_message(tmp_path: Path) -> None:
    broker = Broker()
    publisher = publisher_for(broker, tmp_path / "spool", Clock())
    for n in range(3):
        assert publisher.publish_allocation(allocation(n)).sent == 1
    sent = broker.on("allocation.v1")
    assert [topic for topic, _, _ in broker.log] == ["t.gpumeter.node.allocation.v1"] * 3
    assert [key for key, _ in sent] == [b"gpu-node-1"] * 3
    # Never joined into multi-line records: each message decodes as one NodeAllocation.
    assert [NodeAllocation.model_validate(jsonio.loads(value)) for _, value in sent] == [
        allocation(n) for n in range(3)
    ]
    assert publisher.allocation_spool is None  # nothing ever had to wait


def test_kafka_outage_spools_allocations_apart_and_replays_them_oldest_first(tmp_path: Path) -> None:
    broker = Broker()
    clock = Clock()
    spool_dir = tmp_path / "spool"
    publisher = publisher_for(broker, spool_dir, clock)
    publisher.publish_allocation(allocation(0))
    broker.up = broker.reachable = False
    for n in (1, 2):
        result = publisher.publish_allocation(allocation(n))
        assert (result.sent, result.spooled) == (0, 1)
    assert Spool(spool_dir).records == 0  # the samples spool holds samples only
    lane = publisher.allocation_spool
    assert lane is not None and lane.directory == spool_dir / ALLOCATION_SPOOL and lane.records == 2
    broker.up = broker.reachable = True
    publisher.publish_allocation(allocation(3))  # before the retry time: goes behind the backlog
    assert lane.records == 3
    clock.now += 10
    result = publisher.publish_allocation(allocation(4))
    assert (result.replayed, result.sent) == (3, 1) and lane.records == 0
    order = [NodeAllocation.model_validate(jsonio.loads(value)).at for _, value in broker.on("allocation.v1")]
    assert order == [allocation(n).at for n in range(5)]


def test_spooled_allocations_survive_an_agent_restart(tmp_path: Path) -> None:
    broker = Broker()
    broker.up = broker.reachable = False
    spool_dir = tmp_path / "spool"
    first = publisher_for(broker, spool_dir, Clock())
    first.publish_allocation(allocation(7))
    first.close()
    broker.up = broker.reachable = True
    second = publisher_for(broker, spool_dir, Clock())
    assert second.allocation_spool is not None and second.allocation_spool.records == 1
    second.publish_allocation(allocation(8))
    pods = [jsonio.loads(value)["assignments"][0]["pod"] for _, value in broker.on("allocation.v1")]
    assert pods == ["p7", "p8"]


def test_agent_loop_publishes_one_allocation_per_window_through_the_spool(
    socket_path: Path, tmp_path: Path
) -> None:
    """run_agent with Kafka unreachable: every window's record lands in the allocation spool."""
    podres = [PodSpec("team-a", "trainer", [ContainerSpec("main", {GPU: [gpu_uuid(0), gpu_uuid(1)]})])]
    metadata = StaticPodMetadata([pod("team-a", "trainer", "uid-t", cpu="1", gpus=2)])

    def no_kafka() -> Any:
        raise KafkaUnavailable("no Kafka broker answers at 127.0.0.1:1")

    spool_dir = tmp_path / "spool"
    publisher = Publisher(KafkaSettings(), Spool(spool_dir), producer_factory=no_kafka, retry_seconds=60)
    with serve(socket_path, Lister(podres)):
        nvml = NvmlSource(nvml=board())
        nvml.start()
        collector = node_rig.collector_over(nvml, socket_path, metadata, interval=1)
        config = AgentConfig(cluster="prod", node="gpu-node-1", interval=1, metrics_port=None)
        cycles = run_agent(
            Settings(data_dir=tmp_path),
            collector,
            config=config,
            stop=threading.Event(),
            max_cycles=2,
            publisher=publisher,
        )
    assert cycles == 2
    records = [
        NodeAllocation.model_validate(jsonio.loads(decode_message(payload)[1]))
        for payload in Spool(spool_dir / ALLOCATION_SPOOL).iter_records()
    ]
    assert len(records) == 2 and records[0].at < records[1].at
    assert all([(a.pod, a.gpu_indices) for a in r.assignments] == [("trainer", [0, 1])] for r in records)
    samples = [parse_sample(decode_message(payload)[1]) for payload in Spool(spool_dir).iter_records()]
    assert {s.kind for s in samples} == {"gpu", "cpu"}  # the samples spool: samples only
    assert {s.window_start for s in samples} == {r.at - timedelta(seconds=1) for r in records}
