"""Quota enforcement latency: a crossing produced -> its eviction reaching the API server.

    .venv/bin/python -m benchmarks.quota_latency [--crossings 200] [--pace 0.1] [--skip-pipeline]
        [--fleet-nodes 1250 | --quiet] [--window-seconds 15] [--workers 1]

Everything real, on this machine: Kafka and ClickHouse from `gpumeter up` (started if
needed, in a namespace of topics and a database of its own, dropped afterwards), and the test
control plane of tests/kube (etcd, kube-apiserver, kube-controller-manager built from source,
KWOK running the pods), started here through testkit/kube_cluster.py.

Five measurements in one run, in this order, each over ``--crossings`` crossings paced
``--pace`` apart, one tenant and one GPU pod per crossing, all tenants ``on_exceed: preempt``
with ``grace_seconds: 0``:

- raw Kafka: a small record produced here and consumed in another process (aiokafka, as the
  actuator consumes), paced like the crossings: the floor of one Kafka hop;
- raw eviction: this process POSTs a policy/v1 Eviction (kubernetes client, uid precondition,
  as the actuator's gateway sends it; no gpumeter code on the way) for one GPU pod each, from
  8 threads as the actuator's I/O, in namespaces the tenants file does not know (the actuator
  never touches them); timed from just before the call to the same watch as the others seeing
  the pod deleting, and to the call's HTTP answer: the floor of the Eviction hop, which no
  implementation beats on this host (above 10 x the raw Kafka p99, the ratio target is out of
  reach here);
- raw chain: a small record produced here -> a relay process that produces it again at once
  (the one Kafka hop any quota decision needs between the samples and the quota events
  topics) -> another process that merge-patches an eviction notice on the pod and POSTs its
  Eviction from 8 threads (the least contract 4 asks of an actuator): the floor of the whole
  path, two Kafka hops and two API calls with no gpumeter code and no work between them, on
  topics of its own (so never behind the fleet's window in a partition);
- actuator: a QuotaEvent (gpu_hours exceeded) produced here -> the actuator (its own process,
  as in `gpumeter hooks`) -> Eviction API;
- pipeline: the UsageSample that crosses the tenant's gpu_hours quota produced to the samples
  topic -> `gpumeter worker` (rating, quota accounting) -> quota event -> actuator -> Eviction API.

Under load (the default, issue 34): while all five are measured, the 10,000-GPU fleet of
benchmarks/fleet_realtime.py (``--fleet-nodes`` 8-GPU nodes, 1,250 by default) publishes a
window of samples every ``--window-seconds`` in real time, from a process of its own, into the
same samples topic and so the same worker (rating and quota accounting of every fleet sample
before the crossings' samples behind them) and through the same broker as the raw hop. The
clock starts once the fleet has published two windows. ``--quiet`` (``--fleet-nodes 0``)
measures on a quiet worker as before. Targets: crossing sample -> eviction p99 < 1 s and
<= 10 x the raw Kafka hop's p99 in the same run.

"Reaching the API server" is observed through a watch on the pods: the first event showing
the pod with a deletionTimestamp (or deleted). It follows the eviction's write to etcd by the
watch's own fan-out delay (milliseconds on loopback), so the numbers are a slight upper bound.
Clocks: every timestamp is time.time() on this one host. Prints p50/p99 and the ratios to the
raw Kafka hop; machines are noisy, ratios travel better.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import functools
import itertools
import json
import multiprocessing
import os
import queue
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kafka import KafkaProducer, TopicPartition
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.fleet_realtime import fleet_config, publisher_main
from benchmarks.result_file import write_results
from gpumeter.app import schema
from gpumeter.app.runtime import services
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.models import QuotaEvent
from gpumeter.core.settings import Settings, load_settings
from gpumeter.core.topics import TopicSpec
from gpumeter.infra import clickhouse, kafka
from testkit.kube_cluster import (
    Kube,
    gpu_node_manifest,
    node_schedulable,
    start_kube,
    start_kwok,
    wait_until,
)

console = Console()
# Spawned, not forked: this process holds threads (watch, Kafka) that a fork would copy mid-flight.
MP = multiprocessing.get_context("spawn")
RESULTS = Path(__file__).resolve().parent / "results" / "quota-latency-latest.json"
BENCH_LABEL = "gpumeter.io/bench"
PODS_PER_NODE = 100
GPU_HOURS_LIMIT = "0.01"  # 36 GPU-seconds: one 60 s window of one GPU crosses it
TARGET_P99_S = 1.0
TARGET_P99_RATIO = 10.0  # crossing -> eviction p99 over the raw Kafka hop's p99
FLEET_WINDOWS_BEFORE = 2  # fleet windows published before the clock starts (the worker is in step)
EVICTION_THREADS = 8  # the raw eviction's threads: the actuator's I/O threads (IO_THREADS)


# -- the background fleet --------------------------------------------------------------------------


class BackgroundFleet:
    """benchmarks/fleet_realtime.py's publisher in its own process, one window every
    ``window_seconds`` of wall time into the benchmark's samples topic, until ``close``."""

    def __init__(self, settings: Settings, nodes: int, window_seconds: int, seed: int = 42) -> None:
        # Wall-clock aligned windows, the first a few seconds away (the publisher's set-up).
        first_at = -(-(time.time() + 8) // window_seconds) * window_seconds
        config = fleet_config(nodes, window_seconds, seed,
                              datetime.fromtimestamp(first_at - window_seconds, UTC))
        self.gpus = sum(config.gpus_on(model) * count for model, count in config.nodes.items())
        self.window_seconds = window_seconds
        self.windows: list[dict[str, Any]] = []  # each published window's report
        self.late: list[float] = []  # seconds each window started after it was due
        self.done = threading.Event()
        self._out: Any = MP.Queue()
        self._stop: Any = MP.Event()
        self._process = MP.Process(target=publisher_main,
                                   args=(settings, config, 10**6, first_at, self._out, self._stop),
                                   daemon=True)
        self._process.start()
        self._reader = threading.Thread(target=self._read, name="fleet-reports", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                message = self._out.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive():
                    break
                continue
            if message[0] == "window":
                report = message[1]
                self.late.append(report["started"] - report["due"])
                self.windows.append({**{k: report[k] for k in ("index", "samples", "cpu_s", "gpus_in_use")},
                                     "publish_s": report["published"] - report["started"]})
            elif message[0] == "done":
                break
        self.done.set()

    def wait_windows(self, count: int, timeout: float) -> None:
        wait_until(lambda: len(self.windows) >= count or self.done.is_set(),
                   what=f"{count} fleet windows published", timeout=timeout)
        if len(self.windows) < count:
            raise RuntimeError("the fleet publisher stopped before publishing")

    def close(self) -> dict[str, Any]:
        self._stop.set()
        self.done.wait(60)
        self._process.join(30)
        samples = [w["samples"] for w in self.windows]
        return {
            "nodes_8_gpu": self.gpus // 8,
            "gpus": self.gpus,
            "window_s": self.window_seconds,
            "windows_published": len(self.windows),
            "samples_per_window_mean": statistics.fmean(samples) if samples else 0.0,
            "samples_per_second": (statistics.fmean(samples) / self.window_seconds) if samples else 0.0,
            "window_start_late_max_s": max(self.late, default=0.0),
            # The simulator's own share of the burst: CPU it spends on this host that 1,250 node
            # agents would spend on their own nodes, and how long a window takes it to send.
            "publisher_cpu_s_per_window_mean": statistics.fmean(w["cpu_s"] for w in self.windows)
            if self.windows else 0.0,
            "publish_s_per_window_mean": statistics.fmean(w["publish_s"] for w in self.windows)
            if self.windows else 0.0,
        }


# -- the control plane -----------------------------------------------------------------------------


@contextmanager
def control_plane(workdir: Path) -> Iterator[Kube]:
    """etcd + kube-apiserver + kube-controller-manager + KWOK (as the kube and kwok fixtures)."""
    workdir.mkdir(parents=True, exist_ok=True)
    kube = start_kube(workdir)
    try:
        kwok = start_kwok(kube)
        try:
            yield kube
        finally:
            kwok.process.stop()
    finally:
        kube.stop()


def make_nodes(core: k8s.CoreV1Api, count: int) -> list[str]:
    names = [f"bench-gpu-{i}" for i in range(count)]
    for name in names:
        manifest = gpu_node_manifest(
            name,
            gpus=PODS_PER_NODE,
            gpu_model="H100-SXM-80GB",
            capacity_type="on-demand",
            topology=None,
            cpu="1000",
            memory="4000Gi",
            pods=PODS_PER_NODE + 10,
            labels={},
            taints=(),
        )
        core.create_node(body=k8s.V1Node.model_validate(manifest))
    for name in names:
        wait_until(functools.partial(node_schedulable, core, name), what=f"node {name} Ready")
    return names


def make_tenants(core: k8s.CoreV1Api, tenants: list[str], nodes: list[str], tag: str) -> None:
    """One namespace (named after the tenant) and one 1-GPU pod per tenant, bound to a node."""
    for tenant in tenants:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=tenant)))
    for index, tenant in enumerate(tenants):
        resources = {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": "1"}
        body = {
            "metadata": {"name": "job", "labels": {BENCH_LABEL: tag}},
            "spec": {
                "nodeName": nodes[index % len(nodes)],
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/bench:1",
                        "resources": {"requests": resources, "limits": resources},
                    }
                ],
            },
        }
        while True:
            try:
                core.create_namespaced_pod(tenant, k8s.V1Pod.model_validate(body))
                break
            except k8s.ApiException as exc:
                # ServiceAccount admission refuses pods until the namespace's "default" account exists.
                if exc.status != 403 or "serviceaccount" not in (exc.body or "").lower():
                    raise
                time.sleep(0.2)


def queues_made(api: k8s.ApiClient) -> int:
    """Volcano queues the actuator made so far: its first pass makes one per tenant (the
    clock starts once that burst of API writes is over)."""
    listed = k8s.CustomObjectsApi(api).list_cluster_custom_object(
        "scheduling.volcano.sh", "v1beta1", "queues", label_selector="app.kubernetes.io/managed-by=gpumeter"
    )
    return len(listed.get("items") or []) if isinstance(listed, dict) else 0


class EvictionWatch:
    """When each benchmark pod was first seen terminating (deletionTimestamp) or deleted."""

    def __init__(self, api: k8s.ApiClient, tag: str) -> None:
        self._core = k8s.CoreV1Api(api)
        self._selector = f"{BENCH_LABEL}={tag}"
        self.seen: dict[str, float] = {}  # namespace (= tenant) -> time.time()
        self.running: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            stream = k8s_watch.Watch()
            for event in stream.stream(
                self._core.list_pod_for_all_namespaces,
                label_selector=self._selector,
                timeout_seconds=5,
                resource_version=version,
            ):
                now = time.time()
                pod = event["object"]
                version = pod.metadata.resource_version or version
                namespace = pod.metadata.namespace
                if event["type"] == "DELETED" or pod.metadata.deletion_timestamp is not None:
                    self.seen.setdefault(namespace, now)
                elif pod.status is not None and pod.status.phase == "Running":
                    self.running.add(namespace)
                if self._stop.is_set():
                    stream.stop()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


# -- the actuator in its own process -----------------------------------------------------------------


def _actuator_main(settings_json: str, kubeconfig: str, tenants: str, stop: Any, marks_out: Any) -> None:
    import logging

    from kubernetes import config as k8s_config

    from scheduler_hooks.actuator.kube_gateway import KubeGateway
    from scheduler_hooks.actuator.service import Actuator
    from scheduler_hooks.actuator.tenants_source import TenantsSource

    # Stage marks (time.time() per tenant, first occurrence): "fetched" as the consumer hands the
    # event to its tenant's chain, "handled" as handling starts, "slot" once its pods' part has a
    # tenant slot (reads, plan, notice follow), "evict" as the Eviction call goes out;
    # and the durations of the calls on the way (<call> and <call> done).
    marks: dict[str, dict[str, float]] = {"fetched": {}, "handled": {}, "evict": {}}

    def timed(name: str, tenant: str, call: Callable[[], Any]) -> Any:
        marks.setdefault(name, {}).setdefault(tenant, time.time())
        try:
            return call()
        finally:
            marks.setdefault(f"{name} done", {}).setdefault(tenant, time.time())

    class TimedGateway(KubeGateway):
        def evict(self, namespace: str, name: str, uid: str) -> tuple[int, bytes]:
            return timed("evict", namespace, lambda: super(TimedGateway, self).evict(namespace, name, uid))

        def patch_pod(self, namespace: str, name: str, body: Any, content_type: str) -> int:
            return timed("patch", namespace,
                         lambda: super(TimedGateway, self).patch_pod(namespace, name, body, content_type))

        def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
            return timed("pods", namespace or "", lambda: super(TimedGateway, self).pods(namespace))

    class TimedActuator(Actuator):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            recorded = self.sink.recorded

            async def timed_recorded(tenant: str, cause: str) -> set[str] | None:
                marks.setdefault("recorded", {}).setdefault(tenant, time.time())
                try:
                    return await recorded(tenant, cause)
                finally:
                    marks.setdefault("recorded done", {}).setdefault(tenant, time.time())

            self.sink.recorded = timed_recorded  # type: ignore[method-assign]

        def _chain(self, event: Any, position: Any, done: Any) -> None:
            marks["fetched"].setdefault(event.tenant, time.time())
            super()._chain(event, position, done)

        async def handle(self, event: Any, position: Any = None) -> None:
            marks["handled"].setdefault(event.tenant, time.time())
            await super().handle(event, position)

        async def _pods_for(self, event: Any, policy: Any, position: Any) -> None:
            marks.setdefault("slot", {}).setdefault(event.tenant, time.time())  # a tenant slot taken
            await super()._pods_for(event, policy, position)

    logging.basicConfig(
        filename=str(Path(tenants).with_name("actuator.log")),
        level=logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("gpumeter.actuator").setLevel(logging.DEBUG)
    settings = Settings.model_validate_json(settings_json)
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    actuator = TimedActuator(
        settings,
        dry_run=False,
        kube=TimedGateway(api),
        tenants=TenantsSource(Path(tenants)),
        reclaim_seconds=3600.0,
        queue_sync_seconds=5.0,
    )

    async def main() -> None:
        done = asyncio.Event()

        async def watch_stop() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.2)
            done.set()

        watcher = asyncio.create_task(watch_stop())
        await actuator.run(done)
        watcher.cancel()

    asyncio.run(main())
    marks_out.put(marks)


# -- the raw Kafka hop -------------------------------------------------------------------------------


def _raw_consumer(bootstrap: str, topic: str, expected: int, results: Any, ready: Any) -> None:
    from aiokafka import AIOKafkaConsumer

    async def main() -> None:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
        )
        await consumer.start()
        ready.set()
        received: dict[str, float] = {}
        try:
            while len(received) < expected:
                batch = await consumer.getmany(timeout_ms=500)
                now = time.time()
                for records in batch.values():
                    for record in records:
                        received[record.value.decode()] = now
        finally:
            await consumer.stop()
        results.put(received)

    asyncio.run(main())


def raw_kafka(settings: Settings, count: int, pace: float) -> list[float]:
    name = settings.kafka.topic("raw-latency")
    kafka.ensure_topics(settings.kafka, [TopicSpec("raw-latency", "other")])
    results: Any = MP.Queue()
    ready: Any = MP.Event()
    consumer = MP.Process(
        target=_raw_consumer, args=(settings.kafka.bootstrap, name, count, results, ready), daemon=True
    )
    consumer.start()
    ready.wait(60)
    time.sleep(1.0)  # partitions assigned and fetching before the first send
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all", linger_ms=0)
    sent: dict[str, float] = {}
    with progress() as bar:
        task = bar.add_task("raw Kafka hop", total=count)
        for index in range(count):
            key = f"m{index}"
            sent[key] = time.time()
            producer.send(name, value=key.encode())
            producer.flush()
            bar.advance(task)
            time.sleep(pace)
    received = results.get(timeout=120)
    consumer.join(timeout=30)
    producer.close()
    return sorted(received[key] - sent[key] for key in sent)


# -- the raw eviction ---------------------------------------------------------------------------------


def pod_names_and_uids(core: k8s.CoreV1Api, namespaces: list[str]) -> dict[str, tuple[str, str]]:
    """Per namespace, the name and uid of its benchmark pod (``job``)."""
    pods: dict[str, tuple[str, str]] = {}
    for namespace in namespaces:
        meta = core.read_namespaced_pod("job", namespace).metadata
        if meta is None or meta.uid is None:
            raise RuntimeError(f"pod {namespace}/job has no uid")
        pods[namespace] = ("job", meta.uid)
    return pods


def eviction_of(namespace: str, name: str, uid: str) -> k8s.V1Eviction:
    """A policy/v1 Eviction as the actuator's KubeGateway.evict sends it: preconditioned on the uid."""
    return k8s.V1Eviction.model_validate({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    })


def post_eviction(core: k8s.CoreV1Api, namespace: str, name: str, body: k8s.V1Eviction) -> int:
    """POST the Eviction; the HTTP status of its answer, whatever it is."""
    try:
        response: Any = core.create_namespaced_pod_eviction(
            name, namespace, body, _preload_content=False, _request_timeout=15.0)
        # The body read, as the gateway reads it: until then urllib3 keeps the connection out
        # of the pool and the next call pays a new TLS handshake.
        bytes(response.data or b"")
        return int(response.status)
    except k8s.ApiException as exc:
        return int(exc.status or 0)


def raw_eviction(
    api: k8s.ApiClient, namespaces: list[str], watch: EvictionWatch, pace: float, timeout: float = 300.0
) -> dict[str, Any]:
    """The floor of the Eviction hop: this process POSTs one policy/v1 Eviction per namespace's
    pod, ``pace`` apart, with the kubernetes client directly (no gpumeter code on the way), and
    the same watch as the other measurements sees it. Latencies from just before each call to
    the watch (``seen``) and to the call's HTTP answer (``call``), sorted; the answers' statuses."""
    core = k8s.CoreV1Api(api)
    pods = pod_names_and_uids(core, namespaces)  # read before the clock runs
    # Its own client and threads, as many as the actuator's I/O threads (and a connection each):
    # a slow answer does not hold the next call back, as none holds the actuator's back.
    configuration = copy.deepcopy(api.configuration)
    configuration.connection_pool_maxsize = EVICTION_THREADS
    started: dict[str, float] = {}
    answered: dict[str, float] = {}
    statuses: collections.Counter[str] = collections.Counter()

    def evict(evicting: k8s.CoreV1Api, namespace: str) -> None:
        name, uid = pods[namespace]
        body = eviction_of(namespace, name, uid)
        started[namespace] = time.time()
        try:
            status = post_eviction(evicting, namespace, name, body)
        finally:
            answered[namespace] = time.time()
        statuses[str(status)] += 1

    with (k8s.ApiClient(configuration) as client,
          ThreadPoolExecutor(max_workers=EVICTION_THREADS, thread_name_prefix="raw-evict") as pool,
          progress() as bar):
        evicting = k8s.CoreV1Api(client)
        task = bar.add_task("raw eviction (Eviction API)", total=len(namespaces))
        calls = []
        for namespace in namespaces:
            calls.append(pool.submit(evict, evicting, namespace))
            bar.advance(task)
            time.sleep(pace)
        for call in calls:
            call.result(timeout=timeout)
        task = bar.add_task("  evictions seen", total=len(namespaces))
        deadline = time.monotonic() + timeout
        while len([n for n in namespaces if n in watch.seen]) < len(namespaces):
            if time.monotonic() > deadline:
                missing = [n for n in namespaces if n not in watch.seen]
                raise RuntimeError(f"{len(missing)} raw evictions not seen after {timeout:.0f}s, "
                                   f"e.g. {missing[:3]}; answers {dict(statuses)}")
            bar.update(task, completed=len([n for n in namespaces if n in watch.seen]))
            time.sleep(0.2)
        bar.update(task, completed=len(namespaces))
    return {
        "seen": sorted(watch.seen[n] - started[n] for n in namespaces),
        "call": sorted(answered[n] - started[n] for n in namespaces),
        "statuses": dict(statuses),
    }


# -- the raw chain ------------------------------------------------------------------------------------

NOTICE_ANNOTATION = "gpumeter.io/eviction-notice"


def _raw_relay(bootstrap: str, source: str, target: str, ready: Any, stop: Any) -> None:
    """Each record of ``source`` produced again to ``target`` as soon as it is fetched (acks=all,
    no linger): the one Kafka hop any quota decision needs between the samples topic and the
    quota events topic, with no decoding, rating or counting on the way."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def main() -> None:
        consumer = AIOKafkaConsumer(source, bootstrap_servers=bootstrap, group_id=None,
                                    auto_offset_reset="earliest")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        await consumer.start()
        await producer.start()
        ready.set()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                sends = [await producer.send(target, key=record.key, value=record.value)
                         for records in batch.values() for record in records]
                for sent in sends:
                    await sent
        finally:
            await consumer.stop()
            await producer.stop()

    asyncio.run(main())


def _raw_evictor(bootstrap: str, topic: str, kubeconfig: str, pods: dict[str, tuple[str, str]],
                 ready: Any, results: Any) -> None:
    """Each record of ``topic`` (value = a namespace): a merge patch putting an eviction notice on
    that namespace's pod (uid in the patch, as the actuator's), then its policy/v1 Eviction
    (uid precondition), from EVICTION_THREADS threads: the least an actuator must do under
    contract 4 (a notice, then the Eviction API), with no reads, plan or records."""
    from aiokafka import AIOKafkaConsumer
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    api.configuration.connection_pool_maxsize = EVICTION_THREADS
    core = k8s.CoreV1Api(api)
    statuses: collections.Counter[str] = collections.Counter()

    def act(namespace: str) -> None:
        name, uid = pods[namespace]
        patch = {"metadata": {"uid": uid, "annotations": {NOTICE_ANNOTATION: "bench: raw chain"}}}
        try:
            core.patch_namespaced_pod(name, namespace, patch, _content_type="application/merge-patch+json",
                                      _preload_content=False, _request_timeout=15.0)
        except k8s.ApiException as exc:
            status = int(exc.status or 0)
        else:
            status = post_eviction(core, namespace, name, eviction_of(namespace, name, uid))
        statuses[str(status)] += 1

    async def main() -> None:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                    auto_offset_reset="earliest")
        await consumer.start()
        ready.set()
        loop = asyncio.get_running_loop()
        calls: list[asyncio.Future[None]] = []
        try:
            with ThreadPoolExecutor(max_workers=EVICTION_THREADS, thread_name_prefix="chain-evict") as pool:
                while len(calls) < len(pods):
                    batch = await consumer.getmany(timeout_ms=200)
                    for records in batch.values():
                        calls.extend(loop.run_in_executor(pool, act, record.value.decode())
                                     for record in records)
                await asyncio.gather(*calls)
        finally:
            await consumer.stop()

    asyncio.run(main())
    results.put(dict(statuses))


def raw_chain(settings: Settings, kubeconfig: Path, api: k8s.ApiClient, namespaces: list[str],
              watch: EvictionWatch, pace: float) -> dict[str, Any]:
    """The floor of the whole path: a record produced here -> a relay process (the quota
    decision's one hop) -> another process (the actuator's) -> eviction notice -> Eviction API,
    ``pace`` apart, timed to the same watch. Only what contracts 4 and 9 require of any
    implementation (the quota event on its topic, consumed by the hooks' own process; a notice
    before the Eviction), none of gpumeter's code and none of its work. Its topics are its own,
    so it never waits behind the fleet's window in a partition: a floor, not a fair race."""
    pods = pod_names_and_uids(k8s.CoreV1Api(api), namespaces)
    kafka.ensure_topics(settings.kafka,
                        [TopicSpec("raw-chain-in", "other"), TopicSpec("raw-chain-out", "other")])
    source, target = settings.kafka.topic("raw-chain-in"), settings.kafka.topic("raw-chain-out")
    stop: Any = MP.Event()
    relay_ready: Any = MP.Event()
    evictor_ready: Any = MP.Event()
    results: Any = MP.Queue()
    relay = MP.Process(target=_raw_relay, args=(settings.kafka.bootstrap, source, target, relay_ready, stop),
                       daemon=True)
    evictor = MP.Process(target=_raw_evictor, args=(settings.kafka.bootstrap, target, str(kubeconfig), pods,
                                                    evictor_ready, results), daemon=True)
    relay.start()
    evictor.start()
    try:
        if not (relay_ready.wait(60) and evictor_ready.wait(60)):
            raise RuntimeError("the raw chain's relay or evictor did not start within 60 s")
        time.sleep(1.0)  # partitions assigned and fetching before the first send
        sent: dict[str, float] = {}
        seen = cross(settings, source, namespaces, lambda namespace: (namespace.encode(), namespace.encode()),
                     watch, pace, "raw chain: hop, hop, notice, Eviction", sent=sent)
        statuses = results.get(timeout=60)
    finally:
        stop.set()
        relay.join(timeout=30)
        evictor.join(timeout=30)
    return {"seen": seen, "statuses": statuses}


# -- crossings ----------------------------------------------------------------------------------------


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def quota_event(tenant: str) -> tuple[bytes, bytes]:
    event = QuotaEvent(
        event_id=secrets.token_hex(32),
        tenant=tenant,
        metric="gpu_hours",
        level="exceeded",
        threshold="1",
        used="0.016667",
        limit="0.010000",
        period=datetime.now(UTC).strftime("%Y-%m"),
        at=datetime.now(UTC),
    )
    return tenant.encode(), event.model_dump_json().encode()


def crossing_sample(tenant: str) -> tuple[bytes, bytes]:
    """One GPU for the last minute: 1/60 GPU-hour, over the 0.01 limit in one sample."""
    end = datetime.now(UTC).replace(microsecond=0)
    sample = {
        "event_id": f"bench-{tenant}",
        "kind": "gpu",
        "cluster": "bench",
        "node": "bench-gpu-0",
        "tenant": tenant,
        "namespace": tenant,
        "pod": "job",
        "pod_uid": f"uid-{tenant}",
        "window_start": (end - timedelta(seconds=60)).isoformat(),
        "window_end": end.isoformat(),
        "quantity": "1",
        "gpu_model": "H100-SXM-80GB",
    }
    return tenant.encode(), json.dumps(sample).encode()


def cross(
    settings: Settings,
    topic: str,
    tenants: list[str],
    make: Callable[[str], tuple[bytes, bytes]],
    watch: EvictionWatch,
    pace: float,
    label: str,
    timeout: float = 300.0,
    sent: dict[str, float] | None = None,
) -> list[float]:
    """Produce one crossing per tenant, ``pace`` apart; the latencies to the evictions seen.
    ``sent`` (if given) receives each tenant's produce time."""
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all", linger_ms=0)
    sent = {} if sent is None else sent
    with progress() as bar:
        task = bar.add_task(label, total=len(tenants))
        for tenant in tenants:
            key, value = make(tenant)
            sent[tenant] = time.time()
            producer.send(topic, key=key, value=value)
            producer.flush()
            bar.advance(task)
            time.sleep(pace)
        task = bar.add_task("  evictions seen", total=len(tenants))
        deadline = time.monotonic() + timeout
        while len([t for t in tenants if t in watch.seen]) < len(tenants):
            if time.monotonic() > deadline:
                missing = [t for t in tenants if t not in watch.seen]
                raise RuntimeError(
                    f"{len(missing)} evictions not seen after {timeout:.0f}s, e.g. {missing[:3]}"
                )
            bar.update(task, completed=len([t for t in tenants if t in watch.seen]))
            time.sleep(0.2)
        bar.update(task, completed=len(tenants))
    producer.close()
    return sorted(watch.seen[t] - sent[t] for t in tenants)


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_s": statistics.median(values),
        "p99_s": percentile(values, 0.99),
        "max_s": values[-1],
        "count": len(values),
    }


# -- where the time goes ----------------------------------------------------------------------------


def first_timestamps(settings: Settings, topic: str, keep: Callable[[bytes], bool]) -> dict[str, float]:
    """Per key (= tenant), the CreateTime (seconds) of its first record on ``topic`` that ``keep``
    accepts: the producer stamps a record when its send() is called, on this same host."""
    from kafka import KafkaConsumer

    name = settings.kafka.topic(topic)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        first: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in partitions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    if record.key is not None and keep(record.value):
                        first.setdefault(record.key.decode(), record.timestamp / 1000.0)
        return first
    finally:
        consumer.close()


def stages(
    settings: Settings,
    sent: dict[str, float],
    marks: dict[str, dict[str, float]],
    seen: dict[str, float],
    direct: list[str],
    piped: list[str],
) -> dict[str, dict[str, dict[str, float]]]:
    """p50/p99 of each hop along both paths, from timestamps taken on the way (see the names)."""
    points: dict[str, dict[str, float]] = {
        "produced": sent,
        "rated record produced": first_timestamps(settings, topics.RATED, lambda value: True),
        "quota event produced": first_timestamps(
            settings, topics.QUOTA_EVENTS, lambda value: json.loads(value).get("level") == "exceeded"
        ),
        "actuator fetched": marks.get("fetched", {}),
        "actuator handling": marks.get("handled", {}),
        "tenant slot taken": marks.get("slot", {}),
        "eviction call": marks.get("evict", {}),
        "eviction answered": marks.get("evict done", {}),
        "eviction seen": seen,
    }
    paths = {
        "actuator": (direct, ["produced", "actuator fetched", "actuator handling", "tenant slot taken",
                              "eviction call", "eviction answered", "eviction seen"]),
        "pipeline": (piped, ["produced", "rated record produced", "quota event produced", "actuator fetched",
                             "actuator handling", "tenant slot taken", "eviction call", "eviction answered",
                             "eviction seen"]),
    }
    out: dict[str, dict[str, dict[str, float]]] = {}
    calls: dict[str, dict[str, float]] = {}
    for call in ("recorded", "pods", "patch", "evict"):
        starts, ends = marks.get(call, {}), marks.get(f"{call} done", {})
        gaps = sorted(ends[t] - starts[t] for t in [*direct, *piped] if t in starts and t in ends)
        if gaps:
            calls[f"{call} call"] = summary(gaps)
    if calls:
        out["actuator calls (both paths)"] = calls
    for path, (tenants, names) in paths.items():
        if not tenants:
            continue
        out[path] = {}
        for start, end in itertools.pairwise(names):
            gaps = sorted(points[end][t] - points[start][t] for t in tenants
                          if t in points[start] and t in points[end])
            if gaps:
                out[path][f"{start} -> {end}"] = summary(gaps)
        # The five slowest crossings hop by hop (milliseconds): what the tail is made of.
        slowest = sorted((t for t in tenants if t in seen and t in sent), key=lambda t: sent[t] - seen[t])[:5]
        for rank, tenant in enumerate(slowest, 1):
            hops = {f"{a} -> {b}": round((points[b][tenant] - points[a][tenant]) * 1000, 1)
                    for a, b in itertools.pairwise(names) if tenant in points[a] and tenant in points[b]}
            total = round((seen[tenant] - sent[tenant]) * 1000, 1)
            out[path][f"slowest #{rank}"] = {"total_ms": total, **hops}
    return out


# -- main -----------------------------------------------------------------------------------------------


class Processes:
    """The actuator (spawned, as its own process) and the worker, stopped before the control plane."""

    def __init__(self) -> None:
        self.stop: Any = MP.Event()
        self.marks_queue: Any = MP.Queue()
        self.marks: dict[str, dict[str, float]] = {}  # the actuator's stage marks, once it stopped
        self.actuator: Any = None
        self.workers: list[WorkerProcess] = []

    def start(self, settings: Settings, kube: Kube, tenants_file: Path, worker_logs: list[Path]) -> None:
        self.actuator = MP.Process(
            target=_actuator_main,
            args=(settings.model_dump_json(), str(kube.kubeconfig), str(tenants_file), self.stop,
                  self.marks_queue),
            daemon=True,
        )
        self.actuator.start()
        # One consumer group: the samples topic's partitions (and the quota ledgers with them)
        # are shared between the workers, as replicas of the chart's worker Deployment share them.
        self.workers = [WorkerProcess(settings, log, "warn").start() for log in worker_logs]

    def close(self) -> None:
        self.stop.set()
        if self.actuator is not None and self.actuator.is_alive():
            # Read before joining: a process holding queued data does not exit until it is read.
            with contextlib.suppress(queue.Empty):
                self.marks = self.marks_queue.get(timeout=30)
            self.actuator.join(timeout=30)
        for worker in self.workers:
            worker.stop()


def measure(
    settings: Settings,
    api: k8s.ApiClient,
    watch: EvictionWatch,
    warm: list[str],
    direct: list[str],
    piped: list[str],
    evicted: list[str],
    chained: list[str],
    kubeconfig: Path,
    pace: float,
    sent: dict[str, float],
) -> dict[str, Any]:
    """The five measurements; ``sent`` receives every measured crossing's produce time.
    ``evicted``, ``chained``: the namespaces of the raw eviction's and the raw chain's pods (no
    tenant of the actuator's)."""
    quota_topic, samples_topic = (
        settings.kafka.topic(topics.QUOTA_EVENTS),
        settings.kafka.topic(topics.SAMPLES),
    )
    # Warm-up: one crossing down each path, so start-up, group joins and connections are behind
    # us; and the actuator's first pass (one Volcano queue per tenant) is over before the clock runs.
    cross(settings, quota_topic, warm[:1], quota_event, watch, 0.0, "warm-up (actuator)", timeout=120)
    if piped:
        cross(settings, samples_topic, warm[1:], crossing_sample, watch, 0.0, "warm-up (worker)", timeout=180)
    expected = len(warm) + len(direct) + len(piped)
    with console.status("the actuator makes one Volcano queue per tenant..."):
        wait_until(lambda: queues_made(api) >= expected, what="Volcano queues made", timeout=600)
    results: dict[str, Any] = {"raw_kafka": summary(raw_kafka(settings, len(direct), pace))}
    load = os.getloadavg()[0]
    floor = raw_eviction(api, evicted, watch, pace)
    results["raw_eviction"] = {**summary(floor["seen"]), "call": summary(floor["call"]),
                               "statuses": floor["statuses"], "load_average_at_start": load}
    load = os.getloadavg()[0]
    chain = raw_chain(settings, kubeconfig, api, chained, watch, pace)
    results["raw_chain"] = {**summary(chain["seen"]), "statuses": chain["statuses"],
                            "load_average_at_start": load}
    results["actuator"] = summary(
        cross(settings, quota_topic, direct, quota_event, watch, pace, "QuotaEvent -> eviction", sent=sent)
    )
    if piped:
        results["pipeline"] = summary(
            cross(settings, samples_topic, piped, crossing_sample, watch, pace, "crossing sample -> eviction",
                  sent=sent)
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--crossings", type=int, default=200, help="crossings per measurement (>= 200 for p99)"
    )
    parser.add_argument("--pace", type=float, default=0.1, help="seconds between two crossings")
    parser.add_argument("--skip-pipeline", action="store_true", help="only the raw hops and the actuator")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    parser.add_argument("--fleet-nodes", type=int, default=1250,
                        help="8-GPU nodes of the fleet publishing in real time into the same worker "
                             "while measuring (1,250 = 10,000 GPUs); 0: none")
    parser.add_argument("--quiet", action="store_true", help="no background fleet (= --fleet-nodes 0)")
    parser.add_argument("--window-seconds", type=int, default=15, help="the fleet's window")
    parser.add_argument("--workers", type=int, default=1,
                        help="`gpumeter worker` processes sharing the samples topic (one consumer group)")
    args = parser.parse_args(argv)
    if args.quiet:
        args.fleet_nodes = 0
    if args.fleet_nodes < 0 or args.window_seconds <= 0 or args.workers < 1:
        parser.error("--fleet-nodes must be >= 0, --window-seconds and --workers positive")

    base = load_settings()
    with console.status("starting local services..."):
        services.up(base)
    tag = secrets.token_hex(3)
    settings = services.namespaced(base, f"bench-{tag}.", f"bench_{tag}", "gpumeter-bench")
    settings.hooks.group = f"gpumeter-bench-hooks-{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="gpumeter-quota-bench-"))
    warm = [f"warm-{tag}", f"warmp-{tag}"]
    direct = [f"qd{i:04d}-{tag}" for i in range(args.crossings)]
    piped = [] if args.skip_pipeline else [f"qp{i:04d}-{tag}" for i in range(args.crossings)]
    everyone = [*warm, *direct, *piped]
    # The raw eviction's pods: namespaces the tenants file does not know, so the actuator
    # (and the worker) never touch them; the same label, so the same watch sees them.
    evicted = [f"qe{i:04d}-{tag}" for i in range(args.crossings)]
    chained = [f"qc{i:04d}-{tag}" for i in range(args.crossings)]
    tenants_file = workdir / "tenants.yaml"
    tenants_file.write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"tenant": t, "gpu_hours": GPU_HOURS_LIMIT, "on_exceed": "preempt", "grace_seconds": 0}
                    for t in everyone
                ]
            }
        )
    )
    settings.tenants = tenants_file
    kafka.ensure_topics(settings.kafka)
    client = clickhouse.connect(settings.clickhouse.dsn)
    schema.migrate(client)
    client.close()

    # The machine's load is part of the result: on a shared 2-core box it decides the tail.
    results: dict[str, Any] = {
        "crossings": args.crossings,
        "pace_s": args.pace,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "background": f"fleet of {args.fleet_nodes * 8:,} GPUs" if args.fleet_nodes else "quiet",
        "workers": args.workers,
    }
    try:
        with control_plane(workdir / "kube") as kube, kube.api_client() as api:
            core = k8s.CoreV1Api(api)
            pods = [*everyone, *evicted, *chained]
            with console.status(f"{len(everyone)} tenants, {len(evicted) + len(chained)} namespaces of the "
                                "raw eviction and chain: namespaces and GPU pods on KWOK nodes..."):
                nodes = make_nodes(core, -(-len(pods) // PODS_PER_NODE))
                watch = EvictionWatch(api, tag)
                make_tenants(core, pods, nodes, tag)
                wait_until(
                    lambda: len(watch.running) >= len(pods), what="benchmark pods Running", timeout=600
                )
            processes = Processes()
            sent: dict[str, float] = {}
            fleet: BackgroundFleet | None = None
            try:
                processes.start(settings, kube, tenants_file,
                                [workdir / f"worker-{i}.log" for i in range(args.workers)] if piped else [])
                if args.fleet_nodes:
                    fleet = BackgroundFleet(settings, args.fleet_nodes, args.window_seconds)
                    with console.status(f"the fleet ({fleet.gpus:,} GPUs) publishing its first "
                                        f"{FLEET_WINDOWS_BEFORE} windows..."):
                        fleet.wait_windows(FLEET_WINDOWS_BEFORE, timeout=300 + 3 * args.window_seconds)
                    results["load_average_fleet_on"] = os.getloadavg()[0]
                results.update(measure(settings, api, watch, warm, direct, piped, evicted, chained,
                                       kube.kubeconfig, args.pace, sent))
            finally:
                if fleet is not None:
                    results["fleet"] = fleet.close()
                # Before the control plane goes: nothing left talking to a stopped API server.
                processes.close()
                watch.close()
            results["stages"] = stages(settings, sent, processes.marks, watch.seen, direct, piped)
    finally:
        services.drop_namespace(settings)
        if args.keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    results["load_average_after"] = os.getloadavg()[0]
    report(results)
    write_results(RESULTS, results)
    return 0


def report(results: dict[str, Any]) -> None:
    raw = results["raw_kafka"]
    table = Table(
        "path",
        "p50",
        "p99",
        "max",
        "p50 / raw",
        "p99 / raw",
        title_justify="left",
        title=f"quota enforcement latency, {results['crossings']} crossings each, grace 0, "
              f"background: {results['background']}, {results.get('workers', 1)} worker(s)",
    )
    rows: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("raw Kafka hop (produce -> consume)", lambda: results["raw_kafka"]),
        ("raw eviction: Eviction call -> eviction seen", lambda: results["raw_eviction"]),
        ("  its call alone (call -> HTTP answer)", lambda: results["raw_eviction"]["call"]),
        ("raw chain: hop, hop, notice, Eviction -> seen", lambda: results["raw_chain"]),
        ("QuotaEvent -> eviction at API server", lambda: results["actuator"]),
        ("crossing sample -> eviction at API server", lambda: results["pipeline"]),
    ]
    for label, row in rows:
        try:
            data = row()
        except KeyError:
            continue
        data["p50_ratio_vs_raw"] = data["p50_s"] / raw["p50_s"]
        data["p99_ratio_vs_raw"] = data["p99_s"] / raw["p99_s"]
        table.add_row(
            label,
            f"{data['p50_s'] * 1000:,.1f} ms",
            f"{data['p99_s'] * 1000:,.1f} ms",
            f"{data['max_s'] * 1000:,.1f} ms",
            f"{data['p50_ratio_vs_raw']:.1f}",
            f"{data['p99_ratio_vs_raw']:.1f}",
        )
    console.print(table)
    for path, hops in results.get("stages", {}).items():
        breakdown = Table("hop", "p50", "p99", "count", title_justify="left",
                          title=f"{path}: where the time goes")
        for hop, data in hops.items():
            if "p50_s" in data:
                breakdown.add_row(hop, f"{data['p50_s'] * 1000:,.1f} ms", f"{data['p99_s'] * 1000:,.1f} ms",
                                  str(data["count"]))
        console.print(breakdown)
        for hop, data in hops.items():
            if "p50_s" not in data:
                console.print(f"  {hop}: " + ", ".join(f"{k} {v:,.0f}" for k, v in data.items()))
    if "fleet" in results:
        fleet = results["fleet"]
        console.print(f"fleet: {fleet['gpus']:,} GPUs, {fleet['windows_published']} windows of "
                      f"{fleet['samples_per_window_mean']:,.0f} samples ({fleet['samples_per_second']:,.0f} "
                      f"samples/s) into the same worker; a window started at most "
                      f"{fleet['window_start_late_max_s']:.1f} s late, took "
                      f"{fleet['publish_s_per_window_mean']:.2f} s to send and "
                      f"{fleet['publisher_cpu_s_per_window_mean']:.2f} s of the simulator's CPU")
    if "raw_eviction" in results:
        # The floors: no implementation evicts faster than the Eviction API answers and the watch
        # shows it, nor goes from a sample to an eviction faster than the raw chain (two Kafka
        # hops, the notice, the Eviction, nothing else); above 10 x the raw hop, the ratio target
        # is out of reach on this host in this run.
        floors = {"raw_eviction": results["raw_eviction"]["p99_ratio_vs_raw"]}
        if "raw_chain" in results:
            floors["raw_chain"] = results["raw_chain"]["p99_ratio_vs_raw"]
        results["floor"] = {
            **{f"{name}_p99_ratio_vs_raw": ratio for name, ratio in floors.items()},
            "p99_ratio_target_reachable": max(floors.values()) <= TARGET_P99_RATIO,
        }
        for name, ratio in floors.items():
            data = results[name]
            console.print(
                f"floor: the {name.replace('_', ' ')}'s p99 {data['p99_s'] * 1000:,.0f} ms is {ratio:.1f} x "
                f"the raw Kafka hop's p99 {raw['p99_s'] * 1000:,.1f} ms: "
                f"the <= {TARGET_P99_RATIO:.0f} x target "
                + ("is within its reach" if ratio <= TARGET_P99_RATIO else
                   "is NOT reachable on this host by any implementation")
                + f"; answers {data['statuses']}")
    if "pipeline" in results:
        p99, ratio = results["pipeline"]["p99_s"], results["pipeline"]["p99_ratio_vs_raw"]
        results["targets"] = {"p99_under_1s": p99 < TARGET_P99_S,
                              "p99_ratio_at_most_10": ratio <= TARGET_P99_RATIO}
        console.print(
            f"crossing -> eviction p99 {p99 * 1000:,.0f} ms (target < {TARGET_P99_S * 1000:,.0f} ms: "
            f"{'met' if p99 < TARGET_P99_S else 'NOT met'}), {ratio:.1f} x the raw Kafka hop's p99 "
            f"{results['raw_kafka']['p99_s'] * 1000:,.1f} ms (target <= {TARGET_P99_RATIO:.0f} x: "
            f"{'met' if ratio <= TARGET_P99_RATIO else 'NOT met'}); background: {results['background']}, "
            f"{results.get('workers', 1)} worker(s)")
    console.print(
        f"{results['cpus']} CPUs; 1-minute load average {results['load_average_before']:.1f} before, "
        f"{results['load_average_after']:.1f} after"
    )


if __name__ == "__main__":
    sys.exit(main())
