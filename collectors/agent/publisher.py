"""Publishing samples to Kafka, falling back to the disk spool while Kafka is unreachable.

Samples go to ``gpumeter.usage.samples.v1`` keyed by tenant through the kernel's
idempotent producer (acks=all). A batch is acknowledged when every record's
future succeeded within ``send_timeout``; whatever was not acknowledged is
appended to the spool (and the producer is dropped and rebuilt later, so it
does not keep retrying records the spool now owns). Each publish first replays
the spool, a segment at a time, deleting a segment only after every record in it
was acknowledged or written back to the spool's tail.

Order is kept per key (tenant), which is all a Kafka partition orders: while the
spool holds a tenant's samples, that tenant's new samples are appended behind
them, and a tenant whose records were not acknowledged during a replay has the
rest of its spooled records written back behind them. Other tenants are not held
back: one partition without a leader (its broker died and no replica took over)
spools only the tenants keyed to it, and the node keeps publishing the others. The
producer is dropped and Kafka marked down only when nothing at all was acknowledged.

Delivery is at-least-once: a record whose acknowledgement was lost may be sent
again from the spool; its ``event_id`` makes the duplicate harmless downstream.

The node's allocation record (contract 8, one per window) takes the same path on its own
lane: ``gpumeter.node.allocation.v1`` keyed by node, one record per Kafka message (the topic
is compacted: never joined into multi-line records), spooled while Kafka is away in a spool
of its own (``<spool>/allocation``, bounded at 64 MiB, days of windows) and replayed oldest
first, so the samples spool holds samples only and a long outage cannot fill it with
allocations. Once replayed, the newest record is again the last one per node, as compaction
needs.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.errors import KafkaError

from collectors.agent.spool import Spool
from gpumeter.core import jsonio, records
from gpumeter.core.models import NodeAllocation, NodeTopology, UsageSample
from gpumeter.core.settings import KafkaSettings
from gpumeter.core.topics import ALLOCATION, SAMPLES, TOPOLOGY
from gpumeter.infra.kafka import KafkaUnavailable, make_producer

log = logging.getLogger(__name__)

_KEY_LENGTH = struct.Struct(">H")
ALLOCATION_SPOOL = "allocation"  # subdirectory of the samples spool
ALLOCATION_SPOOL_MAX_BYTES = 64 * 1024 * 1024


def encode_message(key: bytes, value: bytes) -> bytes:
    """Spool payload: u16 key length, key, value."""
    return _KEY_LENGTH.pack(len(key)) + key + value


def decode_message(payload: bytes) -> tuple[bytes, bytes]:
    (length,) = _KEY_LENGTH.unpack_from(payload, 0)
    start = _KEY_LENGTH.size
    return payload[start : start + length], payload[start + length :]


def sample_message(sample: UsageSample) -> bytes:
    value = jsonio.dumpb(sample.model_dump(exclude_none=True))
    return encode_message(sample.tenant.encode(), value)


def allocation_message(allocation: NodeAllocation) -> bytes:
    return encode_message(allocation.node.encode(), jsonio.dumpb(allocation.model_dump()))


class DeliveryFailed(RuntimeError):
    pass


@dataclass
class PublishResult:
    sent: int = 0
    spooled: int = 0
    dropped: int = 0
    replayed: int = 0


ProducerFactory = Callable[[], Any]


class Publisher:
    """Kafka first, disk spool when Kafka is away, replay when it is back."""

    def __init__(
        self,
        kafka: KafkaSettings,
        spool: Spool,
        *,
        producer_factory: ProducerFactory | None = None,
        send_timeout: float = 10.0,
        retry_seconds: float = 5.0,
        replay_budget_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self.spool = spool
        self.topic = kafka.topic(SAMPLES)
        self.topology_topic = kafka.topic(TOPOLOGY)
        self.send_timeout = send_timeout
        self.retry_seconds = retry_seconds
        self.replay_budget_seconds = replay_budget_seconds
        self._clock = clock
        self._factory = producer_factory or self._default_factory
        self._producer: Any = None
        self._next_attempt = 0.0
        self._lock = threading.Lock()
        self._pending_topology: NodeTopology | None = None
        self.allocation_topic = kafka.topic(ALLOCATION)
        self._allocation_spool: Spool | None = None
        if (spool.directory / ALLOCATION_SPOOL).is_dir():
            self._open_allocation_spool()  # records left from before a restart are replayed
        self.sent = 0
        self.spooled = 0
        self.replayed = 0
        self.allocations_sent = 0
        self.allocations_spooled = 0
        self.allocations_replayed = 0
        self.send_failures = 0
        self.kafka_up = False
        # Keys (tenants) with samples in the spool: their new samples queue behind them.
        self._held_keys: set[bytes] = {decode_message(payload)[0] for payload in spool.iter_records()}
        self._next_replay = 0.0  # after a replay that left stalled keys, wait retry_seconds

    def _default_factory(self) -> Any:
        timeout_ms = int(self.send_timeout * 1000)
        return make_producer(
            self.kafka,
            max_block_ms=min(timeout_ms, 5000),
            request_timeout_ms=max(timeout_ms, 5000),
            delivery_timeout_ms=max(2 * timeout_ms, 30_000),
        )

    # -- producer lifecycle ------------------------------------------------------------------------

    def _ensure_producer(self) -> Any:
        if self._producer is not None:
            return self._producer
        now = self._clock()
        if now < self._next_attempt:
            return None
        try:
            self._producer = self._factory()
        except (KafkaUnavailable, KafkaError, OSError) as exc:
            self._mark_down(f"cannot connect: {exc}")
            return None
        return self._producer

    def _mark_down(self, reason: str) -> None:
        if self.kafka_up or self._next_attempt == 0.0:
            log.warning("Kafka unavailable (%s); samples go to the spool at %s", reason, self.spool.directory)
        self.kafka_up = False
        self.send_failures += 1
        self._next_attempt = self._clock() + self.retry_seconds
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                # Give up on its buffered records: the spool owns them now.
                producer.close(timeout=0)
            except Exception as exc:  # closing a broken client must not break the agent
                log.debug("closing producer: %s", exc)

    def _mark_up(self) -> None:
        if not self.kafka_up:
            log.info("Kafka reachable at %s", self.kafka.bootstrap)
        self.kafka_up = True

    # -- sending -----------------------------------------------------------------------------------

    def _send(
        self,
        producer: Any,
        topic: str,
        messages: Sequence[tuple[bytes, bytes]],
        timeout: float,
        *,
        join: bool = True,
    ) -> list[int]:
        """Send and wait; returns the indexes of the messages the broker did not acknowledge.

        Samples go out as multi-sample records per tenant (gpumeter/core/records.py): the worker
        pays its per-record cost once per record, not once per sample. A record that is
        not acknowledged fails every sample in it, so those are spooled and replayed.
        ``join=False`` sends one message per record (compacted state topics).
        """
        if join:
            groups = records.group_by_key(list(messages))
        else:
            groups = [(key, [index]) for index, (key, _value) in enumerate(messages)]
        futures: list[Any] = []
        try:
            for key, members in groups:
                value = records.join([messages[i][1] for i in members])
                futures.append(producer.send(topic, key=key, value=value))
        except KafkaError as exc:
            log.warning("Kafka send failed after %d of %d records: %s", len(futures), len(groups), exc)
        try:
            producer.flush(timeout=timeout)
        except KafkaError as exc:
            log.warning("Kafka flush did not finish in %.1f s: %s", timeout, exc)
        failed_groups = [i for i, future in enumerate(futures) if not (future.is_done and future.succeeded())]
        failed_groups.extend(range(len(futures), len(groups)))
        return sorted(index for g in failed_groups for index in groups[g][1])

    def _send_payloads(self, payloads: list[bytes], stalled: set[bytes]) -> None:
        """Send one spooled segment. Records of keys in ``stalled`` (not acknowledged earlier in
        this replay) and records not acknowledged now are written back to the spool's tail, in
        order, and their keys join ``stalled``. Raises DeliveryFailed, keeping the segment,
        when nothing could be acknowledged.

        A replay that fails whole does not mark Kafka down: the spool holds only tenants whose
        partitions failed before, and those may still have no leader while the rest of the
        cluster serves the other tenants. Fresh samples tell whether Kafka is away (publish).
        """
        producer = self._ensure_producer()
        if producer is None:
            raise DeliveryFailed("Kafka unavailable")
        messages = [decode_message(payload) for payload in payloads]
        to_send = [i for i, (key, _value) in enumerate(messages) if key not in stalled]
        if not to_send:
            self._write_back(payloads, messages)
            return
        timeout = max(self.send_timeout, len(to_send) / 5000)
        failed = self._send(producer, self.topic, [messages[i] for i in to_send], timeout)
        if len(failed) == len(to_send):
            stalled.update(messages[i][0] for i in to_send)
            raise DeliveryFailed(f"{len(failed)} spooled records not acknowledged")
        stalled.update(messages[to_send[i]][0] for i in failed)
        back = [i for i, (key, _value) in enumerate(messages) if key in stalled]
        self._write_back([payloads[i] for i in back], [messages[i] for i in back])
        self.replayed += len(messages) - len(back)
        self._mark_up()

    def _write_back(self, payloads: list[bytes], messages: list[tuple[bytes, bytes]]) -> None:
        """Re-spool records of stalled keys behind everything, so each key keeps its order."""
        if not payloads:
            return
        self.spool.append(payloads, moved=True)
        log.warning(
            "%d spooled samples of %d tenant(s) not acknowledged (their partitions have no leader); "
            "spooled again behind the rest", len(payloads), len({key for key, _ in messages}))

    def replay(self, budget_seconds: float | None = None) -> int:
        """Replay the spool oldest first within a time budget; returns records replayed."""
        if not self.spool.records:
            self._held_keys.clear()
            return 0
        if self._clock() < self._next_replay or self._ensure_producer() is None:
            return 0
        budget = self.replay_budget_seconds if budget_seconds is None else budget_seconds
        deadline = time.monotonic() + budget  # the spool measures its budget on the real monotonic clock
        before = self.replayed
        stalled: set[bytes] = set()
        backlog = {segment.path for segment in self.spool.pending()}
        with contextlib.suppress(DeliveryFailed):
            self.spool.replay(lambda payloads: self._send_payloads(payloads, stalled), deadline=deadline)
        if backlog.isdisjoint(segment.path for segment in self.spool.pending()):
            self._held_keys = stalled  # the spool now holds only what was written back
        else:
            self._held_keys |= stalled  # stopped early (deadline or Kafka away): keep what was held
        if stalled:
            self._next_replay = self._clock() + self.retry_seconds
            log.warning("%d tenant(s) in the spool not acknowledged (their partitions have no leader); "
                        "retrying in %.0f s, other tenants publish meanwhile",
                        len(stalled), self.retry_seconds)
        count = self.replayed - before
        if count:
            log.info("replayed %d spooled samples; %d still spooled", count, self.spool.records)
        return count

    def publish(self, samples: Sequence[UsageSample]) -> PublishResult:
        """Deliver ``samples`` to Kafka, or spool them durably. Never raises for a Kafka outage."""
        with self._lock:
            result = PublishResult()
            self._flush_topology()
            result.replayed = self.replay()
            if not samples:
                return result
            payloads = [sample_message(sample) for sample in samples]
            producer = self._ensure_producer()
            if producer is None:
                self._spool(payloads, result)
                return result
            messages = [decode_message(payload) for payload in payloads]
            # A tenant with samples in the spool queues behind them (its order); the rest go now.
            behind = [i for i, (key, _value) in enumerate(messages) if key in self._held_keys]
            if behind:
                self._spool([payloads[i] for i in behind], result)
            to_send = [i for i, (key, _value) in enumerate(messages) if key not in self._held_keys]
            if not to_send:
                return result
            failed = [to_send[i] for i in self._send(producer, self.topic, [messages[i] for i in to_send],
                                                     self.send_timeout)]
            result.sent = len(to_send) - len(failed)
            self.sent += result.sent
            if len(failed) == len(to_send):
                self._mark_down(f"{len(failed)} of {len(to_send)} records not acknowledged")
            else:
                self._mark_up()
                if failed:
                    log.warning("%d of %d samples not acknowledged (their partitions have no leader); "
                                "spooled, the other tenants' samples were delivered",
                                len(failed), len(to_send))
            if failed:
                self._spool([payloads[i] for i in failed], result)
            return result

    def _spool(self, payloads: list[bytes], result: PublishResult) -> None:
        kept = self.spool.append(payloads)
        result.spooled += kept
        result.dropped += len(payloads) - kept
        self.spooled += kept
        self._held_keys.update(decode_message(payload)[0] for payload in payloads)

    # -- allocation (contract 8) ---------------------------------------------------------------------

    @property
    def allocation_spool(self) -> Spool | None:
        """The allocation lane's spool; None until something had to be spooled."""
        return self._allocation_spool

    def _open_allocation_spool(self) -> Spool:
        if self._allocation_spool is None:
            self._allocation_spool = Spool(
                self.spool.directory / ALLOCATION_SPOOL,
                max_bytes=min(ALLOCATION_SPOOL_MAX_BYTES, self.spool.max_bytes),
                fsync=self.spool.fsync,
            )
        return self._allocation_spool

    def publish_allocation(self, allocation: NodeAllocation) -> PublishResult:
        """Deliver the node's allocation record (key = node), or spool it. Never raises for an outage."""
        with self._lock:
            result = PublishResult()
            self._flush_topology()
            result.replayed = self._replay_allocations()
            payload = allocation_message(allocation)
            spool = self._allocation_spool
            producer = None if spool is not None and spool.records else self._ensure_producer()
            if producer is None:
                self._spool_allocation(payload, result)
                return result
            failed = self._send(
                producer, self.allocation_topic, [decode_message(payload)], self.send_timeout, join=False
            )
            if failed:
                self._mark_down("allocation not acknowledged")
                self._spool_allocation(payload, result)
            else:
                result.sent = 1
                self.allocations_sent += 1
                self._mark_up()
            return result

    def _spool_allocation(self, payload: bytes, result: PublishResult) -> None:
        kept = self._open_allocation_spool().append([payload])
        result.spooled += kept
        result.dropped += 1 - kept
        self.allocations_spooled += kept

    def _send_allocation_payloads(self, payloads: list[bytes]) -> None:
        producer = self._ensure_producer()
        if producer is None:
            raise DeliveryFailed("Kafka unavailable")
        messages = [decode_message(payload) for payload in payloads]
        timeout = max(self.send_timeout, len(messages) / 5000)
        failed = self._send(producer, self.allocation_topic, messages, timeout, join=False)
        if failed:
            self._mark_down(f"{len(failed)} of {len(messages)} spooled allocations not acknowledged")
            raise DeliveryFailed(f"{len(failed)} allocation records not acknowledged")
        self.allocations_replayed += len(messages)
        self._mark_up()

    def _replay_allocations(self) -> int:
        spool = self._allocation_spool
        if spool is None or not spool.records or self._ensure_producer() is None:
            return 0
        before = self.allocations_replayed
        deadline = time.monotonic() + self.replay_budget_seconds
        with contextlib.suppress(DeliveryFailed):
            spool.replay(self._send_allocation_payloads, deadline=deadline)
        return self.allocations_replayed - before

    # -- topology ----------------------------------------------------------------------------------

    def publish_topology(self, topology: NodeTopology) -> bool:
        """Publish the node's topology (compacted topic, key = node); kept and retried while Kafka is away."""
        with self._lock:
            self._pending_topology = topology
            return self._flush_topology()

    def _flush_topology(self) -> bool:
        topology = self._pending_topology
        if topology is None:
            return True
        producer = self._ensure_producer()
        if producer is None:
            return False
        value = jsonio.dumpb(topology.model_dump())
        failed = self._send(
            producer, self.topology_topic, [(topology.node.encode(), value)], self.send_timeout
        )
        if failed:
            self._mark_down("topology not acknowledged")
            return False
        self._pending_topology = None
        self._mark_up()
        return True

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
            if producer is not None:
                try:
                    producer.flush(timeout=timeout)
                    producer.close(timeout=timeout)
                except Exception as exc:
                    log.warning("closing Kafka producer: %s", exc)
            self.spool.close()
            if self._allocation_spool is not None:
                self._allocation_spool.close()
