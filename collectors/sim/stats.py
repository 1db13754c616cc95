"""The simulated fleet's counters, for progress displays and tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FleetStats:
    """Counters of the simulated scheduler, for progress displays and tests."""

    windows: int = 0
    samples: int = 0
    jobs_submitted: int = 0
    jobs_started: int = 0
    jobs_finished: int = 0
    jobs_evicted: int = 0
    jobs_dropped: int = 0
    jobs_reclaimed: int = 0  # pods ended by a spot reclaim (each resubmitted as a new pod)
    spot_reclaims: int = 0
    agent_outages: int = 0
    windows_backfilled: int = 0  # node-windows reported late by a returning agent
    windows_unreported: int = 0  # node-windows never reported (reclaimed, or beyond the backfill)
    queued: int = 0
    running: int = 0
