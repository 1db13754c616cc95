"""The simulated scheduler's call to a scheduler extender, in kube-scheduler's wire format.

kube-scheduler, configured with an extender that has ``filterVerb: filter``,
``nodeCacheCapable: true`` and ``ignorable: false`` (the chart's configuration), sends
``POST <urlPrefix>/filter`` with ``ExtenderArgs`` ``{"Pod": <v1.Pod>, "NodeNames": [...]}`` for
the nodes its own filters passed, and binds the pod only to a node in the answer's
``NodeNames``. ``ExtenderFilter`` does the same for the simulated fleet (its ``admit`` hook,
collectors/sim/scheduler.py): any failure to get an answer (unreachable, non-200, an
``Error``) keeps the pod pending, as ``ignorable: false`` does, and it is asked about again at
the next pass, as kube-scheduler retries an unschedulable pod.

Refusals by quota (every node in ``FailedAndUnresolvableNodes``: preemption cannot help) are
kept, one per pod and reason, with the fleet's clock, for the demo's report.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from collectors.sim.kube_objects import pod_object
from collectors.sim.workload import Job

TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Refusal:
    at: datetime
    tenant: str
    pod: str
    gpus: int
    message: str


def filter_args(job: Job, node_names: Sequence[str], origin: datetime, window_seconds: int) -> dict[str, Any]:
    """The ``ExtenderArgs`` kube-scheduler sends about ``job`` (nodeCacheCapable: NodeNames),
    asked before binding: the pod is Pending, with no node yet. Its resources are the job's
    (kube_objects.job_resources): ``nvidia.com/gpu``, or a MIG profile's own resource."""
    pod = pod_object(job, origin, window_seconds)
    pod["spec"].pop("nodeName", None)
    pod["status"] = {"phase": "Pending"}
    return {"Pod": pod, "NodeNames": list(node_names)}


class ExtenderFilter:
    """``admit(job, node_names)``: the names the extender passes (see the module docstring)."""

    def __init__(self, url_prefix: str, origin: datetime, window_seconds: int,
                 clock: Callable[[], datetime]) -> None:
        parsed = urllib.parse.urlsplit(url_prefix.rstrip("/"))
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._path = f"{parsed.path}/filter"
        self._origin, self._seconds, self._clock = origin, window_seconds, clock
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self.calls = 0
        self.failures = 0  # no usable answer: the pod waited
        self.refusals: list[Refusal] = []

    def __call__(self, job: Job, node_names: Sequence[str]) -> Sequence[str]:
        body = json.dumps(filter_args(job, node_names, self._origin, self._seconds)).encode()
        with self._lock:
            self.calls += 1
            answer = self._post(body)
        if answer is None or answer.get("Error"):
            self.failures += 1
            return []
        unresolvable = answer.get("FailedAndUnresolvableNodes") or {}
        if unresolvable:
            message = str(next(iter(unresolvable.values())))
            if (job.pod_uid, message) not in self._seen:
                self._seen.add((job.pod_uid, message))
                self.refusals.append(Refusal(self._clock(), job.tenant, job.pod, job.gpus, message))
        return [str(name) for name in answer.get("NodeNames") or ()]

    def _post(self, body: bytes) -> dict[str, Any] | None:
        for _ in range(2):  # a kept-alive connection the server closed: one fresh try
            try:
                if self._connection is None:
                    self._connection = http.client.HTTPConnection(self._host, self._port,
                                                                  timeout=TIMEOUT_SECONDS)
                self._connection.request("POST", self._path, body, {"Content-Type": "application/json"})
                response = self._connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                continue
            if response.status != 200:
                return None
            try:
                document = json.loads(data)
            except ValueError:
                return None
            return document if isinstance(document, dict) else None
        return None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
