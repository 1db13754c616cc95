"""The demo's scheduler asking the extender's policy: every kind of GPU pod the fleet runs (whole
GPUs, MIG devices, time-sliced replicas) of a blocked tenant is refused, as kube-scheduler's
extender call would be answered (the request collectors/sim/extender_client.py sends, the
answer scheduler_hooks/extender/wire_kube.py gives).

Issue 33: in the demo the block tenant team-b went on starting MIG pods hours after its daily
gpu_hours crossing: a MIG pod asks ``nvidia.com/mig-<profile>``, not ``nvidia.com/gpu``, and the
policy let every pod asking no ``nvidia.com/gpu`` through.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from collectors.sim.config import TenantSpec
from collectors.sim.extender_client import filter_args
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from collectors.sim.workload import Job
from scheduler_hooks.cluster.placement import PlacementIndex
from scheduler_hooks.cluster.state import ClusterView
from scheduler_hooks.extender.policy import Policy
from scheduler_hooks.extender.wire_kube import handle_filter

MESSAGE = "gpumeter: tenant team-b over gpu_hours quota"


def test_a_blocked_tenant_gets_no_pod_of_any_gpu_kind_placed_and_others_do() -> None:
    config = FleetConfig(seed=5, window_seconds=600, nodes={"H100-SXM-80GB": 2, "L4-24GB": 1},
                         mig_gpus_per_node={"H100-SXM-80GB": 2}, time_sliced_nodes={"L4-24GB": 1},
                         tenants=(TenantSpec("team-a", 0.0), TenantSpec("team-b", 0.0)), warm_start_jobs=0,
                         spot_reclaims_per_day=0.0, agent_outages_per_day=0.0)
    fleet = SimulatedFleet(config)
    policy = Policy(ClusterView(placement=PlacementIndex(), blocked={"team-b": "gpu_hours"}))
    answers: dict[str, dict[str, object]] = {}

    def admit(job: Job, names: Sequence[str]) -> Sequence[str]:
        args = filter_args(job, names, config.start, config.window_seconds)
        answer = json.loads(handle_filter(args, policy))
        answers[job.pod_uid] = answer
        return answer["NodeNames"]

    fleet.set_admission_filter(admit)
    kinds = {
        "whole": {"model": "H100-SXM-80GB", "gpus": 1},
        "mig": {"model": "H100-SXM-80GB", "request": "mig", "mig_profile": "1g.10gb"},
        "shared": {"model": "L4-24GB", "request": "shared"},
    }
    submitted = {(tenant, kind): fleet.submit(tenant, duration_seconds=7200, **spec)  # type: ignore[arg-type]
                 for tenant in ("team-a", "team-b") for kind, spec in kinds.items()}
    fleet.step_dicts()
    fleet.step_dicts()
    running = {pod["pod_uid"] for pod in fleet.running_pods()}
    for (tenant, kind), uid in submitted.items():
        if tenant == "team-a":
            assert uid in running, f"team-a's {kind} pod was not placed"
        else:
            assert uid not in running, f"blocked team-b's {kind} pod was placed"
            refused = answers[uid]["FailedAndUnresolvableNodes"]
            assert isinstance(refused, dict) and refused and set(refused.values()) == {MESSAGE}, kind
