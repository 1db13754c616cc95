"""`gpumeter worker`: the faust-streaming app, composed of its agents.

Agents (each module wires its own onto the app):
- ``rate`` (streams/rating_agent.py): samples topic -> rated topic (key = tenant) and
  rated_usage in ClickHouse, or -> dead-letter topic.
- ``sink_dead`` (streams/dead_letter_agent.py): dead-letter topic (from the agents and from
  `gpumeter ingest`) -> dead_letters in ClickHouse.
- ``account_quota`` (+ the ``quota_clock`` timer) and ``sink_quota`` (streams/quota_agent.py):
  rated topic -> per-tenant quota ledgers -> quota events topic -> quota_events in ClickHouse.

None auto-acknowledges: a record's offset becomes committable only once what it produced is
stored (streams/batch_writer.py), and faust flushes the producer before every commit, so a
committed record is both published and stored. ClickHouse being down stalls the agents with
exponential back-off; nothing is acknowledged meanwhile.

Here: the app, its topics, the ClickHouse sink the agents share, and what spans them
(metrics, rebalances, periodic flushes, the log report, shutdown, garbage-collector pacing).
"""

from __future__ import annotations

import gc
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faust
from faust.types import TP

from gpumeter.core import topics
from gpumeter.core.settings import KafkaSettings, Settings
from gpumeter.infra import kafka as kafka_admin
from gpumeter.infra import kafka_log
from gpumeter.infra.insert import load_client_extras
from gpumeter.infra.kafka_log import KafkaErrorThrottle
from gpumeter.infra.tables import Topology
from streams import metrics
from streams.batch_writer import BatchWriter
from streams.dead_letter_agent import add_dead_letter_sink
from streams.faust_consumer import seek_safe_transport
from streams.quota_agent import add_quota
from streams.ratecards import RateCardWatcher
from streams.rating_agent import add_rating
from streams.sink import ClickHouseSink, connector

log = logging.getLogger("gpumeter.worker")


def _raw_topic(app: faust.App, name: str) -> Any:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


@dataclass(frozen=True)
class WorkerApp:
    app: faust.App
    writers: tuple[BatchWriter, ...]
    kafka_errors: KafkaErrorThrottle


class _SeekSafeApp(faust.App):
    """faust's App on a consumer whose seek after recovery loses nothing (streams/faust_consumer.py)."""

    def _new_transport(self) -> Any:
        return seek_safe_transport(self)


def broker_credentials(kafka: KafkaSettings) -> faust.SASLCredentials | faust.SSLCredentials | None:
    """contract 9's security settings in faust's terms (its aiokafka consumers and producers)."""
    context = kafka_admin.ssl_context(kafka)
    if kafka.uses_sasl:
        return faust.SASLCredentials(username=kafka.sasl_username, password=kafka.sasl_password(),
                                     ssl_context=context, mechanism=kafka.sasl_mechanism)
    return faust.SSLCredentials(context) if context is not None else None


def create_app(settings: Settings) -> WorkerApp:
    kafka = settings.kafka
    rate_cards = RateCardWatcher(settings.rate_cards)

    faust_dir = settings.data_dir / "faust"
    faust_dir.mkdir(parents=True, exist_ok=True)
    app = _SeekSafeApp(
        topics.worker_group_id(kafka.topic_prefix, settings.worker.group),
        broker=[f"kafka://{address.strip()}" for address in kafka.bootstrap.split(",")],
        broker_credentials=broker_credentials(kafka),
        producer_compression_type=kafka_admin.compression_type(kafka),
        store="memory://",
        # faust's default is "<app id>-data" in the working directory: one stray directory per
        # worker group wherever a worker was started.
        datadir=str(faust_dir),
        autodiscover=False,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        broker_session_timeout=settings.worker.session_timeout_seconds,
        broker_heartbeat_interval=settings.worker.session_timeout_seconds / 3,
        producer_acks=-1,
        topic_allow_declare=False,
        topic_disable_leader=True,
        stream_wait_empty=False,
        producer_linger_ms=5,
        broker_max_poll_records=2000,
        consumer_max_fetch_size=settings.worker.fetch_partition_bytes,
        stream_buffer_maxsize=settings.worker.stream_buffer_records,
    )
    samples_topic = _raw_topic(app, kafka.topic(topics.SAMPLES))
    rated_topic = _raw_topic(app, kafka.topic(topics.RATED))
    dead_topic = _raw_topic(app, kafka.topic(topics.DEADLETTER))
    quota_topic = _raw_topic(app, kafka.topic(topics.QUOTA_EVENTS))

    sink = ClickHouseSink(connector(settings.clickhouse.connection_dsn()), Topology.of(settings.clickhouse))
    worker = settings.worker

    rating = add_rating(app, settings, rate_cards, samples_topic, rated_topic, dead_topic, sink)
    stage, rated_writer = rating.stage, rating.writer
    dead_writer = add_dead_letter_sink(app, settings, dead_topic, sink)
    quota = add_quota(app, settings, rated_topic, quota_topic, dead_topic, sink)

    pending = {"rated": 0, "dead letters": 0, "quota events": 0}
    kafka_errors = KafkaErrorThrottle()
    metrics.serve(metrics.WorkerCollector(stage.counters, sink.counters, pending, kafka_errors),
                  worker.metrics_port)

    @app.timer(1.0)
    async def measure_pending() -> None:
        pending["rated"] = len(rated_writer.pending.rows)
        pending["dead letters"] = len(dead_writer.pending.rows)
        pending["quota events"] = len(quota.writer.pending.rows)

    @app.on_partitions_revoked.connect
    async def drop_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        revoked: set[TP] = set(args[0])  # mode's Signal calls receiver(sender, revoked, signal=...)
        stage.forget()  # before anything is read again: dropped samples are not duplicates
        for writer in (rated_writer, dead_writer, quota.writer):
            await writer.revoke(revoked, app.consumer_generation_id)

    @app.timer(worker.sink_batch_seconds)
    async def flush_due() -> None:
        await rated_writer.flush()
        await dead_writer.flush()
        await quota.writer.flush()

    @app.timer(30.0)
    async def report() -> None:
        counters = stage.counters
        log.info("rated %d, dead letters %d, duplicates %d, stored %d, sink failures %d; quota: records %d, "
                 "replays skipped %d, events %d",
                 counters.rated, counters.dead, counters.duplicates, sink.counters.stored,
                 sink.counters.failures, quota.processor.counters.records, quota.processor.counters.replayed,
                 quota.processor.counters.events)

    return WorkerApp(app, (rated_writer, dead_writer, quota.writer), kafka_errors)


class _Worker(faust.Worker):
    """faust's Worker, telling the batch writers to give up first when a signal arrives,
    and logging at the level asked for.

    A writer retrying a batch would otherwise hold the shutdown until ClickHouse answers.
    """

    def __init__(self, app: faust.App, writers: Sequence[BatchWriter],
                 kafka_errors: KafkaErrorThrottle | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._writers = writers
        self._kafka_errors = kafka_errors
        # faust's start-up spinner sets the root logger to DEBUG so that every record turns
        # it, and leaves it there: each debug call of aiokafka and faust (several per produce
        # request) then built a LogRecord for handlers that drop it, ~3 % of the worker's CPU.
        # Without the spinner the root logger keeps --loglevel.
        self.spinner = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        if self._kafka_errors is not None:  # a broker outage: one line per kind per minute
            kafka_log.install(self._kafka_errors, logger)

    def _schedule_shutdown(self, signum: signal.Signals) -> None:
        for writer in self._writers:
            writer.stop()
        super()._schedule_shutdown(signum)


# Young-generation collections every GC_YOUNG_THRESHOLD container allocations, not 700.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collect garbage cycles at a pace fit for a worker allocating a dozen objects a sample.

    With the defaults, collections cost the worker ~10 µs a sample (measured with gc.callbacks
    on the rating, quota and sink path), most of it full collections traversing the
    hundreds of thousands of objects that imports and start-up leave behind, which live as
    long as the process. Those are frozen (never traversed again) and young collections run
    less often; what refcounting frees is unaffected, cycles are still collected.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run_worker(settings: Settings, loglevel: str = "warn") -> None:
    """Run the worker until SIGTERM/SIGINT: unstored batches stay uncommitted."""
    built = create_app(settings)
    load_client_extras()  # not on the first quota event's path (gpumeter/infra/insert.py)
    worker = _Worker(built.app, built.writers, built.kafka_errors, loglevel=loglevel, quiet=True)
    tune_gc()  # after the start-up objects exist
    worker.execute_from_commandline()
