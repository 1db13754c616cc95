"""`gpumeter explain pod NS/NAME [--json]`: why a GPU pod waits, and what would change that.

The facts come from where the deciders read them, never from a second implementation:

- the pod, its namespace and the nodes from the apiserver (KUBECONFIG, else in-cluster, as
  the hooks); the tenant by ``gpumeter.core.kube``'s rule (the hooks' ``watched_namespace``);
- the tenant's quotas as `quota status` and `budget show` compute them: the quota worker's
  ledger changelog (Kafka), the tenants file and the grants in ClickHouse ``quota_grants``;
- the GPUs the tenant's bound pods hold, counted as the extender counts them (its
  ``watched_pod``/``watched_node`` over the same API objects);
- what the extender would answer now: the running extender itself, asked with the
  kube-scheduler extender ``/kube/filter`` request for this pod and every node its
  ``nodeSelector`` admits (``NodeNames``), at ``explain.extender_url`` (default: the hooks'
  ``hooks.listen``). When it does not answer, one line says so and the quota part stands.

The rule that turns these into "held by" and "would change" is ``gpumeter.app.explanation``.
Exit 2 for bad input: not NS/NAME, a pod or namespace that does not exist (the name given is
the mistake), a pod that requests no GPUs.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpumeter.app.cli.arguments import Parser
from gpumeter.app.cli.errors import Failure, UsageError
from gpumeter.app.explanation import ExtenderAnswer, Facts, QuotaLine, explain, render
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantPolicy, load_tenants, model_key

_POD = re.compile(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="explain_command", required=True, parser_class=Parser)
    pod = commands.add_parser("pod", help="why a GPU pod is held (quota, capacity, topology) and what "
                                          "would change it")
    pod.add_argument("pod", metavar="NS/NAME", help="the pod: namespace/name")
    pod.add_argument("--json", action="store_true", help="machine-readable output")


def run(settings: Settings, args: argparse.Namespace) -> int:
    match = _POD.match(args.pod)
    if match is None:
        raise UsageError(f"expected NS/NAME (a namespace and a pod name), got {args.pod!r}")
    namespace, name = match.group(1), match.group(3)
    document = explain(gather(settings, namespace, name))
    print(json.dumps(document, indent=2) if args.json else render(document))
    return 0


def gather(settings: Settings, namespace: str, name: str) -> Facts:
    from kubernetes import client as k8s
    from kubernetes.config import ConfigException

    from scheduler_hooks.cluster.feeds import kube_api_client
    from scheduler_hooks.cluster.kube_json import WireError, pod_gpu_requests

    try:
        api = kube_api_client()
    except ConfigException as exc:
        raise Failure(f"no Kubernetes access (no in-cluster account, no kubeconfig): {exc}") from None
    try:
        core = k8s.CoreV1Api(api)
        pod = _read(api, lambda: core.read_namespaced_pod(name, namespace), f"pod {namespace}/{name}")
        ns = _read(api, lambda: core.read_namespace(namespace), f"namespace {namespace}")
        try:
            gpus, devices = pod_gpu_requests(pod.get("spec") or {})
        except WireError as exc:
            raise UsageError(f"pod {namespace}/{name}: {exc}") from None
        if gpus <= 0 and devices <= 0:
            raise UsageError(f"pod {namespace}/{name} requests no GPU device (nvidia.com/gpu, a MIG "
                             "device or a shared replica): gpumeter holds only GPU pods")
        nodes = _listed(api, core.list_node)
        namespaces = _listed(api, core.list_namespace)
        pods = _listed(api, lambda: core.list_pod_for_all_namespaces(field_selector="spec.nodeName!="))
    finally:
        api.close()
    return _facts(settings, pod, ns, gpus, devices, nodes, namespaces, pods)


def _read(api: Any, call: Any, what: str) -> dict[str, Any]:
    from kubernetes import client as k8s

    try:
        obj = call()
    except k8s.ApiException as exc:
        if exc.status == 404:
            raise UsageError(f"{what} not found") from None
        raise Failure(f"reading {what}: HTTP {exc.status} {exc.reason}") from None
    except OSError as exc:
        raise Failure(f"the Kubernetes API server does not answer: {exc}") from None
    document: dict[str, Any] = api.sanitize_for_serialization(obj)
    return document


def _listed(api: Any, call: Any) -> list[dict[str, Any]]:
    from kubernetes import client as k8s

    try:
        items = call().items
    except k8s.ApiException as exc:
        raise Failure(f"listing: HTTP {exc.status} {exc.reason}") from None
    except OSError as exc:
        raise Failure(f"the Kubernetes API server does not answer: {exc}") from None
    return [api.sanitize_for_serialization(item) for item in items]


Json = dict[str, Any]


def _facts(settings: Settings, pod: Json, ns: Json, gpus: int, devices: int, nodes: list[Json],
           namespaces: list[Json], pods: list[Json]) -> Facts:
    from gpumeter.core import kube
    from scheduler_hooks.cluster.state import watched_namespace, watched_node, watched_pod

    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    this_ns = watched_namespace(ns)
    tenant = None if this_ns is None or this_ns.tenant == kube.NO_TENANT else this_ns.tenant
    policies = load_tenants(settings.tenants)
    policy = policies.policy(tenant) if tenant is not None else None

    # GPUs held now, as the extender counts them: bound, unfinished pods of the tenant.
    tenant_of = {w.name: w.tenant for w in map(watched_namespace, namespaces) if w is not None}
    models = {w.name: w.gpu_model for w in map(watched_node, nodes) if w is not None}
    keys = tuple(policy.max_gpus_by_model) if policy is not None else ()
    held, by_key = Decimal(0), {key: Decimal(0) for key in keys}
    for other in map(watched_pod, pods):
        if other is None or other.uid == uid or not other.holds_gpus:
            continue
        if tenant_of.get(other.namespace) != tenant:
            continue
        held += other.gpus
        key = model_key(keys, models.get(other.node))
        if key is not None:
            by_key[key] += other.gpus

    quotas, blocked, period_end = _quota_lines(settings, tenant, policy)
    selector = spec.get("nodeSelector") or {}
    names = [n["metadata"]["name"] for n in nodes
             if all((n["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())]
    return Facts(
        namespace=namespace, name=name, gpus=gpus, gpu_devices=devices,
        phase=str((pod.get("status") or {}).get("phase") or "Unknown"), node=spec.get("nodeName") or None,
        tenant=tenant, on_exceed=policy.on_exceed if policy else None, blocked=blocked, quotas=quotas,
        period_end=period_end, max_gpus=policy.max_gpus if policy else None, held=held,
        max_gpus_by_model=dict(policy.max_gpus_by_model) if policy else {}, held_by_key=by_key,
        extender=ask_extender(settings, pod, names),
    )


def _quota_lines(settings: Settings, tenant: str | None,
                 policy: TenantPolicy | None) -> tuple[list[QuotaLine], list[str], datetime | None]:
    """The tenant's quotas as `quota status` computes them, with `budget show`'s grants."""
    if tenant is None or policy is None:
        return [], [], None
    from gpumeter.app.cli.budget import _client
    from gpumeter.app.cli.quota import _read_states
    from gpumeter.core.topics import ledger_changelog_topic
    from gpumeter.infra import grants as store
    from quota.grants import GrantError, active, fold, of_file
    from quota.periods import period_end, period_key
    from streams.quota import tenant_status

    client = _client(settings)
    try:
        records = store.read(client, tenant)
    finally:
        client.close()
    try:
        table_grants = fold(records).get(tenant, [])
    except GrantError as exc:
        raise Failure(f"quota_grants: {exc}") from None
    state = _read_states(settings, ledger_changelog_topic(settings.kafka.topic_prefix,
                                                          settings.worker.group)).get(tenant)
    # The quota clock of the tenant (event time), as `quota status`; wall time before any usage.
    at = state.clock if state is not None and state.clock is not None else datetime.now(UTC)
    status = tenant_status(tenant, state, policy, at, settings.quota.stale_seconds, table_grants)
    every = [*of_file(policy.grants), *table_grants]
    lines = []
    for metric in status.metrics:
        counted = (active(every, metric.metric, policy.period, at)
                   if metric.metric != "max_gpus" and metric.gpu_model is None else [])
        lines.append(QuotaLine(metric=metric.metric, period=metric.period, used=metric.used,
                               limit=metric.limit, state=metric.state, gpu_model=metric.gpu_model,
                               grants=[(g.key, g.amount) for g in counted]))
    return lines, list(status.blocked), period_end(period_key(at, policy.period))


def extender_url(settings: Settings) -> str:
    if settings.explain.extender_url:
        return settings.explain.extender_url.rstrip("/")
    host, port = settings.hooks.listen.rsplit(":", 1)
    if host in ("0.0.0.0", "::", "[::]"):  # a wildcard listen: ask it on this host
        host = "127.0.0.1"
    scheme = "https" if settings.hooks.tls_cert is not None else "http"
    return f"{scheme}://{host}:{port}"


def ask_extender(settings: Settings, pod: dict[str, Any], names: list[str]) -> ExtenderAnswer:
    """The extender's ``/kube/filter`` answer for the pod, as kube-scheduler would ask it."""
    url = extender_url(settings)
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    request = urllib.request.Request(f"{url}/kube/filter", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    context = None
    if url.startswith("https:"):
        tls = settings.explain
        context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
        if tls.client_cert is not None:
            context.load_cert_chain(str(tls.client_cert), str(tls.client_key) if tls.client_key else None)
    try:
        with urllib.request.urlopen(request, timeout=settings.explain.timeout_seconds,
                                    context=context) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return ExtenderAnswer(url, error=f"HTTP {exc.code} {_first_line(exc.read())}")
    except (OSError, ValueError, ssl.SSLError) as exc:
        return ExtenderAnswer(url, error=_first_line(str(getattr(exc, "reason", exc)).encode()))
    if not isinstance(answer, dict):
        return ExtenderAnswer(url, error="the answer is not an ExtenderFilterResult")
    if answer.get("Error"):
        return ExtenderAnswer(url, error=f"extender error: {answer['Error']}")
    return ExtenderAnswer(url, passed=list(answer.get("NodeNames") or []),
                          failed=dict(answer.get("FailedNodes") or {}),
                          unresolvable=dict(answer.get("FailedAndUnresolvableNodes") or {}))


def _first_line(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:300] if text else "(no body)"

