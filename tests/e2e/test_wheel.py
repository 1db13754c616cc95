"""What the image holds, without the image: the wheels `make dist` builds (gpumeter and the native
rating extension) installed into a fresh virtualenv outside the repository, then the commands
every chart workload runs asked for their help and the worker's native rating path imported.

The Dockerfile installs exactly these two wheels (its build stage runs the same `pip wheel`);
no base image can be pulled where the tests run, so this is the check of its contents. Slow
once (dependencies come from PyPI, or pip's cache).
"""

from __future__ import annotations

import os
import subprocess
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"
INSTALL_TIMEOUT_S = 1800


def version() -> str:
    found: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return found


def wheel(name: str) -> Path:
    found = sorted(DIST.glob(f"{name}-{version()}-*.whl"))
    assert found, f"no {name} {version()} wheel in dist/: run `make dist`"
    return found[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv (outside the repository) with both wheels and their dependencies."""
    home = tmp_path_factory.mktemp("wheel-venv")
    assert REPO not in home.parents
    venv.EnvBuilder(with_pip=True, clear=True).create(home / "venv")
    python = home / "venv" / "bin" / "python"
    packages = [wheel("gpumeter"), wheel("gpumeter_native")]
    # Nothing of the test's environment may point pip at the repository (PYTHONPATH would make
    # its sources look installed).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--find-links", str(DIST),
                           *map(str, packages)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                          check=False, cwd=home, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    yield home


def run(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """A command of the virtualenv, run in its directory with nothing of the repository on the path."""
    env = {"PATH": f"{home / 'venv' / 'bin'}:/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("command", [
    pytest.param(("gpumeter", "--help"), id="gpumeter"),
    pytest.param(("gpumeter", "hooks", "--help"), id="hooks"),
    pytest.param(("gpumeter", "worker", "--help"), id="worker"),
    pytest.param(("gpumeter", "collect", "--help"), id="collect"),
    pytest.param(("gpumeter", "api", "--help"), id="api"),
    pytest.param(("gpumeter", "invoice", "--help"), id="invoice"),
    pytest.param(("gpumeter", "insights", "--help"), id="insights"),
])
def test_the_installed_commands_answer(installed: Path, command: tuple[str, ...]) -> None:
    shown = run(installed, *command)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: gpumeter"), shown.stdout


def test_the_installed_package_is_the_wheel_not_the_repository(installed: Path) -> None:
    shown = run(installed, "python", "-c",
                "import gpumeter, streams; print(gpumeter.__file__, streams.__file__)")
    assert shown.returncode == 0, shown.stderr
    for path in shown.stdout.split():
        assert Path(path).is_relative_to(installed / "venv"), path


def test_the_native_rating_path_is_built_in(installed: Path) -> None:
    checked = run(installed, "python", "-c",
                  "import gpumeter_native; from streams.native_rating import BUILT; assert BUILT; "
                  "print(gpumeter_native.__file__)")
    assert checked.returncode == 0, checked.stderr
    assert Path(checked.stdout.strip()).is_relative_to(installed / "venv")


NATIVE_RATING = """
from collectors.sim.config import FleetConfig
from collectors.sim.fleet import SimulatedFleet
from gpumeter.core import jsonio
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import join, split
from gpumeter.core.settings import DEFAULTS_DIR
from streams.stage import RatingStage

cards = load_rate_cards(DEFAULTS_DIR / "ratecards")
native, python = RatingStage(cards, "samples"), RatingStage(cards, "samples", native=False)
assert native.native, "the rating stage did not take the native path"
fleet = SimulatedFleet(FleetConfig(seed=3, window_seconds=15, nodes={"H100-SXM-80GB": 2, "A100-SXM-40GB": 1}))
lines = [jsonio.dumpb(sample) for sample in fleet.step_dicts()][:200]
record = join(lines)
assert None not in native._native.rate_lines(split(record), 0, 0), "a line was declined to Python"
rows, dead = native.rate_record(record, 0, 0)
expected, expected_dead = python.rate_record(record, 0, 0)
assert rows == expected and not dead and not expected_dead
print(len(rows))
"""


def test_the_installed_wheel_rates_a_fleet_natively_as_the_python_path_does(installed: Path) -> None:
    """The worker's rating stage from the wheel: every line rated by the extension, rows equal to
    the Python path's (the definition)."""
    rated = run(installed, "python", "-c", NATIVE_RATING)
    assert rated.returncode == 0, rated.stderr[-3000:]
    assert int(rated.stdout.strip()) > 0
