"""Scheduling throughput of the real kube-scheduler with gpumeter's extender, beside without it.

    .venv/bin/python -m benchmarks.scheduling [--nodes 5000] [--pods 2000] [--order without-first]

Everything real, on this machine: the test control plane of tests/kube (etcd, kube-apiserver,
kube-controller-manager, KWOK; testkit/kube_cluster.py) holding ``--nodes`` KWOK nodes of
8 GPUs each, and kube-scheduler v1.37 from the same build. Two rounds on the same nodes, one
after the other:

- without: kube-scheduler with its default configuration;
- with: kube-scheduler with the chart's configuration (deploy/rendered/gpumeter.yaml,
  ConfigMap gpumeter-scheduler-config: filter, prioritize and preempt for pods asking for
  ``nvidia.com/gpu``, ``nodeCacheCapable: true``, ``ignorable: false``), its urlPrefix pointed
  at a `gpumeter hooks` extender (the production server, state and Kubernetes watches, in a
  process of its own, as deployed) over plain HTTP on loopback; that process runs during
  this round only.

Both rounds raise kube-scheduler's API client limits (qps and burst 5,000, as the scheduler's
own performance tests do): with the defaults (50 / 100) both would measure that limiter.

In each round ``--pods`` GPU pods (1, 2, 4 and 8 GPUs in turn) are created while no scheduler
runs, then the scheduler starts and drains them. A watch on the pods records when each one is
first seen bound; throughput is pods bound per second from the first binding to the last.
Pods are deleted between rounds. Prints both rates and their ratio; target (issue 34): with
the extender >= 0.7 x without. Results go to benchmarks/results/scheduling-latest.json with
commit, date, cores and load average.

kube-scheduler sends an extender only the feasible nodes it found: with the default
``percentageOfNodesToScore`` that is max(100, N x (50 - N/125) %) of them, about 500 at 5,000
nodes (schedule_one.go, numFeasibleNodesToFind).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import yaml
from kubernetes import client as k8s
from kubernetes.watch.watch import iter_resp_lines
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.result_file import write_results
from gpumeter.core.kube import GPU_RESOURCE
from testkit.kube_cluster import (
    Kube,
    gpu_node_manifest,
    require_binaries,
    start_kube,
    start_kwok,
    start_scheduler,
    wait_for_default_service_account,
    wait_until,
)

console = Console()
MP = multiprocessing.get_context("spawn")
REPO = Path(__file__).resolve().parent.parent
RENDERED = REPO / "deploy" / "rendered" / "gpumeter.yaml"
RESULTS = Path(__file__).resolve().parent / "results" / "scheduling-latest.json"
TARGET_RATIO = 0.7
GPU_SIZES = (1, 2, 4, 8)
GPUS_PER_NODE = 8
WORKERS = 8  # parallel creates and deletes (the apiserver takes them concurrently)
ROUND_TIMEOUT_S = 1800.0
POLL_S = 2.0
FILTER_CALLS = 'gpumeter_hooks_requests_total{code="200",verb="kube.filter"}'
# kube-scheduler's API client limits (default qps 50, burst 100) are raised in both rounds, as
# the scheduler's own performance tests do: with the defaults, both rounds measure the limiter
# (one binding and one event per pod), not scheduling.
CLIENT_CONNECTION = {"qps": 5000, "burst": 5000}


# -- the cluster ------------------------------------------------------------------------------


@contextmanager
def control_plane(workdir: Path) -> Iterator[Kube]:
    kube = start_kube(workdir)
    try:
        kwok = start_kwok(kube)
        try:
            yield kube
        finally:
            kwok.process.stop()
    finally:
        kube.stop()


def api_client(kube: Kube) -> k8s.ApiClient:
    """Kube.api_client's settings, with a connection per worker thread."""
    configuration = k8s.Configuration(
        host=kube.server,
        api_key={"BearerToken": kube.token},
        api_key_prefix={"BearerToken": "Bearer"},
        ssl_ca_cert=str(kube.ca_file),
    )
    configuration.connection_pool_maxsize = WORKERS * 2
    return k8s.ApiClient(configuration)


def make_nodes(core: k8s.CoreV1Api, count: int, progress: Progress) -> list[str]:
    names = [f"sched-gpu-{i:05d}" for i in range(count)]
    task = progress.add_task("nodes created", total=count)

    def create(name: str) -> None:
        manifest = gpu_node_manifest(
            name, gpus=GPUS_PER_NODE, gpu_model="H100-SXM-80GB", capacity_type="on-demand",
            topology=None, cpu="96", memory="1024Gi", pods=110, labels={}, taints=(),
        )
        core.create_node(body=k8s.V1Node.model_validate(manifest))
        progress.advance(task)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(create, names))
    ready = progress.add_task("nodes Ready and untainted", total=count)

    def lift(name: str) -> None:
        core.patch_node(name, {"spec": {"taints": None}})

    def schedulable() -> bool:
        nodes = list(list_all(core.list_node))
        # KWOK reports the nodes Ready; the not-ready taint the apiserver put on each new node is
        # lifted here, as the node lifecycle controller does, without waiting for that
        # controller's client rate limit (20 writes/s: minutes for thousands of nodes).
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lift, [node["metadata"]["name"] for node in nodes if node_ready(node)
                                 and (node.get("spec") or {}).get("taints")]))
        found = sum(1 for node in nodes if node_ready(node) and not (node.get("spec") or {}).get("taints"))
        progress.update(ready, completed=found)
        if found < count:
            time.sleep(POLL_S)  # a full list of thousands of nodes is not free for the apiserver
        return found == count

    wait_until(schedulable, what=f"{count} nodes Ready and untainted", timeout=1800)
    return names


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def list_all(lister: Any, *args: Any) -> Iterator[dict[str, Any]]:
    """Every item of a paged list, as plain JSON (the client's models are slow to build)."""
    token: str | None = None
    while True:
        response = lister(*args, limit=1000, _continue=token, _preload_content=False)
        document = orjson.loads(response.data)
        yield from document.get("items") or []
        token = (document.get("metadata") or {}).get("continue") or None
        if token is None:
            return


def pod_body(name: str, gpus: int) -> dict[str, Any]:
    resources = {"cpu": "100m", "memory": "64Mi", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "registry.invalid/bench:1",
                            "resources": {"requests": resources, "limits": resources}}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
        },
    }


class Bindings:
    """A watch on the namespace's pods: when each pod was first seen bound (monotonic)."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="bindings", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed: Any = self.core.list_namespaced_pod(self.namespace, limit=1,
                                                                _preload_content=False)
                    version = orjson.loads(listed.data)["metadata"]["resourceVersion"]
                response = self.core.list_namespaced_pod(
                    self.namespace, watch=True, resource_version=version, allow_watch_bookmarks=True,
                    timeout_seconds=300, _preload_content=False)
                self._response = response
                for line in iter_resp_lines(response):
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") == "ERROR":
                        version = ""  # too old: list again (a binding missed would show in the count)
                        break
                    if event.get("type") in ("ADDED", "MODIFIED") and (obj.get("spec") or {}).get("nodeName"):
                        name = obj["metadata"]["name"]
                        with self.lock:
                            self.bound.setdefault(name, time.monotonic())
            except Exception:  # the stream ends on stop (socket shut) or the apiserver's timeout
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def of(self, names: list[str]) -> list[float]:
        with self.lock:
            return [self.bound[n] for n in names if n in self.bound]

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        with contextlib.suppress(Exception):
            response.connection.sock.shutdown(2)
        self._thread.join(10)


# -- the extender -----------------------------------------------------------------------------


def serve_extender(kubeconfig: str, ports: Any) -> None:
    """Extender process: what `gpumeter hooks --role extender` runs (server, state, Kubernetes
    watches, the heap frozen once loaded), without the Kafka feed (no quota state needed here)."""
    import asyncio

    from kubernetes import config as k8s_config

    from scheduler_hooks.cluster.feeds import kube_feeds, loop_poster, start_all
    from scheduler_hooks.cluster.state import HooksState
    from scheduler_hooks.extender.server import HooksServer, freeze_heap

    async def main() -> None:
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        api = k8s.ApiClient(configuration)
        state = HooksState()
        server = HooksServer(state, "127.0.0.1:0")
        await server.start()
        start_all(kube_feeds(api, state, loop_poster(asyncio.get_running_loop())))
        while not state.ready:
            await asyncio.sleep(0.2)
        freeze_heap()
        ports.put(server.port)
        await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


def extender_metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def extender_config(url_prefix: str) -> dict[str, Any]:
    """The chart's kube-scheduler configuration, reaching the extender over plain HTTP."""
    for document in yaml.safe_load_all(RENDERED.read_text()):
        if document and document["kind"] == "ConfigMap" and \
                document["metadata"]["name"] == "gpumeter-scheduler-config":
            config: dict[str, Any] = yaml.safe_load(document["data"]["kube-scheduler-config.yaml"])
            break
    else:
        raise RuntimeError(f"no ConfigMap gpumeter-scheduler-config in {RENDERED}")
    config["clientConnection"] = dict(CLIENT_CONNECTION)  # start_scheduler adds the kubeconfig
    [extender] = config["extenders"]
    extender["urlPrefix"] = url_prefix
    extender.pop("tlsConfig", None)
    extender["enableHTTPS"] = False
    return config


@contextmanager
def extender_process(kube: Kube, nodes: int) -> Iterator[int]:
    ports = MP.Queue()
    process = MP.Process(target=serve_extender, args=(str(kube.kubeconfig), ports), daemon=True)
    process.start()
    try:
        port = int(ports.get(timeout=600))
        # Ready means listed; wait until every node is in its placement index too.
        wait_until(lambda: extender_metric(port, "gpumeter_hooks_nodes") >= nodes,
                   what=f"extender holding {nodes} nodes", timeout=600)
        yield port
    finally:
        process.terminate()
        process.join(15)


# -- one round --------------------------------------------------------------------------------


def run_round(label: str, kube: Kube, core: k8s.CoreV1Api, namespace: str, bindings: Bindings,
              pods: int, config: dict[str, Any] | None, index: int, progress: Progress,
              extender_port: int | None = None) -> dict[str, Any]:
    tag = secrets.token_hex(2)
    names = [f"{label}-{tag}-{i:05d}" for i in range(pods)]
    sizes = list(itertools.islice(itertools.cycle(GPU_SIZES), pods))
    created = progress.add_task(f"{label}: pods created", total=pods)

    def create(item: tuple[str, int]) -> None:
        core.create_namespaced_pod(namespace, k8s.V1Pod.model_validate(pod_body(*item)))
        progress.advance(created)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(create, zip(names, sizes, strict=True)))
    binary = require_binaries("kube-scheduler")["kube-scheduler"]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    scheduler = start_scheduler(binary, kube, kube.workdir, index, config)
    ready = time.monotonic()
    bound_task = progress.add_task(f"{label}: pods bound", total=pods)
    try:
        deadline = ready + ROUND_TIMEOUT_S
        while True:
            count = len(bindings.of(names))
            progress.update(bound_task, completed=count)
            if count == pods or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        filter_calls = extender_metric(extender_port, FILTER_CALLS) if extender_port else 0.0
    finally:
        scheduler.stop()
    times = sorted(bindings.of(names))
    load_after = os.getloadavg()[0]
    delete_pods(core, namespace, names, progress, label)
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    return {
        "round": label,
        "pods": pods,
        "bound": len(times),
        "scheduler_start_s": ready - started,
        "first_binding_after_ready_s": times[0] - ready if times else None,
        "bind_span_s": span,
        "pods_per_second": (len(times) - 1) / span if len(times) > 1 else 0.0,
        "pods_per_second_from_ready": len(times) / (times[-1] - ready) if times else 0.0,
        "extender_filter_calls": filter_calls,
        "load_average_1m": [load_before, load_after],
    }


def delete_pods(core: k8s.CoreV1Api, namespace: str, names: list[str], progress: Progress,
                label: str) -> None:
    """One DELETE per pod, in parallel (one deletecollection of thousands outlasts the apiserver's
    60 s request timeout on a loaded host). Grace 0: bound pods go at once (no kubelet to
    confirm), so the nodes are free for the next round."""
    task = progress.add_task(f"{label}: pods deleted", total=len(names))

    def delete(name: str) -> None:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
        progress.advance(task)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(delete, names))

    def gone() -> bool:
        left = sum(1 for _ in list_all(core.list_namespaced_pod, namespace))
        if left:
            time.sleep(POLL_S)
        return left == 0

    wait_until(gone, what="pods deleted", timeout=600)


# -- main -------------------------------------------------------------------------------------


@contextmanager
def removed(workdir: Path, *, keep: bool) -> Iterator[None]:
    try:
        yield
    finally:
        if keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--order", choices=("without-first", "with-first"), default="without-first")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    args = parser.parse_args()
    rounds: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="gpumeter-scheduling-"))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # removed() first: the work directory goes once the control plane has stopped.
    with removed(workdir, keep=args.keep), Progress(*columns, console=console) as progress, \
            control_plane(workdir) as kube, api_client(kube) as api:
        core = k8s.CoreV1Api(api)
        started = time.monotonic()
        make_nodes(core, args.nodes, progress)
        nodes_s = time.monotonic() - started
        namespace = f"sched-{secrets.token_hex(3)}"
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        wait_for_default_service_account(api, namespace, kube.processes)
        bindings = Bindings(core, namespace)
        order = ["without", "with"] if args.order == "without-first" else ["with", "without"]
        try:
            for index, label in enumerate(order):
                if label == "without":
                    plain = {"profiles": [{"schedulerName": "default-scheduler"}],
                             "clientConnection": dict(CLIENT_CONNECTION)}
                    rounds.append(run_round(label, kube, core, namespace, bindings, args.pods, plain,
                                            index, progress))
                    continue
                with extender_process(kube, args.nodes) as port:
                    config = extender_config(f"http://127.0.0.1:{port}/kube")
                    rounds.append(run_round(label, kube, core, namespace, bindings, args.pods, config,
                                            index, progress, extender_port=port))
        finally:
            bindings.stop()
    by_label = {r["round"]: r for r in rounds}
    ratio = by_label["with"]["pods_per_second"] / by_label["without"]["pods_per_second"]
    table = Table(title=f"kube-scheduler, {args.pods:,} GPU pods over {args.nodes:,} KWOK nodes")
    for column in ("round", "bound", "pods/s (first to last binding)", "pods/s (from ready)",
                   "extender filter calls", "load 1m"):
        table.add_column(column, justify="right")
    for r in rounds:
        table.add_row(r["round"], f"{r['bound']:,}", f"{r['pods_per_second']:.1f}",
                      f"{r['pods_per_second_from_ready']:.1f}", f"{r['extender_filter_calls']:.0f}",
                      f"{r['load_average_1m'][0]:.1f} -> {r['load_average_1m'][1]:.1f}")
    console.print(table)
    console.print(f"with the extender {by_label['with']['pods_per_second']:.1f} pods/s, without "
                  f"{by_label['without']['pods_per_second']:.1f} pods/s: {ratio:.2f} x (target >= "
                  f"{TARGET_RATIO} x: {'met' if ratio >= TARGET_RATIO else 'NOT met'}); nodes ready in "
                  f"{nodes_s:.0f} s; {os.cpu_count()} CPUs")
    write_results(RESULTS, {"nodes": args.nodes, "pods": args.pods, "gpu_sizes": list(GPU_SIZES),
                            "order": args.order, "nodes_ready_s": nodes_s, "ratio": ratio,
                            "target_ratio": TARGET_RATIO, "rounds": rounds})
    return 0 if all(r["bound"] == r["pods"] for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
