"""The simulated fleet's realism, one feature at a time, on scripted fleets (no random arrivals,
no random events): time-slicing, MIG profiles, pods ending inside a window, spot reclaims and
agent outages. Expected figures are written by hand or derived from a second, undisturbed run
of the same fleet, never read back from the code under test.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from collectors.agent.samples import event_id as agent_event_id
from collectors.sim.fleet import FleetConfig, SimulatedFleet, TenantSpec

START = datetime(2026, 11, 2, tzinfo=UTC)
W = 600


def quiet(**overrides: Any) -> FleetConfig:
    """One tenant that submits nothing by itself, no events, no MIG, no time-slicing unless asked."""
    base: dict[str, Any] = {
        "seed": 1, "window_seconds": W, "start": START, "diurnal": False, "warm_start_jobs": 0,
        "tenants": (TenantSpec("solo", arrivals_per_hour=0.0),),
        "mig_gpus_per_node": {}, "time_sliced_nodes": {},
        "spot_reclaims_per_day": 0.0, "agent_outages_per_day": 0.0,
    }
    base.update(overrides)
    return FleetConfig(**base)


def at(index: int) -> str:
    return (START + timedelta(seconds=W * index)).isoformat()


def gpu(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in samples if s["kind"] == "gpu"]


def of_pod(samples: list[dict[str, Any]], uid: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [s for s in samples if s["pod_uid"] == uid and (kind is None or s["kind"] == kind)]


# ---------------------------------------------------------------- time-slicing


def test_a_gpu_time_sliced_four_ways_bills_a_quarter_to_each_pod() -> None:
    fleet = SimulatedFleet(quiet(nodes={"L4-24GB": 1}, gpus_per_node_by_model={"L4-24GB": 1},
                                 time_sliced_nodes={"L4-24GB": 1}, time_slice_replicas=4))
    uids = [
        fleet.submit("solo", model="L4-24GB", request="shared", duration_seconds=10 * W) for _ in range(5)
    ]
    samples = fleet.step_dicts()
    (gpu_uuid,) = [g.uuid for g in fleet.topology()[0].gpus]
    placed = {s["pod_uid"] for s in gpu(samples)}
    assert placed == set(uids[:4])  # four replicas; the fifth pod waits
    assert {s["quantity"] for s in gpu(samples)} == {"0.250000000000"}
    # The kubelet's replica IDs <uuid>::0 .. ::3 are what the agent's event ids are made of.
    expected_ids = {
        agent_event_id("sim-cluster", "l4-node-00", uid, "gpu", f"{gpu_uuid}::{n}", START)
        for n, uid in enumerate(uids[:4])
    }
    assert {s["event_id"] for s in gpu(samples)} == expected_ids
    for sample in gpu(samples):
        # Shared by four pods: no utilization nor power is any one pod's; its own memory only.
        assert sample["utilization"] is None and sample["power_watts"] is None
        assert sample["energy_joules"] is None and sample["memory_used_bytes"] is not None
        assert sample["labels"]["gpu_uuid"] == gpu_uuid and sample["labels"]["gpu_index"] == "0"
    (record,) = fleet.allocations()
    assert sorted(a.pod_uid for a in record.assignments) == sorted(uids[:4])
    assert {tuple(a.gpu_indices) for a in record.assignments} == {(0,)}  # one index under four pods


def test_replicas_spread_over_gpus_and_a_replica_held_alone_has_the_gpus_telemetry() -> None:
    fleet = SimulatedFleet(quiet(nodes={"L4-24GB": 1}, time_sliced_nodes={"L4-24GB": 1}))
    for _ in range(4):
        fleet.submit("solo", model="L4-24GB", request="shared", duration_seconds=10 * W)
    samples = gpu(fleet.step_dicts())
    assert sorted(s["labels"]["gpu_index"] for s in samples) == ["0", "1", "2", "3"]
    for sample in samples:
        assert sample["quantity"] == "0.250000000000"
        assert sample["utilization"] is not None and sample["power_watts"] is not None


# ---------------------------------------------------------------- MIG profiles


def test_mig_profiles_bill_their_compute_slices_of_seven() -> None:
    fleet = SimulatedFleet(quiet(nodes={"A100-SXM-40GB": 1, "H100-SXM-80GB": 1},
                                 mig_gpus_per_node={"A100-SXM-40GB": 1, "H100-SXM-80GB": 1}))
    wanted = {
        ("A100-SXM-40GB", "1g.5gb"): "0.142857142857",  # 1/7
        ("A100-SXM-40GB", "2g.10gb"): "0.285714285714",  # 2/7
        ("A100-SXM-40GB", "3g.20gb"): "0.428571428571",  # 3/7
        ("H100-SXM-80GB", "1g.10gb"): "0.142857142857",
        ("H100-SXM-80GB", "3g.40gb"): "0.428571428571",
    }
    uids = {
        fleet.submit("solo", model=model, request="mig", mig_profile=profile, duration_seconds=10 * W): key
        for key in wanted for model, profile in (key,)
    }
    whole = fleet.submit("solo", model="A100-SXM-40GB", gpus=7, duration_seconds=10 * W)
    too_big = fleet.submit("solo", model="A100-SXM-40GB", gpus=8, duration_seconds=10 * W)
    samples = fleet.step_dicts()
    for uid, (model, profile) in uids.items():
        (sample,) = of_pod(samples, uid, "gpu")
        assert (sample["gpu_model"], sample["mig_profile"]) == (model, profile)
        assert sample["quantity"] == wanted[(model, profile)]
        assert sample["utilization"] is None and sample["power_watts"] is None  # NVML has none for MIG
        assert sample["memory_used_bytes"] is not None
        assert sample["labels"]["gpu_index"] == "0" and sample["labels"]["gpu_uuid"].startswith("MIG-")
    # The MIG GPU is never handed out whole: 7 whole GPUs fit, 8 never do.
    assert sorted(int(s["labels"]["gpu_index"]) for s in of_pod(samples, whole, "gpu")) == list(range(1, 8))
    assert of_pod(samples, too_big) == []
    records = {r.node: r for r in fleet.allocations()}
    a100 = {a.pod_uid: a.gpu_indices for a in records["a100-node-00"].assignments}
    assert a100 == {**{uid: [0] for uid, key in uids.items() if key[0] == "A100-SXM-40GB"},
                    whole: [1, 2, 3, 4, 5, 6, 7]}
    topology = {t.node: t for t in fleet.topology()}
    assert [g.mig_enabled for g in topology["a100-node-00"].gpus] == [True] + [False] * 7
    with pytest.raises(ValueError, match="no MIG profile"):
        fleet.submit("solo", model="A100-SXM-40GB", request="mig", mig_profile="1g.10gb", duration_seconds=W)


def test_a_full_mig_layout_takes_the_next_pod_of_a_profile_only_when_a_device_is_free() -> None:
    fleet = SimulatedFleet(quiet(nodes={"A100-SXM-40GB": 1}, mig_gpus_per_node={"A100-SXM-40GB": 1}))
    # all-balanced: two 1g devices, so the third 1g pod waits while the others run.
    first = [fleet.submit("solo", model="A100-SXM-40GB", request="mig", mig_profile="1g.5gb",
                          duration_seconds=2 * W) for _ in range(3)]
    window0 = fleet.step_dicts()
    assert {s["pod_uid"] for s in gpu(window0)} == set(first[:2])
    fleet.step_dicts()
    window2 = fleet.step_dicts()
    assert {s["pod_uid"] for s in gpu(window2)} == {first[2]}


# ---------------------------------------------------------------- pods ending inside a window


def test_a_pod_ending_at_forty_percent_of_a_window_bills_forty_percent_of_it() -> None:
    fleet = SimulatedFleet(quiet(nodes={"H100-SXM-80GB": 1}, gpus_per_node_by_model={"H100-SXM-80GB": 1}))
    uid = fleet.submit("solo", model="H100-SXM-80GB", duration_seconds=2 * W + 240,  # 2.4 windows
                       cpu=Decimal(4), memory_gib=Decimal(16), ephemeral_gib=Decimal(50),
                       pvc_gib=Decimal(200))
    nxt = fleet.submit("solo", model="H100-SXM-80GB", duration_seconds=W)  # waits for the one GPU
    windows = [fleet.step_dicts() for _ in range(4)]
    assert [[s["quantity"] for s in of_pod(w, uid, "gpu")] for w in windows] == [
        ["1.000000000000"], ["1.000000000000"], ["0.400000000000"], [],
    ]
    last = {(s["kind"], "pvc" in s["labels"]): s for s in of_pod(windows[2], uid)}
    assert last[("memory", False)]["quantity"] == "6.400000000000"  # 16 GiB requested x 0.4
    assert last[("storage", False)]["quantity"] == "20.000000000000"  # 50 GiB ephemeral x 0.4
    assert last[("storage", True)]["quantity"] == "200.000000000000"  # a claim bills whole
    cpu = last[("cpu", False)]
    used = Decimal(cpu["utilization"]) * 4  # cores used; a burst over the request bills the usage
    assert Decimal(cpu["quantity"]) == (max(Decimal(4), used) * Decimal("0.4")).quantize(Decimal("1e-12"))
    # The next pod gets the GPU from the next window on: the device never bills twice in a window.
    assert [len(of_pod(w, nxt, "gpu")) for w in windows] == [0, 0, 0, 1]
    assert of_pod(windows[3], nxt, "gpu")[0]["labels"]["gpu_uuid"] == of_pod(windows[0], uid, "gpu")[0][
        "labels"]["gpu_uuid"]


def test_a_pod_that_ended_in_the_window_is_not_in_the_allocation_record() -> None:
    fleet = SimulatedFleet(quiet(nodes={"H100-SXM-80GB": 1}))
    uid = fleet.submit("solo", model="H100-SXM-80GB", gpus=2, duration_seconds=W + 100)
    fleet.step_dicts()
    assert [a.pod_uid for r in fleet.allocations() for a in r.assignments] == [uid]
    assert gpu(fleet.step_dicts())  # billed for the 100 s it held
    assert [a for r in fleet.allocations() for a in r.assignments] == []  # but holds nothing at the end


# ---------------------------------------------------------------- spot reclaims


def test_a_spot_reclaim_ends_the_pods_and_the_nodes_reports_until_it_comes_back() -> None:
    fleet = SimulatedFleet(quiet(nodes={"H100-SXM-80GB": 2}, capacity_mix={"spot": 1.0}))
    victim = fleet.submit("solo", model="H100-SXM-80GB", gpus=8, duration_seconds=60 * W,
                          pvc_gib=Decimal(100))
    other = fleet.submit("solo", model="H100-SXM-80GB", gpus=8, duration_seconds=60 * W)
    fleet.step_dicts()
    fleet.step_dicts()
    before = {t.node: t for t in fleet.topology()}
    pvc_name = next(s["labels"]["pvc"] for s in fleet.step_dicts() if "pvc" in s["labels"])  # window 2
    assert fleet.reclaim("h100-node-00", offset_seconds=200, downtime_windows=3) is True
    assert fleet.reclaim("no-such-node", offset_seconds=1, downtime_windows=1) is False
    window3 = fleet.step_dicts()  # the provider takes the machine 200 s into window 3
    assert {s["node"] for s in window3} == {"h100-node-01"}  # its agent died with it: nothing reported
    assert of_pod(window3, victim) == []
    assert [r.node for r in fleet.allocations()] == ["h100-node-01"]
    assert [t.node for t in fleet.topology()] == ["h100-node-01"]
    assert fleet.stats.spot_reclaims == 1 and fleet.stats.jobs_reclaimed == 1
    later = [fleet.step_dicts() for _ in range(2)]  # windows 4 and 5: still gone
    assert all(s["node"] == "h100-node-01" for w in later for s in w)
    window6 = fleet.step_dicts()  # back, on another machine: other GPU UUIDs
    back = {t.node: t for t in fleet.topology()}["h100-node-00"]
    assert {g.uuid for g in back.gpus}.isdisjoint({g.uuid for g in before["h100-node-00"].gpus})
    assert [g.index for g in back.gpus] == list(range(8)) and back.links == before["h100-node-00"].links
    # The pod's controller recreated it: a new pod, the same volume, for the rest of its run.
    replacement = [p for p in fleet.running_pods() if p["node"] == "h100-node-00"]
    (pod,) = replacement
    assert pod["pod_uid"] not in (victim, other)
    remaining = 60 * W - (3 * W + 200)  # it had run from 0 until 200 s into window 3
    assert (pod["ends"] - pod["started"]).total_seconds() == remaining
    assert pod["started"] == START + timedelta(seconds=6 * W)
    assert any(s["labels"].get("pvc") == pvc_name for s in of_pod(window6, pod["pod_uid"]))
    assert victim not in {p["pod_uid"] for p in fleet.running_pods()}


def test_random_spot_reclaims_only_hit_spot_nodes_and_are_deterministic() -> None:
    config = quiet(seed=4, nodes={"H100-SXM-80GB": 4}, spot_reclaims_per_day=24.0,
                   tenants=(TenantSpec("solo", arrivals_per_hour=6.0),))
    kinds = SimulatedFleet(config).node_capacity_types()
    spot = {node for node, kind in kinds.items() if kind == "spot"}
    assert spot and spot != set(kinds)

    def silent_windows() -> dict[str, list[int]]:
        fleet = SimulatedFleet(config)
        missing: dict[str, list[int]] = defaultdict(list)
        for index in range(200):
            fleet.step_dicts()
            reporting = {r.node for r in fleet.allocations()}
            for node in set(kinds) - reporting:
                missing[node].append(index)
        assert fleet.stats.spot_reclaims > 0
        return dict(missing)

    first = silent_windows()
    assert set(first) == spot
    assert silent_windows() == first


# ---------------------------------------------------------------- agent outages (node loss)


def busy(**overrides: Any) -> FleetConfig:
    return quiet(seed=8, nodes={"H100-SXM-80GB": 1, "A100-SXM-40GB": 1}, warm_start_jobs=3,
                 tenants=(TenantSpec("solo", arrivals_per_hour=8.0, size_weights=(0.6, 0.3, 0.1, 0.0)),),
                 **overrides)


def run(
    fleet: SimulatedFleet, windows: int, silence: tuple[int, str, int] | None = None
) -> list[list[dict[str, Any]]]:
    out = []
    for index in range(windows):
        if silence is not None and index == silence[0]:
            assert fleet.silence(silence[1], silence[2]) is True
        out.append(fleet.step_dicts())
    return out


def test_an_agent_outage_is_backfilled_from_the_pods_there_when_it_returns() -> None:
    node, first, length = "h100-node-00", 10, 3
    normal = run(SimulatedFleet(busy()), 20)
    silenced = run(SimulatedFleet(busy()), 20, (first, node, length))
    for index in range(first, first + length):
        assert all(s["node"] != node for s in silenced[index])  # nothing while silent
    returned = silenced[first + length]
    live = [s for s in returned if s["window_start"] == at(first + length)]
    backfill = [s for s in returned if s["window_start"] != at(first + length)]
    # The returning window itself: the same pods and quantities as without the outage.
    expected_live = {(s["event_id"], s["kind"]) for s in normal[first + length] if s["node"] == node}
    assert {(s["event_id"], s["kind"]) for s in live if s["node"] == node} == expected_live
    # Backfill: each missed window, for the pods on the node when it returned (pods that ended
    # during the outage are gone), with the gpu quantities those windows would have had.
    on_node_now = {s["pod_uid"] for s in normal[first + length] if s["node"] == node}
    expected = {
        s["event_id"]: s for index in range(first, first + length) for s in normal[index]
        if s["node"] == node and s["pod_uid"] in on_node_now
    }
    assert {s["event_id"] for s in backfill} == set(expected)
    assert backfill and all(s["labels"]["backfilled"] == "true" for s in backfill)
    for sample in backfill:
        assert sample["utilization"] is None and sample["memory_used_bytes"] is None
        if sample["kind"] == "gpu" or "pvc" in sample["labels"]:
            assert sample["quantity"] == expected[sample["event_id"]]["quantity"]
    ended = {s["pod_uid"] for index in range(first, first + length) for s in normal[index]
             if s["node"] == node} - on_node_now
    assert ended, "the scenario needs a pod that ended during the outage"
    assert not ended & {s["pod_uid"] for s in backfill}
    # The other node never noticed.
    assert [s for s in silenced[first] if s["node"] != node] != []


def test_an_outage_longer_than_the_backfill_leaves_the_older_windows_unbilled() -> None:
    node, first, length = "a100-node-00", 5, 12
    fleet = SimulatedFleet(replace(busy(), max_backfill_windows=8))
    windows = run(fleet, first + length + 1, (first, node, length))
    backfilled = {s["window_start"] for s in windows[first + length] if s["labels"].get("backfilled")}
    assert backfilled == {at(i) for i in range(first + length - 8, first + length)}
    never = {at(i) for i in range(first, first + length - 8)}
    assert not any(s["window_start"] in never and s["node"] == node for w in windows for s in w)
    assert fleet.stats.windows_backfilled == 8 and fleet.stats.windows_unreported == 4
