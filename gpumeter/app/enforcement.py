"""The demo's enforcement: the real extender and the real actuator against the simulated fleet.

``gpumeter demo`` meters and bills a simulated fleet; this closes the loop (issue 33, point 5):

- the extender (``HooksServer`` over a ``HooksState``, its quota events, topology and
  allocation read from Kafka by its own ``KafkaFeed``) serves ``/kube/filter`` on a loopback
  port, and the fleet's scheduler asks it, in kube-scheduler's wire format, before it places
  a pod (collectors/sim/extender_client.py); the fleet's namespaces, nodes and pods are handed
  to the state after every window, as the Kubernetes watches would;
- the actuator (``Actuator``) consumes the quota events and acts on the fleet through
  ``SimClusterGateway`` (collectors/sim/cluster_gateway.py): notices are annotations on the
  simulated pods, evictions end them.

Both run on one asyncio loop in a thread of their own; the fleet is stepped on the demo's
thread under ``lock``, which the gateway's calls take too.

The clock: the fleet's time is simulated and runs far ahead of wall time (a 10-minute window
takes a fraction of a second), and its quota events name the fleet's periods. The trust check
acts only on events of the current period, so both the extender's state and the actuator are
given the fleet's clock (``clock=``; production keeps the real clock, and the rule itself is
the same). Eviction countdowns look at that clock every ``TICK_SECONDS``.

Pacing (``caught_up``): the fleet does not step on while a quota event is on the topic that
the extender has not read or the actuator has not handled (its offset committed once handled),
waiting at most ``MAX_WAIT_SECONDS`` of wall time per window; with the demo's bound on rated
samples in flight (``LAG_WINDOWS``), this bounds the fleet time between a crossing and the
action on it: the stated pipeline lag.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from collectors.sim.cluster_gateway import SimClusterGateway
from collectors.sim.extender_client import ExtenderFilter
from collectors.sim.fleet import SimulatedFleet
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import load_tenants
from gpumeter.core.topics import QUOTA_EVENTS, actuator_group_id
from gpumeter.infra import kafka as gkafka

log = logging.getLogger(__name__)

TICK_SECONDS = 0.02
MAX_WAIT_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 60.0


class DemoEnforcement:
    def __init__(self, settings: Settings, fleet: SimulatedFleet, lock: threading.Lock,
                 log_path: Path | None = None, clock: Callable[[], datetime] | None = None) -> None:
        """``clock``: None for the demo (the fleet's clock, see the module's docstring); the wall
        clock for a fleet stepped in real time (benchmarks/quota_overshoot.py), where it also
        dates the evictions, so that an evicted pod is billed up to the moment it was evicted."""
        self.settings = settings
        self.fleet = fleet
        self.lock = lock
        self.gateway = SimClusterGateway(fleet, lock, clock)
        self.clock: Callable[[], datetime] = clock or (lambda: fleet.clock)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._log_path = log_path
        self.url = ""
        self.filter: ExtenderFilter | None = None
        self._state: object = None
        self._feed: object = None
        self._offsets: KafkaConsumer | None = None
        self.waited_seconds = 0.0

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the extender and the actuator; returns once the extender answers (has read
        the quota events, topology and allocations on the topics) and the fleet asks it."""
        if self._log_path is not None:
            handler = logging.FileHandler(self._log_path)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
            for name in ("gpumeter.actuator", "scheduler_hooks"):
                logging.getLogger(name).addHandler(handler)
                logging.getLogger(name).setLevel(logging.INFO)
        self._thread = threading.Thread(target=self._main, name="gpumeter-demo-enforcement", daemon=True)
        self._thread.start()
        if not self._started.wait(READY_TIMEOUT_SECONDS) or self._failure is not None:
            raise RuntimeError(f"the demo's extender did not start: {self._failure}")
        config = self.fleet.config
        self.filter = ExtenderFilter(f"{self.url}/kube", config.start, config.window_seconds, self.clock)
        self.fleet.set_admission_filter(self.filter)
        self._offsets = gkafka.make_consumer(self.settings.kafka, enable_auto_commit=False,
                                             group_id=self._actuator_group)
        self.sync()

    @property
    def _actuator_group(self) -> str:
        return actuator_group_id(self.settings.kafka.topic_prefix, self.settings.hooks.group)

    def stop(self) -> None:
        self.fleet.set_admission_filter(None)
        if self.filter is not None:
            self.filter.close()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
        if self._offsets is not None:
            self._offsets.close()

    def alive(self) -> bool:
        return self._failure is None and self._thread is not None and self._thread.is_alive()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the demo's thread by ``alive``/``start``
            self._failure = exc
            log.exception("the demo's enforcement stopped")
        finally:
            self._started.set()

    async def _serve(self) -> None:
        from scheduler_hooks.actuator.service import Actuator
        from scheduler_hooks.actuator.tenants_source import TenantsSource
        from scheduler_hooks.actuator.volcano_queues import NoVolcanoQueues
        from scheduler_hooks.cluster.feeds import KafkaFeed, loop_poster
        from scheduler_hooks.cluster.state import HooksState
        from scheduler_hooks.extender.server import HooksServer

        self._loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        state = HooksState(load_tenants(self.settings.tenants), clock=self.clock)
        feed = KafkaFeed(self.settings.kafka, state, loop_poster(self._loop),
                         client_id="gpumeter-demo-extender", poll_ms=100)
        self._state, self._feed = state, feed
        server = HooksServer(state, "127.0.0.1:0")
        await server.start()
        feed.start()
        actuator = Actuator(self.settings, dry_run=False, kube=self.gateway,
                            tenants=TenantsSource(self.settings.tenants), clock=self.clock,
                            queues=NoVolcanoQueues(), tick=TICK_SECONDS)
        running = asyncio.create_task(actuator.run(stop))
        try:
            while not state.ready:
                if running.done():
                    running.result()
                await asyncio.sleep(0.05)
            self.url = server.url
            self._started.set()
            await running
        finally:
            stop.set()
            await asyncio.to_thread(feed.stop)
            await server.stop()

    # -- each window ------------------------------------------------------------------------
    def sync(self) -> None:
        """Hand the fleet's namespaces, nodes and pods to the extender's state (the watches'
        part); called on the demo's thread after each window."""
        from scheduler_hooks.cluster.state import HooksState, watched_namespace, watched_node, watched_pod

        namespaces = self.gateway.namespaces()
        nodes = self.gateway.nodes()
        pods = [p for p in (watched_pod(raw) for raw in self.gateway.pods()) if p is not None]
        state = self._state
        assert isinstance(state, HooksState) and self._loop is not None

        def apply() -> None:
            state.replace_namespaces(ns for ns in map(watched_namespace, namespaces) if ns is not None)
            state.replace_nodes(n for n in map(watched_node, nodes) if n is not None)
            current = {pod.uid for pod in pods}
            for uid in [uid for uid in state.pods if uid not in current]:
                state.delete_pod(uid)
            for pod in pods:
                state.upsert_pod(pod)
            state.refresh_blocked()

        done = threading.Event()

        def run() -> None:
            try:
                apply()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def caught_up(self) -> bool:
        """Every quota event on the topic is read by the extender and handled by the actuator."""
        from scheduler_hooks.cluster.feeds import KafkaFeed

        assert self._offsets is not None and isinstance(self._feed, KafkaFeed)
        topic = self.settings.kafka.topic(QUOTA_EVENTS)
        found = self._offsets.partitions_for_topic(topic) or ()
        partitions = [TopicPartition(topic, p) for p in sorted(found)]
        ends = self._offsets.end_offsets(partitions)
        read = self._feed.read_up_to(topic)
        for tp, end in ends.items():
            if end == 0:
                continue
            if read.get(tp.partition, 0) < end or (self._offsets.committed(tp) or 0) < end:
                return False
        return True

    def wait_caught_up(self) -> None:
        started = time.monotonic()
        while time.monotonic() - started < MAX_WAIT_SECONDS and not self.caught_up():
            time.sleep(0.02)
        self.waited_seconds += time.monotonic() - started
