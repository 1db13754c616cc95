"""The demo's simulated cluster behind the calls the actuator makes to an API server.

``SimClusterGateway`` implements the actuator's ``ClusterGateway`` (scheduler_hooks/actuator/
kube_gateway.py) structurally, over a ``SimulatedFleet``: the same actuator that runs against
Kubernetes runs against the fleet, not a second one. What the calls mean here:

- lists (namespaces, nodes, pods, unscheduled pods) are the fleet's now, as API JSON
  (kube_objects.py); a namespace per tenant, labelled with it;
- ``patch_pod`` applies the actuator's two patches as the API server would: a merge patch of
  annotations preconditioned on the uid (422 when another pod has the name now), and a JSON
  patch ``test`` + ``remove`` (422 when the value is not the one tested); a pod that is gone
  answers 404. The notice annotations live here, by pod uid, and go with the pod;
- ``evict`` ends the pod: the fleet takes it off its node at its next window and meters it no
  more (``SimulatedFleet.evict``); 201, or 404 (no such pod running) / 409 (another uid);
  an evicted pod shows a ``deletionTimestamp`` until the fleet has removed it. With ``clock``
  (a fleet run in real time, benchmarks/quota_overshoot.py) the pod ends at the moment the
  eviction was asked for, read from ``clock`` before the lock is taken, and the fleet bills it
  up to then; without it, at the fleet's clock (the demo, whose fleet time jumps ahead);
- ``post_event`` keeps the Event (reason, message, the fleet's clock) for the demo's report.

Every call holds ``lock``: the fleet is stepped on another thread, which holds it too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from collectors.sim.fleet import SimulatedFleet
from collectors.sim.kube_objects import namespace_object, rfc3339

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
ANNOTATIONS_PATH = "/metadata/annotations/"


@dataclass(frozen=True)
class PostedEvent:
    at: datetime
    namespace: str
    pod: str
    reason: str
    message: str
    warning: bool


def _unpointer(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


class SimClusterGateway:
    def __init__(self, fleet: SimulatedFleet, lock: threading.Lock | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.fleet = fleet
        self.lock = lock or threading.Lock()
        self.clock = clock
        self.annotations: dict[str, dict[str, str]] = {}  # pod uid -> annotations written
        self.evicted: dict[str, datetime] = {}  # pod uid -> when the eviction was accepted (see clock)
        self.evicted_namespace: dict[str, str] = {}  # pod uid -> its namespace (= tenant)
        self.events: list[PostedEvent] = []

    # -- reads ------------------------------------------------------------------------------
    def namespaces(self) -> list[dict[str, Any]]:
        return [namespace_object(tenant) for tenant in self.fleet.tenants()]

    def nodes(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.fleet.kube_nodes()

    def _pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            pods = self.fleet.kube_pods(self.annotations, namespace)
        for pod in pods:
            at = self.evicted.get(pod["metadata"]["uid"])
            if at is not None:
                pod["metadata"]["deletionTimestamp"] = rfc3339(at)
        return pods

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self._pods(namespace)

    def unscheduled_pods(self) -> list[dict[str, Any]]:
        return [p for p in self._pods() if not p["spec"].get("nodeName")]

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods(namespace) if p["metadata"]["name"] == name), None)

    # -- writes -----------------------------------------------------------------------------
    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> int:
        found = self.pod(namespace, name)
        if found is None:
            return 404
        uid = found["metadata"]["uid"]
        current = self.annotations.setdefault(uid, {})
        if content_type == MERGE_PATCH:
            metadata = body.get("metadata") or {} if isinstance(body, dict) else {}
            if metadata.get("uid", uid) != uid:
                return 422  # the uid precondition: a same-named successor is not patched
            for key, value in (metadata.get("annotations") or {}).items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = str(value)
            return 200
        if content_type == JSON_PATCH and isinstance(body, list):
            updated = dict(current)
            for op in body:
                path = str(op.get("path", ""))
                if not path.startswith(ANNOTATIONS_PATH):
                    return 422
                key = _unpointer(path[len(ANNOTATIONS_PATH):])
                if op.get("op") == "test" and updated.get(key) != op.get("value"):
                    return 422
                if op.get("op") == "remove":
                    if key not in updated:
                        return 422
                    del updated[key]
            self.annotations[uid] = updated
            return 200
        return 415

    def evict(self, namespace: str, name: str, uid: str) -> tuple[int, bytes]:
        asked = self.clock() if self.clock is not None else None
        found = self.pod(namespace, name)
        if found is None:
            return 404, b'{"kind":"Status","message":"pod not found"}'
        if found["metadata"]["uid"] != uid:
            return 409, b'{"kind":"Status","message":"uid precondition failed"}'
        with self.lock:
            accepted = self.fleet.evict(uid, asked)
            at = asked if asked is not None else self.fleet.clock
        if not accepted and uid not in self.evicted:
            return 404, b'{"kind":"Status","message":"pod is not running"}'
        self.evicted.setdefault(uid, at)
        self.evicted_namespace.setdefault(uid, namespace)
        return 201, b'{"kind":"Status","status":"Success"}'

    def post_event(self, pod: Any, reason: str, message: str, warning: bool = False) -> None:
        """An Event on the pod (``pod``: the actuator's PodView), kept for the demo's report."""
        self.events.append(PostedEvent(self.fleet.clock, pod.namespace, pod.name, reason, message, warning))

    def post_namespace_event(self, namespace: str, reason: str, message: str, warning: bool = False) -> None:
        """An Event on a tenant's namespace (a warning / exceeded / recovered crossing)."""
        self.events.append(PostedEvent(self.fleet.clock, namespace, "", reason, message, warning))
