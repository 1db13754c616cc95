"""`gpumeter demo`: the main job on embedded defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpumeter.core.settings import Settings


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.demo import run_demo

    return run_demo(settings, wall_seconds=args.seconds, out_dir=Path("gpumeter-out"))
