"""The quota actuator's RBAC as the chart renders it (deploy/rendered/gpumeter.yaml) on the real
kube-apiserver: exactly what the actuator needs.

The objects are applied as rendered; SubjectAccessReview (the apiserver's own RBAC
authorizer answering) is asked about the service account for every verb it needs and for
the ones it must never have; then a token of that service account patches, evicts and is
refused a delete and a secret, against live objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from testkit.kube_cluster import Kube, wait_for_default_service_account
from tests.kube.fixtures import CreateGpuNodes
from tests.support.rendered import NAMESPACE, rendered

pytestmark = [pytest.mark.kube, pytest.mark.security]

SA_NAMESPACE = NAMESPACE
SA_NAME = "gpumeter-actuator"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
SA_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{SA_NAMESPACE}", "system:authenticated"]
WAIT_S = 60.0


def rbac_documents() -> list[dict[str, Any]]:
    """The actuator's account, cluster role, its Lease role and their bindings."""
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    return [doc for doc in rendered() if doc["kind"] in kinds
            and doc["metadata"]["name"] in (SA_NAME, f"{SA_NAME}-lease")]


def apply_rbac(api: k8s.ApiClient) -> None:
    """Create (or replace with the file's content) the namespace's ServiceAccount and the RBAC."""
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=SA_NAMESPACE)))
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    writers: dict[str, tuple[Any, Callable[[Any], Any], Callable[[str, Any], Any]]] = {
        "ServiceAccount": (k8s.V1ServiceAccount,
                           lambda body: core.create_namespaced_service_account(SA_NAMESPACE, body),
                           lambda name, body: core.replace_namespaced_service_account(
                               name, SA_NAMESPACE, body)),
        "ClusterRole": (k8s.V1ClusterRole, rbac.create_cluster_role, rbac.replace_cluster_role),
        "ClusterRoleBinding": (k8s.V1ClusterRoleBinding, rbac.create_cluster_role_binding,
                               rbac.replace_cluster_role_binding),
        "Role": (k8s.V1Role, lambda body: rbac.create_namespaced_role(SA_NAMESPACE, body),
                 lambda name, body: rbac.replace_namespaced_role(name, SA_NAMESPACE, body)),
        "RoleBinding": (k8s.V1RoleBinding,
                        lambda body: rbac.create_namespaced_role_binding(SA_NAMESPACE, body),
                        lambda name, body: rbac.replace_namespaced_role_binding(name, SA_NAMESPACE, body)),
    }
    for doc in rbac_documents():
        model, create, replace = writers[doc["kind"]]
        body = model.model_validate(doc)
        try:
            create(body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
            replace(doc["metadata"]["name"], body)  # applied earlier in the session: the file's again


def service_account_token(api: k8s.ApiClient) -> str:
    """A fresh bound token of the hooks ServiceAccount (an hour)."""
    core = k8s.CoreV1Api(api)
    spec = k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    request = k8s.AuthenticationV1TokenRequest(spec=spec)
    status = core.create_namespaced_service_account_token(SA_NAME, SA_NAMESPACE, request).status
    assert status is not None and status.token
    token: str = status.token
    return token


def service_account_client(kube: Kube, api: k8s.ApiClient) -> k8s.ApiClient:
    """A client authenticated as the hooks ServiceAccount (a fresh bound token)."""
    token = service_account_token(api)
    configuration = k8s.Configuration(host=kube.server, api_key={"BearerToken": token},
                                      api_key_prefix={"BearerToken": "Bearer"}, ssl_ca_cert=str(kube.ca_file))
    return k8s.ApiClient(configuration)


@pytest.fixture
def admin(kube: Kube) -> Iterator[k8s.ApiClient]:
    with kube.api_client() as client:
        apply_rbac(client)
        wait_for_default_service_account(client, SA_NAMESPACE)
        yield client


def allowed(api: k8s.ApiClient, verb: str, resource: str, *, group: str = "", subresource: str = "",
            namespace: str = "team-ns") -> bool:
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
                  "namespace": namespace}
    review = k8s.V1SubjectAccessReview.model_validate({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": SA_USER, "groups": SA_GROUPS, "resourceAttributes": attributes},
    })
    status = k8s.AuthorizationV1Api(api).create_subject_access_review(review).status
    assert status is not None
    return bool(status.allowed)


VOLCANO = "scheduling.volcano.sh"
COORDINATION = "coordination.k8s.io"
NEEDED = [
    *[("pods", "", "", verb, ns) for verb in ("get", "list", "watch", "patch") for ns in ("team-ns", "")],
    ("pods", "", "eviction", "create", "team-ns"),
    *[(kind, "", "", verb, "") for kind in ("nodes", "namespaces") for verb in ("get", "list", "watch")],
    ("events", "", "", "create", "team-ns"),
    *[("queues", VOLCANO, "", verb, "") for verb in ("get", "list", "watch", "create", "update", "patch")],
    *[("queues", VOLCANO, "status", verb, "") for verb in ("get", "update", "patch")],
    *[("leases", COORDINATION, "", verb, SA_NAMESPACE) for verb in ("get", "create", "update")],
]
FORBIDDEN = [
    ("pods", "", "", "delete", "team-ns"),
    ("pods", "", "", "deletecollection", "team-ns"),
    ("pods", "", "", "create", "team-ns"),
    ("pods", "", "", "update", "team-ns"),
    ("pods", "", "status", "patch", "team-ns"),
    ("pods", "", "exec", "create", "team-ns"),
    ("pods", "", "binding", "create", "team-ns"),
    *[("secrets", "", "", verb, ns) for verb in ("get", "list", "watch")
      for ns in ("team-ns", SA_NAMESPACE, "")],
    ("configmaps", "", "", "get", "team-ns"),
    ("nodes", "", "", "patch", ""),
    ("nodes", "", "", "delete", ""),
    ("namespaces", "", "", "delete", ""),
    ("events", "", "", "delete", "team-ns"),
    ("queues", VOLCANO, "", "delete", ""),
    ("podgroups", VOLCANO, "", "create", "team-ns"),
    ("serviceaccounts", "", "token", "create", SA_NAMESPACE),
    ("clusterroles", "rbac.authorization.k8s.io", "", "escalate", ""),
    ("clusterrolebindings", "rbac.authorization.k8s.io", "", "create", ""),
    ("deployments", "apps", "", "patch", "team-ns"),
    # The Lease grant is its own namespace's only: not node heartbeats, not others' elections.
    *[("leases", COORDINATION, "", verb, ns) for verb in ("get", "update", "create")
      for ns in ("kube-node-lease", "kube-system", "")],
    *[("leases", COORDINATION, "", verb, SA_NAMESPACE) for verb in ("delete", "list", "watch", "patch")],
]


def access(resource: str, group: str, subresource: str, verb: str, namespace: str) -> str:
    """A test id for one access: ``patch-pods-in-team-ns``, ``get-queues/status-cluster-wide``."""
    what = f"{resource}/{subresource}" if subresource else resource
    return f"{verb}-{what}-{f'in-{namespace}' if namespace else 'cluster-wide'}"


@pytest.mark.parametrize(
    ("resource", "group", "subresource", "verb", "namespace"), NEEDED, ids=[access(*case) for case in NEEDED]
)
def test_hooks_may(admin: k8s.ApiClient, resource: str, group: str, subresource: str, verb: str,
                   namespace: str) -> None:
    assert allowed(admin, verb, resource, group=group, subresource=subresource, namespace=namespace)


@pytest.mark.parametrize(
    ("resource", "group", "subresource", "verb", "namespace"),
    FORBIDDEN,
    ids=[access(*case) for case in FORBIDDEN],
)
def test_hooks_may_not(admin: k8s.ApiClient, resource: str, group: str, subresource: str, verb: str,
                       namespace: str) -> None:
    assert not allowed(admin, verb, resource, group=group, subresource=subresource, namespace=namespace)


def test_rules_name_no_wildcards() -> None:
    roles = [doc for doc in rbac_documents() if doc["kind"] in ("ClusterRole", "Role")]
    assert len(roles) == 2
    for rule in (rule for role in roles for rule in role["rules"]):
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule


def test_a_token_of_the_account_does_what_it_may_and_nothing_else(
    kube: Kube, admin: k8s.ApiClient, kube_namespace: str, gpu_nodes: CreateGpuNodes,
) -> None:
    [node] = gpu_nodes(1, gpus_per_node=2)
    core = k8s.CoreV1Api(admin)
    for name in ("victim", "bystander"):
        core.create_namespaced_pod(kube_namespace, k8s.V1Pod.model_validate({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [{
                "name": "main", "image": "registry.invalid/x:1",
                "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
        }))
    core.create_namespaced_secret(kube_namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="s"),
                                                               string_data={"k": "v"}))
    with service_account_client(kube, admin) as as_hooks:
        hooks_core = k8s.CoreV1Api(as_hooks)
        listed = hooks_core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={kube_namespace}")
        assert {p.metadata.name for p in listed.items if p.metadata} == {"victim", "bystander"}
        hooks_core.patch_namespaced_pod("victim", kube_namespace,
                                        {"metadata": {"annotations": {"gpumeter.io/eviction-notice": "{}"}}},
                                        _content_type="application/merge-patch+json")
        eviction = k8s.V1Eviction.model_validate(
            {"metadata": {"name": "victim", "namespace": kube_namespace}})
        hooks_core.create_namespaced_pod_eviction("victim", kube_namespace, eviction)
        for forbidden in (
            lambda: hooks_core.delete_namespaced_pod("bystander", kube_namespace),
            lambda: hooks_core.read_namespaced_secret("s", kube_namespace),
            lambda: hooks_core.list_secret_for_all_namespaces(),
        ):
            with pytest.raises(k8s.ApiException) as refused:
                forbidden()
            assert refused.value.status == 403
    deadline = time.monotonic() + WAIT_S
    while True:  # the eviction went through: the pod terminates (KWOK removes it)
        try:
            core.read_namespaced_pod("victim", kube_namespace)
        except k8s.ApiException as exc:
            assert exc.status == 404
            break
        assert time.monotonic() < deadline, "evicted pod still present"
        time.sleep(0.2)
    bystander = core.read_namespaced_pod("bystander", kube_namespace).metadata
    assert bystander is not None and bystander.deletion_timestamp is None
