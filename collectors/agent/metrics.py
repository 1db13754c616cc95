"""Prometheus metrics of the node agent itself, served on ``/metrics``.

Counters live on the objects that own them (spool, NVML source, publisher,
collector); a custom collector reads them at scrape time, so the hot path never
touches Prometheus. The same HTTP server answers the liveness probe on ``/healthz``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collectors.agent.publisher import Publisher

PREFIX = "gpumeter_agent"
LIVENESS_WINDOWS = 3  # /healthz fails when the last completed cycle is older than this many windows


# What the metrics read of the collector, as a protocol: the collector imports this module to
# count its cycles, so this module must not import the collector back.
class _BuilderStats(Protocol):
    unattributed: int
    unknown_devices: int
    finished_holders: int
    invalid: int
    invalid_tenant_label: int


class _SampleBuilder(Protocol):
    @property
    def stats(self) -> _BuilderStats: ...


class CollectorView(Protocol):
    lost_gpus: int
    source_errors: dict[str, int]

    @property
    def builder(self) -> _SampleBuilder: ...

    def nvml_error_counts(self) -> Mapping[tuple[str, str], int]: ...

    def gpu_count(self) -> int: ...


class _AgentState(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        m = self._metrics
        emitted = CounterMetricFamily(f"{PREFIX}_samples_emitted", "Samples built, by kind", labels=["kind"])
        for kind, count in sorted(m.emitted.items()):
            emitted.add_metric([kind], count)
        yield emitted
        publisher = m.publisher
        if publisher is not None:
            spool = publisher.spool
            yield GaugeMetricFamily(f"{PREFIX}_spool_bytes", "Spool bytes", value=spool.size_bytes)
            yield GaugeMetricFamily(
                f"{PREFIX}_spool_records", "Records in the disk spool", value=spool.records
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_spool_full", "1 while the spool is dropping records", value=1 if spool.full else 0
            )
            yield CounterMetricFamily(
                f"{PREFIX}_spool_dropped_records",
                "Records dropped because the spool was full (usage not billed)",
                value=spool.dropped,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_spool_corrupt_records",
                "Damaged spool records skipped",
                value=spool.corrupt_records,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_samples_sent", "Samples acknowledged by Kafka", value=publisher.sent
            )
            yield CounterMetricFamily(
                f"{PREFIX}_samples_spooled", "Samples written to the spool", value=publisher.spooled
            )
            yield CounterMetricFamily(
                f"{PREFIX}_samples_replayed",
                "Spooled samples acknowledged by Kafka",
                value=publisher.replayed,
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_kafka_up",
                "1 when the last Kafka send was acknowledged",
                value=1 if publisher.kafka_up else 0,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_allocations_sent",
                "Allocation records acknowledged by Kafka (replays included)",
                value=publisher.allocations_sent + publisher.allocations_replayed,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_allocations_spooled",
                "Allocation records written to the allocation spool",
                value=publisher.allocations_spooled,
            )
            allocation_spool = publisher.allocation_spool
            yield GaugeMetricFamily(
                f"{PREFIX}_allocation_spool_records",
                "Allocation records waiting in their spool",
                value=allocation_spool.records if allocation_spool is not None else 0,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_allocation_spool_dropped_records",
                "Allocation records dropped because their spool was full",
                value=allocation_spool.dropped if allocation_spool is not None else 0,
            )
        yield GaugeMetricFamily(
            f"{PREFIX}_last_cycle_age_seconds",
            "Seconds since the last completed collection cycle (liveness fails past 3 windows)",
            value=m.cycle_age(),
        )
        windows = m.windows
        if windows is not None:
            yield CounterMetricFamily(
                f"{PREFIX}_windows_backfilled",
                "Missed windows billed from the current observation (no telemetry)",
                value=windows.backfilled,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_windows_skipped",
                "Missed windows not billed (beyond the backfill bound, or before the host booted)",
                value=windows.skipped,
            )
        collector = m.collector
        if collector is not None:
            errors = CounterMetricFamily(
                f"{PREFIX}_nvml_errors", "NVML call errors", labels=["call", "error"]
            )
            for (call, error), count in sorted(collector.nvml_error_counts().items()):
                errors.add_metric([call, error], count)
            yield errors
            yield GaugeMetricFamily(f"{PREFIX}_gpus", "GPUs NVML reports", value=collector.gpu_count())
            yield GaugeMetricFamily(
                f"{PREFIX}_gpus_lost", "GPUs lost in the last read", value=collector.lost_gpus
            )
            failures = CounterMetricFamily(
                f"{PREFIX}_source_errors", "Failed reads of a source", labels=["source"]
            )
            for source, count in sorted(collector.source_errors.items()):
                failures.add_metric([source], count)
            yield failures
            yield CounterMetricFamily(
                f"{PREFIX}_unattributed_devices",
                "Held devices whose pod was unknown",
                value=collector.builder.stats.unattributed,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_unknown_devices",
                "Devices the kubelet assigned that NVML does not report (or a DRA name that does not "
                "resolve): held but not billed",
                value=collector.builder.stats.unknown_devices,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_finished_pod_devices",
                "Devices still listed by the kubelet for pods that had finished (not billed)",
                value=collector.builder.stats.finished_holders,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_invalid_tenant_label",
                "Samples withheld: their namespace's gpumeter.io/tenant label is not a tenant id",
                value=collector.builder.stats.invalid_tenant_label,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_invalid_samples",
                "Samples failing contract 1 (bug)",
                value=collector.builder.stats.invalid,
            )


class _WindowCounts(Protocol):
    backfilled: int
    skipped: int


class AgentMetrics:
    """The agent's /metrics, and its /healthz: healthy while the last completed collection cycle is
    at most ``LIVENESS_WINDOWS`` windows old (a stalled loop fails the liveness probe)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        interval: int = 15,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.emitted: dict[str, int] = {}
        self.publisher: Publisher | None = None
        self.collector: CollectorView | None = None
        self.windows: _WindowCounts | None = None
        self.interval = interval
        self._clock = clock
        self._started = clock()
        self.last_completed: float | None = None
        self.cycle_seconds = Histogram(
            f"{PREFIX}_cycle_seconds",
            "Wall time of one collection cycle",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.cycle_cpu_seconds = Histogram(
            f"{PREFIX}_cycle_cpu_seconds",
            "CPU time of one collection cycle",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=self.registry,
        )
        self.registry.register(_AgentState(self))

    def count_emitted(self, kind: str, count: int = 1) -> None:
        self.emitted[kind] = self.emitted.get(kind, 0) + count

    def cycle_completed(self) -> None:
        self.last_completed = self._clock()

    def cycle_age(self) -> float:
        """Seconds since the last completed cycle (since start while none has completed)."""
        since = self.last_completed if self.last_completed is not None else self._started
        return max(0.0, self._clock() - since)

    def health(self) -> tuple[bool, str]:
        age, limit = self.cycle_age(), LIVENESS_WINDOWS * self.interval
        if age > limit:
            windows = LIVENESS_WINDOWS
            return False, f"last completed cycle {age:.0f} s ago (limit: {windows} windows, {limit} s)"
        return True, f"last completed cycle {age:.0f} s ago"

    def serve(self, port: int, addr: str = "0.0.0.0") -> tuple[ThreadingHTTPServer, threading.Thread]:
        """Serve ``/metrics`` and ``/healthz`` on a daemon thread; ``server.shutdown()`` stops it."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                if path == "/healthz":
                    ok, reason = metrics.health()
                    self._send(200 if ok else 503, "text/plain; charset=utf-8", (reason + "\n").encode())
                elif path in ("/metrics", "/"):
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds: not worth a log line each

        server = ThreadingHTTPServer((addr, port), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="agent-metrics", daemon=True)
        thread.start()
        return server, thread
