"""Writing a benchmark's results file (benchmarks/results/*-latest.json).

Every file carries, beside its figures, what they depend on most: the commit measured
(``-dirty`` when tracked files other than the results themselves differed from it), the date
(UTC), the machine's cores and its load average (1, 5 and 15 minutes) when the run ended. A
figure without them cannot be compared with the next one (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = "benchmarks/results"


def _git(*args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None


def commit() -> str:
    """The short hash of HEAD, ``-dirty`` when tracked files differ from it; "unknown" outside git.

    Results files do not count: a run that rewrote one does not change the code the next run
    of the same commit measures (two runs in a row were otherwise recorded as "-dirty")."""
    head = _git("rev-parse", "--short", "HEAD")
    if head is None or head.returncode != 0:
        return "unknown"
    diff = _git("diff", "--quiet", "HEAD", "--", ".", f":(exclude){RESULTS_DIR}")
    dirty = diff is None or diff.returncode != 0
    return head.stdout.strip() + ("-dirty" if dirty else "")


def run_metadata() -> dict[str, Any]:
    return {
        "commit": commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load": list(os.getloadavg()),
    }


def write_results(
    path: Path, results: Mapping[str, Any], default: Callable[[Any], Any] | None = None
) -> None:
    """``results`` as indented JSON at ``path``, after the run's metadata."""
    metadata = run_metadata()
    if clash := metadata.keys() & results.keys():
        raise ValueError(f"results use the metadata's own keys: {sorted(clash)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**metadata, **results}
    path.write_text(json.dumps(document, indent=2, default=default) + "\n")
