"""The chart's admission policies (deploy/helm/gpumeter/admission/, as rendered in
deploy/rendered/gpumeter.yaml) on the real kube-apiserver (contract 4, "trust").

The policies and bindings are applied as rendered. A tenant (a ServiceAccount of its own
namespace, through a token of its own) is refused a pod annotated ``gpumeter.io/protected``
and refused adding the annotation later; a member of the operator group (impersonated by the
admin) is not. The actuator's ServiceAccount (the chart's RBAC applied too) may patch the
eviction-notice annotation of a pod, and nothing else of it.

Admission policies are compiled and picked up asynchronously by the apiserver, so the first
refusal is waited for; every check after it is immediate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from testkit.kube_cluster import Kube
from tests.kube.test_rbac import SA_NAMESPACE, apply_rbac, service_account_client
from tests.support.rendered import rendered

pytestmark = [pytest.mark.kube, pytest.mark.security]

OPERATOR_GROUP = "gpumeter:operators"
PROTECTED = "gpumeter.io/protected"
NOTICE = "gpumeter.io/eviction-notice"
TENANT_SA = "tenant-app"
WAIT_S = 30.0
MERGE_PATCH = "application/merge-patch+json"


def policy_documents() -> list[dict[str, Any]]:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    return [doc for doc in rendered() if doc["kind"] in kinds]


@pytest.fixture
def policies(kube: Kube) -> Iterator[k8s.ApiClient]:
    """The file's policies and bindings applied (replacing earlier ones), removed afterwards."""
    with kube.api_client() as api:
        admission = k8s.AdmissionregistrationV1Api(api)
        kinds: dict[str, tuple[Any, Callable[[Any], Any], Callable[[str], Any]]] = {
            "ValidatingAdmissionPolicy": (k8s.V1ValidatingAdmissionPolicy,
                                          admission.create_validating_admission_policy,
                                          admission.delete_validating_admission_policy),
            "ValidatingAdmissionPolicyBinding": (k8s.V1ValidatingAdmissionPolicyBinding,
                                                 admission.create_validating_admission_policy_binding,
                                                 admission.delete_validating_admission_policy_binding),
        }
        documents = policy_documents()
        for doc in documents:
            model, create, delete = kinds[doc["kind"]]
            try:
                delete(doc["metadata"]["name"])
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
            create(model.model_validate(doc))
        apply_rbac(api)
        try:
            yield api
        finally:
            for doc in reversed(documents):
                _model, _create, delete = kinds[doc["kind"]]
                delete(doc["metadata"]["name"])


def pod_body(name: str, annotations: dict[str, str] | None = None) -> k8s.V1Pod:
    return k8s.V1Pod.model_validate({
        "metadata": {"name": name, "annotations": annotations or {}, "labels": {"app": name}},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.invalid/x:1"}]},
    })


def tenant_client(kube: Kube, admin: k8s.ApiClient, namespace: str) -> k8s.ApiClient:
    """A token of a ServiceAccount of the tenant's namespace, allowed to create and patch pods."""
    core, rbac = k8s.CoreV1Api(admin), k8s.RbacAuthorizationV1Api(admin)
    core.create_namespaced_service_account(namespace, k8s.V1ServiceAccount(
        metadata=k8s.V1ObjectMeta(name=TENANT_SA)))
    rbac.create_namespaced_role(namespace, k8s.V1Role.model_validate({
        "metadata": {"name": "pods"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "patch", "update"]}],
    }))
    rbac.create_namespaced_role_binding(namespace, k8s.V1RoleBinding.model_validate({
        "metadata": {"name": "pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": TENANT_SA, "namespace": namespace},
                     {"kind": "Group", "name": OPERATOR_GROUP, "apiGroup": "rbac.authorization.k8s.io"}],
    }))
    spec = k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    status = core.create_namespaced_service_account_token(
        TENANT_SA, namespace, k8s.AuthenticationV1TokenRequest(spec=spec)).status
    assert status is not None and status.token
    configuration = k8s.Configuration(host=kube.server, api_key={"BearerToken": status.token},
                                      api_key_prefix={"BearerToken": "Bearer"}, ssl_ca_cert=str(kube.ca_file))
    return k8s.ApiClient(configuration)


def operator_client(kube: Kube) -> k8s.ApiClient:
    """The admin impersonating an operator: user alice, group gpumeter:operators only."""
    client = kube.api_client()
    client.set_default_header("Impersonate-User", "alice")
    client.set_default_header("Impersonate-Group", OPERATOR_GROUP)
    return client


def refused(call: Callable[[], Any]) -> str:
    """The apiserver's refusal message of ``call``; fails if the call went through."""
    with pytest.raises(k8s.ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value.body
    return str(caught.value.body)


def first_refusal(call: Callable[[], Any]) -> str:
    """Wait until the policies are in force: ``call`` (a dry run) is refused."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            call()
        except k8s.ApiException as exc:
            if exc.status == 403 and "gpumeter" in str(exc.body):
                return str(exc.body)
            raise
        assert time.monotonic() < deadline, "admission policy not in force"
        time.sleep(0.2)


def test_only_an_operator_may_protect_a_pod(
    kube: Kube, policies: k8s.ApiClient, kube_namespace: str,
) -> None:
    namespace = kube_namespace
    with tenant_client(kube, policies, namespace) as tenant_api, operator_client(kube) as operator_api:
        tenant, operator = k8s.CoreV1Api(tenant_api), k8s.CoreV1Api(operator_api)
        message = first_refusal(lambda: tenant.create_namespaced_pod(
            namespace, pod_body("self-protected", {PROTECTED: "true"}), dry_run="All"))
        assert "only an operator" in message and OPERATOR_GROUP in message
        refused(lambda: tenant.create_namespaced_pod(namespace, pod_body("loud", {PROTECTED: "TRUE"})))

        # Without the annotation the tenant's pod is admitted; adding it afterwards is refused.
        tenant.create_namespaced_pod(namespace, pod_body("plain", {"team": "a"}))
        refused(lambda: tenant.patch_namespaced_pod(
            "plain", namespace, {"metadata": {"annotations": {PROTECTED: "true"}}},
            _content_type=MERGE_PATCH))
        # Other changes to the tenant's own pod still go through.
        tenant.patch_namespaced_pod("plain", namespace, {"metadata": {"labels": {"tier": "x"}}},
                                    _content_type=MERGE_PATCH)

        # The operator may protect, at creation and later.
        operator.create_namespaced_pod(namespace, pod_body("guarded", {PROTECTED: "true"}))
        operator.patch_namespaced_pod("plain", namespace, {"metadata": {"annotations": {PROTECTED: "true"}}},
                                      _content_type=MERGE_PATCH)

        # A tenant may update a protected pod without touching the annotation, or drop it; not change it.
        tenant.patch_namespaced_pod("guarded", namespace, {"metadata": {"labels": {"tier": "y"}}},
                                    _content_type=MERGE_PATCH)
        refused(lambda: tenant.patch_namespaced_pod(
            "guarded", namespace, {"metadata": {"annotations": {PROTECTED: "yes"}}},
            _content_type=MERGE_PATCH))
        tenant.patch_namespaced_pod("guarded", namespace, {"metadata": {"annotations": {PROTECTED: None}}},
                                    _content_type=MERGE_PATCH)
    core = k8s.CoreV1Api(policies)
    annotations = {}
    for name in ("plain", "guarded"):
        metadata = core.read_namespaced_pod(name, namespace).metadata
        assert metadata is not None
        annotations[name] = metadata.annotations or {}
    assert annotations["plain"].get(PROTECTED) == "true"
    assert PROTECTED not in annotations["guarded"]


def test_the_hooks_account_may_patch_only_the_eviction_notice(
    kube: Kube, policies: k8s.ApiClient, kube_namespace: str,
) -> None:
    namespace = kube_namespace
    core = k8s.CoreV1Api(policies)
    # A protected pod (made by the admin, an operator): the notice patch must pass there too.
    core.create_namespaced_pod(namespace, pod_body("victim", {PROTECTED: "true", "owner": "team-a"}))
    with service_account_client(kube, policies) as hooks_api:
        hooks = k8s.CoreV1Api(hooks_api)

        def patch(body: dict[str, Any]) -> Callable[[], Any]:
            return lambda: hooks.patch_namespaced_pod("victim", namespace, body, _content_type=MERGE_PATCH)

        message = first_refusal(lambda: hooks.patch_namespaced_pod(
            "victim", namespace, {"metadata": {"labels": {"evicted": "yes"}}}, _content_type=MERGE_PATCH,
            dry_run="All"))
        assert "only the gpumeter.io/eviction-notice annotation" in message
        patch({"metadata": {"annotations": {NOTICE: '{"cause": "c"}'}}})()  # the notice: allowed
        patch({"metadata": {"annotations": {NOTICE: None}}})()  # withdrawn: allowed
        for forbidden in (
            {"metadata": {"annotations": {"owner": "team-b"}}},
            {"metadata": {"annotations": {PROTECTED: None}}},
            {"metadata": {"annotations": {"new": "x", NOTICE: "{}"}}},
            {"metadata": {"labels": {"app": "other"}}},
            {"metadata": {"finalizers": ["example.com/hold"]}},
            {"spec": {"activeDeadlineSeconds": 5}},
        ):
            refused(patch(forbidden))
    stored = core.read_namespaced_pod("victim", namespace)
    assert stored.metadata is not None and stored.spec is not None
    assert stored.metadata.annotations == {PROTECTED: "true", "owner": "team-a"}
    assert stored.metadata.labels == {"app": "victim"} and not stored.metadata.finalizers
    assert stored.spec.active_deadline_seconds is None
    assert SA_NAMESPACE == "gpumeter-system"  # the account the policy names (the chart's actuator)
