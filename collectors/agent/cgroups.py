"""Which pod a host PID belongs to, from its cgroup path (needs hostPID in the DaemonSet).

Kubelet cgroup paths carry the pod UID: ``.../kubepods-burstable-pod<uid>.slice/...``
(systemd driver, dashes as underscores) or ``/kubepods/burstable/pod<uid>/...`` (cgroupfs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    match = _POD.search(text)
    return match.group(1).replace("_", "-").lower() if match else None


def pod_uids_of(pids: Iterable[int], proc_root: Path = Path("/proc")) -> dict[int, str]:
    """PID -> pod UID for the PIDs whose cgroup names a pod; others are left out."""
    found: dict[int, str] = {}
    for pid in pids:
        try:
            text = (proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            continue
        uid = pod_uid_from_cgroup(text)
        if uid is not None:
            found[pid] = uid
    return found
