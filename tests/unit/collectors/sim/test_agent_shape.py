"""The simulated fleet's samples have the node agent's shape: the same inputs through the agent's
SampleBuilder (collectors/agent/samples.py) and through collectors/sim/samples.py give the same
samples, field for field, but for the simulator's ``gpumeter.io/source`` label.

One node-window holds every case the fleet produces: a whole GPU held by one pod, a MIG device,
a GPU time-sliced by two pods, a replica held alone, a pod that finished at 40 % of the window
(with a PVC, billed whole), and a backfilled window (no readings, no usage).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from collectors.agent.kubelet_stats import NodeStats, PodUsage
from collectors.agent.nvml_inventory import GpuInfo, MigInstance
from collectors.agent.nvml_telemetry import DeviceReading, ProcessMemory
from collectors.agent.podmeta import ClaimInfo, PodInfo, Requests
from collectors.agent.podresources import DeviceAllocation
from collectors.agent.samples import SampleBuilder
from collectors.sim.samples import (
    BACKFILL_LABEL,
    SOURCE_LABEL,
    Device,
    HostUsage,
    PodIdentity,
    PodSampler,
    Reading,
    event_id,
    held_fraction,
)
from gpumeter.core import jsonio

GIB = 2**30
CLUSTER, NODE, MODEL = "sim-cluster", "h100-node-00", "H100-SXM-80GB"
START = datetime(2026, 11, 2, tzinfo=UTC)
END = START + timedelta(seconds=600)
GPU = [f"GPU-{i}000" for i in range(5)]
MIG = "MIG-1111"
PVC_UID = "pvc-uid-f"


def gpu_info(index: int, mig: bool = False) -> GpuInfo:
    instances: tuple[MigInstance, ...] = ()
    if mig:
        instances = (
            MigInstance(
                uuid=MIG, parent_uuid=GPU[index], parent_index=index, mig_index=2, profile="2g.20gb",
                gpu_instance_id=3, compute_instance_id=0, memory_total_bytes=20 * GIB, slices=2,
                share=Decimal(2) / Decimal(7),
            ),
        )
    return GpuInfo(
        index=index, uuid=GPU[index], name="NVIDIA H100 80GB HBM3", model=MODEL, memory_total_bytes=80 * GIB,
        pci_bus_id=None, numa_node=0, mig_enabled=mig, mig_instances=instances, mig_slices=7 if mig else None,
    )


GPUS = {GPU[i]: gpu_info(i, mig=i == 1) for i in range(5)}


def lookup(uuid: str) -> tuple[GpuInfo, MigInstance | None] | None:
    if uuid == MIG:
        return GPUS[GPU[1]], GPUS[GPU[1]].mig_instances[0]
    return (GPUS[uuid], None) if uuid in GPUS else None


def pod(name: str, *, finished: datetime | None = None, cpu: str = "2", memory_gib: int = 4,
        pvc: tuple[str, ...] = ()) -> PodInfo:
    return PodInfo(
        uid=f"uid-{name}", namespace="team-a", name=name, node=NODE,
        phase="Succeeded" if finished else "Running", tenant="team-a", priority=100,
        capacity_type="spot", start_time=START - timedelta(hours=1),
        requests=Requests(Decimal(cpu), Decimal(memory_gib * GIB), Decimal(10 * GIB)),
        pvc_claims=pvc, finish_time=finished,
    )


FINISH = START + timedelta(seconds=240)  # 40 % of the window
PODS = [pod("a"), pod("b"), pod("c"), pod("d"), pod("e"), pod("f", finished=FINISH, pvc=("data-f",))]


def allocation(name: str, device_id: str, uuid: str, share: Decimal = Decimal(1),
               resource: str = "nvidia.com/gpu", profile: str | None = None) -> DeviceAllocation:
    return DeviceAllocation(namespace="team-a", pod=name, container="main", resource_name=resource,
                            device_id=device_id, device_uuid=uuid, mig_profile=profile, share=share)


QUARTER = Decimal(1) / Decimal(4)
ALLOCATIONS = [
    allocation("a", GPU[0], GPU[0]),
    allocation("b", MIG, MIG, resource="nvidia.com/mig-2g.20gb", profile="2g.20gb"),
    allocation("c", f"{GPU[2]}::0", GPU[2], QUARTER),
    allocation("d", f"{GPU[2]}::1", GPU[2], QUARTER),
    allocation("e", f"{GPU[3]}::0", GPU[3], QUARTER),
    allocation("f", GPU[4], GPU[4]),
]
READINGS = {
    GPU[0]: DeviceReading(GPU[0], 0, Decimal("0.83"), 40 * GIB, Decimal("518.7"), Decimal("311220")),
    MIG: DeviceReading(MIG, 1, None, 5 * GIB),
    GPU[2]: DeviceReading(GPU[2], 2, Decimal("0.5"), 9 * GIB, Decimal("300"), Decimal("180000"),
                          processes=(ProcessMemory(11, 3 * GIB), ProcessMemory(12, 6 * GIB))),
    GPU[3]: DeviceReading(GPU[3], 3, Decimal("0.2"), GIB, Decimal("150.5"), Decimal("90300")),
    GPU[4]: DeviceReading(GPU[4], 4, Decimal("0.9"), 70 * GIB, Decimal("600"), Decimal("360000")),
}
USAGE = {
    "a": (Decimal("2.3"), 3 * GIB),  # a CPU burst over the request bills the usage
    "b": (Decimal("1"), 5 * GIB),  # memory over the request bills the working set
    "c": (Decimal("0.5"), GIB), "d": (Decimal("0.5"), GIB), "e": (Decimal("0.5"), GIB),
    "f": (Decimal("1.5"), 2 * GIB),
}
CLAIM = ClaimInfo(PVC_UID, "team-a", "data-f", Decimal(500 * GIB))


def agent_samples(backfill: bool) -> list[dict[str, Any]]:
    builder = SampleBuilder(CLUSTER, NODE, 600)
    stats = None
    if not backfill:
        stats = NodeStats(NODE, {
            f"uid-{name}": PodUsage(f"uid-{name}", "team-a", name, cpu, memory, 0)
            for name, (cpu, memory) in USAGE.items()
        })
    samples = builder.build(
        window_start=START, window_end=END, pods=PODS, allocations=ALLOCATIONS, device_lookup=lookup,
        readings={} if backfill else READINGS, node_stats=stats,
        claim_lookup=lambda namespace, name: CLAIM if name == "data-f" else None,
        pid_pods={11: "uid-c", 12: "uid-d"},
    )
    assert builder.stats.invalid == 0
    out = [jsonio.loads(jsonio.dumps(sample.model_dump())) for sample in samples]
    if backfill:  # what collectors.agent.collector.NodeCollector.backfill adds
        for sample in out:
            sample["labels"][BACKFILL_LABEL] = "true"
    return out


def six(value: Decimal | int) -> str:
    return str(Decimal(value).quantize(Decimal("0.000001")))


def sim_samples(backfill: bool) -> list[dict[str, Any]]:
    """The same node-window written with the simulator's builders (readings spelled as strings)."""
    begin = 0
    started = -3600
    devices = {
        "a": Device(0, GPU[0], GPU[0], "whole", Decimal(1), 80 * GIB),
        "b": Device(1, MIG, MIG, "mig", Decimal(2) / Decimal(7), 20 * GIB, "2g.20gb"),
        "c": Device(2, f"{GPU[2]}::0", GPU[2], "shared", QUARTER, 20 * GIB),
        "d": Device(2, f"{GPU[2]}::1", GPU[2], "shared", QUARTER, 20 * GIB),
        "e": Device(3, f"{GPU[3]}::0", GPU[3], "shared", QUARTER, 20 * GIB),
        "f": Device(4, GPU[4], GPU[4], "whole", Decimal(1), 80 * GIB),
    }
    readings = {
        "a": Reading(six(Decimal("0.83")), six(40 * GIB), six(Decimal("518.7")), six(311220)),
        "b": Reading(memory_used_bytes=six(5 * GIB)),
        "c": Reading(memory_used_bytes=six(3 * GIB)),
        "d": Reading(memory_used_bytes=six(6 * GIB)),
        "e": Reading(six(Decimal("0.2")), six(GIB), six(Decimal("150.5")), six(90300)),
        "f": Reading(six(Decimal("0.9")), six(70 * GIB), six(600), six(360000)),
    }
    out: list[dict[str, Any]] = []
    for info in PODS:
        name = info.name
        identity = PodIdentity("team-a", "team-a", name, info.uid, "spot", 100)
        sampler = PodSampler(
            CLUSTER, NODE, MODEL, identity, (devices[name],), cpu_request=Decimal(2), memory_request=4 * GIB,
            ephemeral_gib=Decimal(10), pvc=(PVC_UID, "data-f", Decimal(500)) if name == "f" else None,
        )
        finished = 240 if name == "f" else None
        fraction = held_fraction(started, finished, begin, 600)
        cpu, memory = USAGE[name]
        usage = HostUsage() if backfill else HostUsage(cpu, memory)
        out.extend(sampler.window(START.isoformat(), END.isoformat(), fraction,
                                  None if backfill else [readings[name]], usage, backfill))
    return out


def without_source(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for sample in samples:
        assert sample["labels"].pop(SOURCE_LABEL) == "simulated"
        out.append(sample)
    return out


def by_id(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table = {sample["event_id"]: sample for sample in samples}
    assert len(table) == len(samples)
    return table


def test_a_window_of_every_device_kind_matches_the_agent() -> None:
    agent = by_id(agent_samples(backfill=False))
    sim = by_id(without_source(sim_samples(backfill=False)))
    assert sim == agent
    # The figures themselves, by hand: the agent is the reference, but not an unchecked one.
    gpu = {s["pod"]: s for s in agent.values() if s["kind"] == "gpu"}
    assert gpu["b"]["quantity"] == "0.285714285714" and gpu["b"]["utilization"] is None  # 2/7, MIG
    assert gpu["c"]["quantity"] == "0.250000000000" and gpu["c"]["power_watts"] is None  # shared by 2
    assert gpu["c"]["memory_used_bytes"] == six(3 * GIB)  # its own processes
    assert gpu["e"]["utilization"] == "0.200000"  # a replica held alone: the GPU's reading
    assert gpu["f"]["quantity"] == "0.400000000000"  # finished at 40 %
    pvc = [s for s in agent.values() if s["labels"].get("pvc") == "data-f"]
    assert len(pvc) == 1 and pvc[0]["quantity"] == "500.000000000000"  # a claim bills whole
    cpu_f = next(s for s in agent.values() if s["pod"] == "f" and s["kind"] == "cpu")
    assert cpu_f["quantity"] == "0.800000000000"  # request 2 x 0.4


def test_event_ids_are_the_agents() -> None:
    from collectors.agent.samples import event_id as agent_event_id

    for args in (("c", "n", "uid", "gpu", f"{GPU[2]}::3"), ("c", "", "", "storage", "pvc:x")):
        assert event_id(*args, START.isoformat()) == agent_event_id(*args, START)


def test_a_backfilled_window_matches_the_agent() -> None:
    agent = by_id(agent_samples(backfill=True))
    sim = by_id(without_source(sim_samples(backfill=True)))
    assert sim == agent
    assert all(s["utilization"] is None and s["memory_used_bytes"] is None for s in agent.values())
