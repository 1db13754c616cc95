"""What feeds the extender's state: Kubernetes watches, Kafka topics and the tenants file.

Each feed runs its blocking client (the ``kubernetes`` client, kafka-python) in a daemon
thread, decodes there, and hands finished values to the event loop thread with ``post``
(``loop.call_soon_threadsafe``), where ``HooksState`` is mutated: the state has one owner.
``post`` is FIFO, so "source loaded" always lands after the values it covers.

- Kubernetes (pods, nodes, namespaces), as a reflector does it: list (paginated) at a
  resourceVersion, then watch from it with bookmarks; a watch that ends is resumed from the
  last version seen; ``410 Gone`` (the version was compacted away) means list again; any other
  error backs off and resumes. Access: the in-cluster service account, else ``KUBECONFIG`` /
  ``~/.kube/config``.
- Kafka: quota events from the beginning (the state is a fold of all of them), the compacted
  topology and allocation topics from the beginning (the latest record per node; a tombstone
  forgets the node). No consumer group and no commits: every start replays, and positions
  survive a reconnect within one run. A source is loaded once its partitions are read up to
  the end offsets taken when they were first assigned.
- The tenants file: re-read when its modification time or size changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.watch.watch import iter_resp_lines
from pydantic import ValidationError

from gpumeter.core import topics
from gpumeter.core.config_files import ConfigError
from gpumeter.core.grants import Grant
from gpumeter.core.models import NodeAllocation, NodeTopology, QuotaEvent
from gpumeter.core.settings import KafkaSettings
from gpumeter.core.tenants import load_tenants
from gpumeter.infra import kafka as gkafka
from gpumeter.infra.grants import GrantsReader
from scheduler_hooks.cluster import state as sources
from scheduler_hooks.cluster.state import HooksState, watched_namespace, watched_node, watched_pod

log = logging.getLogger(__name__)

Post = Callable[..., None]  # post(fn, *args): run fn(*args) on the event loop thread, in order

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
HTTP_GONE = 410


def loop_poster(loop: Any) -> Post:
    """``post`` for an asyncio loop; values posted while the loop closes are dropped."""

    def post(fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed: shutting down
            loop.call_soon_threadsafe(fn, *args)

    return post


class Feed:
    """A blocking source in a daemon thread: ``_run_once`` until stopped, backing off on errors."""

    name = "feed"

    def __init__(self, post: Post) -> None:
        self._post = post
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"gpumeter-hooks-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _interrupt(self) -> None:
        """Unblock a read in progress (subclasses); the loop checks ``stopping`` next."""

    def _run_once(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        backoff = MIN_BACKOFF_S
        while not self.stopping:
            started = time.monotonic()
            try:
                self._run_once()
            except Exception as exc:  # a feed never dies: log, back off, resume
                if self.stopping:
                    return
                self.errors += 1
                log.warning("%s feed: %s: %s (retrying in %.1f s)", self.name, type(exc).__name__, exc,
                            backoff)
            if time.monotonic() - started > 60:
                backoff = MIN_BACKOFF_S  # it ran a good while: the next failure is a new one
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF_S)


# -- Kubernetes --------------------------------------------------------------------------------


def kube_api_client() -> k8s.ApiClient:
    """The in-cluster service account, else KUBECONFIG / ~/.kube/config (as controllers do)."""
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        # Read KUBECONFIG now: the client evaluates its default path once, at import time.
        k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                    client_configuration=configuration)
    return k8s.ApiClient(configuration)


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


@dataclass(frozen=True)
class _Kind:
    source: str
    list_function: str  # CoreV1Api method
    parse: Callable[[dict[str, Any]], Any]
    replace: Callable[[HooksState, list[Any]], None]
    upsert: Callable[[HooksState, Any], None]
    delete: Callable[[HooksState, Any], None]


KINDS: dict[str, _Kind] = {
    "pods": _Kind(
        sources.PODS, "list_pod_for_all_namespaces", watched_pod,
        HooksState.replace_pods, HooksState.upsert_pod, lambda s, pod: s.delete_pod(pod.uid),
    ),
    "nodes": _Kind(
        sources.NODES, "list_node", watched_node,
        HooksState.replace_nodes, HooksState.upsert_node, lambda s, node: s.delete_node(node.name),
    ),
    "namespaces": _Kind(
        sources.NAMESPACES, "list_namespace", watched_namespace,
        HooksState.replace_namespaces, HooksState.upsert_watched_namespace,
        lambda s, ns: s.delete_namespace(ns.name),
    ),
}


class KubeWatch(Feed):
    """List-then-watch of one kind of object into the state (module docstring)."""

    def __init__(
        self,
        kind: str,
        api: k8s.ApiClient,
        state: HooksState,
        post: Post,
        *,
        watch_seconds: int = 300,
        page_size: int = 500,
        request_timeout: float = 30.0,
    ) -> None:
        super().__init__(post)
        self.name = f"kube-{kind}"
        self.kind = KINDS[kind]
        self.state = state
        self._list = getattr(k8s.CoreV1Api(api), self.kind.list_function)
        self.watch_seconds = watch_seconds
        self.page_size = page_size
        self.request_timeout = request_timeout
        self._response: Any = None
        self._listed = False
        self.events = 0
        state.expect(self.kind.source)

    def _run_once(self) -> None:
        version = self._list_all()
        while not self.stopping:
            try:
                version = self._watch(version)
            except Gone:
                return  # _loop lists again after a short pause
            except k8s.ApiException as exc:
                if exc.status == HTTP_GONE:
                    return
                raise

    def _list_all(self) -> str:
        items: list[Any] = []
        token: str | None = None
        while True:
            response = self._list(limit=self.page_size, _continue=token, _preload_content=False,
                                  _request_timeout=self.request_timeout)
            document = json.loads(response.data)
            for item in document.get("items") or []:
                parsed = self.kind.parse(item)
                if parsed is not None:
                    items.append(parsed)
            meta = document.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self._post(self.kind.replace, self.state, items)
        if not self._listed:
            self._listed = True
            self._post(self.state.loaded, self.kind.source)
        version = meta.get("resourceVersion")
        if not isinstance(version, str) or not version:
            raise RuntimeError(f"{self.name}: list answered without a resourceVersion")
        return version

    def _watch(self, version: str) -> str:
        """One watch request, until the server ends it; returns the last resourceVersion seen."""
        response = self._list(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=self.watch_seconds, _preload_content=False,
            _request_timeout=(self.request_timeout, self.watch_seconds + self.request_timeout),
        )
        self._response = response
        try:
            for event in _events(response):
                if self.stopping:
                    break
                version = self._handle(event, version)
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.close()
                response.release_conn()
        return version

    def _handle(self, event: dict[str, Any], version: str) -> str:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return version
        if kind == "ERROR":
            code = obj.get("code")
            if code == HTTP_GONE:
                raise Gone(obj.get("message", "resource version too old"))
            raise k8s.ApiException(status=code if isinstance(code, int) else 500,
                                   reason=f"{obj.get('reason')}: {obj.get('message')}")
        meta = obj.get("metadata") or {}
        found = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(found, str) and found:
            version = found
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return version  # BOOKMARK: only the version moves
        parsed = self.kind.parse(obj)
        if parsed is None:
            return version
        self.events += 1
        action = self.kind.delete if kind == "DELETED" else self.kind.upsert
        self._post(action, self.state, parsed)
        return version

    def _interrupt(self) -> None:
        # Shut the socket down: a read blocked in the watch returns at once (as Watch.stop does).
        response = self._response
        connection = getattr(response, "connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in iter_resp_lines(response):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            log.warning("kube watch: undecodable line skipped: %.200s", line)
            continue
        if isinstance(event, dict):
            yield event


def kube_feeds(api: k8s.ApiClient, state: HooksState, post: Post, **options: Any) -> list[KubeWatch]:
    return [KubeWatch(kind, api, state, post, **options) for kind in ("namespaces", "nodes", "pods")]


# -- Kafka -------------------------------------------------------------------------------------

_Decoded = tuple[str, Any]  # (action, value)


class KafkaFeed(Feed):
    """Quota events, topology and allocation from Kafka into the state (module docstring)."""

    name = "kafka"

    def __init__(self, kafka: KafkaSettings, state: HooksState, post: Post, *,
                 client_id: str = "gpumeter-hooks", poll_ms: int = 500) -> None:
        super().__init__(post)
        self.kafka = kafka
        self.state = state
        self.client_id = client_id
        self.poll_ms = poll_ms
        self.sources = {
            kafka.topic(topics.QUOTA_EVENTS): sources.QUOTA_EVENTS,
            kafka.topic(topics.TOPOLOGY): sources.TOPOLOGY,
            kafka.topic(topics.ALLOCATION): sources.ALLOCATION,
        }
        self._positions: dict[TopicPartition, int] = {}
        self._targets: dict[TopicPartition, int] = {}
        self._loaded: set[str] = set()
        self._topics_ensured = False
        self.records = 0
        self.rejected = 0
        state.expect(*self.sources.values())

    def _run_once(self) -> None:
        if not self._topics_ensured:
            wanted = [spec for spec in topics.ALL if self.kafka.topic(spec.name) in self.sources]
            gkafka.ensure_topics(self.kafka, wanted)
            self._topics_ensured = True
        try:
            consumer = gkafka.make_consumer(
                self.kafka, client_id=self.client_id, group_id=None,
                enable_auto_commit=False, auto_offset_reset="earliest",
            )
        except KafkaError as exc:
            raise gkafka.KafkaUnavailable(f"no Kafka broker at {self.kafka.bootstrap}: {exc}") from exc
        try:
            partitions = self._assign(consumer)
            while not self.stopping:
                self._mark_loaded(consumer, partitions)
                batch = consumer.poll(timeout_ms=self.poll_ms, max_records=2000)
                decoded: list[_Decoded] = []
                for tp, records in batch.items():
                    for record in records:
                        item = self._decode(tp.topic, record)
                        if item is not None:
                            decoded.append(item)
                    self._positions[tp] = records[-1].offset + 1
                self.records += sum(len(records) for records in batch.values())
                if decoded:
                    self._post(self._apply, decoded)
        finally:
            # A stop waits for at most one poll (poll_ms): kafka-python has no wakeup.
            with contextlib.suppress(Exception):
                consumer.close(autocommit=False)

    def read_up_to(self, topic: str) -> dict[int, int]:
        """The next offset to read of each partition of ``topic`` read so far (the demo waits
        on it: what is read is handed to the state right away)."""
        return {tp.partition: offset for tp, offset in dict(self._positions).items() if tp.topic == topic}

    def _assign(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        partitions: list[TopicPartition] = []
        for topic in self.sources:
            found = consumer.partitions_for_topic(topic)
            if not found:
                raise gkafka.KafkaUnavailable(f"topic {topic} has no partitions yet")
            partitions.extend(TopicPartition(topic, p) for p in sorted(found))
        consumer.assign(partitions)
        for tp in partitions:
            if tp in self._positions:
                consumer.seek(tp, self._positions[tp])
            else:
                consumer.seek_to_beginning(tp)
        missing = [tp for tp in partitions if tp not in self._targets]
        if missing:
            self._targets.update(consumer.end_offsets(missing))
        return partitions

    def _mark_loaded(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        for topic, source in self.sources.items():
            if source in self._loaded:
                continue
            mine = [tp for tp in partitions if tp.topic == topic]
            if all(consumer.position(tp) >= self._targets.get(tp, 0) for tp in mine):
                self._loaded.add(source)
                self._post(self.state.loaded, source)

    def _decode(self, topic: str, record: Any) -> _Decoded | None:
        source = self.sources[topic]
        try:
            if record.value is None:  # a tombstone on a compacted topic forgets the node
                if source == sources.QUOTA_EVENTS or record.key is None:
                    return None
                return (f"remove-{source}", record.key.decode("utf-8"))
            if source == sources.QUOTA_EVENTS:
                return (source, QuotaEvent.model_validate_json(record.value))
            if source == sources.TOPOLOGY:
                return (source, NodeTopology.model_validate_json(record.value))
            return (source, NodeAllocation.model_validate_json(record.value))
        except (ValidationError, UnicodeDecodeError, ValueError) as exc:
            self.rejected += 1
            log.warning("kafka feed: %s[%d]@%d rejected: %s", topic, record.partition, record.offset,
                        str(exc).splitlines()[0])
            return None

    def _apply(self, items: list[_Decoded]) -> None:
        state = self.state
        for action, value in items:
            if action == sources.QUOTA_EVENTS:
                state.apply_quota_event(value)
            elif action == sources.TOPOLOGY:
                state.apply_topology(value)
            elif action == sources.ALLOCATION:
                state.apply_allocation(value)
            elif action == f"remove-{sources.TOPOLOGY}":
                state.remove_topology(value)
            elif action == f"remove-{sources.ALLOCATION}":
                state.remove_allocation(value)


# -- the tenants file --------------------------------------------------------------------------


class TenantsFileFeed(Feed):
    """Re-reads the tenants file when it changes; a file that fails to load keeps the old one."""

    name = "tenants"

    def __init__(self, path: Path, state: HooksState, post: Post, *, every_seconds: float = 5.0) -> None:
        super().__init__(post)
        self.path = path
        self.state = state
        self.every_seconds = every_seconds
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            info = self.path.stat()
        except OSError:
            return None
        return (info.st_mtime_ns, info.st_size)

    def _run_once(self) -> None:
        while not self._stopping.wait(self.every_seconds):
            stamp = self._stamp()
            if stamp is None or stamp == self._seen:
                continue
            self._seen = stamp
            try:
                tenants = load_tenants(self.path)
            except ConfigError as exc:
                log.warning("tenants file %s not reloaded: %s", self.path, exc)
                continue
            log.info("tenants file %s reloaded (%d tenants)", self.path, len(tenants.tenants))
            self._post(self.state.set_tenants, tenants)


# -- quota_grants -------------------------------------------------------------------------------


class GrantsFeed(Feed):
    """Reads ClickHouse quota_grants every ``every_seconds`` and hands a changed set to the
    state (the trust check's limits include grants). A failed read keeps the last set: until
    the first read, a ``recovered`` that a grant caused is not trusted (the tenant stays
    blocked a little longer, never unblocked by a forged event)."""

    name = "grants"

    def __init__(self, reader: GrantsReader[dict[str, list[Grant]]], state: HooksState, post: Post, *,
                 every_seconds: float = 1.0) -> None:
        super().__init__(post)
        self.reader = reader
        self.state = state
        self.every_seconds = every_seconds
        self._last: dict[str, list[Grant]] | None = None

    def _run_once(self) -> None:
        try:
            while True:
                read = self.reader.read()
                if read is not None and read != self._last:
                    self._last = read
                    self._post(self.state.set_grants, read)
                if self._stopping.wait(self.every_seconds):
                    return
        finally:
            self.reader.close()


def start_all(feeds: Iterable[Feed]) -> None:
    for feed in feeds:
        feed.start()


def stop_all(feeds: Iterable[Feed], timeout: float = 10.0) -> None:
    for feed in feeds:
        feed._stopping.set()
        feed._interrupt()
    for feed in feeds:
        feed.stop(timeout)
