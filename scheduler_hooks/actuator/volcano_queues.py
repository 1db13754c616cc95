"""A Volcano Queue per tenant (``gpumeter-<tenant>``), in step with the tenants file, closed
while the tenant is blocked and reopened when it recovers (issue 9, item 5).

Queues are ``scheduling.volcano.sh/v1beta1`` objects, cluster-scoped, written through the
CustomObjectsApi. Each tenant of the tenants file gets one, labelled
``app.kubernetes.io/managed-by: gpumeter`` and ``gpumeter.io/tenant``, with
``spec.capability[nvidia.com/gpu]`` = ``max_gpus`` (no GPU capability when max_gpus is null);
``weight`` and ``reclaimable`` are set at creation only, so an operator may tune them.

Closing and opening, faithfully to Volcano: a Queue's state lives in ``status.state``
(``Open`` | ``Closed`` | ``Closing`` | ``Unknown``); there is no spec field for it. Volcano's
own tools (``vcctl queue operate``) create a ``bus.volcano.sh/v1alpha1`` Command
(``CloseQueue``/``OpenQueue``) that vc-controller-manager turns into a write of
``status.state`` (pkg/controllers/queue/queue_controller_action.go); the scheduler only reads
``status.state`` and schedules nothing new from a queue that is not Open. We write
``status.state`` through the status subresource directly, which is what the controller itself
does, because (a) it works where only the Queue CRD is installed (no controller, no Command
CRD: our test control plane) and (b) the controller preserves it: its sync of a Closed or
Open queue keeps the state it finds (pkg/controllers/queue/state/closed.go, open.go). The one
difference from a Command: a queue with running PodGroups goes straight to Closed rather than
Closing, which the scheduler treats the same way (neither is Open).

Which metrics closed a queue is kept on the queue itself, in the annotation
``gpumeter.io/blocked-on`` (e.g. ``gpu_hours,max_gpus``): the state survives an actuator
restart without any store, ``recovered`` on one metric leaves the queue closed while another
is still exceeded, and a queue an operator closed by hand (no annotation) is never reopened
by us.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from gpumeter.core.kube import BLOCKED_ON_ANNOTATION, GPU_RESOURCE, TENANT_LABEL, parse_quantity
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from scheduler_hooks.cluster.kube_objects import QUEUE_PREFIX

log = logging.getLogger(__name__)

GROUP = "scheduling.volcano.sh"
VERSION = "v1beta1"
PLURAL = "queues"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "gpumeter"
OPEN, CLOSED = "Open", "Closed"
MERGE_PATCH = "application/merge-patch+json"


def queue_name(tenant: str) -> str:
    return f"{QUEUE_PREFIX}{tenant}"


def gpu_capability(policy: TenantPolicy | None) -> str | None:
    """``max_gpus`` as a resource quantity string (``"64"``, ``"2.5"``), or None for no limit."""
    if policy is None or policy.max_gpus is None:
        return None
    # Fixed-point: normalize() drops trailing zeros (2.50 -> 2.5), "f" writes 1E+2 out as 100.
    return format(policy.max_gpus.normalize(), "f")


def queue_manifest(tenant: str, policy: TenantPolicy | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": 1, "reclaimable": True}
    capability = gpu_capability(policy)
    if capability is not None:
        spec["capability"] = {GPU_RESOURCE: capability}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Queue",
        "metadata": {"name": queue_name(tenant), "labels": {MANAGED_BY_LABEL: MANAGER, TENANT_LABEL: tenant}},
        "spec": spec,
    }


def spec_patch(queue: Mapping[str, Any], policy: TenantPolicy | None) -> dict[str, Any] | None:
    """Merge patch bringing the queue's GPU capability in step with the policy; None when it is."""
    wanted = gpu_capability(policy)
    capability = (queue.get("spec") or {}).get("capability") or {}
    have = capability.get(GPU_RESOURCE)
    if have is not None and wanted is not None and _same_quantity(str(have), wanted):
        return None
    if have is None and wanted is None:
        return None
    return {"spec": {"capability": {GPU_RESOURCE: wanted}}}


def _same_quantity(a: str, b: str) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return a == b


def blocked_on(queue: Mapping[str, Any]) -> frozenset[str]:
    text = ((queue.get("metadata") or {}).get("annotations") or {}).get(BLOCKED_ON_ANNOTATION, "")
    return frozenset(part for part in str(text).split(",") if part)


def queue_state(queue: Mapping[str, Any]) -> str:
    return str((queue.get("status") or {}).get("state") or "")


@dataclass(frozen=True)
class QueueChange:
    tenant: str
    queue: str
    state: str  # OPEN or CLOSED after the change
    blocked_on: frozenset[str]


class VolcanoQueues:
    """Blocking calls against the API server; the actuator runs them in a worker thread."""

    def __init__(self, custom: CustomObjectsApi, dry_run: bool = False) -> None:
        self._custom = custom
        self._dry_run = dry_run
        # One change at a time: a sync pass repairing "blocked, not closed" must not interleave
        # with a reopen that has written the state and not yet the annotation.
        self._lock = threading.Lock()

    # -- reads ------------------------------------------------------------------------------
    def get(self, tenant: str) -> dict[str, Any] | None:
        try:
            found = self._custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, queue_name(tenant))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found) if isinstance(found, Mapping) else None

    def managed(self) -> dict[str, dict[str, Any]]:
        """Queues we manage, by tenant."""
        listed = self._custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, label_selector=f"{MANAGED_BY_LABEL}={MANAGER}")
        out: dict[str, dict[str, Any]] = {}
        items = listed.get("items") if isinstance(listed, Mapping) else None
        for item in items or ():
            tenant = ((item.get("metadata") or {}).get("labels") or {}).get(TENANT_LABEL)
            if tenant:
                out[str(tenant)] = item
        return out

    # -- the tenants file -------------------------------------------------------------------
    def sync(self, tenants: TenantsFile) -> list[str]:
        """Create missing queues and correct capabilities; returns what changed (or would)."""
        with self._lock:
            return self._sync(tenants)

    def _sync(self, tenants: TenantsFile) -> list[str]:
        existing = self.managed()
        changes: list[str] = []
        for policy in tenants.tenants:
            queue = existing.get(policy.tenant)
            if queue is None:
                changes.append(f"create {queue_name(policy.tenant)} capability {gpu_capability(policy)}")
                if not self._dry_run:
                    self._create(policy.tenant, policy)
                continue
            patch = spec_patch(queue, policy)
            if patch is not None:
                changes.append(f"set {queue_name(policy.tenant)} capability {gpu_capability(policy)}")
                self._patch(queue_name(policy.tenant), patch)
            if blocked_on(queue) and queue_state(queue) != CLOSED:
                # Blocked but not closed: a close interrupted between its two writes. Finish it.
                metrics = ",".join(sorted(blocked_on(queue)))
                changes.append(f"close {queue_name(policy.tenant)} (blocked on {metrics})")
                self._set_state(queue_name(policy.tenant), CLOSED)
        listed = {p.tenant for p in tenants.tenants}
        for tenant, queue in existing.items():
            if tenant not in listed and spec_patch(queue, None) is not None:
                # Gone from the file: no quota any more, so no GPU capability either.
                changes.append(f"drop capability of {queue_name(tenant)} (tenant left the tenants file)")
                self._patch(queue_name(tenant), {"spec": {"capability": {GPU_RESOURCE: None}}})
        return changes

    # -- blocked / recovered ----------------------------------------------------------------
    def close(self, tenant: str, metric: str, policy: TenantPolicy | None) -> QueueChange | None:
        """Close the tenant's queue for ``metric``; the change made (or that would be), else None."""
        with self._lock:
            return self._close(tenant, metric, policy)

    def _close(self, tenant: str, metric: str, policy: TenantPolicy | None) -> QueueChange | None:
        queue = self.get(tenant)
        if queue is None:
            queue = queue_manifest(tenant, policy) if self._dry_run else self._create(tenant, policy)
        metrics = blocked_on(queue) | {metric}
        was_closed = queue_state(queue) == CLOSED
        if metrics != blocked_on(queue):
            # Annotation first: a crash before the state write leaves "blocked, not closed",
            # which sync() finishes (and the replayed event does too).
            self._annotate(queue_name(tenant), metrics)
        if was_closed:
            return None
        self._set_state(queue_name(tenant), CLOSED)
        return QueueChange(tenant, queue_name(tenant), CLOSED, metrics)

    def reopen(self, tenant: str, metric: str) -> QueueChange | None:
        """Forget ``metric``; reopen when no metric we closed the queue for is left."""
        with self._lock:
            return self._reopen(tenant, metric)

    def _reopen(self, tenant: str, metric: str) -> QueueChange | None:
        queue = self.get(tenant)
        if queue is None or metric not in blocked_on(queue):
            return None  # not closed by us for this metric (or an operator's closed queue)
        metrics = blocked_on(queue) - {metric}
        if metrics:
            self._annotate(queue_name(tenant), metrics)
            return None
        # State first, annotation second: a crash in between leaves the metric on the queue, so
        # the replayed ``recovered`` finds it and finishes; the other order would leave a
        # closed queue that no longer says why, which nothing would ever reopen.
        self._set_state(queue_name(tenant), OPEN)
        self._annotate(queue_name(tenant), metrics)
        return QueueChange(tenant, queue_name(tenant), OPEN, metrics)

    # -- writes -----------------------------------------------------------------------------
    def _create(self, tenant: str, policy: TenantPolicy | None) -> dict[str, Any]:
        try:
            created = self._custom.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, queue_manifest(tenant, policy))
        except ApiException as exc:
            if exc.status != 409:
                raise
            found = self.get(tenant)  # created meanwhile (another replica, an operator)
            return found if found is not None else queue_manifest(tenant, policy)
        # vc-controller-manager would set Open on a new queue; where none runs, we do (same value).
        self._set_state(queue_name(tenant), OPEN)
        return dict(created) if isinstance(created, Mapping) else queue_manifest(tenant, policy)

    def _patch(self, name: str, body: dict[str, Any]) -> None:
        if not self._dry_run:
            self._custom.patch_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, body, _content_type=MERGE_PATCH)

    def _annotate(self, name: str, metrics: frozenset[str]) -> None:
        value = ",".join(sorted(metrics)) if metrics else None
        self._patch(name, {"metadata": {"annotations": {BLOCKED_ON_ANNOTATION: value}}})

    def _set_state(self, name: str, state: str) -> None:
        if not self._dry_run:
            self._custom.patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, {"status": {"state": state}}, _content_type=MERGE_PATCH)


class NoVolcanoQueues(VolcanoQueues):
    """A cluster without Volcano (the demo's simulated one): no queue to create, close or reopen;
    blocking is the extender's refusal alone there."""

    def __init__(self) -> None:
        self._dry_run = True
        self._lock = threading.Lock()

    def sync(self, tenants: TenantsFile) -> list[str]:
        return []

    def close(self, tenant: str, metric: str, policy: TenantPolicy | None) -> QueueChange | None:
        return None

    def reopen(self, tenant: str, metric: str) -> QueueChange | None:
        return None
