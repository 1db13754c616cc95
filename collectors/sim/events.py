"""What happens to the simulated fleet's nodes over time: spot reclaims and agent outages.

Both are drawn each window from their own ``random.Random`` (as telemetry is), so a silent node
leaves the jobs as they would be; tests force them through SimulatedFleet.reclaim and .silence.
collectors/sim/fleet.py's module docstring states what each does to pods and reports.
"""

from __future__ import annotations

import random
from datetime import datetime

from collectors.sim.config import FleetConfig
from collectors.sim.scheduler import Node, Scheduler
from collectors.sim.stats import FleetStats
from collectors.sim.workload import Workload

DAY_SECONDS = 86_400


class NodeEvents:
    """Spot reclaims (the node and its pods go, the pods are recreated) and agent outages."""

    def __init__(
        self, config: FleetConfig, scheduler: Scheduler, workload: Workload, stats: FleetStats
    ) -> None:
        self.config = config
        self._rng = random.Random(f"gpumeter-sim-events/{config.seed}")
        self._scheduler = scheduler
        self._workload = workload
        self._stats = stats
        self._seconds = config.window_seconds
        self._forced_reclaims: dict[str, tuple[int, int]] = {}  # node -> (offset s, downtime windows)
        self._forced_outages: dict[str, int] = {}  # node -> silent windows

    def force_reclaim(self, node: Node, offset_seconds: int, downtime_windows: int) -> None:
        self._forced_reclaims[node.name] = (offset_seconds, downtime_windows)

    def force_outage(self, node: Node, windows: int) -> None:
        self._forced_outages[node.name] = windows

    def restore(self, index: int, at: datetime) -> None:
        """Reclaimed nodes whose downtime ends at window ``index`` exist again (on new machines)."""
        for node in self._scheduler.nodes:
            if node.back_at is not None and node.back_at <= index:
                node.back_at = None
                self._scheduler.replace_machine(node, at)

    def draw(self, index: int) -> None:
        """Spot reclaims and agent outages starting in window ``index``."""
        config = self.config
        rng = self._rng
        reclaim_p = config.spot_reclaims_per_day * self._seconds / DAY_SECONDS
        outage_p = config.agent_outages_per_day * self._seconds / DAY_SECONDS
        forced_reclaims, self._forced_reclaims = self._forced_reclaims, {}
        forced_outages, self._forced_outages = self._forced_outages, {}
        for node in self._scheduler.nodes:
            if node.gone or node.silent_from is not None:
                continue
            if node.name in forced_reclaims:
                offset, downtime = forced_reclaims[node.name]
                self._reclaim_node(node, index, offset, downtime)
                continue
            if node.name in forced_outages:
                self._silence_node(node, index, forced_outages[node.name])
                continue
            if node.capacity_type == "spot" and reclaim_p > 0 and rng.random() < reclaim_p:
                offset = rng.randint(1, self._seconds - 1) if self._seconds > 1 else 0
                minutes = rng.uniform(*config.spot_downtime_minutes)
                self._reclaim_node(node, index, offset, self._windows_of(minutes))
            elif outage_p > 0 and rng.random() < outage_p:
                self._silence_node(node, index, self._windows_of(rng.uniform(*config.agent_outage_minutes)))

    def _windows_of(self, minutes: float) -> int:
        return max(1, round(minutes * 60.0 / self._seconds))

    def _reclaim_node(self, node: Node, index: int, offset: int, downtime: int) -> None:
        """The provider takes the machine ``offset`` seconds into window ``index``: its pods end
        then, unreported (the agent dies with the node), and are recreated as new pods."""
        moment = index * self._seconds + offset
        for job in list(node.jobs.values()):
            self._scheduler.remove(job)
            remaining = job.finished - moment
            if remaining > 0:
                self._stats.jobs_reclaimed += 1
                self._scheduler.requeue(self._workload.recreated(job, remaining, index))
            else:
                self._stats.jobs_finished += 1  # it had ended just before the machine went
        node.back_at = index + max(1, downtime)
        node.assignments = None
        self._stats.spot_reclaims += 1
        self._stats.windows_unreported += max(1, downtime)

    def _silence_node(self, node: Node, index: int, windows: int) -> None:
        node.silent_from = index
        node.silent_until = index + windows
        self._stats.agent_outages += 1
