"""The simulated fleet as a cluster the actuator acts on and a scheduler that asks an extender:
SimClusterGateway's answers (the API server's, for the actuator's calls) and the admission filter,
on a real SimulatedFleet."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

from collectors.sim.cluster_gateway import JSON_PATCH, MERGE_PATCH, SimClusterGateway
from collectors.sim.config import TenantSpec
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from collectors.sim.workload import Job
from gpumeter.core import jsonio
from gpumeter.core.kube import EVICTION_NOTICE_ANNOTATION

KEY = EVICTION_NOTICE_ANNOTATION.replace("/", "~1")


def small(seed: int = 3) -> SimulatedFleet:
    nodes = {"H100-SXM-80GB": 2, "L4-24GB": 1}
    return SimulatedFleet(FleetConfig(seed=seed, window_seconds=600, nodes=nodes))


def running(gateway: SimClusterGateway) -> list[dict[str, Any]]:
    return [p for p in gateway.pods() if p["status"]["phase"] == "Running"]


def test_pods_are_listed_as_the_api_server_would_with_their_node_and_gpus() -> None:
    fleet = small()
    fleet.submit("team-a", model="H100-SXM-80GB", gpus=2, duration_seconds=7200)
    fleet.step_dicts()
    gateway = SimClusterGateway(fleet)
    pods = running(gateway)
    assert {p["metadata"]["uid"] for p in pods} == {p["pod_uid"] for p in fleet.running_pods()}
    mine = [p for p in pods if p["metadata"]["namespace"] == "team-a"]
    assert any(p["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu") == "2"
               for p in mine)
    assert all(p["spec"]["nodeName"] for p in pods)
    assert {n["metadata"]["name"] for n in gateway.nodes()} == set(fleet.node_names())
    assert {ns["metadata"]["name"] for ns in gateway.namespaces()} == set(fleet.tenants())


def test_notice_patches_follow_the_api_servers_preconditions() -> None:
    fleet = small()
    fleet.step_dicts()
    gateway = SimClusterGateway(fleet)
    pod = running(gateway)[0]
    meta = pod["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
    notice = {"metadata": {"uid": uid, "annotations": {EVICTION_NOTICE_ANNOTATION: "n1"}}}
    successor = {"metadata": {"uid": "someone-else", "annotations": {}}}
    assert gateway.patch_pod(ns, name, successor, MERGE_PATCH) == 422
    assert gateway.patch_pod(ns, name, notice, MERGE_PATCH) == 200
    assert (gateway.pod(ns, name) or {})["metadata"]["annotations"] == {EVICTION_NOTICE_ANNOTATION: "n1"}
    stale = [{"op": "test", "path": f"/metadata/annotations/{KEY}", "value": "n0"},
             {"op": "remove", "path": f"/metadata/annotations/{KEY}"}]
    assert gateway.patch_pod(ns, name, stale, JSON_PATCH) == 422
    stale[0]["value"] = "n1"
    assert gateway.patch_pod(ns, name, stale, JSON_PATCH) == 200
    assert (gateway.pod(ns, name) or {})["metadata"]["annotations"] == {}
    assert gateway.patch_pod(ns, "no-such-pod", notice, MERGE_PATCH) == 404


def test_an_eviction_ends_the_pod_and_its_metering() -> None:
    fleet = small()
    fleet.submit("team-a", model="H100-SXM-80GB", gpus=1, duration_seconds=86_400)
    fleet.step_dicts()
    gateway = SimClusterGateway(fleet)
    pod = next(p for p in running(gateway) if p["metadata"]["namespace"] == "team-a")
    meta = pod["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
    assert gateway.evict(ns, name, "another-uid")[0] == 409
    assert gateway.evict(ns, name, uid)[0] == 201
    assert (gateway.pod(ns, name) or {})["metadata"]["deletionTimestamp"]
    samples = fleet.step_dicts()
    assert all(s["pod_uid"] != uid for s in samples)
    assert gateway.pod(ns, name) is None
    assert gateway.evict(ns, name, uid)[0] == 404


def test_an_eviction_dated_by_a_clock_bills_the_pod_up_to_that_moment() -> None:
    # A fleet stepped in real time: the eviction lands 150 s into the 600 s window being metered,
    # so that window's sample bills a quarter of the GPU, and none follows.
    fleet = small()
    uid = fleet.submit("team-a", model="H100-SXM-80GB", gpus=1, duration_seconds=86_400)
    fleet.step_dicts()  # window 0 placed the pod; the fleet's clock is now window 1's start
    moment = fleet.clock + timedelta(seconds=149, microseconds=200_000)  # rounded up to 150 s
    gateway = SimClusterGateway(fleet, clock=lambda: moment)
    pod = next(p for p in gateway.pods("team-a") if p["metadata"]["uid"] == uid)
    assert gateway.evict("team-a", pod["metadata"]["name"], uid)[0] == 201
    assert gateway.evicted[uid] == moment and gateway.evicted_namespace[uid] == "team-a"
    window = [s for s in fleet.step_dicts() if s["pod_uid"] == uid and s["kind"] == "gpu"]
    assert [Decimal(s["quantity"]) for s in window] == [Decimal("0.25")]
    assert uid not in {p["pod_uid"] for p in fleet.running_pods()}
    assert all(s["pod_uid"] != uid for s in fleet.step_dicts())
    assert fleet.stats.jobs_evicted == 1


def test_an_eviction_dated_before_the_window_ends_the_pod_before_it() -> None:
    fleet = small()
    uid = fleet.submit("team-a", model="H100-SXM-80GB", gpus=1, duration_seconds=86_400)
    fleet.step_dicts()
    before = fleet.clock - timedelta(seconds=30)  # asked in the window already metered
    assert fleet.evict(uid, before)
    assert all(s["pod_uid"] != uid for s in fleet.step_dicts())


def test_pods_of_one_namespace_are_only_that_tenants() -> None:
    fleet = small()
    fleet.submit("team-a", model="H100-SXM-80GB", gpus=1, duration_seconds=86_400)
    fleet.step_dicts()
    gateway = SimClusterGateway(fleet)
    mine = gateway.pods("team-a")
    assert mine and {p["metadata"]["namespace"] for p in mine} == {"team-a"}
    assert {p["metadata"]["uid"] for p in mine} == {
        p["metadata"]["uid"] for p in gateway.pods() if p["metadata"]["namespace"] == "team-a"}


def test_the_admission_filter_holds_refused_pods_and_they_are_placed_once_passed() -> None:
    fleet = small()
    refused: list[str] = []
    allow = {"value": False}

    def admit(job: Job, names: Sequence[str]) -> Sequence[str]:
        if job.tenant == "team-a" and not allow["value"]:
            refused.append(job.pod_uid)
            return []
        return names

    fleet.set_admission_filter(admit)
    uid = fleet.submit("team-a", model="H100-SXM-80GB", gpus=1, duration_seconds=86_400)
    fleet.step_dicts()
    fleet.step_dicts()
    assert uid in refused and uid not in {p["pod_uid"] for p in fleet.running_pods()}
    waiting = SimClusterGateway(fleet).unscheduled_pods()
    assert uid in {p["metadata"]["uid"] for p in waiting}
    allow["value"] = True  # nothing else changes: the refused pod is asked about again anyway
    fleet.step_dicts()
    assert uid in {p["pod_uid"] for p in fleet.running_pods()}


def test_a_pod_refused_by_the_filter_holds_no_room_for_itself() -> None:
    # Issue 33: in the demo a blocked tenant's refused whole-GPU pods waited past
    # reserve_after_seconds and so stopped backfill on their model, for as long as the block
    # lasted: the idle pods' successors after a spot reclaim (another tenant, room free) stayed
    # pending. kube-scheduler holds nothing for a pod its extender refuses; the reservation is
    # for a pod starving for room.
    fleet = SimulatedFleet(FleetConfig(seed=3, window_seconds=600, nodes={"L40S-48GB": 1},
                                       tenants=(TenantSpec("team-a", 0.0), TenantSpec("research", 0.0)),
                                       warm_start_jobs=0, spot_reclaims_per_day=0.0,
                                       agent_outages_per_day=0.0, reserve_after_seconds=600))
    fleet.set_admission_filter(lambda job, names: [] if job.tenant == "team-a" else names)
    refused = fleet.submit("team-a", model="L40S-48GB", gpus=1, duration_seconds=86_400)
    for _ in range(3):  # refused for three windows: past reserve_after_seconds
        fleet.step_dicts()
    later = fleet.submit("research", model="L40S-48GB", gpus=1, duration_seconds=86_400)
    fleet.step_dicts()
    running = {p["pod_uid"] for p in fleet.running_pods()}
    assert refused not in running
    assert later in running, "a refused pod reserved its model: the next pod waits with the node free"


def test_a_pod_waiting_for_room_still_reserves_its_model() -> None:
    # The reservation itself stays: an 8-GPU pod waiting for room past reserve_after_seconds
    # keeps a later 1-GPU pod of its model off the GPUs that free up before all 8 do.
    fleet = SimulatedFleet(FleetConfig(seed=3, window_seconds=600, nodes={"H100-SXM-80GB": 1},
                                       mig_gpus_per_node={}, tenants=(TenantSpec("team-a", 0.0),),
                                       warm_start_jobs=0, spot_reclaims_per_day=0.0,
                                       agent_outages_per_day=0.0, reserve_after_seconds=600))
    fleet.set_admission_filter(lambda job, names: names)
    fleet.submit("team-a", model="H100-SXM-80GB", gpus=4, duration_seconds=86_400)
    fleet.submit("team-a", model="H100-SXM-80GB", gpus=4, duration_seconds=1800)  # ends in window 2
    fleet.step_dicts()
    big = fleet.submit("team-a", model="H100-SXM-80GB", gpus=8, duration_seconds=3600)
    fleet.step_dicts()
    fleet.step_dicts()  # big has waited a window: its model is reserved; 4 GPUs free at the end
    small = fleet.submit("team-a", model="H100-SXM-80GB", gpus=1, duration_seconds=3600)
    fleet.step_dicts()
    running = {p["pod_uid"] for p in fleet.running_pods()}
    assert big not in running and small not in running
    assert fleet.stats.queued == 2


def test_a_filter_passing_everything_changes_nothing() -> None:
    plain, asked = small(9), small(9)
    asked.set_admission_filter(lambda job, names: names)
    for _ in range(30):
        assert jsonio.dumps(plain.step_dicts()) == jsonio.dumps(asked.step_dicts())
