"""The jobs (pods) tenants submit to the simulated fleet: what each asks for and how it behaves.

Tenants submit jobs as a Poisson process per window with a daily and weekly rhythm
(collectors/sim/rhythm.py); a job asks for 1, 2, 4 or 8 whole GPUs of one model, one MIG device
of a profile (1-slice profiles most often), or one time-sliced replica, and runs a log-uniform
number of seconds with a workload's utilization and memory (collectors/sim/fleet.py has the model).
Every draw comes from the fleet's job stream (``random.Random(seed)``), in submission order.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from collectors.sim.config import FleetConfig, TenantSpec
from collectors.sim.hardware import GPU_SPECS, MigProfile
from collectors.sim.rhythm import arrival_factor
from collectors.sim.samples import Device, PodSampler

if TYPE_CHECKING:
    from collectors.sim.scheduler import Node

WHOLE_SIZES: tuple[int, ...] = (1, 2, 4, 8)

# Job duration ranges (minutes of simulated time, log-uniform) per workload.
DURATION_MINUTES: dict[str, tuple[float, float]] = {
    "train": (20.0, 720.0),
    "infer": (60.0, 720.0),
    "notebook": (10.0, 240.0),
}
# Base GPU utilization (percent) per workload; each window adds +-6 points of jitter.
BASE_UTILIZATION: dict[str, tuple[int, int]] = {
    "train": (55, 97),
    "infer": (15, 70),
    "notebook": (0, 35),
}
GPU_MEMORY_PERCENT: dict[str, tuple[int, int]] = {
    "train": (60, 95),
    "infer": (30, 80),
    "notebook": (5, 50),
}
# CPU used as a percentage of the request (above 100: a burst over the request, which bills),
# and host memory working set as a percentage of the request; each window adds jitter.
CPU_PERCENT: tuple[int, int] = (30, 115)
HOST_MEMORY_PERCENT: tuple[int, int] = (40, 95)
EPHEMERAL_GIB: tuple[int, ...] = (10, 20, 50, 100)
PVC_GIB: tuple[int, ...] = (100, 250, 500, 1000, 2000)
PVC_SHARE = 0.7  # training and inference jobs that mount a data volume
SMALL_CPU_CORES: tuple[Decimal, ...] = (Decimal("0.5"), Decimal("1"), Decimal("2"))
SMALL_MEMORY_GIB: tuple[Decimal, ...] = (Decimal("4"), Decimal("8"), Decimal("16"))
# Which MIG profile a MIG job asks for, by the profile's compute slices: small ones most often.
MIG_PROFILE_WEIGHTS: dict[int, float] = {1: 0.6, 2: 0.25, 3: 0.15}

Request = Literal["whole", "mig", "shared"]


@dataclass(slots=True)
class Job:
    number: int
    tenant: str
    workload: str
    model: str
    request: Request
    gpus: int  # whole GPUs; 1 device for a MIG or shared request
    mig_profile: MigProfile | None
    duration: int  # seconds
    priority: int
    base_util: int
    gpu_mem_percent: int
    cpu_percent: int
    host_mem_percent: int
    cpu: Decimal
    memory_gib: Decimal
    ephemeral_gib: Decimal
    pvc: tuple[str, str, Decimal] | None
    pod: str
    pod_uid: str
    submitted: int  # window index
    # Set at placement.
    node: Node | None = None
    devices: tuple[Device, ...] = ()
    slots: tuple[int, ...] = ()  # per device: its MIG layout slot or replica number (0 for a whole GPU)
    started: int = 0  # seconds since the fleet's start
    end_window: int = 0  # the window in which the pod ends
    sampler: PodSampler | None = None
    idle: bool = False  # holds its GPUs and computes nothing (utilization 0): what idle advice finds

    @property
    def finished(self) -> int:
        return self.started + self.duration

    @property
    def gpu_indices(self) -> list[int]:
        return sorted({device.index for device in self.devices})


class Workload:
    """Draws the jobs tenants submit; numbers them and names their pods (``pod_uid`` is
    ``uuid5(namespace, "job/<n>")``)."""

    def __init__(
        self, config: FleetConfig, uid_namespace: uuid.UUID, capacity: Mapping[Request, dict[str, int]],
        max_whole: Mapping[str, int],
    ) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._uid_namespace = uid_namespace
        self._tenants = config.tenant_specs
        self._seconds = config.window_seconds
        self._whole_capacity = capacity["whole"]
        self._mig_capacity = capacity["mig"]
        self._shared_capacity = capacity["shared"]
        self._max_whole = max_whole
        self._job_counter = 0

    def arrivals(self, index: int, start: datetime) -> list[Job]:
        """The jobs submitted in window ``index`` (window 0 adds ``warm_start_jobs`` per tenant)."""
        rng = self._rng
        hours = self._seconds / 3600.0
        factor = arrival_factor(start, self.config.start) if self.config.diurnal else 1.0
        jobs: list[Job] = []
        for tenant in self._tenants:
            count = _poisson(rng, tenant.arrivals_per_hour * hours * factor)
            if index == 0:
                count += self.config.warm_start_jobs
            for _ in range(count):
                jobs.append(self._new_job(tenant, index))
        return jobs

    def explicit(
        self, tenant: str, index: int, *, model: str, duration_seconds: int, request: Request, gpus: int,
        mig_profile: str | None, priority: int, cpu: Decimal, memory_gib: Decimal, ephemeral_gib: Decimal,
        pvc_gib: Decimal | None,
    ) -> Job:
        """One job asked for by name (SimulatedFleet.submit); ValueError for one it cannot describe."""
        spec = GPU_SPECS[model]
        profile = None
        if request == "mig":
            profile = next((p for p in spec.mig_profiles if p.name == mig_profile), None)
            if profile is None:
                raise ValueError(f"{model} has no MIG profile {mig_profile!r} in the simulator")
        if duration_seconds < 1 or gpus < 1 or (request != "whole" and gpus != 1):
            raise ValueError("duration_seconds and gpus must be >= 1 (gpus = 1 unless whole GPUs)")
        self._job_counter += 1
        number = self._job_counter
        pvc = None
        if pvc_gib is not None:
            pvc = (str(uuid.uuid5(self._uid_namespace, f"pvc/{number}")), f"data-{number:06d}", pvc_gib)
        return self._job(
            number, tenant, "train" if request == "whole" else "notebook", model, request, gpus, profile,
            duration_seconds, priority, index, base_util=50, gpu_mem_percent=50, cpu_percent=100,
            host_mem_percent=50, cpu=cpu, memory_gib=memory_gib, ephemeral_gib=ephemeral_gib, pvc=pvc,
        )

    def recreated(self, job: Job, remaining: int, index: int) -> Job:
        """The pod's controller recreates it: a new pod (name, UID) for the rest of the run, same volume."""
        self._job_counter += 1
        successor = self._job(
            self._job_counter, job.tenant, job.workload, job.model, job.request, job.gpus, job.mig_profile,
            remaining, job.priority, index, base_util=job.base_util, gpu_mem_percent=job.gpu_mem_percent,
            cpu_percent=job.cpu_percent, host_mem_percent=job.host_mem_percent, cpu=job.cpu,
            memory_gib=job.memory_gib, ephemeral_gib=job.ephemeral_gib, pvc=job.pvc,
        )
        successor.idle = job.idle  # the same program: idle again
        return successor

    def _request(self, rng: random.Random, tenant: TenantSpec) -> Request:
        draw = rng.random()
        if draw < tenant.mig_share and self._mig_capacity:
            return "mig"
        if draw < tenant.mig_share + tenant.shared_share and self._shared_capacity:
            return "shared"
        if self._whole_capacity:
            return "whole"
        return "mig" if self._mig_capacity else "shared"

    def _new_job(self, tenant: TenantSpec, index: int) -> Job:
        rng = self._rng
        inference = rng.random() < tenant.inference_share
        request = self._request(rng, tenant)
        profile: MigProfile | None = None
        gpus = 1
        if request == "whole":
            model = _weighted(rng, self._whole_capacity)
            spec = GPU_SPECS[model]
            # Never ask for more whole GPUs than one node of the model has.
            largest = self._max_whole[model]
            weights = {
                size: weight
                for size, weight in zip(WHOLE_SIZES, tenant.size_weights, strict=True)
                if size <= largest and weight > 0
            }
            gpus = _weighted(rng, weights) if weights else max(s for s in WHOLE_SIZES if s <= largest)
        elif request == "mig":
            model = _weighted(rng, self._mig_capacity)
            spec = GPU_SPECS[model]
            profile = _weighted(rng, {p: MIG_PROFILE_WEIGHTS.get(p.slices, 0.1) for p in spec.mig_profiles})
        else:
            model = _weighted(rng, self._shared_capacity)
            spec = GPU_SPECS[model]
        workload = "infer" if inference else "train" if request == "whole" else "notebook"
        low, high = DURATION_MINUTES[workload]
        duration = max(1, round(math.exp(rng.uniform(math.log(low), math.log(high))) * 60.0))
        priority = _weighted(rng, tenant.priorities or self.config.priorities)
        if request == "whole":
            share = rng.randint(2, 4)
            cpu = Decimal(max(1, gpus * spec.host_cores_per_gpu * share // 4))
            memory = Decimal(max(1, gpus * spec.host_memory_gib_per_gpu * share // 4))
        else:
            cpu = rng.choice(SMALL_CPU_CORES)
            memory = rng.choice(SMALL_MEMORY_GIB)
        self._job_counter += 1
        number = self._job_counter
        pvc = None
        if workload != "notebook" and rng.random() < PVC_SHARE:
            claim_uid = str(uuid.uuid5(self._uid_namespace, f"pvc/{number}"))
            pvc = (claim_uid, f"data-{number:06d}", Decimal(rng.choice(PVC_GIB)))
        return self._job(
            number, tenant.name, workload, model, request, gpus, profile, duration, priority, index,
            base_util=rng.randint(*BASE_UTILIZATION[workload]),
            gpu_mem_percent=rng.randint(*GPU_MEMORY_PERCENT[workload]),
            cpu_percent=rng.randint(*CPU_PERCENT),
            host_mem_percent=rng.randint(*HOST_MEMORY_PERCENT),
            cpu=cpu, memory_gib=memory, ephemeral_gib=Decimal(rng.choice(EPHEMERAL_GIB)), pvc=pvc,
        )

    def _job(
        self, number: int, tenant: str, workload: str, model: str, request: Request, gpus: int,
        profile: MigProfile | None, duration: int, priority: int, submitted: int, **host: Any,
    ) -> Job:
        pod_uid = str(uuid.uuid5(self._uid_namespace, f"job/{number}"))
        return Job(
            number=number, tenant=tenant, workload=workload, model=model, request=request, gpus=gpus,
            mig_profile=profile, duration=duration, priority=priority,
            pod=f"{workload}-{number:06d}-{pod_uid[:5]}", pod_uid=pod_uid, submitted=submitted, **host,
        )


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method: fine for the small per-window means the fleet uses."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit = math.exp(-mean)
    count = 0
    product = rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


_K = TypeVar("_K")


def _weighted(rng: random.Random, weights: Mapping[_K, float]) -> _K:
    keys = list(weights)
    return rng.choices(keys, weights=[float(weights[k]) for k in keys])[0]
