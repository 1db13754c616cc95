"""`gpumeter hooks --role`: what each role starts (the extender, the actuator with its Lease)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpumeter.app.cli import build_parser
from gpumeter.app.cli import hooks as hooks_cli
from gpumeter.core.settings import load_settings


def test_help_names_the_roles(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["hooks", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--role {extender,actuator,all}" in text
    assert "all (default)" in text and "Lease" in text


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        pytest.param([], "all", id="default"),
        pytest.param(["--role", "extender"], "extender", id="extender"),
        pytest.param(["--role", "actuator"], "actuator", id="actuator"),
    ],
)
def test_role_argument(argv: list[str], role: str) -> None:
    assert build_parser().parse_args(["hooks", *argv]).role == role


def test_an_unknown_role_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["hooks", "--role", "leader"])
    assert exited.value.code == 2


@pytest.mark.parametrize(
    ("role", "started"),
    [
        pytest.param("extender", {"extender"}, id="extender-takes-no-lease"),
        pytest.param("actuator", {"actuator"}, id="actuator-listens-nowhere"),
        pytest.param("all", {"extender", "actuator"}, id="all"),
    ],
)
def test_each_role_starts_only_its_part(monkeypatch: pytest.MonkeyPatch, role: Any,
                                        started: set[str]) -> None:
    seen: set[str] = set()

    async def start_extender(*args: Any, **kwargs: Any) -> tuple[asyncio.Task[Any], Any]:
        seen.add("extender")
        return asyncio.create_task(asyncio.sleep(0)), None

    async def actuate(settings: Any, api: Any, stop: asyncio.Event, *, dry_run: bool, registry: Any) -> None:
        seen.add("actuator")  # the Lease is taken in here, and only here
        await stop.wait()

    monkeypatch.setattr(hooks_cli, "_start_extender", start_extender)
    monkeypatch.setattr(hooks_cli, "_actuate", actuate)

    class Api:
        def close(self) -> None:
            pass

    async def main() -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        return await hooks_cli.serve(load_settings(env={}), dry_run=False, role=role, stop=stop, api=Api())

    assert asyncio.run(main()) == 0
    assert seen == started
