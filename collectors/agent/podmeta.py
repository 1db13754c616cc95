"""Pod metadata from the API server: tenant, priority, capacity type, start time, requests, volumes.

Rules (``gpumeter.core.kube``, shared with the scheduler extender and the actuator):

* tenant: the namespace label ``gpumeter.io/tenant``, else the namespace name; None when that
  is not a tenant id ``[a-z0-9][a-z0-9-]{0,62}`` (never folded: the pod's samples are withheld).
* capacity type: the node label ``gpumeter.io/capacity-type``; else the
  cloud's own spot labels (Karpenter, EKS, GKE, AKS); else the pod's label or
  annotation ``gpumeter.io/capacity-type``; else ``on-demand``. The node wins
  because the node is what was bought: a pod cannot make its usage cheaper by
  labelling itself spot.
* requests: the pod's effective request as the kubelet computes it
  (max(sum of app containers + sidecars, each init container + the sidecars
  before it) + overhead).

Everything is computed from the API objects as JSON dicts, so the same pure
functions serve the watcher and the tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpumeter.core import kube
from gpumeter.core.models import CapacityType

log = logging.getLogger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
_BILLED_RESOURCES = ("cpu", "memory", "ephemeral-storage")


@dataclass(frozen=True)
class Requests:
    cpu_cores: Decimal = Decimal(0)
    memory_bytes: Decimal = Decimal(0)
    ephemeral_bytes: Decimal = Decimal(0)


def effective_requests(spec: Mapping[str, Any]) -> Requests:
    """The pod's request as the scheduler sees it (init containers, sidecars and overhead included)."""
    amounts = kube.effective_requests(spec, _BILLED_RESOURCES)
    zero = Decimal(0)
    return Requests(
        amounts.get("cpu", zero), amounts.get("memory", zero), amounts.get("ephemeral-storage", zero)
    )


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str
    phase: str
    tenant: str | None  # None: the namespace's gpumeter.io/tenant label is not a tenant id
    priority: int
    capacity_type: CapacityType
    start_time: datetime | None
    requests: Requests
    pvc_claims: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    # When a Succeeded/Failed pod's last container ended (None: running, or not recorded).
    finish_time: datetime | None = None

    @property
    def finished(self) -> bool:
        """Succeeded or Failed: its containers are gone, whatever the kubelet still lists for it."""
        return self.phase in FINISHED_PHASES


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def finish_time_of(status: Mapping[str, Any]) -> datetime | None:
    """The latest ``state.terminated.finishedAt`` over the pod's containers (init containers too:
    a pod can fail in one), or None when no container recorded an end."""
    latest: datetime | None = None
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for container in status.get(key) or []:
            if not isinstance(container, Mapping):
                continue
            terminated = (container.get("state") or {}).get("terminated") or {}
            finished = _parse_time(terminated.get("finishedAt"))
            if finished is not None and (latest is None or finished > latest):
                latest = finished
    return latest


def pod_info(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str] | None = None,
    node_labels: Mapping[str, str] | None = None,
) -> PodInfo:
    """A pod's billing metadata from its API object (JSON form, camelCase keys)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace = str(metadata.get("namespace") or "default")
    claims = tuple(
        str(volume["persistentVolumeClaim"]["claimName"])
        for volume in spec.get("volumes") or []
        if isinstance(volume, Mapping) and (volume.get("persistentVolumeClaim") or {}).get("claimName")
    )
    priority = spec.get("priority")
    phase = str(status.get("phase") or "Unknown")
    return PodInfo(
        uid=str(metadata.get("uid") or ""),
        namespace=namespace,
        name=str(metadata.get("name") or ""),
        node=str(spec.get("nodeName") or ""),
        phase=phase,
        tenant=kube.tenant_of_namespace(namespace, namespace_labels),
        priority=int(priority) if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        capacity_type=kube.capacity_type_of(metadata, node_labels),
        start_time=_parse_time(status.get("startTime")),
        requests=effective_requests(spec),
        pvc_claims=claims,
        labels=dict(metadata.get("labels") or {}),
        finish_time=finish_time_of(status) if phase in FINISHED_PHASES else None,
    )


@dataclass(frozen=True)
class ClaimInfo:
    uid: str
    namespace: str
    name: str
    capacity_bytes: Decimal


def claim_info(pvc: Mapping[str, Any]) -> ClaimInfo | None:
    """A bound claim's size: status.capacity.storage, else spec.resources.requests.storage."""
    metadata = pvc.get("metadata") or {}
    status = pvc.get("status") or {}
    spec = pvc.get("spec") or {}
    size = (status.get("capacity") or {}).get("storage")
    if size is None:
        size = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if size is None or not metadata.get("uid"):
        return None
    try:
        capacity = kube.parse_quantity(size)
    except ValueError:
        return None
    return ClaimInfo(
        str(metadata["uid"]), str(metadata.get("namespace", "")), str(metadata.get("name", "")), capacity
    )


class StaticPodMetadata:
    """Pod metadata from fixed API objects (tests, benchmarks, replaying recorded state)."""

    def __init__(
        self,
        pods: Iterable[Mapping[str, Any]],
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        node_labels: Mapping[str, str] | None = None,
        claims: Iterable[Mapping[str, Any]] = (),
        node_capacity: Mapping[str, str] | None = None,
    ) -> None:
        namespaces = namespaces or {}
        self._node_labels = dict(node_labels or {})
        self._node_capacity = dict(node_capacity or {})
        self._pods = [
            pod_info(pod, namespaces.get(str((pod.get("metadata") or {}).get("namespace")), {}), node_labels)
            for pod in pods
        ]
        self._claims: dict[tuple[str, str], ClaimInfo] = {}
        for pvc in claims:
            info = claim_info(pvc)
            if info is not None:
                self._claims[(info.namespace, info.name)] = info

    def pods(self) -> list[PodInfo]:
        return list(self._pods)

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._claims.get((namespace, name))

    def node_labels(self) -> dict[str, str]:
        return dict(self._node_labels)

    def node_capacity(self) -> dict[str, str]:
        return dict(self._node_capacity)


class _Reflector:
    """List then watch one kind of object into a dict, relisting when the watch expires (410 Gone)."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        serialize: Callable[[Any], dict[str, Any]],
        on_change: Callable[[], None],
        **selectors: Any,
    ) -> None:
        self.name = name
        self._list = list_fn
        self._serialize = serialize
        self._on_change = on_change
        self._selectors = selectors
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> str:
        metadata = obj.get("metadata") or {}
        return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        backoff = 1.0
        while not self._stop.is_set():
            try:
                listing = self._list(**self._selectors)
                items = {}
                for item in listing.items:
                    obj = self._serialize(item)
                    items[self._key(obj)] = obj
                self.items = items
                self.synced.set()
                self._on_change()
                version = listing.metadata.resource_version
                watcher = watch.Watch()
                for event in watcher.stream(
                    self._list, resource_version=version, timeout_seconds=300, **self._selectors
                ):
                    if self._stop.is_set():
                        watcher.stop()
                        return
                    kind = event.get("type")
                    if kind == "ERROR":
                        break
                    obj = self._serialize(event["object"])
                    key = self._key(obj)
                    if kind == "DELETED":
                        self.items.pop(key, None)
                    else:
                        self.items[key] = obj
                    self._on_change()
                backoff = 1.0
            except ApiException as exc:
                self.errors += 1
                if exc.status != 410:
                    log.warning("watch %s: %s", self.name, exc.reason)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
            except Exception as exc:  # network errors: keep the last state and retry
                self.errors += 1
                log.warning("watch %s: %s", self.name, exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)


class KubePodMetadata:
    """Pods of this node (field selector spec.nodeName), namespaces and this node, watched live.

    PVC sizes are read on demand and cached for ``claim_ttl`` seconds.
    """

    def __init__(self, api_client: Any, node: str, claim_ttl: float = 300.0) -> None:
        from kubernetes import client

        self.node = node
        self.core = client.CoreV1Api(api_client)
        self._api = api_client
        self._claim_ttl = claim_ttl
        self._claims: dict[tuple[str, str], tuple[float, ClaimInfo | None]] = {}
        self._cache: tuple[int, list[PodInfo]] | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self._pods = _Reflector(
            "pods",
            self.core.list_pod_for_all_namespaces,
            self._to_dict,
            self._invalidate,
            field_selector=f"spec.nodeName={node}",
        )
        self._namespaces = _Reflector("namespaces", self.core.list_namespace, self._to_dict, self._invalidate)
        self._nodes = _Reflector(
            "node",
            self.core.list_node,
            self._to_dict,
            self._invalidate,
            field_selector=f"metadata.name={node}",
        )

    def _to_dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self._api.sanitize_for_serialization(obj)

    def _invalidate(self) -> None:
        self._generation += 1

    def start(self, timeout: float = 30.0) -> bool:
        for reflector in (self._pods, self._namespaces, self._nodes):
            reflector.start()
        deadline = time.monotonic() + timeout
        return all(
            r.synced.wait(max(0.0, deadline - time.monotonic()))
            for r in (self._pods, self._namespaces, self._nodes)
        )

    def stop(self) -> None:
        for reflector in (self._pods, self._namespaces, self._nodes):
            reflector.stop()

    @property
    def watch_errors(self) -> int:
        return self._pods.errors + self._namespaces.errors + self._nodes.errors

    def node_labels(self) -> dict[str, str]:
        for obj in self._nodes.items.values():
            return dict((obj.get("metadata") or {}).get("labels") or {})
        return {}

    def node_capacity(self) -> dict[str, str]:
        """The node's ``status.capacity`` (what the kubelet advertises, device plugin resources included)."""
        for obj in self._nodes.items.values():
            return {str(k): str(v) for k, v in ((obj.get("status") or {}).get("capacity") or {}).items()}
        return {}

    def pods(self) -> list[PodInfo]:
        with self._lock:
            generation = self._generation
            if self._cache is not None and self._cache[0] == generation:
                return list(self._cache[1])
            node_labels = self.node_labels()
            namespaces = {
                (obj.get("metadata") or {}).get("name", ""): (obj.get("metadata") or {}).get("labels") or {}
                for obj in list(self._namespaces.items.values())
            }
            pods = [
                pod_info(
                    obj, namespaces.get((obj.get("metadata") or {}).get("namespace", ""), {}), node_labels
                )
                for obj in list(self._pods.items.values())
            ]
            self._cache = (generation, pods)  # changed meanwhile: rebuilt next call
            return list(pods)

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        now = time.monotonic()
        cached = self._claims.get((namespace, name))
        if cached is not None and now - cached[0] < self._claim_ttl:
            return cached[1]
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(name, namespace)
            info = claim_info(self._to_dict(pvc))
        except Exception as exc:
            log.warning("PVC %s/%s: %s", namespace, name, exc)
            info = cached[1] if cached else None
        self._claims[(namespace, name)] = (now, info)
        return info
