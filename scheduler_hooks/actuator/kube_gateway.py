"""The actuator's calls to the Kubernetes API server: blocking, JSON in and out.

Every read returns the JSON the server sent (``_preload_content=False``), not the client's
generated models: the pure modules (kube_objects, plan, reclaim) read plain mappings,
and skipping model construction keeps a list of thousands of pods cheap. Expected refusals
come back as HTTP statuses for the caller to decide on (404 gone, 409/422 replaced, 429
budget); anything else (the server unreachable, 5xx) raises. The bodies sent and the reading
of the answers (``classify_eviction``: 429 + ``DisruptionBudget`` told apart from API Priority
and Fairness throttling, also 429) are pure functions at the top.

Credentials as every controller finds them: the in-cluster service account when running
in a pod, else ``$KUBECONFIG`` / ``~/.kube/config``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpumeter.core import jsonio
from gpumeter.core.kube import EVICTION_NOTICE_ANNOTATION
from scheduler_hooks.cluster.kube_objects import Notice, PodView, rfc3339

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PAGE = 500
COMPONENT = "gpumeter-actuator"
# Seconds a single API call may take before it counts as failed (and is retried by the caller).
REQUEST_TIMEOUT = 15.0


# -- API bodies and answers (pure) ------------------------------------------------------------


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def notice_patch(uid: str, notice: Notice) -> dict[str, Any]:
    """JSON merge patch adding the notice; the uid makes it fail (422) on a same-named new pod."""
    return {"metadata": {"uid": uid, "annotations": {EVICTION_NOTICE_ANNOTATION: notice.to_annotation()}}}


def withdraw_patch(notice_text: str) -> list[dict[str, Any]]:
    """JSON patch removing the notice only if it is still exactly the one we put there."""
    path = f"/metadata/annotations/{_pointer(EVICTION_NOTICE_ANNOTATION)}"
    return [{"op": "test", "path": path, "value": notice_text}, {"op": "remove", "path": path}]


def eviction_body(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """policy/v1 Eviction, preconditioned on the uid: never evicts a same-named successor."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


EvictionOutcome = Literal["evicted", "pdb", "throttled", "gone", "error"]


def classify_eviction(status: int, body: str | bytes | None) -> EvictionOutcome:
    """The Eviction API's answer: 201/200 evicted; 429 with a ``DisruptionBudget`` cause is a
    PodDisruptionBudget refusal, any other 429 is throttling; 404 (pod gone) and 409 (uid
    precondition failed: a new pod took the name) mean our pod is no more."""
    if status in (200, 201):
        return "evicted"
    if status == 429:
        return "pdb" if _disruption_budget(body) else "throttled"
    if status in (404, 409):
        return "gone"
    return "error"


def _disruption_budget(body: str | bytes | None) -> bool:
    if not body:
        return False
    try:
        document = jsonio.loads(body)
    except jsonio.JSONInputError:
        return False
    details = document.get("details") if isinstance(document, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes or ())


def status_message(body: str | bytes | None) -> str:
    """The ``message`` of a Kubernetes Status body, for records and logs (first 300 chars)."""
    if not body:
        return ""
    try:
        document = jsonio.loads(body)
    except jsonio.JSONInputError:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return text.strip()[:300]
    message = document.get("message") if isinstance(document, dict) else None
    return str(message)[:300] if message else ""


# -- the calls ------------------------------------------------------------------------------------


class ClusterGateway(Protocol):
    """What the actuator asks of a cluster: ``KubeGateway`` against the API server, or a
    simulated cluster behind the same calls (the demo's, collectors/sim/cluster_gateway.py),
    which implements it structurally."""

    def namespaces(self) -> list[dict[str, Any]]: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]: ...
    def unscheduled_pods(self) -> list[dict[str, Any]]: ...
    def pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> int: ...
    def evict(self, namespace: str, name: str, uid: str) -> tuple[int, bytes]: ...
    def post_event(self, pod: PodView, reason: str, message: str, warning: bool = False) -> None: ...
    def post_namespace_event(self, namespace: str, reason: str, message: str,
                             warning: bool = False) -> None: ...



class KubeGateway:
    def __init__(self, api: k8s.ApiClient, instance: str | None = None) -> None:
        """``instance``: the ``reportingInstance`` of our Events (default: the host's name)."""
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self._instance = instance or socket.gethostname()

    # -- reads ------------------------------------------------------------------------------
    def _list(self, call: Callable[..., Any], *args: Any, **selectors: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            response = call(*args, limit=PAGE, _continue=token, _preload_content=False,
                            _request_timeout=REQUEST_TIMEOUT, **selectors)
            document = jsonio.loads(response.data)
            items.extend(document.get("items") or ())
            token = (document.get("metadata") or {}).get("continue") or None
            if token is None:
                return items

    def namespaces(self) -> list[dict[str, Any]]:
        return self._list(self.core.list_namespace)

    def nodes(self) -> list[dict[str, Any]]:
        return self._list(self.core.list_node)

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return self._list(self.core.list_pod_for_all_namespaces)
        return self._list(self.core.list_namespaced_pod, namespace)

    def unscheduled_pods(self) -> list[dict[str, Any]]:
        """Pending pods no scheduler has bound yet (selected by the server: usually few)."""
        return self._list(self.core.list_pod_for_all_namespaces,
                          field_selector="spec.nodeName=,status.phase=Pending")

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response: Any = self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                          _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        document = jsonio.loads(response.data)
        return document if isinstance(document, dict) else None

    # -- writes -----------------------------------------------------------------------------
    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> int:
        """HTTP status of the patch: 200, or 404 (gone), 409/422 (refused: replaced, test failed)."""
        try:
            self.core.patch_namespaced_pod(name, namespace, body, _content_type=content_type,
                                           _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                return int(exc.status)
            raise
        return 200

    def evict(self, namespace: str, name: str, uid: str) -> tuple[int, bytes]:
        """POST the Eviction; (status, body) whatever the answer, so 429 can be told apart."""
        body = k8s.V1Eviction.model_validate(eviction_body(namespace, name, uid))
        try:
            response: Any = self.core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            text = exc.body if isinstance(exc.body, str) else ""
            return int(exc.status or 0), text.encode()
        return int(response.status), bytes(response.data or b"")

    def post_event(self, pod: PodView, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on the pod, for ``kubectl describe``; best effort, never raises."""
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                    "uid": pod.uid}
        self._post(pod.namespace, f"{pod.name}.", involved, reason, message, warning)

    def post_namespace_event(self, namespace: str, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on a namespace (``kubectl get events -n NS``, ``kubectl describe ns``)."""
        # The API server wants an event's namespace to be its object's: a Namespace is named as
        # its own namespace here, so the Event lives (and is listed) in the tenant's namespace.
        involved = {"apiVersion": "v1", "kind": "Namespace", "name": namespace, "namespace": namespace}
        self._post(namespace, f"{namespace}.", involved, reason, message, warning)

    def _post(self, namespace: str, prefix: str, involved: dict[str, str], reason: str, message: str,
              warning: bool) -> None:
        now = rfc3339(datetime.now(UTC))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": prefix, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(namespace, k8s.CoreV1Event.model_validate(event),
                                              _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # an Event is a courtesy: failing to post one changes nothing
            log.debug("could not post event %s on %s %s/%s: %s", reason, involved["kind"], namespace,
                      involved["name"], exc)
