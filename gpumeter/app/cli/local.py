"""`gpumeter up` / `down` / `status`: the local Kafka broker and ClickHouse server."""

from __future__ import annotations

import argparse

from gpumeter.core.settings import Settings


def up(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.runtime import services

    for line in services.up(settings) or ["already running"]:
        print(line)
    return status(settings, args)


def down(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.runtime import services

    for line in services.down(settings) or ["nothing was running"]:
        print(line)
    return 0


def status(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.runtime import services

    report = services.status(settings)
    width = max(len(key) for key in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    return 0
