"""deploy/helm/gpumeter against helm and the real kube-apiserver.

- `helm lint --strict` with the default values and with the production example;
- `helm template` of each, sent to the apiserver with `kubectl apply --dry-run=server
  --validate=strict` (every object admitted and every field known, nothing stored);
- the committed rendering (deploy/rendered/gpumeter.yaml) is what helm renders now;
- every pod hardened (seccomp RuntimeDefault, capabilities dropped, read-only root, non-root but
  the agent), with requests, limits and probes;
- RBAC applied for real and asked with SubjectAccessReview what each service account may do;
- the wiring smoke: each workload's rendered command and environment run here, its ConfigMap and
  Secret volumes written to local files and its endpoints pointed at the local Kafka and
  ClickHouse, until its readiness probe answers (Deployments) or it completes (Jobs).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from gpumeter.app import schema
from gpumeter.core.config_files import ConfigError
from gpumeter.core.kafka_acls import role_acls
from gpumeter.core.settings import KafkaSettings, Settings, load_settings
from gpumeter.infra import clickhouse, kafka
from testkit.certs import CertificateAuthority
from testkit.kube_cluster import Kube, free_port, write_kubeconfig
from tests.kube.chart import CHART, PRODUCTION_VALUES, helm, render, render_text
from tests.services import Endpoints, Namespaces
from tests.support.rendered import NAMESPACE, RELEASE, RENDERED, find, pod_spec

pytestmark = pytest.mark.kube

VALUES = [
    pytest.param((), id="default-values"),
    pytest.param((PRODUCTION_VALUES,), id="production-example"),
]
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "Job", "CronJob")


def kubectl(kube: Kube, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl")
    assert binary, "kubectl is needed for `kubectl apply --dry-run=server`"
    return subprocess.run([binary, f"--kubeconfig={kube.kubeconfig}", *args], input=stdin,
                          capture_output=True, text=True, check=False, timeout=120)


def create_namespace(kube: Kube, name: str) -> None:
    with kube.api_client() as api:
        try:
            k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise


@pytest.fixture(scope="module")
def podmonitor_crd(kube: Kube) -> None:
    """The Prometheus Operator's PodMonitor kind, schema-less: the optional monitors are admitted."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "podmonitors.monitoring.coreos.com"},
        "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                 "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }
    applied = kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump(crd))
    assert applied.returncode == 0, applied.stderr
    established = kubectl(kube, "wait", "--for=condition=Established", "--timeout=60s",
                          "crd/podmonitors.monitoring.coreos.com")
    assert established.returncode == 0, established.stderr


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_passes(values: tuple[Path, ...]) -> None:
    args: list[str | Path] = ["lint", "--strict", CHART]
    for path in values:
        args += ["-f", path]
    linted = helm(*args)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_committed_rendering_is_current() -> None:
    assert RENDERED.read_text() == render_text(RELEASE, NAMESPACE), \
        "deploy/rendered/gpumeter.yaml is stale: run `make manifests`"


@pytest.mark.parametrize("values", VALUES)
def test_the_apiserver_admits_every_rendered_object(kube: Kube, podmonitor_crd: None,
                                                    values: tuple[Path, ...]) -> None:
    namespace = f"chart-dry-{uuid.uuid4().hex[:6]}"
    create_namespace(kube, namespace)
    text = render_text("gpumeter", namespace, values)
    objects = [d for d in yaml.safe_load_all(text) if d]
    applied = kubectl(kube, "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=text)
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    for obj in objects:
        name = obj["metadata"]["name"]
        assert any(f"/{name} " in line and "(server dry run)" in line for line in lines), \
            f"{obj['kind']} {name} not in kubectl's answer:\n{applied.stdout}"


@pytest.mark.parametrize("values", VALUES)
def test_every_pod_is_hardened_and_bounded(values: tuple[Path, ...]) -> None:
    workloads = [d for d in render("gpumeter", "gpumeter-system", values) if d["kind"] in WORKLOAD_KINDS]
    assert {w["metadata"]["name"] for w in workloads} == {
        "gpumeter-agent", "gpumeter-worker", "gpumeter-extender", "gpumeter-actuator", "gpumeter-api",
        "gpumeter-insights", "gpumeter-invoice-close", "gpumeter-migrate"}
    for workload in workloads:
        name, spec = workload["metadata"]["name"], pod_spec(workload)
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        if name != "gpumeter-agent":  # root for the kubelet's root-only socket (README)
            assert spec["securityContext"]["runAsNonRoot"] is True, name
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert set(context["capabilities"].get("add", [])) <= {"SYS_ADMIN"}, name
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), name
            assert {"cpu", "memory"} <= container["resources"]["limits"].keys(), name
            if workload["kind"] in ("Deployment", "DaemonSet") and name != "gpumeter-actuator":
                # (The actuator has no listener: the process is its own liveness.)
                assert "readinessProbe" in container and "livenessProbe" in container, name


KAFKA_CLIENTS = {"agent", "worker", "extender", "actuator", "insights"}
# The extender and the actuator read quota_grants (contract 4, amendment "grants").
CLICKHOUSE_CLIENTS = {"worker", "api", "insights", "invoice-close", "migrate", "extender", "actuator"}


@pytest.mark.parametrize("values", VALUES)
def test_network_policies_open_kafka_and_clickhouse_only_to_their_clients(values: tuple[Path, ...]) -> None:
    docs = render("gpumeter", "gpumeter-system", values)
    chosen = yaml.safe_load(PRODUCTION_VALUES.read_text()) if values else {}
    kafka_ports = set(chosen.get("networkPolicy", {}).get("kafka", {}).get("ports", [9092]))
    clickhouse_ports = set(chosen.get("networkPolicy", {}).get("clickhouse", {}).get("ports", [8123]))
    policies = {d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: d["spec"]
                for d in docs if d["kind"] == "NetworkPolicy"}
    workloads = {d["metadata"]["name"].removeprefix("gpumeter-")
                 for d in docs if d["kind"] in WORKLOAD_KINDS}
    assert policies.keys() == workloads  # every workload's pods are selected by a policy
    for component, spec in policies.items():
        assert spec["policyTypes"] == ["Ingress", "Egress"], component
        egress = {port["port"] for rule in spec["egress"] for port in rule["ports"]}
        assert bool(egress & kafka_ports) == (component in KAFKA_CLIENTS), component
        assert bool(egress & clickhouse_ports) == (component in CLICKHOUSE_CLIENTS), component
    extender_values = yaml.safe_load((CHART / "values.yaml").read_text())["extender"]
    allowed_clients = chosen.get("extender", {}).get("allowedClients", extender_values["allowedClients"])
    (rule,) = policies["extender"]["ingress"]
    assert rule["from"] == allowed_clients and rule["ports"] == [{"protocol": "TCP", "port": 8790}]


@pytest.mark.parametrize("values", VALUES)
def test_every_workload_loads_its_rendered_settings(values: tuple[Path, ...], tmp_path: Path) -> None:
    """The settings file and each container's GPUMETER_* variables pass the product's own loader
    (unknown keys, SASL without a username, bad values would each stop the pod at start)."""
    docs = render("gpumeter", "gpumeter-system", values)
    for workload in (d for d in docs if d["kind"] in WORKLOAD_KINDS):
        spec = pod_spec(workload)
        config = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "config")
        path = tmp_path / f"{workload['metadata']['name']}.yaml"
        path.write_text(find(docs, "ConfigMap", config)["data"]["settings.yaml"])
        (container,) = spec["containers"]
        env = {e["name"]: e["value"] for e in container["env"]
               if e["name"].startswith("GPUMETER_") and e["name"] != "GPUMETER_CONFIG" and "value" in e}
        load_settings(path, env=env)


@pytest.mark.parametrize(
    ("sets", "ca", "insecure"),
    [
        pytest.param({}, None, False, id="default-verifies-with-the-cluster-ca"),
        pytest.param({"agent.kubeletCAConfigMap": "kubelet-ca"}, Path("/etc/gpumeter/kubelet-ca/ca.crt"),
                     False, id="a-named-ca"),
        pytest.param({"agent.kubeletInsecureTLS": True}, None, True, id="insecure-only-when-asked"),
    ],
)
def test_the_agent_verifies_the_kubelet_unless_told_not_to(
    sets: dict[str, str | bool], ca: Path | None, insecure: bool
) -> None:
    """Issue 31, point 4: the chart used to turn kubelet TLS verification off by default."""
    from collectors.agent.collector import AgentConfig

    docs = render("gpumeter", "gpumeter-system", sets=sets)
    spec = pod_spec(find(docs, "DaemonSet", "gpumeter-agent"))
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = AgentConfig.from_env({**env, "NODE_IP": "10.0.0.7"})
    assert (config.kubelet_ca, config.kubelet_insecure_tls) == (ca, insecure)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    if ca is not None:
        assert mounts[str(ca.parent)] == "kubelet-ca"
        assert volumes["kubelet-ca"]["configMap"]["name"] == sets["agent.kubeletCAConfigMap"]
    else:
        assert "kubelet-ca" not in volumes


def test_the_documented_kafka_acls_are_the_roles_acls_of_the_code() -> None:
    """values.yaml's kafka.acls (for the platform's ACL tooling) say what gpumeter/core/kafka_acls.py
    grants each role the chart runs, under the default settings."""
    documented = yaml.safe_load((CHART / "values.yaml").read_text())["kafka"]["acls"]
    expected = {role: sorted((acl.resource, acl.name, acl.operation) for acl in acls)
                for role, acls in role_acls(Settings()).items() if role in documented}
    assert documented.keys() == {"agent", "worker", "hooks", "insights"}
    for role, entries in documented.items():
        flat = sorted((e["resource"], e["name"], operation) for e in entries for operation in e["operations"])
        assert flat == expected[role], role


@pytest.mark.parametrize("values", VALUES)
def test_only_the_migrate_job_migrates_and_it_runs_before_install_and_upgrade(
        values: tuple[Path, ...]) -> None:
    """Issue 30's upgrade order: Helm runs the migrate Job (a pre-install/pre-upgrade hook) and
    waits for it before it applies the release's workloads; no workload of the release migrates
    (a worker of the new version refuses a schema that is behind: tests/integration/
    test_migrate.py::test_an_upgrade_in_the_charts_order_refuses_then_migrates_then_bills)."""
    docs = render(RELEASE, NAMESPACE, values)
    job = find(docs, "Job", f"{RELEASE}-migrate")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    # The Job of the previous upgrade is replaced, a finished one removed: a failed one stays
    # for `kubectl logs` until the next attempt.
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation", "hook-succeeded"}
    [container] = pod_spec(job)["containers"]
    assert [*container["command"], *container.get("args", [])] == ["gpumeter", "migrate"]
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["activeDeadlineSeconds"] > 0
    # Hooks run before the release's objects exist: what the Job mounts and runs as is a hook
    # too, created before it (a lower weight).
    spec = pod_spec(job)
    needed = [find(docs, "ServiceAccount", spec["serviceAccountName"])] + [
        find(docs, "ConfigMap", v["configMap"]["name"]) for v in spec["volumes"] if "configMap" in v]
    for obj in needed:
        hook = obj["metadata"].get("annotations", {})
        assert hook.get("helm.sh/hook") == annotations["helm.sh/hook"], obj["metadata"]["name"]
        assert int(hook["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    hooks = {(d["kind"], d["metadata"]["name"]) for d in docs
             if "helm.sh/hook" in d["metadata"].get("annotations", {})}
    assert hooks == {("Job", job["metadata"]["name"]), *((o["kind"], o["metadata"]["name"]) for o in needed)}
    for workload in (d for d in docs if d["kind"] in WORKLOAD_KINDS and d is not job):
        pod = pod_spec(workload)
        for each in [*pod.get("initContainers", []), *pod["containers"]]:
            argv = [*each.get("command", []), *each.get("args", [])]
            assert "migrate" not in argv, (workload["metadata"]["name"], argv)
    [worker] = pod_spec(find(docs, "Deployment", f"{RELEASE}-worker"))["containers"]
    assert worker["command"][:2] == ["gpumeter", "worker"]


def test_more_workers_than_sample_partitions_is_refused() -> None:
    refused = helm("template", "gpumeter", CHART, "--set", "worker.replicas=7",
                   "--set", "kafka.partitions.samples=6")
    assert refused.returncode != 0
    assert "worker.replicas (7) must not exceed kafka.partitions.samples (6)" in refused.stderr


def test_a_plain_http_extender_is_rendered_only_behind_a_network_policy_naming_its_clients(
    tmp_path: Path,
) -> None:
    """Issue 31, point 7: with extender.tls.enabled: false (Volcano cannot present a client
    certificate) any pod could read every tenant's quota state through the Volcano verbs."""
    plain = ("--set", "extender.tls.enabled=false")
    refused = helm("template", "gpumeter", CHART, *plain, "--set", "networkPolicy.enabled=false")
    assert refused.returncode != 0 and "needs networkPolicy.enabled: true" in refused.stderr
    refused = helm("template", "gpumeter", CHART, *plain, "--set", "extender.allowedClients=null")
    assert refused.returncode != 0 and "needs extender.allowedClients" in refused.stderr

    docs = render("gpumeter", "gpumeter-system", sets={"extender.tls.enabled": False})
    spec = pod_spec(find(docs, "Deployment", "gpumeter-extender"))
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]
           if e["name"].startswith("GPUMETER_HOOKS_") and "value" in e}
    assert "GPUMETER_HOOKS_TLS_CERT" not in env
    assert load_settings(None, env=env).hooks.allow_plaintext  # would refuse 0.0.0.0 without it
    without = {k: v for k, v in env.items() if k != "GPUMETER_HOOKS_ALLOW_PLAINTEXT"}
    with pytest.raises(ConfigError, match=r"hooks\.allow_plaintext"):
        load_settings(None, env=without)
    (rule,) = find(docs, "NetworkPolicy", "gpumeter-extender")["spec"]["ingress"]
    assert rule["from"] and rule["from"] == yaml.safe_load((CHART / "values.yaml").read_text())["extender"][
        "allowedClients"]


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("deployment", ["gpumeter-extender", "gpumeter-api"])
def test_a_stopping_server_keeps_serving_until_its_endpoint_is_gone_and_drains_within_the_grace_period(
    values: tuple[Path, ...], deployment: str,
) -> None:
    """A replica taken away by choice sleeps in preStop (its endpoint is withdrawn meanwhile), then
    gets SIGTERM and drains its calls in flight (scheduler_hooks.extender.server.DRAIN_SECONDS):
    both must end before the kubelet's SIGKILL at terminationGracePeriodSeconds."""
    from scheduler_hooks.extender.server import DRAIN_SECONDS

    spec = pod_spec(find(render("gpumeter", "gpumeter-system", values=values), "Deployment", deployment))
    (container,) = spec["containers"]
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = spec.get("terminationGracePeriodSeconds", 30)  # the Kubernetes default when unset
    assert sleep >= 2, "kube-proxy needs a second or two to drop the endpoint"
    assert sleep + DRAIN_SECONDS < grace


def test_sasl_without_a_role_secret_is_refused() -> None:
    others = [f"--set=kafka.credentials.{role}.secretName=kafka-{role}"
              for role in ("agent", "hooks", "insights")]
    refused = helm("template", "gpumeter", CHART, "--set", "kafka.securityProtocol=SASL_SSL", *others)
    assert refused.returncode != 0
    assert "kafka.credentials.worker.secretName is required with SASL_SSL" in refused.stderr
    complete = helm("template", "gpumeter", CHART, "--set", "kafka.securityProtocol=SASL_SSL", *others,
                    "--set", "kafka.credentials.worker.secretName=kafka-worker")
    assert complete.returncode == 0, complete.stderr


# --- RBAC: SubjectAccessReview against the chart's roles, applied for real ------------------

RBAC_RELEASE = "rbac-gpumeter"
RBAC_NAMESPACE = "gpumeter-rbac"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
VOLCANO = "scheduling.volcano.sh"
LEASES = "coordination.k8s.io"


@pytest.fixture(scope="module")
def chart_rbac(kube: Kube) -> Kube:
    create_namespace(kube, RBAC_NAMESPACE)
    rbac = [d for d in render(RBAC_RELEASE, RBAC_NAMESPACE) if d["kind"] in RBAC_KINDS]
    applied = kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    assert applied.returncode == 0, applied.stderr
    return kube


def allowed(kube: Kube, account: str, verb: str, resource: str, group: str = "", subresource: str = "",
            namespace: str = "team-ns", name: str = "") -> bool:
    user = f"system:serviceaccount:{RBAC_NAMESPACE}:{RBAC_RELEASE}-{account}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{RBAC_NAMESPACE}", "system:authenticated"]
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
                  "namespace": namespace, "name": name}
    review = k8s.V1SubjectAccessReview.model_validate({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
    })
    with kube.api_client() as api:
        status = k8s.AuthorizationV1Api(api).create_subject_access_review(review).status
    assert status is not None
    return bool(status.allowed)


def may(account: str, verb: str, resource: str, group: str = "", subresource: str = "",
        namespace: str = "team-ns", name: str = "") -> Any:
    where = f"{namespace or 'cluster'}{'/' + name if name else ''}"
    return pytest.param(account, verb, resource, group, subresource, namespace, name,
                        id=f"{account}-{verb}-{resource}{'/' + subresource if subresource else ''}-{where}")


READS = ("get", "list", "watch")
ALLOWED = [
    # The agent reads pods (of its node), namespaces (tenants), nodes (its labels), claims
    # (storage) and the kubelet's stats; nothing else.
    *[may("agent", verb, kind, namespace=ns) for verb in READS
      for kind, ns in (("pods", ""), ("pods", "team-ns"), ("namespaces", ""), ("nodes", ""),
                       ("persistentvolumeclaims", "team-ns"))],
    may("agent", "get", "nodes", subresource="stats", namespace="", name="gpu-1"),
    # The extender only reads.
    *[may("extender", verb, kind, namespace="") for verb in READS
      for kind in ("pods", "nodes", "namespaces")],
    # The actuator: evictions, eviction-notice patches, events, Volcano queues, its own Lease.
    may("actuator", "create", "pods", subresource="eviction"),
    may("actuator", "patch", "pods"),
    may("actuator", "create", "events"),
    *[may("actuator", verb, "queues", group=VOLCANO, namespace="")
      for verb in ("get", "list", "watch", "create", "update", "patch")],
    *[may("actuator", verb, "leases", group=LEASES, namespace=RBAC_NAMESPACE, name="gpumeter-actuator")
      for verb in ("get", "create", "update")],
]
DENIED = [
    may("agent", "get", "nodes", subresource="proxy", namespace="", name="gpu-1"),
    may("agent", "create", "nodes", subresource="proxy", namespace="", name="gpu-1"),
    *[may("agent", verb, "pods") for verb in ("create", "patch", "update", "delete")],
    may("agent", "create", "pods", subresource="exec"),
    may("agent", "get", "pods", subresource="log"),
    may("agent", "create", "pods", subresource="eviction"),
    may("agent", "get", "secrets"),
    may("agent", "list", "secrets", namespace=""),
    may("agent", "get", "configmaps"),
    may("agent", "patch", "nodes", namespace=""),
    may("agent", "create", "leases", group=LEASES, namespace=RBAC_NAMESPACE),
    may("extender", "patch", "pods"),
    may("extender", "create", "pods", subresource="eviction"),
    may("extender", "create", "leases", group=LEASES, namespace=RBAC_NAMESPACE),
    may("extender", "get", "secrets", namespace=RBAC_NAMESPACE),
    may("extender", "get", "nodes", subresource="proxy", namespace=""),
    *[may("actuator", verb, "pods") for verb in ("create", "update", "delete", "deletecollection")],
    may("actuator", "patch", "pods", subresource="status"),
    may("actuator", "create", "pods", subresource="exec"),
    may("actuator", "get", "secrets", namespace=RBAC_NAMESPACE),
    may("actuator", "get", "configmaps"),
    may("actuator", "patch", "nodes", namespace=""),
    may("actuator", "delete", "queues", group=VOLCANO, namespace=""),
    *[may("actuator", verb, "leases", group=LEASES, namespace=RBAC_NAMESPACE, name="gpumeter-actuator")
      for verb in ("delete", "patch", "list", "watch")],
    *[may("actuator", "update", "leases", group=LEASES, namespace=ns, name="gpumeter-actuator")
      for ns in ("team-ns", "kube-node-lease")],
    may("actuator", "create", "serviceaccounts", subresource="token", namespace=RBAC_NAMESPACE),
    may("actuator", "create", "clusterrolebindings", group="rbac.authorization.k8s.io", namespace=""),
    # Accounts that talk to ClickHouse only have no Kubernetes rights at all.
    *[may(account, "list", "pods", namespace="")
      for account in ("worker", "api", "insights", "invoice-close")],
    *[may(account, "get", "secrets", namespace=RBAC_NAMESPACE) for account in ("worker", "api", "migrate")],
]


REVIEW = ("account", "verb", "resource", "group", "subresource", "namespace", "name")


@pytest.mark.parametrize(REVIEW, ALLOWED)
def test_service_account_may(chart_rbac: Kube, account: str, verb: str, resource: str, group: str,
                             subresource: str, namespace: str, name: str) -> None:
    assert allowed(chart_rbac, account, verb, resource, group, subresource, namespace, name)


@pytest.mark.parametrize(REVIEW, DENIED)
def test_service_account_may_not(chart_rbac: Kube, account: str, verb: str, resource: str, group: str,
                                 subresource: str, namespace: str, name: str) -> None:
    assert not allowed(chart_rbac, account, verb, resource, group, subresource, namespace, name)


# --- the wiring smoke --------------------------------------------------------------------

SMOKE_RELEASE = "smoke-gpumeter"
SMOKE_NAMESPACE = "gpumeter-smoke"
READY_TIMEOUT_S = 180.0
BIN = Path(sys.executable).parent


def gpumeter_help(*command: str) -> str:
    shown = subprocess.run([str(BIN / "gpumeter"), *command, "--help"], capture_output=True, text=True,
                           check=False, timeout=60)
    return shown.stdout


class Sandbox:
    """A rendered pod's volumes as local directories, and its paths rewritten to them."""

    def __init__(self, root: Path, docs: list[dict[str, Any]], spec: dict[str, Any],
                 secrets: dict[str, dict[str, bytes]]) -> None:
        self.mounts: dict[str, Path] = {}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        (container,) = spec["containers"]
        self.container = container
        for mount in container.get("volumeMounts", []):
            local = root / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                configmap = find(docs, "ConfigMap", volume["configMap"]["name"])
                data = {key: text.encode() for key, text in configmap["data"].items()}
                self._write(local, data, volume["configMap"].get("items"))
            elif "secret" in volume:
                secret = volume["secret"]["secretName"]
                assert secret in secrets, f"the smoke has no stand-in for Secret {secret}"
                self._write(local, secrets[secret], volume["secret"].get("items"))
            self.mounts[mount["mountPath"]] = local
        for path in root.rglob("*.yaml"):
            path.write_text(self.local(path.read_text()))

    @staticmethod
    def _write(directory: Path, data: dict[str, bytes], items: list[dict[str, str]] | None) -> None:
        for key, path in ((i["key"], i["path"]) for i in items) if items else ((k, k) for k in data):
            target = directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[key])

    def local(self, text: str) -> str:
        """Mount paths in ``text`` (whole path components, in one pass) as their local directories."""
        if not self.mounts:
            return text
        paths = "|".join(re.escape(m) for m in sorted(self.mounts, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w./-])({paths})(?![\w.-])")
        return pattern.sub(lambda match: str(self.mounts[match.group(1)]), text)

    def environment(self, kubeconfig: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUMETER_", "KUBERNETES_", "KUBECONFIG"))}
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        for item in self.container.get("env", []):
            if "value" in item:
                env[item["name"]] = self.local(item["value"])
            else:
                field = item["valueFrom"]["fieldRef"]["fieldPath"]
                env[item["name"]] = {"spec.nodeName": "smoke-node", "status.hostIP": "127.0.0.1",
                                     "metadata.name": "smoke-pod"}[field]
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def command(self) -> list[str]:
        return [self.local(part) for part in [*self.container["command"], *self.container.get("args", [])]]


def probe_answers(sandbox: Sandbox, probe: dict[str, Any], env: dict[str, str]) -> bool:
    ports = {p["name"]: p["containerPort"] for p in sandbox.container.get("ports", [])}
    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = ports.get(get["port"], get["port"])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}", timeout=3) as answer:
                return bool(answer.status == 200)
        if "exec" in probe:
            done = subprocess.run([sandbox.local(p) for p in probe["exec"]["command"]], env=env,
                                  capture_output=True, timeout=10, check=False)
            return done.returncode == 0
        port = ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return True
    except (OSError, ssl.SSLError):
        return False


def service_account_kubeconfig(kube: Kube, account: str, path: Path) -> Path:
    """A kubeconfig holding a fresh token of the release's service account."""
    spec = k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    with kube.api_client() as api:
        status = k8s.CoreV1Api(api).create_namespaced_service_account_token(
            account, SMOKE_NAMESPACE, k8s.AuthenticationV1TokenRequest(spec=spec)).status
    assert status is not None and status.token
    write_kubeconfig(path, kube.server, kube.ca_file, status.token)
    return path


@pytest.fixture(scope="module")
def smoke_namespace(kube: Kube) -> str:
    create_namespace(kube, SMOKE_NAMESPACE)
    return SMOKE_NAMESPACE


def extender_secrets(directory: Path) -> dict[str, dict[str, bytes]]:
    """The extender's three Secrets as cert-manager would write them, from one throwaway CA."""
    authority = CertificateAuthority(directory)
    server = authority.issue("gpumeter-extender", hosts=("127.0.0.1", "localhost"))
    probe = authority.issue("readiness-probe", server=False)
    ca = authority.certificate.read_bytes()
    return {
        "gpumeter-extender-tls": {"tls.crt": server.certificate.read_bytes(),
                                        "tls.key": server.key.read_bytes(), "ca.crt": ca},
        "gpumeter-extender-client-ca": {"ca.crt": ca},
        "gpumeter-extender-probe": {"tls.crt": probe.certificate.read_bytes(),
                                          "tls.key": probe.key.read_bytes()},
    }


# kind, component, what it talks to: Kafka, ClickHouse.
SMOKE = [
    pytest.param("Deployment", "worker", {"kafka", "clickhouse"}, id="worker"),
    pytest.param("Deployment", "extender", {"kafka", "clickhouse"}, id="extender"),
    pytest.param("Deployment", "actuator", {"kafka", "clickhouse"}, id="actuator"),
    pytest.param("Deployment", "api", {"clickhouse"}, id="api"),
    pytest.param("CronJob", "insights", {"kafka", "clickhouse"}, id="insights-cronjob"),
    pytest.param("CronJob", "invoice-close", {"clickhouse"}, id="invoice-close-cronjob"),
    pytest.param("Job", "migrate", {"clickhouse"}, id="migrate-job"),
    pytest.param("DaemonSet", "agent", {"kafka"}, id="agent-daemonset"),
]


@pytest.fixture
def running() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.parametrize(("kind", "component", "services"), SMOKE)
def test_each_workload_starts_with_its_rendered_wiring(
        kube: Kube, smoke_namespace: str, endpoints: Endpoints, namespaces: Namespaces, tmp_path: Path,
        running: list[subprocess.Popen[bytes]], kind: str, component: str, services: set[str]) -> None:
    tag = uuid.uuid4().hex[:10]
    settings = Settings(kafka=KafkaSettings(bootstrap=endpoints.kafka_bootstrap, topic_prefix=f"t{tag}."))
    settings.clickhouse.dsn = f"{endpoints.clickhouse_url}/t_{tag}"
    namespaces.add(settings)
    kafka.ensure_topics(settings.kafka)  # the platform's job on a managed cluster (createTopics: false)
    if component != "migrate":  # the install order: the pre-install migrate Job has run
        client = clickhouse.connect(settings.clickhouse.dsn)
        try:
            schema.migrate(client)
        finally:
            client.close()
    docs = render(SMOKE_RELEASE, smoke_namespace, sets={
        "kafka.bootstrap": settings.kafka.bootstrap, "kafka.topicPrefix": settings.kafka.topic_prefix,
        "clickhouse.dsn": settings.clickhouse.dsn,
        "worker.metricsPort": free_port(), "extender.port": free_port(),
        "api.port": free_port(), "agent.metricsPort": free_port(),
    })
    workload = find(docs, kind, f"{SMOKE_RELEASE}-{component}")
    spec = pod_spec(workload)
    sandbox = Sandbox(tmp_path / "pod", docs, spec, extender_secrets(tmp_path / "ca"))
    command = sandbox.command()
    if command[:2] == ["gpumeter", "hooks"] and "--role" not in gpumeter_help("hooks"):
        role = command[command.index("--role") + 1]
        print(f"`gpumeter hooks` has no --role yet (branch hooks-roles): the {role} runs as "
              "`gpumeter hooks` (every role) with the same rendered wiring")
        command = [part for i, part in enumerate(command) if part != "--role" and command[i - 1] != "--role"]
    if command[:2] == ["gpumeter", "migrate"] and " migrate " not in gpumeter_help():
        pytest.skip("`gpumeter migrate` does not exist yet (branch ch-cluster): the migrate Job is not run")
    kubeconfig = None
    if spec.get("automountServiceAccountToken", True) is not False:
        applied = kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump_all(
            [d for d in docs if d["kind"] in RBAC_KINDS]))
        assert applied.returncode == 0, applied.stderr
        kubeconfig = service_account_kubeconfig(kube, spec["serviceAccountName"], tmp_path / "kubeconfig")
    env = sandbox.environment(kubeconfig)
    # What the process will load is this release's endpoints, not a default: a key the chart
    # left out would otherwise reach whatever answers on the default port of this machine.
    loaded = load_settings(env=env)
    if "kafka" in services:
        assert (loaded.kafka.bootstrap, loaded.kafka.topic_prefix) == (
            settings.kafka.bootstrap, settings.kafka.topic_prefix)
    if "clickhouse" in services:
        assert loaded.clickhouse.dsn == settings.clickhouse.dsn
    log = tmp_path / "process.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    running.append(process)

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:]

    if kind == "DaemonSet":
        # No NVML here: the agent must get as far as looking for it (its settings loaded).
        assert process.wait(timeout=READY_TIMEOUT_S) == 1, tail()
        assert "NVML is not available" in tail(), tail()
        return
    if kind in ("Job", "CronJob"):
        assert process.wait(timeout=READY_TIMEOUT_S) == 0, tail()
        return
    if component == "actuator":  # no probe: ready is holding the Lease (its RBAC and namespace work)
        def ready() -> bool:
            return " holds lease " in tail()
    else:
        def ready() -> bool:
            return probe_answers(sandbox, sandbox.container["readinessProbe"], env)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        assert process.poll() is None, f"{component} exited with {process.returncode}:\n{tail()}"
        assert time.monotonic() < deadline, f"{component} not ready in {READY_TIMEOUT_S:.0f} s:\n{tail()}"
        time.sleep(1.0)
