"""The simulated fleet: deterministic, contract-1 valid, physically consistent."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import gpumeter
from collectors.sim.fleet import FleetConfig, SimulatedFleet, TenantSpec
from gpumeter.core import jsonio
from gpumeter.core.models import UsageSample, parse_sample
from gpumeter.core.tenants import load_tenants

SWITCH = datetime(2026, 11, 1, tzinfo=UTC)
# 10-minute windows from 2026-10-30 to 2026-11-01T12:00Z: 360 windows crossing the switch.
CROSSING = FleetConfig(seed=7, window_seconds=600, end=datetime(2026, 11, 1, 12, tzinfo=UTC))


def run_dicts(config: FleetConfig, windows: int | None = None) -> list[tuple[datetime, list[dict[str, Any]]]]:
    fleet = SimulatedFleet(config)
    if windows is None:
        return list(fleet.windows_dicts())
    return [(fleet.clock, fleet.step_dicts()) for _ in range(windows)]


@pytest.fixture(scope="module")
def crossing_run() -> list[tuple[datetime, list[dict[str, Any]]]]:
    return run_dicts(CROSSING)


@pytest.fixture(scope="module")
def crossing_samples(crossing_run: list[tuple[datetime, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    return [sample for _, samples in crossing_run for sample in samples]


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_byte_identical_streams() -> None:
    config = FleetConfig(seed=11)
    first = [jsonio.dumps(samples) for _, samples in run_dicts(config, 240)]
    second = [jsonio.dumps(samples) for _, samples in run_dicts(FleetConfig(seed=11), 240)]
    assert first == second
    assert sum(len(window) for window in first) > 0


def test_same_seed_gives_identical_models() -> None:
    one, two = SimulatedFleet(CROSSING), SimulatedFleet(CROSSING)
    for _ in range(50):
        assert one.step() == two.step()


def test_different_seeds_differ() -> None:
    a = [jsonio.dumps(samples) for _, samples in run_dicts(FleetConfig(seed=1), 120)]
    b = [jsonio.dumps(samples) for _, samples in run_dicts(FleetConfig(seed=2), 120)]
    assert a != b


def test_step_and_step_dicts_are_the_same_samples() -> None:
    as_models, as_dicts = SimulatedFleet(CROSSING), SimulatedFleet(CROSSING)
    for _ in range(60):
        models = as_models.step()
        dicts = as_dicts.step_dicts()
        assert [parse_sample(d) for d in dicts] == models
        # The dict is exactly the model's dump in gpumeter.core.jsonio conventions.
        assert [jsonio.loads(jsonio.dumps(m.model_dump())) for m in models] == dicts


# ---------------------------------------------------------------- contract 1


def test_every_sample_validates(crossing_samples: list[dict[str, Any]]) -> None:
    assert len(crossing_samples) > 10_000
    for sample in crossing_samples:
        parsed = parse_sample(jsonio.dumpb(sample))  # through JSON text, as the publish path sends it
        assert isinstance(parsed, UsageSample)
        assert parsed.window_start.utcoffset() == timedelta(0)
        assert parsed.window_seconds == Decimal(600)


def test_dicts_are_json_ready(crossing_samples: list[dict[str, Any]]) -> None:
    allowed = (str, int, type(None), dict)
    for sample in crossing_samples[:5000]:
        for key, value in sample.items():
            assert isinstance(value, allowed), (key, value)
            assert not isinstance(value, bool)
        assert sample["window_start"].endswith("+00:00")
        assert isinstance(sample["quantity"], str)


def test_event_ids_unique_and_shaped(crossing_samples: list[dict[str, Any]]) -> None:
    ids = [s["event_id"] for s in crossing_samples]
    assert len(ids) == len(set(ids))  # one pod per claim at a time: even PVC ids are unique here
    for sample in crossing_samples[:2000]:
        assert len(sample["event_id"]) == 40  # the agent's: 40 hex digits of a sha256
        int(sample["event_id"], 16)


# Written by hand: a MIG device's compute slices of the GPU's 7, to 12 places half-even.
MIG_QUANTITIES = {
    ("A100-SXM-40GB", "1g.5gb"): "0.142857142857",
    ("A100-SXM-40GB", "2g.10gb"): "0.285714285714",
    ("A100-SXM-40GB", "3g.20gb"): "0.428571428571",
    ("H100-SXM-80GB", "1g.10gb"): "0.142857142857",
    ("H100-SXM-80GB", "2g.20gb"): "0.285714285714",
    ("H100-SXM-80GB", "3g.40gb"): "0.428571428571",
}


def test_all_kinds_capacity_types_and_mig_present(crossing_samples: list[dict[str, Any]]) -> None:
    assert {s["kind"] for s in crossing_samples} == {"gpu", "cpu", "memory", "storage"}
    gpu = [s for s in crossing_samples if s["kind"] == "gpu"]
    assert {s["capacity_type"] for s in gpu} == {"on-demand", "reserved", "spot"}
    assert {s["gpu_model"] for s in gpu} == {
        "H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "A100-SXM-40GB", "L40S-48GB", "L4-24GB",
    }
    shares = set(MIG_QUANTITIES.values())
    full_windows = [s for s in gpu if s["mig_profile"] is not None and s["quantity"] in shares]
    assert {(s["gpu_model"], s["mig_profile"]) for s in full_windows} == set(MIG_QUANTITIES)
    for sample in full_windows:
        assert sample["quantity"] == MIG_QUANTITIES[(sample["gpu_model"], sample["mig_profile"])]
    # Time-sliced L4 replicas: a quarter of a GPU per pod-window held whole.
    assert any(s["gpu_model"] == "L4-24GB" and s["quantity"] == "0.250000000000" for s in gpu)
    assert {s["priority"] for s in gpu} >= {0, 100, 1000}


def test_tenants_include_one_missing_from_tenants_file(crossing_samples: list[dict[str, Any]]) -> None:
    defaults = Path(gpumeter.__file__).parent / "defaults" / "tenants.yaml"
    known = {policy.tenant for policy in load_tenants(defaults).tenants}
    seen = {s["tenant"] for s in crossing_samples}
    assert seen == {"team-a", "team-b", "research", "inference", "sandbox"}
    assert seen - known == {"sandbox"}


def test_run_crosses_rate_card_switch_and_month(
    crossing_run: list[tuple[datetime, list[dict[str, Any]]]],
) -> None:
    starts = [start for start, samples in crossing_run if samples]
    assert min(starts) < SWITCH <= max(starts)
    assert crossing_run[0][0] == datetime(2026, 10, 30, tzinfo=UTC)
    assert crossing_run[-1][0] == CROSSING.end - timedelta(seconds=600)  # type: ignore[operator]
    months = {s["window_start"][:7] for _, samples in crossing_run for s in samples}
    assert months == {"2026-10", "2026-11"}


def by_window(run: list[tuple[datetime, list[dict[str, Any]]]]) -> dict[str, list[dict[str, Any]]]:
    """Samples by the window they describe (a backfilled window arrives with a later step)."""
    table: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _, samples in run:
        for sample in samples:
            table[sample["window_start"]].append(sample)
    return table


def test_every_pod_window_has_one_sample_per_device_and_host_kind(
    crossing_run: list[tuple[datetime, list[dict[str, Any]]]],
) -> None:
    """The agent's shape: a gpu sample per device, one cpu, one memory, one ephemeral storage sample
    and at most one PVC sample per pod-window, all naming the same pod the same way."""
    identity: dict[str, tuple[str, str, str, str, str, int]] = {}
    devices_per_pod: dict[str, set[int]] = defaultdict(set)
    for samples in by_window(crossing_run).values():
        by_pod: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for sample in samples:
            by_pod[sample["pod_uid"]].append(sample)
        for pod_uid, group in by_pod.items():
            kinds = Counter(s["kind"] for s in group)
            pvc = [s for s in group if "pvc" in s["labels"]]
            assert kinds["gpu"] >= 1 and kinds["cpu"] == kinds["memory"] == 1
            assert kinds["storage"] == 1 + len(pvc) and len(pvc) <= 1
            gpu = [s for s in group if s["kind"] == "gpu"]
            indices = [s["labels"]["gpu_index"] for s in gpu]
            assert len(indices) == len(set(indices))  # one sample per device
            devices_per_pod[pod_uid].add(len(gpu))
            assert all(s["labels"]["container"] == "main" for s in gpu)
            ident = {
                (s["node"], s["tenant"], s["namespace"], s["pod"], s["capacity_type"], s["priority"])
                for s in group
            }
            assert len(ident) == 1
            assert identity.setdefault(pod_uid, ident.pop()) == identity[pod_uid]
    assert {len(gpus) for gpus in devices_per_pod.values()} == {1}  # a pod's device count never changes
    counts = Counter(next(iter(gpus)) for gpus in devices_per_pod.values())
    assert set(counts) == {1, 2, 4, 8}


def test_devices_never_held_beyond_their_capacity(
    crossing_run: list[tuple[datetime, list[dict[str, Any]]]],
) -> None:
    """Per device and window: a whole GPU one pod, a MIG device one pod, a time-sliced GPU at most
    four (the replicas); a MIG-mode GPU is never handed out whole; a node holds at most its GPUs."""
    replicas = FleetConfig().time_slice_replicas
    busiest = Decimal(0)
    for samples in by_window(crossing_run).values():
        holders: dict[tuple[str, str], set[str]] = defaultdict(set)
        kind_of: dict[tuple[str, str], set[str]] = defaultdict(set)
        held: dict[str, Decimal] = defaultdict(Decimal)
        for sample in (s for s in samples if s["kind"] == "gpu"):
            node, index = sample["node"], sample["labels"]["gpu_index"]
            quantity = Decimal(sample["quantity"])
            kind = "mig" if sample["mig_profile"] else "shared" if node == "l4-node-00" else "whole"
            held[node] += quantity
            holders[(node, sample["labels"]["gpu_uuid"])].add(sample["pod_uid"])
            kind_of[(node, index)].add(kind)
        for (node, device), pods in holders.items():
            limit = replicas if node == "l4-node-00" else 1
            assert len(pods) <= limit, (node, device, pods)
        for key, kinds in kind_of.items():
            assert kinds in ({"whole"}, {"mig"}, {"shared"}), (key, kinds)  # MIG GPUs never whole
        for node, gpus in held.items():
            assert gpus <= (4 if node.startswith("l4-") else 8), (node, gpus)
            busiest = max(busiest, gpus)
    assert busiest == 8  # the fleet does fill nodes


def test_jobs_start_and_finish(crossing_run: list[tuple[datetime, list[dict[str, Any]]]]) -> None:
    windows = by_window(crossing_run)
    pod_sets = [
        frozenset(s["pod_uid"] for s in windows.get(start.isoformat(), ())) for start, _ in crossing_run
    ]
    assert pod_sets[0]  # warm start: busy from the first window
    changes = sum(1 for before, after in pairwise(pod_sets) if before != after)
    assert changes > 50
    first_seen: dict[str, int] = {}
    last_seen: dict[str, int] = {}
    for index, pods in enumerate(pod_sets):
        for pod in pods:
            first_seen.setdefault(pod, index)
            last_seen[pod] = index
    finished = [pod for pod, last in last_seen.items() if last < len(pod_sets) - 1]
    started_later = [pod for pod, first in first_seen.items() if first > 0]
    assert len(finished) > 20 and len(started_later) > 20
    # A pod is billed for one contiguous stretch of windows (an agent outage is backfilled).
    for pod in first_seen:
        span = range(first_seen[pod], last_seen[pod] + 1)
        assert all(pod in pod_sets[i] for i in span)


def test_telemetry_is_where_nvml_has_it(crossing_samples: list[dict[str, Any]]) -> None:
    seen: Counter[str] = Counter()
    for sample in crossing_samples:
        backfilled = sample["labels"].get("backfilled") == "true"
        if sample["kind"] == "gpu":
            if backfilled:
                assert sample["utilization"] is sample["memory_used_bytes"] is sample["power_watts"] is None
                seen["backfilled"] += 1
            elif sample["mig_profile"] is not None:
                # NVML has neither utilization nor power for a MIG device: memory only.
                assert sample["utilization"] is sample["power_watts"] is sample["energy_joules"] is None
                assert Decimal(sample["memory_used_bytes"]) >= 0
                seen["mig"] += 1
            elif sample["utilization"] is None:
                # A GPU shared by several pods in the window: their own memory only.
                assert sample["power_watts"] is None and sample["gpu_model"] == "L4-24GB"
                assert Decimal(sample["memory_used_bytes"]) >= 0
                seen["shared"] += 1
            else:
                utilization = Decimal(sample["utilization"])
                assert Decimal(0) <= utilization <= Decimal(1)
                assert utilization.as_tuple().exponent == -6  # the agent's 6 places
                power = Decimal(sample["power_watts"])
                assert power > 0
                assert Decimal(sample["energy_joules"]) == power * 600
                seen["whole"] += 1
        else:
            assert sample["gpu_model"] is None and sample["mig_profile"] is None
            assert sample["power_watts"] is None
            assert Decimal(sample["quantity"]) > 0
            if sample["kind"] == "cpu" and not backfilled:
                assert Decimal(sample["utilization"]) > 0
    assert min(seen.values()) > 0 and len(seen) == 4


def test_the_last_window_of_a_pod_bills_the_part_it_held() -> None:
    """Every pod's gpu quantity in every window = its device share x the part of the window it ran,
    computed here from the start and end the fleet announced for the pod."""
    config = FleetConfig(seed=3, window_seconds=600, spot_reclaims_per_day=0.0, agent_outages_per_day=0.0)
    fleet = SimulatedFleet(config)
    lifetimes: dict[str, tuple[datetime, datetime]] = {}
    partial = 0
    for _ in range(150):
        start = fleet.clock
        samples = fleet.step_dicts()
        for pod in fleet.running_pods():
            lifetimes[pod["pod_uid"]] = (pod["started"], pod["ends"])
        for sample in (s for s in samples if s["kind"] == "gpu"):
            begin, finish = lifetimes.get(sample["pod_uid"], (start, start + timedelta(days=1)))
            seconds = (min(finish, start + timedelta(seconds=600)) - max(begin, start)).total_seconds()
            share = Decimal(1)
            if sample["mig_profile"]:
                share = Decimal(int(sample["mig_profile"][0])) / 7
            elif sample["node"] in fleet.time_sliced_nodes():
                share = Decimal(1) / 4
            expected = (share * Decimal(str(round(seconds / 600, 6)))).quantize(Decimal("1e-12"))
            assert Decimal(sample["quantity"]) == expected, sample
            partial += seconds < 600
    assert partial > 20


# ---------------------------------------------------------------- API details


def test_windows_stop_at_end_and_step_continues() -> None:
    end = datetime(2026, 10, 30, 1, tzinfo=UTC)
    fleet = SimulatedFleet(FleetConfig(end=end))
    windows = list(fleet.windows())
    assert len(windows) == 60
    assert [start for start, _ in windows] == [
        datetime(2026, 10, 30, tzinfo=UTC) + timedelta(minutes=i) for i in range(60)
    ]
    assert all(isinstance(s, UsageSample) for _, samples in windows for s in samples)
    assert list(fleet.windows()) == []
    assert fleet.clock == end
    fleet.step()  # explicit stepping is not bounded by end
    assert fleet.clock == end + timedelta(minutes=1)


def test_start_in_another_offset_is_normalised_to_utc() -> None:
    start = datetime(2026, 10, 30, 2, tzinfo=timezone(timedelta(hours=2)))
    fleet = SimulatedFleet(FleetConfig(start=start))
    samples = fleet.step_dicts()
    assert samples and samples[0]["window_start"] == "2026-10-30T00:00:00+00:00"


def test_topology() -> None:
    fleet = SimulatedFleet(FleetConfig())
    topology = fleet.topology()
    assert [t.node for t in topology] == fleet.node_names()
    assert fleet.node_names() == [
        "h100-node-00", "h100-node-01", "h100-node-02", "h200-node-00", "b200-node-00",
        "a100-node-00", "a100-node-01", "l40s-node-00", "l4-node-00", "l4-node-01",
    ]
    by_node = {t.node: t for t in topology}
    for node, link in (("h100-node-00", "NV18"), ("h200-node-00", "NV18"), ("b200-node-00", "NV18"),
                       ("a100-node-00", "NV12")):
        board = by_node[node]
        assert len(board.gpus) == 8 and len(board.links) == 28
        assert set(board.links.values()) == {link}
        assert all(len(gpu.nvlink_peers) == 7 for gpu in board.gpus)
    assert {t.gpus[0].model for t in topology} == {
        "H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "A100-SXM-40GB", "L40S-48GB", "L4-24GB",
    }
    l40s = by_node["l40s-node-00"]
    assert l40s.links["0-1"] == "PIX" and l40s.links["6-7"] == "PIX"
    assert l40s.links["1-2"] == "SYS" and l40s.links["0-7"] == "SYS"
    assert Counter(l40s.links.values()) == {"PIX": 4, "SYS": 24}
    assert all(gpu.nvlink_peers == [] for gpu in l40s.gpus)
    # MIG mode (defaults: two GPUs of each A100 node, one of each H100 node); none elsewhere.
    mig = {t.node: [g.index for g in t.gpus if g.mig_enabled] for t in topology}
    assert mig == {
        "h100-node-00": [0], "h100-node-01": [0], "h100-node-02": [0], "h200-node-00": [], "b200-node-00": [],
        "a100-node-00": [0, 1], "a100-node-01": [0, 1], "l40s-node-00": [],
        "l4-node-00": [], "l4-node-01": [],
    }
    assert fleet.time_sliced_nodes() == ["l4-node-00"]
    uuids = [gpu.uuid for t in topology for gpu in t.gpus]
    assert len(set(uuids)) == 8 * 8 + 2 * 4 and all(u.startswith("GPU-") for u in uuids)
    assert [t.model_dump() for t in SimulatedFleet(FleetConfig()).topology()] == [
        t.model_dump() for t in topology
    ]
    assert {t.cluster for t in topology} == {"sim-cluster"}
    assert topology[0].at == datetime(2026, 10, 30, tzinfo=UTC)


def test_capacity_types_spread_over_nodes() -> None:
    kinds = SimulatedFleet(FleetConfig()).node_capacity_types()
    assert set(kinds.values()) == {"on-demand", "reserved", "spot"}
    only_spot = SimulatedFleet(FleetConfig(capacity_mix={"spot": 1.0})).node_capacity_types()
    assert set(only_spot.values()) == {"spot"}


def test_tenants_as_plain_names_and_custom_cluster() -> None:
    config = FleetConfig(cluster="lab", tenants=("alpha", TenantSpec("beta", arrivals_per_hour=6.0)), seed=3)
    samples: list[dict[str, Any]] = []
    fleet = SimulatedFleet(config)
    for _ in range(120):
        samples.extend(fleet.step_dicts())
    assert {s["tenant"] for s in samples} == {"alpha", "beta"}
    assert {s["cluster"] for s in samples} == {"lab"}


def test_evict_and_admission_block() -> None:
    fleet = SimulatedFleet(FleetConfig(seed=5))
    fleet.step()
    pods = fleet.running_pods()
    assert pods
    victim = pods[0]["pod_uid"]
    assert fleet.evict(victim) is True
    assert fleet.evict(victim) is False  # already pending
    assert fleet.evict("no-such-pod") is False
    after = fleet.step_dicts()
    assert victim not in {s["pod_uid"] for s in after}
    assert fleet.stats.jobs_evicted == 1

    fleet.set_admission("team-a", allowed=False)
    started = {p["pod_uid"] for p in fleet.running_pods()}
    for _ in range(300):
        fleet.step()
    new_team_a = [p for p in fleet.running_pods() if p["tenant"] == "team-a" and p["pod_uid"] not in started]
    assert new_team_a == []
    fleet.set_admission("team-a", allowed=True)
    for _ in range(30):
        fleet.step()
    assert any(p["tenant"] == "team-a" and p["pod_uid"] not in started for p in fleet.running_pods())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param({"tenants": ("Team_A",)}, "does not match", id="tenant-not-a-tenant-name"),
        pytest.param({"tenants": ("a", "a")}, "listed twice", id="tenant-twice"),
        pytest.param({"start": datetime(2026, 10, 30)}, "timezone-aware", id="naive-start"),
        pytest.param({"nodes": {"B200": 1}}, "unknown GPU model", id="unknown-gpu-model"),
        pytest.param({"window_seconds": 7200}, "window_seconds", id="window-over-an-hour"),
        pytest.param({"mig_gpus_per_node": {"L40S-48GB": 1}}, "no MIG profile", id="mig-on-l40s"),
        pytest.param({"capacity_mix": {"spot": 0.0}}, "capacity_mix", id="capacity-mix-all-zero"),
        pytest.param({"time_slice_replicas": 1}, "time_slice_replicas", id="one-replica"),
        pytest.param({"time_sliced_nodes": {"L4-24GB": 3}}, "time_sliced_nodes", id="more-shared-than-nodes"),
        pytest.param({"time_sliced_nodes": {"T4": 1}}, "unknown GPU model", id="shared-unknown-model"),
        pytest.param({"spot_reclaims_per_day": -1.0}, "spot_reclaims_per_day", id="negative-rate"),
        pytest.param({"agent_outage_minutes": (10.0, 5.0)}, "agent_outage_minutes", id="outage-range"),
        pytest.param({"max_backfill_windows": -1}, "max_backfill_windows", id="negative-backfill"),
    ],
)
def test_config_is_validated(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FleetConfig(**overrides)


def test_stream_is_identical_across_processes() -> None:
    """No dependence on hash randomisation: two interpreters with different hash seeds agree."""
    import os
    import subprocess
    import sys

    script = (
        "import hashlib\n"
        "from collectors.sim.fleet import FleetConfig, SimulatedFleet\n"
        "from gpumeter.core import jsonio\n"
        "fleet = SimulatedFleet(FleetConfig(seed=21))\n"
        "digest = hashlib.sha256()\n"
        "for _ in range(300):\n"
        "    digest.update(jsonio.dumpb(fleet.step_dicts()))\n"
        "print(digest.hexdigest())\n"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=120
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_a_time_sliced_nodes_topology_carries_its_replicas() -> None:
    fleet = SimulatedFleet(FleetConfig(time_sliced_nodes={"L4-24GB": 1}, time_slice_replicas=3))
    by_node = {t.node: {gpu.replicas for gpu in t.gpus} for t in fleet.topology()}
    assert fleet.time_sliced_nodes() == ["l4-node-00"]
    assert by_node.pop("l4-node-00") == {3}
    assert all(replicas == {1} for replicas in by_node.values())
