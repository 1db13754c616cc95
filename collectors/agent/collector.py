"""The node agent: every ``interval`` seconds, collect one window of usage and publish it.

``run_agent(settings, source="nvml")`` is what ``gpumeter collect --source nvml``
runs as a DaemonSet on every GPU node:

1. NVML (collectors.agent.nvml_source): inventory, telemetry, topology;
2. kubelet PodResources (collectors.agent.podresources): which pod holds which device, through
   device plugins or DRA ResourceClaims (collectors.agent.dra resolves DRA names to NVML devices);
3. kubelet stats summary (collectors.agent.kubelet_stats): CPU, memory, ephemeral storage used;
4. API server (collectors.agent.podmeta): tenant, priority, capacity type, requests, PVCs;
5. samples (collectors.agent.samples) -> publisher (Kafka, or the disk spool while Kafka is away);
6. from the same reads, the node's allocation record (collectors.agent.allocation, contract 8):
   which GPU indices the kubelet assigned to which pod, every window, through the same publisher.

A failing source costs its part of one window, never the agent: each read is
isolated, counted (``gpumeter_agent_source_errors``) and, for PodResources,
the last good allocation list is reused for up to three intervals. Past that the
allocation is unknown: the window bills no GPU and publishes no allocation record (the
last one published stands), rather than one claiming every GPU is free.

Windows the loop missed (an overrunning cycle, a restart) are backfilled from the
current observation, bounded, and counted beyond that (collectors.agent.windows).
``/healthz`` on the metrics port fails once the last completed cycle is older than
three windows (collectors.agent.metrics), which is what the DaemonSet's liveness
probe asks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from collectors.agent.allocation import AllocationBuilder
from collectors.agent.cgroups import pod_uids_of
from collectors.agent.dra import resolve as resolve_dra
from collectors.agent.kubelet_stats import (
    ApiServerStatsClient,
    KubeletStatsClient,
    KubeletStatsError,
    NodeStats,
    default_kubelet_ca,
)
from collectors.agent.metrics import AgentMetrics
from collectors.agent.nvml_source import NvmlSource
from collectors.agent.nvml_telemetry import DeviceReading
from collectors.agent.podmeta import ClaimInfo, PodInfo
from collectors.agent.podresources import (
    DEFAULT_SOCKET,
    DeviceAllocation,
    PodResourcesClient,
    mig_profile_of,
    replicas_from_node,
)
from collectors.agent.publisher import Publisher
from collectors.agent.samples import SampleBuilder, window_bounds
from collectors.agent.spool import DEFAULT_MAX_BYTES, Spool
from collectors.agent.windows import DEFAULT_MAX_BACKFILL, STATE_FILE, WindowTracker, host_boot_time
from gpumeter.core.kube import GPU_RESOURCE
from gpumeter.core.models import NodeAllocation, NodeTopology, UsageSample
from gpumeter.core.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 15
DEFAULT_METRICS_PORT = 9464
INVENTORY_REFRESH_CYCLES = 20  # NVML re-enumeration (and topology check) every ~5 min at 15 s
UNKNOWN_DEVICE_REFRESH_CYCLES = 4
ALLOCATION_STALENESS_INTERVALS = 3
# Collect this long after a window closes, so the window's last moments are in the readings.
COLLECT_DELAY_S = 0.25
BACKFILL_LABEL = "backfilled"


class AllocationSource(Protocol):
    def gpu_allocations(self) -> list[DeviceAllocation]: ...


class StatsSource(Protocol):
    def fetch(self) -> NodeStats: ...


class MetadataSource(Protocol):
    def pods(self) -> list[PodInfo]: ...

    def claim(self, namespace: str, name: str) -> ClaimInfo | None: ...


class SampleSource(Protocol):
    """What the loop drives: a node collector, or any other source of samples (e.g. a simulated fleet)."""

    def collect(self, window_start: datetime, window_end: datetime) -> list[UsageSample]: ...

    def topologies(self) -> list[NodeTopology]: ...

    def node_allocations(self) -> list[NodeAllocation]:
        """Allocation records of the window last collected (none when they are unknown)."""
        ...

    def close(self) -> None: ...


class NodeCollector:
    """Joins NVML, PodResources, kubelet stats and pod metadata into one window's samples."""

    def __init__(
        self,
        *,
        cluster: str,
        node: str,
        interval: int,
        nvml: NvmlSource,
        allocations: AllocationSource,
        metadata: MetadataSource,
        stats: StatsSource | None = None,
        proc_root: Path | None = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.interval = interval
        self.nvml = nvml
        self.allocations = allocations
        self.metadata = metadata
        self.stats = stats
        self.proc_root = proc_root
        self._clock = clock
        self.builder = SampleBuilder(cluster=cluster, node=node, interval=interval)
        self.allocation_builder = AllocationBuilder(cluster=cluster, node=node)
        self.source_errors: dict[str, int] = {}
        self.lost_gpus = 0
        self.cycles = 0
        self._last_allocations: tuple[float, list[DeviceAllocation]] | None = None
        self._allocations_known = False
        # What the last window was built from, for its allocation record (None: unknown).
        self._window_state: tuple[datetime, list[DeviceAllocation], list[PodInfo]] | None = None
        self._topology_signature: Any = None
        self._unknown_refresh_cycle = -UNKNOWN_DEVICE_REFRESH_CYCLES
        if hasattr(allocations, "replica_hints") and allocations.replica_hints is None:
            # Without the kubelet's allocatable list, the node and NVML tell the replica counts.
            allocations.replica_hints = self.replica_hints

    def replica_hints(self) -> dict[str, int]:
        """Replicas per device of each GPU resource, from the node object and the NVML inventory."""
        labels = getattr(self.metadata, "node_labels", None)
        capacity = getattr(self.metadata, "node_capacity", None)
        if not callable(labels) or not callable(capacity):
            return {}
        inventory = self.nvml.inventory

        def devices_behind(resource: str) -> int:
            profile = mig_profile_of(resource)
            if profile is not None:
                return sum(1 for g in inventory for m in g.mig_instances if m.profile == profile)
            whole = sum(1 for g in inventory if not g.mig_enabled)
            # MIG "single" strategy: every MIG device is advertised as nvidia.com/gpu.
            return whole or sum(len(g.mig_instances) for g in inventory)

        return replicas_from_node(labels(), capacity(), devices_behind)

    def _failed(self, source: str, exc: Exception) -> None:
        self.source_errors[source] = self.source_errors.get(source, 0) + 1
        log.warning("%s read failed: %s", source, exc)

    def nvml_error_counts(self) -> dict[tuple[str, str], int]:
        return self.nvml.error_counts()

    def gpu_count(self) -> int:
        return len(self.nvml.inventory)

    def _gpu_allocations(self) -> list[DeviceAllocation]:
        now = self._clock()
        try:
            allocations = self.allocations.gpu_allocations()
        except Exception as exc:
            self._failed("podresources", exc)
            if self._last_allocations is not None:
                at, previous = self._last_allocations
                if now - at <= ALLOCATION_STALENESS_INTERVALS * self.interval:
                    self._allocations_known = True
                    return previous
            self._allocations_known = False
            return []
        self._last_allocations = (now, allocations)
        self._allocations_known = True
        return allocations

    def _node_stats(self) -> NodeStats | None:
        if self.stats is None:
            return None
        try:
            return self.stats.fetch()
        except (KubeletStatsError, OSError, ValueError) as exc:
            self._failed("kubelet_stats", exc)
            return None

    def _pods(self) -> list[PodInfo]:
        try:
            return self.metadata.pods()
        except Exception as exc:
            self._failed("pod_metadata", exc)
            return []

    def _pid_pods(self, readings: dict[str, DeviceReading]) -> dict[int, str]:
        if self.proc_root is None:
            return {}
        pids = {p.pid for reading in readings.values() for p in reading.processes}
        return pod_uids_of(pids, self.proc_root) if pids else {}

    def collect(self, window_start: datetime, window_end: datetime) -> list[UsageSample]:
        self.cycles += 1
        if self.cycles % INVENTORY_REFRESH_CYCLES == 0:
            self.nvml.refresh_inventory()
        listed = self._gpu_allocations()
        allocations = resolve_dra(listed, self.nvml.inventory)
        unknown = any(self.nvml.device(a.device_uuid) is None for a in allocations)
        if unknown and self.cycles - self._unknown_refresh_cycle >= UNKNOWN_DEVICE_REFRESH_CYCLES:
            # A device the last inventory lacks (MIG reconfigured, a DRA driver's new MIG device, a
            # GPU back): re-enumerate, rate-limited.
            self._unknown_refresh_cycle = self.cycles
            self.nvml.refresh_inventory()
            allocations = resolve_dra(listed, self.nvml.inventory)
        readings = self.nvml.read(window=(window_start, window_end))
        self.lost_gpus = sum(
            1
            for gpu in self.nvml.inventory
            if readings.get(gpu.uuid, None) is not None and readings[gpu.uuid].lost
        )
        pods = self._pods()
        node_stats = self._node_stats()
        self._window_state = (window_end, allocations, pods) if self._allocations_known else None
        return self.builder.build(
            window_start=window_start,
            window_end=window_end,
            pods=pods,
            allocations=allocations,
            device_lookup=self.nvml.device,
            readings=readings,
            node_stats=node_stats,
            claim_lookup=self.metadata.claim,
            pid_pods=self._pid_pods(readings),
        )

    def backfill(self, windows: list[tuple[datetime, datetime]]) -> list[UsageSample]:
        """Samples for missed windows from the observation of the window last collected.

        Quantities only (nothing was measured then): GPUs as the kubelet assigns them now, CPU and
        memory at the pods' requests, each pod from its start and up to its end; labelled
        ``backfilled``. Nothing when the allocation is unknown (collectors.agent.windows).
        """
        if self._window_state is None:
            return []
        _at, allocations, pods = self._window_state
        out: list[UsageSample] = []
        for start, end in windows:
            for sample in self.builder.build(
                window_start=start,
                window_end=end,
                pods=pods,
                allocations=allocations,
                device_lookup=self.nvml.device,
                readings={},
                node_stats=None,
                claim_lookup=self.metadata.claim,
            ):
                out.append(sample.model_copy(update={"labels": {**sample.labels, BACKFILL_LABEL: "true"}}))
        return out

    def node_allocations(self) -> list[NodeAllocation]:
        """The node's allocation for the window last collected, ``at`` its end; [] when unknown."""
        if self._window_state is None:
            return []
        window_end, allocations, pods = self._window_state
        record = self.allocation_builder.build(
            at=window_end, allocations=allocations, device_lookup=self.nvml.device, pods=pods
        )
        return [record]

    def topology(self, at: datetime | None = None) -> NodeTopology:
        """NVML's layout, each whole GPU with the replicas the device plugin time-slices it into."""
        topology = self.nvml.topology(self.cluster, self.node, at)
        replicas = self.gpu_replicas()
        gpus = [
            gpu.model_copy(update={"replicas": replicas[gpu.uuid]})
            if replicas.get(gpu.uuid, 1) != gpu.replicas
            else gpu
            for gpu in topology.gpus
        ]
        return topology.model_copy(update={"gpus": gpus})

    def gpu_replicas(self) -> dict[str, int]:
        """Replicas per whole GPU (by UUID): the kubelet's allocatable list when it has one, else
        the node's hint for ``nvidia.com/gpu`` (GPU feature discovery's label, or its capacity
        over the GPUs behind it); 1 when neither says the GPU is shared."""
        whole = [gpu.uuid for gpu in self.nvml.inventory if not gpu.mig_enabled]
        listed = getattr(self.allocations, "device_replicas", None)
        per_device = listed() if callable(listed) else None
        if per_device is not None:
            return {uuid: max(1, per_device.get(uuid, 1)) for uuid in whole}
        try:
            hinted = self.replica_hints().get(GPU_RESOURCE, 1)
        except Exception as exc:  # a hint is an aid; the layout is published without it
            log.warning("replica hints from the node failed: %s", exc)
            hinted = 1
        return dict.fromkeys(whole, max(1, hinted))

    def topologies(self) -> list[NodeTopology]:
        """The topology when it changed since the last call (first call: always)."""
        topology = self.topology()
        signature = (tuple(topology.gpus), tuple(sorted(topology.links.items())))
        if signature == self._topology_signature:
            return []
        self._topology_signature = signature
        return [topology]

    def close(self) -> None:
        self.nvml.stop()
        close = getattr(self.allocations, "close", None)
        if callable(close):
            close()
        stop = getattr(self.metadata, "stop", None)
        if callable(stop):
            stop()


@dataclass
class AgentConfig:
    """Agent options, each also an env var (``GPUMETER_AGENT_*``, ``GPUMETER_CLUSTER``, ``NODE_NAME``)."""

    cluster: str = "default"
    node: str = field(default_factory=socket.gethostname)
    interval: int = DEFAULT_INTERVAL
    metrics_port: int | None = DEFAULT_METRICS_PORT
    spool_dir: Path | None = None  # default: <data_dir>/agent-spool
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    pod_resources_socket: str = DEFAULT_SOCKET
    # https://<node>:10250 (direct, RBAC nodes/stats), "apiserver" (node proxy, nodes/proxy), "" (off).
    kubelet_url: str | None = None
    kubelet_insecure_tls: bool = False
    # The CA verifying the kubelet's serving certificate; None: the ServiceAccount's cluster CA.
    kubelet_ca: Path | None = None
    proc_root: Path | None = Path("/proc")
    # Missed windows (an overrunning cycle, a restart) billed from the current observation, at most
    # this many; older ones are counted, not billed (collectors.agent.windows).
    backfill_windows: int = DEFAULT_MAX_BACKFILL

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> AgentConfig:
        env = dict(os.environ if env is None else env)
        config = cls()
        config.cluster = env.get("GPUMETER_CLUSTER", config.cluster)
        config.node = env.get("GPUMETER_AGENT_NODE") or env.get("NODE_NAME") or config.node
        if "GPUMETER_AGENT_INTERVAL" in env:
            config.interval = int(env["GPUMETER_AGENT_INTERVAL"])
        if "GPUMETER_AGENT_METRICS_PORT" in env:
            port = env["GPUMETER_AGENT_METRICS_PORT"]
            config.metrics_port = int(port) if port not in ("", "0", "off") else None
        if env.get("GPUMETER_AGENT_SPOOL_DIR"):
            config.spool_dir = Path(env["GPUMETER_AGENT_SPOOL_DIR"])
        if "GPUMETER_AGENT_SPOOL_MAX_BYTES" in env:
            config.spool_max_bytes = int(env["GPUMETER_AGENT_SPOOL_MAX_BYTES"])
        config.pod_resources_socket = env.get(
            "GPUMETER_AGENT_POD_RESOURCES_SOCKET", config.pod_resources_socket
        )
        if "GPUMETER_AGENT_KUBELET_URL" in env:
            config.kubelet_url = env["GPUMETER_AGENT_KUBELET_URL"]
        elif env.get("NODE_IP"):
            config.kubelet_url = f"https://{env['NODE_IP']}:10250"
        if env.get("GPUMETER_AGENT_KUBELET_CA"):
            config.kubelet_ca = Path(env["GPUMETER_AGENT_KUBELET_CA"])
        if "GPUMETER_AGENT_BACKFILL_WINDOWS" in env:
            config.backfill_windows = int(env["GPUMETER_AGENT_BACKFILL_WINDOWS"])
        config.kubelet_insecure_tls = env.get("GPUMETER_AGENT_KUBELET_INSECURE_TLS", "").lower() in (
            "1",
            "true",
            "yes",
        )
        for key, value in overrides.items():
            if value is not None:
                setattr(config, key, value)
        return config


def _kube_api_client() -> Any:
    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    return client.ApiClient()


def build_nvml_collector(
    config: AgentConfig, *, nvml_module: Any = None, api_client: Any = None
) -> NodeCollector:
    """The real node collector: NVML, the kubelet's socket and stats, the API server."""
    from collectors.agent.podmeta import KubePodMetadata

    nvml = NvmlSource(nvml=nvml_module)
    nvml.start()  # NvmlUnavailable propagates: a GPU node agent without NVML is a failed agent
    log.info("NVML driver %s: %d GPU(s)", nvml.driver_version, len(nvml.inventory))
    api = api_client if api_client is not None else _kube_api_client()
    metadata = KubePodMetadata(api, config.node)
    if not metadata.start():
        log.warning("pod metadata not synced yet; samples start once the API server answers")
    stats: StatsSource | None = None
    if config.kubelet_url == "apiserver":
        from kubernetes import client

        stats = ApiServerStatsClient(client.CoreV1Api(api), config.node)
    elif config.kubelet_url:
        stats = KubeletStatsClient(config.kubelet_url, insecure=config.kubelet_insecure_tls,
                                   ca_path=default_kubelet_ca(config.kubelet_ca))
    return NodeCollector(
        cluster=config.cluster,
        node=config.node,
        interval=config.interval,
        nvml=nvml,
        allocations=PodResourcesClient(config.pod_resources_socket),
        metadata=metadata,
        stats=stats,
        proc_root=config.proc_root,
    )


def run_agent(
    settings: Settings,
    source: str | SampleSource = "nvml",
    interval: int | None = None,
    *,
    config: AgentConfig | None = None,
    stop: threading.Event | None = None,
    max_cycles: int | None = None,
    publisher: Publisher | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> int:
    """Run the collection loop until ``stop`` is set (SIGTERM/SIGINT set it in the main thread).

    ``source`` is ``"nvml"`` for the real node agent, or any :class:`SampleSource`
    (the CLI passes the simulated fleet this way). Returns the number of cycles run.
    """
    config = config or AgentConfig.from_env()
    if interval is not None:
        config.interval = interval
    if config.interval <= 0:
        raise ValueError("interval must be a positive number of seconds")
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())

    if isinstance(source, str):
        if source != "nvml":
            raise ValueError(
                f"unknown source {source!r}: run_agent builds 'nvml'; pass other sources as objects"
            )
        collector: SampleSource = build_nvml_collector(config)
    else:
        collector = source

    if publisher is None:
        spool_dir = config.spool_dir or settings.data_dir / "agent-spool"
        publisher = Publisher(settings.kafka, Spool(spool_dir, max_bytes=config.spool_max_bytes))
    tracker = WindowTracker(
        interval=config.interval,
        state_path=publisher.spool.directory / STATE_FILE,
        max_backfill=config.backfill_windows,
        boot_time=host_boot_time(config.proc_root),
        identity=f"{config.cluster}/{config.node}",
    )
    metrics = AgentMetrics(interval=config.interval)
    metrics.publisher = publisher
    metrics.windows = tracker
    if isinstance(collector, NodeCollector):
        metrics.collector = collector
    server = metrics.serve(config.metrics_port) if config.metrics_port else None
    log.info(
        "agent for node %s in cluster %s: %d s windows, spool %s (%d records waiting)",
        config.node,
        config.cluster,
        config.interval,
        publisher.spool.directory,
        publisher.spool.records,
    )

    cycles = 0
    last_window: datetime | None = None
    try:
        for topology in collector.topologies():
            publisher.publish_topology(topology)
        while not stop.is_set():
            now = wall_clock()
            boundary = (int(now // config.interval) + 1) * config.interval + COLLECT_DELAY_S
            if stop.wait(max(0.0, boundary - now)):
                break
            window_start, window_end = window_bounds(wall_clock(), config.interval)
            if window_start == last_window:
                continue
            last_window = window_start
            started, cpu_started = time.monotonic(), time.process_time()
            try:
                missed = tracker.plan(window_start)
                samples = collector.collect(window_start, window_end)
                backfill = getattr(collector, "backfill", None)
                filled = backfill(missed) if missed and callable(backfill) else []
                if missed and not callable(backfill):
                    tracker.count_unfilled(missed)
                for sample in [*samples, *filled]:
                    metrics.count_emitted(sample.kind)
                publisher.publish([*samples, *filled])
                tracker.done(window_end, backfilled=len(missed) if callable(backfill) else 0)
                for allocation in collector.node_allocations():
                    publisher.publish_allocation(allocation)
                if isinstance(collector, NodeCollector) and collector.cycles % INVENTORY_REFRESH_CYCLES == 0:
                    for topology in collector.topologies():
                        publisher.publish_topology(topology)
                metrics.cycle_completed()  # what the liveness probe watches
            except Exception:  # one bad cycle must not end the agent
                log.exception("collection cycle for window %s failed", window_start.isoformat())
            metrics.cycle_seconds.observe(time.monotonic() - started)
            metrics.cycle_cpu_seconds.observe(time.process_time() - cpu_started)
            cycles += 1
            if max_cycles is not None and cycles >= max_cycles:
                break
    finally:
        log.info(
            "agent stopping after %d cycle(s); %d record(s) left in the spool",
            cycles,
            publisher.spool.records,
        )
        publisher.close()
        collector.close()
        if server is not None:
            with contextlib.suppress(TypeError, AttributeError):
                server[0].shutdown()
    return cycles

