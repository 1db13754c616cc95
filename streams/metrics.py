"""Prometheus metrics of the worker, read from the stage's and sink's own counters at scrape time."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpumeter.infra.kafka_log import KafkaErrorThrottle
from streams.sink import SinkCounters
from streams.stage import StageCounters

log = logging.getLogger(__name__)


class WorkerCollector(Collector):
    def __init__(self, stage: StageCounters, sink: SinkCounters, pending: dict[str, int],
                 kafka_errors: KafkaErrorThrottle | None = None) -> None:
        self.stage = stage
        self.sink = sink
        self.pending = pending  # rows held unacknowledged, by writer name
        self.kafka_errors = kafka_errors

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        samples = CounterMetricFamily("gpumeter_worker_samples", "Samples read, by outcome",
                                      labels=["outcome"])
        samples.add_metric(["rated"], self.stage.rated)
        samples.add_metric(["dead_letter"], self.stage.dead)
        samples.add_metric(["duplicate"], self.stage.duplicates)
        yield samples
        reasons = CounterMetricFamily("gpumeter_worker_dead_letters", "Dead letters by reason code",
                                      labels=["reason"])
        for reason, count in sorted(self.stage.by_reason.items()):
            reasons.add_metric([reason], count)
        yield reasons
        yield CounterMetricFamily("gpumeter_worker_rows_stored", "Rated rows inserted into ClickHouse",
                                  value=self.sink.stored)
        yield CounterMetricFamily("gpumeter_worker_rows_already_stored",
                                  "Rated rows skipped because their event_id was stored already",
                                  value=self.sink.skipped_duplicates)
        yield CounterMetricFamily("gpumeter_worker_store_failures", "Failed ClickHouse writes (retried)",
                                  value=self.sink.failures)
        pending = GaugeMetricFamily("gpumeter_worker_pending_rows", "Rows waiting to be stored",
                                    labels=["writer"])
        for writer, rows in sorted(self.pending.items()):
            pending.add_metric([writer], rows)
        yield pending
        if self.kafka_errors is not None:
            yield CounterMetricFamily(
                "gpumeter_worker_kafka_client_errors",
                "Warnings and errors the Kafka clients logged (a broker away: logged once a minute)",
                value=self.kafka_errors.errors)


def serve(collector: WorkerCollector, port: int) -> bool:
    """Expose /metrics on ``port`` (0: off). A taken port is logged, never fatal to the worker."""
    if port == 0:
        return False
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        start_http_server(port, registry=registry)
    except OSError as exc:
        log.warning("metrics: cannot listen on port %d (%s); running without /metrics", port, exc)
        return False
    return True
