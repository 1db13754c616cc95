"""`gpumeter explain pod` as a user runs it: a process against the real kube-apiserver, a running
`gpumeter hooks` process (Kafka, ClickHouse and the apiserver behind it) and real ClickHouse
for the grants. Three pending pods of one tenant on one 4-GPU KWOK node: one held by quota
(max_gpus), one held by capacity, one that fits. No kube-scheduler runs, so they stay pending
and the extender's answer is the only thing deciding what explain says.
"""

from __future__ import annotations

import functools
import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from gpumeter.core.settings import Settings, settings_env
from testkit.kube_cluster import Kube, free_port
from tests.kube.fixtures import CreateGpuNodes
from tests.kube.pods import POOL_LABEL, pod_manifest
from tests.support import polling

pytestmark = [pytest.mark.kube, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
eventually = functools.partial(polling.eventually, timeout=90.0)


def gpumeter(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumeter.app.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def tenant_env(settings: Settings, kube_namespace: str, tmp_path: Path) -> Settings:
    """The namespace (unlabelled: its name is the tenant) has max_gpus 6 and 100 GPU-hours."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(yaml.safe_dump({"tenants": [
        {"tenant": kube_namespace, "gpu_hours": 100, "max_gpus": 6, "on_exceed": "block"}]}))
    settings.tenants = tenants
    return settings


@pytest.fixture
def hooks(kube: Kube, tenant_env: Settings, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A `gpumeter hooks --role extender` process on the tenant's settings; yields the
    environment that reaches it (and ClickHouse, Kafka and the apiserver)."""
    settings = tenant_env
    settings.hooks.listen = f"127.0.0.1:{free_port()}"
    env = settings_env(settings) | {"KUBECONFIG": str(kube.kubeconfig)}
    log_path = tmp_path / "hooks.log"
    log = log_path.open("w")
    process = subprocess.Popen([sys.executable, "-m", "gpumeter.app.cli", "hooks", "--role", "extender"],
                               env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    port = int(settings.hooks.listen.rsplit(":", 1)[1])

    def ready() -> bool:
        assert process.poll() is None, log_path.read_text()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    try:
        eventually(ready, "gpumeter hooks ready")
        yield env
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
            log.close()


def explain_json(env: dict[str, str], pod: str) -> dict[str, Any]:
    done = gpumeter(env, "explain", "pod", pod, "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def test_explain_pod_says_quota_capacity_or_fits_as_the_running_extender_answers(
    kube_namespace: str, gpu_nodes: CreateGpuNodes, hooks: dict[str, str], kube: Kube
) -> None:
    ns = kube_namespace
    [node] = gpu_nodes(1, gpus_per_node=4, labels={POOL_LABEL: ns})
    # A grant in ClickHouse quota_grants: explain lists it with the gpu_hours quota.
    granted = gpumeter(hooks, "budget", "grant", "--tenant", ns, "--gpu-hours", "5", "--note", "explain test")
    assert granted.returncode == 0, granted.stderr
    with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        for name, gpus in (("over-quota", 8), ("too-wide", 5), ("fits", 2), ("cpu-only", 0)):
            core.create_namespaced_pod(ns, pod_manifest(name, gpus=gpus, pool=ns))
        core.create_namespaced_pod(ns, pod_manifest("mig", pool=ns, extra={"nvidia.com/mig-1g.10gb": "1"}))

    # 8 GPUs asked, 0 held, max_gpus 6: 0 + 8 - 6 = 2 GPUs must be freed; refused on every node.
    quota = explain_json(hooks, f"{ns}/over-quota")
    assert quota["tenant"] == ns and quota["gpus"] == 8 and quota["phase"] == "Pending"
    assert quota["held_by"] == ["quota"]
    assert quota["extender"]["answered"] is True and quota["extender"]["passed"] == []
    assert quota["extender"]["unresolvable"][node].startswith(f"gpumeter: tenant {ns} over max_gpus quota")
    assert quota["would_change"] == [f"2 GPUs of {ns} must be freed (holds 0, pod needs 8, max_gpus 6)"]
    by_metric = {line["metric"]: line for line in quota["quotas"]}
    # limit 100 + grant 5 = 105 GPU-hours, nothing used yet (no worker ledger).
    assert by_metric["gpu_hours"]["limit"] == "105.000000" and by_metric["gpu_hours"]["used"] == "0.000000"
    assert [g["amount"] for g in by_metric["gpu_hours"]["grants"]] == ["5.000000"]
    assert by_metric["max_gpus"]["limit"] == "6"

    # 5 GPUs asked, within max_gpus; the only node has 4: capacity, and that node came closest.
    capacity = explain_json(hooks, f"{ns}/too-wide")
    assert capacity["held_by"] == ["capacity"]
    assert capacity["extender"]["failed"] == {node: "gpumeter: capacity: node has 4 free GPUs, pod needs 5"}
    assert capacity["would_change"] == [f"capacity: 5 free GPUs on one node; closest: {node} (4 free)"]

    fits = explain_json(hooks, f"{ns}/fits")
    assert fits["held_by"] == [] and fits["extender"]["passed"] == [node] and fits["would_change"] == []

    # A MIG pod is a GPU pod (contract 6 as amended): its tenant's quotas hold it or not; it takes
    # no whole GPU, so neither capacity nor max_gpus does.
    mig = explain_json(hooks, f"{ns}/mig")
    assert mig["gpus"] == 0 and mig["gpu_devices"] == 1
    assert mig["held_by"] == [] and mig["extender"]["passed"] == [node]

    text = gpumeter(hooks, "explain", "pod", f"{ns}/over-quota")
    assert text.returncode == 0, text.stderr
    assert "held by: quota" in text.stdout
    assert f"would change it: 2 GPUs of {ns} must be freed" in text.stdout

    # The extender away: one line says so, the quota part still stands (exit 0).
    away = f"http://127.0.0.1:{free_port()}"
    down = gpumeter(hooks | {"GPUMETER_EXPLAIN_EXTENDER_URL": away}, "explain", "pod", f"{ns}/over-quota")
    assert down.returncode == 0, down.stderr
    assert f"extender: no answer from {away}: " in down.stdout
    assert "gpu_hours" in down.stdout and "held by: quota" in down.stdout

    # Bad input: one line on stderr, exit 2.
    for argument, said in (("not-a-pod", "expected NS/NAME"),
                           (f"{ns}/missing", f"pod {ns}/missing not found"),
                           (f"{ns}/cpu-only", "requests no GPU device")):
        bad = gpumeter(hooks, "explain", "pod", argument)
        assert bad.returncode == 2 and said in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad
