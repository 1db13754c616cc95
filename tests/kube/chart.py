"""helm for the chart tests: built from the Go module proxy by tests/kube/build_helm.sh and
cached beside the control-plane binaries; the chart rendered by it."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.rendered import REPO, documents

CHART = REPO / "deploy" / "helm" / "gpumeter"
PRODUCTION_VALUES = REPO / "deploy" / "helm" / "examples" / "production-values.yaml"


@functools.cache
def helm_binary() -> Path:
    """Fails (never skips) when helm cannot be built, as the control-plane fixtures do."""
    built = subprocess.run(["bash", str(REPO / "tests" / "kube" / "build_helm.sh")], capture_output=True,
                           text=True, check=False, timeout=3600)
    assert built.returncode == 0, f"tests/kube/build_helm.sh failed (make helm):\n{built.stderr[-3000:]}"
    return Path(built.stdout.strip().splitlines()[-1])


def helm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm_binary()), *map(str, args)], capture_output=True, text=True,
                          check=False, timeout=120)


def render_text(release: str, namespace: str, values: Sequence[Path] = (),
                sets: Mapping[str, str | int | bool] | None = None) -> str:
    args: list[str | Path] = ["template", release, CHART, "--namespace", namespace]
    for path in values:
        args += ["-f", path]
    for key, value in (sets or {}).items():
        if isinstance(value, bool):
            args += ["--set", f"{key}={str(value).lower()}"]
        else:
            args += ["--set-string" if isinstance(value, str) else "--set", f"{key}={value}"]
    done = helm(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(release: str, namespace: str, values: Sequence[Path] = (),
           sets: Mapping[str, str | int | bool] | None = None) -> list[dict[str, Any]]:
    return documents(render_text(release, namespace, values, sets))
