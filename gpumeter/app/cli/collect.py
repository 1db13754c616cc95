"""`gpumeter collect`: the node agent (NVML) or the simulated fleet."""

from __future__ import annotations

import argparse

from gpumeter.app.cli.arguments import positive_number
from gpumeter.app.cli.errors import Failure, UsageError
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=["nvml", "simulated"], required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--windows", type=int, default=0, help="simulated: stop after N windows (0: never)")
    parser.add_argument("--speed", type=positive_number, default=None,
                        help="simulated: windows per second (default: as fast as possible)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.source == "nvml":
        from collectors.agent.collector import AgentConfig, run_agent
        from collectors.agent.kubelet_stats import KubeletCAError
        from collectors.agent.nvml_source import NvmlUnavailable

        try:
            cycles = run_agent(settings, "nvml", config=AgentConfig.from_env())
        except NvmlUnavailable as exc:
            raise Failure(f"NVML is not available on this node: {exc}") from None
        except KubeletCAError as exc:  # a setting naming a CA file that cannot be read
            raise UsageError(str(exc)) from None
        print(f"agent stopped after {cycles} collection cycles")
        return 0
    from collectors.sim.runner import run_simulated

    published = run_simulated(settings, seed=args.seed, windows=args.windows or None, speed=args.speed)
    print(f"published {published} samples")
    return 0
