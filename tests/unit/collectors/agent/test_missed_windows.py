"""Windows the agent missed (a cycle overran, the agent restarted) are backfilled from the current
observation, at most ``backfill_windows`` of them; the rest are counted, never silently lost."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from collectors.agent.collector import AgentConfig, run_agent
from collectors.agent.publisher import Publisher, decode_message
from collectors.agent.spool import Spool
from gpumeter.core.models import UsageSample, parse_sample
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.infra.kafka import KafkaUnavailable
from testkit.cluster_state import pod
from testkit.nvml_standin import NvmlStandIn, gpu_uuid, nvswitch_node
from testkit.podresources_server import ContainerSpec, PodSpec

from .node_rig import GPU, START, gpu_samples, node

pytestmark = pytest.mark.agent

T = START  # 10:15:00, a window boundary at 15 s
STEP = timedelta(seconds=15)


def tracker(**options: Any) -> Any:
    # Imported here so the rest of this file also runs against code without the module.
    from collectors.agent.windows import WindowTracker

    return WindowTracker(interval=15, **options)


def test_an_overrun_cycle_backfills_the_windows_it_missed() -> None:
    windows = tracker()
    windows.done(T)  # collected [T-15, T)
    # The next cycle ran three windows late: [T, T+15) and [T+15, T+30) were missed.
    assert windows.plan(T + 2 * STEP) == [(T, T + STEP), (T + STEP, T + 2 * STEP)]
    assert windows.skipped == 0


def test_backfill_is_bounded_and_the_rest_is_counted() -> None:
    windows = tracker(max_backfill=3)
    windows.done(T)
    planned = windows.plan(T + 10 * STEP)  # ten missed windows
    assert planned == [(T + k * STEP, T + (k + 1) * STEP) for k in (7, 8, 9)]  # the three most recent
    assert windows.skipped == 7


def test_windows_before_the_host_booted_are_not_billed() -> None:
    windows = tracker(boot_time=T + 3 * STEP + timedelta(seconds=4))
    windows.done(T)
    # Missed [T, T+75): the node was down until T+49 s; only the window after the boot is billed.
    assert windows.plan(T + 5 * STEP) == [(T + 4 * STEP, T + 5 * STEP)]
    assert windows.skipped == 4


def test_the_last_window_survives_a_restart_in_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "agent-state.json"
    tracker(state_path=state, identity="prod/n1").done(T)
    assert tracker(state_path=state, identity="prod/n1").plan(T + STEP) == [(T, T + STEP)]
    # Another node's state (a host path reused) or another interval is not continued.
    assert tracker(state_path=state, identity="prod/n2").plan(T + STEP) == []
    state.write_text("{not json")
    assert tracker(state_path=state, identity="prod/n1").plan(T + STEP) == []


def test_backfilled_samples_bill_quantities_without_telemetry_under_the_same_event_ids() -> None:
    kubelet = [PodSpec("team-a", "trainer", [ContainerSpec("c", {GPU: [gpu_uuid(0)]})])]
    # Started 12 s before T: it held 12 of the 15 s of [T-15, T).
    api = [pod("team-a", "trainer", "uid-t", cpu="3", gpus=1, start="2026-11-03T10:14:48Z")]
    with node(NvmlStandIn(nvswitch_node(1)), kubelet, api) as rig:
        normal = {s.kind: s for s in rig.collector.collect(T - STEP, T)}  # what a live cycle emits
        rig.collector.collect(T, T + STEP)
        filled = rig.collector.backfill([(T - 2 * STEP, T - STEP), (T - STEP, T)])
    assert {s.window_start for s in filled} == {T - STEP}  # not started in the first: nothing there
    by_kind = {s.kind: s for s in filled}
    gpu = by_kind["gpu"]
    assert gpu.quantity == Decimal("0.8") and gpu.labels["backfilled"] == "true"
    assert gpu.utilization is None and gpu.power_watts is None and gpu.memory_used_bytes is None
    assert by_kind["cpu"].quantity == Decimal("2.4")  # 3 cores for 0.8 of the window
    assert {k: s.event_id for k, s in by_kind.items()} == {k: normal[k].event_id for k in by_kind}


def no_kafka() -> object:
    raise KafkaUnavailable("no Kafka broker answers at 127.0.0.1:1")


def test_a_restarted_agent_backfills_the_windows_it_was_down_for(tmp_path: Path) -> None:
    interval = 1
    now = datetime(2026, 11, 3, 10, 15, 4, 500000, tzinfo=UTC).timestamp()  # the clock, held still
    last_end = datetime(2026, 11, 3, 10, 15, 1, tzinfo=UTC)  # before the restart: up to 10:15:01
    spool = Spool(tmp_path / "spool")
    state = {"interval": interval, "identity": "prod/gpu-node-1", "last_window_end": last_end.isoformat()}
    (spool.directory / "agent-state.json").write_text(json.dumps(state))
    publisher = Publisher(KafkaSettings(), spool, producer_factory=no_kafka, retry_seconds=60)
    kubelet = [PodSpec("team-a", "trainer", [ContainerSpec("c", {GPU: [gpu_uuid(0)]})])]
    with node(NvmlStandIn(nvswitch_node(1)), kubelet, [pod("team-a", "trainer", "uid-t", gpus=1)]) as rig:
        rig.collector.interval = interval
        config = AgentConfig(
            cluster="prod", node="gpu-node-1", interval=interval, metrics_port=None, proc_root=None
        )
        cycles = run_agent(
            Settings(data_dir=tmp_path),
            rig.collector,
            config=config,
            stop=threading.Event(),
            max_cycles=1,
            publisher=publisher,
            wall_clock=lambda: now,
        )
    assert cycles == 1
    records = [parse_sample(decode_message(p)[1]) for p in Spool(tmp_path / "spool").iter_records()]
    gpu: list[UsageSample] = gpu_samples(records)
    # Collected [10:15:03, 10:15:04); missed [10:15:01, 10:15:02) and [10:15:02, 10:15:03): backfilled.
    starts = sorted((s.window_start.second, s.labels.get("backfilled")) for s in gpu)
    assert starts == [(1, "true"), (2, "true"), (3, None)]
    saved = json.loads((tmp_path / "spool" / "agent-state.json").read_text())
    assert saved["last_window_end"] == datetime(2026, 11, 3, 10, 15, 4, tzinfo=UTC).isoformat()
