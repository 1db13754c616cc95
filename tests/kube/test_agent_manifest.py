"""The agent's objects as the chart renders them (deploy/rendered/gpumeter.yaml) against a real
kube-apiserver: they are accepted, and the RBAC grants the agent exactly the reads it makes
(checked by the apiserver's authorizer), never nodes/proxy."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import utils

from tests.support.rendered import rendered

pytestmark = [pytest.mark.agent, pytest.mark.kube]

AGENT = "system:serviceaccount:gpumeter-system:gpumeter-agent"


def allowed(api: Any, verb: str, resource: str, subresource: str = "") -> bool:
    review = k8s.V1SubjectAccessReview(spec=k8s.V1SubjectAccessReviewSpec(
        user=AGENT, groups=["system:serviceaccounts", "system:serviceaccounts:gpumeter-system"],
        resource_attributes=k8s.V1ResourceAttributes(verb=verb, resource=resource, subresource=subresource,
                                                     group="")))
    status = k8s.AuthorizationV1Api(api).create_subject_access_review(review).status
    assert status is not None
    return bool(status.allowed)


def namespace_exists(api: Any, name: str) -> bool:
    try:
        k8s.CoreV1Api(api).read_namespace(name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_manifest_is_accepted_and_rbac_covers_the_agent(kube: Any) -> None:
    api = kube.api_client()
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet")
    documents = [d for d in rendered() if d["metadata"]["name"] == "gpumeter-agent" and d["kind"] in kinds]
    assert sorted(d["kind"] for d in documents) == sorted(kinds)
    # The hooks' tests deploy into the same namespace and leave it to the session.
    shared = namespace_exists(api, "gpumeter-system")
    try:
        if not shared:
            k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="gpumeter-system")))
        for document in documents:
            utils.create_from_dict(api, document)
        daemonset = k8s.AppsV1Api(api).read_namespaced_daemon_set("gpumeter-agent", "gpumeter-system")
        pod_spec = daemonset.spec.template.spec if daemonset.spec else None
        assert pod_spec is not None and pod_spec.service_account_name == "gpumeter-agent"

        for resource in ("pods", "namespaces", "nodes", "persistentvolumeclaims"):
            for verb in ("get", "list", "watch"):
                assert allowed(api, verb, resource), f"agent cannot {verb} {resource}"
        assert allowed(api, "get", "nodes", "stats")
        # nodes/proxy would reach every kubelet API (exec, logs) through the apiserver.
        assert not allowed(api, "get", "nodes", "proxy") and not allowed(api, "create", "nodes", "proxy")
        # Least privilege: it reads, it never writes.
        assert not allowed(api, "delete", "pods")
        assert not allowed(api, "create", "pods", "eviction")
        assert not allowed(api, "list", "secrets")
    finally:
        rbac = k8s.RbacAuthorizationV1Api(api)
        core = k8s.CoreV1Api(api)
        owned = (lambda: core.delete_namespace("gpumeter-system"),) if not shared else (
            lambda: k8s.AppsV1Api(api).delete_namespaced_daemon_set("gpumeter-agent", "gpumeter-system"),
            lambda: core.delete_namespaced_service_account("gpumeter-agent", "gpumeter-system"))
        for delete in (lambda: rbac.delete_cluster_role_binding("gpumeter-agent"),
                       lambda: rbac.delete_cluster_role("gpumeter-agent"), *owned):
            try:
                delete()
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
