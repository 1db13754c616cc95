"""`gpumeter demo`: the main job on embedded defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpumeter.app.cli.arguments import positive_number
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=positive_number, default=60.0,
                        help="wall time of the simulated run")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.demo import run_demo

    return run_demo(settings, wall_seconds=args.seconds, out_dir=Path("gpumeter-out"))
