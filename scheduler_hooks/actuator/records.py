"""Where the actuator's decisions go: gpumeter.preemptions.v1 and ClickHouse ``preemptions``.

The actuator writes ClickHouse itself (no sink stage in between) because it also reads it
back: ``recorded(tenant, cause)`` is how a replayed quota event is recognised as handled
(service.py explains why ClickHouse holds that memory). ``write`` returns once the records
are on the topic and in the table, and the actuator commits an event only after that, so
"handled" always implies "recorded"; failures are retried with back-off, never dropped.

Writes from concurrent events are batched: one flusher takes whatever is waiting and stores
it with one anti-join, one produce round and one insert. The anti-join drops ids already in
ClickHouse, so a decision re-made after a restart (a PDB refusal seen again) is neither
republished nor stored twice; across crashes the deterministic id makes ReplacingMergeTree
(ORDER BY tenant, record_id) and topic consumers fold any copy: ``record_id`` is sha256 of
(cause, subject, action), so a replay republishes the same ids. The replay guard's reads use a
client of their own, so they never queue behind a batch being written.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from clickhouse_connect.driver.client import Client

from gpumeter.core.models import PreemptionAction, PreemptionRecord
from gpumeter.core.settings import Settings
from gpumeter.core.topics import PREEMPTIONS as PREEMPTIONS_TOPIC
from gpumeter.infra import clickhouse
from gpumeter.infra import kafka as gkafka
from gpumeter.infra.schema import PREEMPTIONS
from scheduler_hooks.actuator.backoff import backoff_seconds
from scheduler_hooks.cluster.kube_objects import PodView

log = logging.getLogger(__name__)
T = TypeVar("T")

# Ids remembered per process to skip rewriting the same decision (e.g. a PDB refusal seen on
# every retry); older ids fall out first, and the stores fold whatever is written again.
REMEMBERED_IDS = 100_000
MAX_BACKOFF = 30.0
# Replay-guard reads run concurrently for different tenants' events: on one connection they
# queued behind each other (p99 363 ms at load 5 in benchmarks/quota_latency.py), which held
# every tenant slot of the actuator. A few connections are enough for the tenants acted on at once.
READERS = 4


def record_id(cause: str, subject: str, action: str) -> str:
    """Deterministic id of one decision: the same cause, pod (or queue) and action, the same id."""
    return hashlib.sha256(f"{cause}|{subject}|{action}".encode()).hexdigest()


def pod_record(cause: str, metric: str, pod: PodView, action: PreemptionAction, detail: str,
               at: datetime) -> PreemptionRecord:
    return PreemptionRecord(
        record_id=record_id(cause, pod.uid, action), tenant=pod.tenant, namespace=pod.namespace,
        # GPU devices it held: whole GPUs, MIG slices and shared replicas alike.
        pod=pod.name, pod_uid=pod.uid, node=pod.node, gpus=pod.gpus + pod.other_gpu_devices,
        capacity_type=pod.capacity_type,
        priority=pod.priority, cause=cause, metric=metric, action=action, detail=detail, at=at,
    )


def queue_record(cause: str, metric: str, tenant: str, queue: str, action: PreemptionAction, detail: str,
                 at: datetime) -> PreemptionRecord:
    """A Volcano queue decision; the queue's name stands where a pod's would (namespace empty)."""
    return PreemptionRecord(
        record_id=record_id(cause, f"queue/{queue}", action), tenant=tenant, namespace="", pod=queue,
        pod_uid="", cause=cause, metric=metric, action=action, detail=detail, at=at,
    )


class _Connection:
    """One clickhouse-connect client, used by one caller at a time, reopened after a failure."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            if self._client is None:
                self._client = await asyncio.to_thread(clickhouse.connect, self._dsn)
            try:
                return await asyncio.to_thread(work, self._client, *args)
            except Exception:
                # A broken connection is not reused: the next attempt starts a fresh client.
                client, self._client = self._client, None
                await asyncio.to_thread(_close_quietly, client)
                raise

    async def close(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(_close_quietly, self._client)
            self._client = None


class RecordSink:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._topic = settings.kafka.topic(PREEMPTIONS_TOPIC)
        self._producer: AIOKafkaProducer | None = None
        self._writer = _Connection(settings.clickhouse.connection_dsn())
        self._readers = [_Connection(settings.clickhouse.connection_dsn()) for _ in range(READERS)]
        self._idle_readers: asyncio.Queue[_Connection] = asyncio.Queue()
        for reader in self._readers:
            self._idle_readers.put_nowait(reader)
        self._written: OrderedDict[str, None] = OrderedDict()
        self._waiting: list[tuple[list[PreemptionRecord], asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None

    async def start(self, stop: asyncio.Event) -> None:
        self._stop = stop
        kafka = self._settings.kafka
        self._producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap, acks="all", enable_idempotence=True,
            compression_type=gkafka.compression_type(kafka), **gkafka.security_options(kafka))
        await self._producer.start()
        self._flusher = asyncio.create_task(self._flush_forever())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        for _, waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(False)
        self._waiting.clear()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        await self._writer.close()
        for reader in self._readers:
            await reader.close()

    async def write(self, records: Sequence[PreemptionRecord]) -> bool:
        """Publish and store ``records`` not stored yet; False only if stopped first."""
        fresh = list({r.record_id: r for r in records if r.record_id not in self._written}.values())
        if not fresh:
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((fresh, waiter))
        self._wake.set()
        return await waiter

    async def recorded(self, tenant: str, cause: str) -> set[str] | None:
        """Ids of the pod decisions stored for ``cause`` (queue decisions left out: closing a
        queue is not planning evictions); None only if stopped before ClickHouse answered."""
        attempt = 0
        while not self._stop.is_set():
            try:
                reader = await self._idle_readers.get()
                try:
                    return await reader.run(_select_ids, tenant, cause)
                finally:
                    self._idle_readers.put_nowait(reader)
            except Exception as exc:  # without the answer we must not act: retry
                delay = backoff_seconds(attempt, MAX_BACKOFF)
                log.warning("cannot read handled decisions from ClickHouse (%s); retrying in %.0fs",
                            _first_line(exc), delay)
                attempt += 1
                await _sleep_or_stop(self._stop, delay)
        return None

    # -- the flusher -------------------------------------------------------------------------
    async def _flush_forever(self) -> None:
        while not self._stop.is_set():
            await self._wake.wait()
            self._wake.clear()
            batch, self._waiting = self._waiting, []
            if not batch:
                continue
            records = list({r.record_id: r for fresh, _ in batch for r in fresh}.values())
            stored = await self._store(records)
            for _, waiter in batch:
                if not waiter.done():
                    waiter.set_result(stored)

    async def _store(self, records: list[PreemptionRecord]) -> bool:
        checked = produced = False
        attempt = 0
        while not self._stop.is_set():
            try:
                if not checked:
                    already = await self._writer.run(_stored_ids, records)
                    for record_id in already:
                        self._remember(record_id)
                    records = [r for r in records if r.record_id not in already]
                    checked = True
                if records and not produced:
                    await self._produce(records)
                    produced = True
                if records:
                    await self._writer.run(_insert, records)
            except Exception as exc:  # broker or server away: retry, the decision must be kept
                delay = backoff_seconds(attempt, MAX_BACKOFF)
                log.warning("cannot record %d preemption decision(s) yet (%s); retrying in %.0fs",
                            len(records), _first_line(exc), delay)
                attempt += 1
                await _sleep_or_stop(self._stop, delay)
                continue
            for record in records:
                self._remember(record.record_id)
            return True
        return False

    async def _produce(self, records: Sequence[PreemptionRecord]) -> None:
        if self._producer is None:
            raise RuntimeError("RecordSink.start() was not called")
        futures = [
            await self._producer.send(self._topic, r.model_dump_json().encode(), key=r.tenant.encode())
            for r in records
        ]
        await asyncio.gather(*futures)

    def _remember(self, record_id: str) -> None:
        self._written[record_id] = None
        self._written.move_to_end(record_id)
        while len(self._written) > REMEMBERED_IDS:
            self._written.popitem(last=False)


def _insert(client: Client, records: Sequence[PreemptionRecord]) -> None:
    client.insert(PREEMPTIONS.name, [PREEMPTIONS.row_of(r) for r in records],
                  column_names=list(PREEMPTIONS.insert_columns))


def _stored_ids(client: Client, records: Sequence[PreemptionRecord]) -> set[str]:
    rows = client.query(
        f"SELECT DISTINCT record_id FROM {PREEMPTIONS.name} "
        "WHERE tenant IN %(tenants)s AND record_id IN %(ids)s",
        parameters={"tenants": sorted({r.tenant for r in records}), "ids": [r.record_id for r in records]},
    ).result_rows
    return {str(row[0]) for row in rows}


def _select_ids(client: Client, tenant: str, cause: str) -> set[str]:
    rows = client.query(
        f"SELECT DISTINCT record_id FROM {PREEMPTIONS.name} "
        "WHERE tenant = %(tenant)s AND cause = %(cause)s AND pod_uid != ''",
        parameters={"tenant": tenant, "cause": cause},
    ).result_rows
    return {str(row[0]) for row in rows}


def _close_quietly(client: Client | None) -> None:
    if client is None:
        return
    try:
        client.close()
    except Exception:  # closing a broken connection may fail too; nothing to do about it
        log.debug("closing a failed ClickHouse client raised", exc_info=True)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
