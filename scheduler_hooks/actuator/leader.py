"""The actuator's leader election on a ``coordination.k8s.io/v1`` Lease (contract 9).

Several ``gpumeter hooks --role actuator`` replicas may run; one acts. A candidate takes the
Lease when it is missing, released (no holder), its own, or unchanged for
``leaseDurationSeconds`` as this candidate saw it (its own clock, from when it read the
change: clocks of different machines are never compared). Every write carries the
``resourceVersion`` it read, so of two candidates writing at once the API server accepts one
and refuses the other with 409 Conflict.

The leader renews every ``retry_period`` and counts itself leader only until
``renew_deadline`` after the *start* of its last successful renewal: the other candidates
count ``lease_duration`` from *after* they read that renewal, so with renew_deadline <
lease_duration the old leader has stopped acting before anyone may take over.
``holding()`` answers from the clock alone (a hung request changes nothing), so the actuator
asks it right before every eviction or notice it sends.

Why not ``kubernetes.leaderelection``: it runs in threads with blocking sleeps, uses the
client's global configuration instead of a given ApiClient, and cannot be stopped or asked
"am I leader right now"; the loop needed here is small.

``lead(elector, work, stop)`` runs ``work(term)`` for each term of leadership; ``term`` is
set the moment leadership is lost (or on stop), and ``work`` must stop acting then. On a clean
stop the Lease is released (holder cleared) so a successor takes over at once instead of after
the lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpumeter.core import jsonio

log = logging.getLogger("gpumeter.actuator")


class NotLeading(Exception):
    """Raised instead of an action when this process does not hold the Lease (any more)."""


@dataclass(frozen=True)
class LeaseTimings:
    duration: int  # leaseDurationSeconds written on the Lease
    renew_deadline: float
    retry_period: float

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ValueError("lease timings must satisfy 0 < retry period < renew deadline < duration")


def default_identity() -> str:
    """Unique per process: the host (the pod's name in a cluster), the pid, a random suffix (two
    pods on the host network share a hostname, and every container's first pid is 1)."""
    return f"{socket.gethostname()}_{os.getpid()}_{secrets.token_hex(3)}"


def micro_time(at: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 with exactly six fraction digits, UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- the API calls (blocking) -------------------------------------------------------------------


class LeaseClient:
    """One Lease object, as JSON: read (None when missing), create and replace (None when
    another writer got there first: 409). Anything else (server away, 403) raises."""

    def __init__(self, api: Any, namespace: str, name: str, request_timeout: float) -> None:
        """``api``: a ``kubernetes.client.CoordinationV1Api`` (its read, create and replace of
        namespaced leases are the calls made), or a stand-in answering them the same way."""
        self.api = api
        self.namespace = namespace
        self.name = name
        self.request_timeout = request_timeout

    def get(self) -> dict[str, Any] | None:
        try:
            response = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                      _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _document(response)

    def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        try:
            response = self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                        _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return _document(response)

    def replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
        """Write ``spec`` over ``lease`` as read: refused (None) if it changed since."""
        metadata = lease.get("metadata") or {}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": metadata.get("resourceVersion")},
                "spec": spec}
        try:
            response = self.api.replace_namespaced_lease(self.name, self.namespace, body,
                                                         _preload_content=False,
                                                         _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return _document(response)


def _document(response: Any) -> dict[str, Any]:
    document = jsonio.loads(response.data)
    if not isinstance(document, dict):
        raise ValueError("the API server answered a Lease request with something that is not an object")
    return document


# -- the election -------------------------------------------------------------------------------


Clock = Callable[[], float]
Run = Callable[..., Awaitable[Any]]
Wait = Callable[[asyncio.Event, float], Awaitable[None]]


class LeaderElector:
    def __init__(self, leases: LeaseClient, identity: str, timings: LeaseTimings, *,
                 clock: Clock = time.monotonic, wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 io: Run | None = None, wait: Wait | None = None) -> None:
        """``clock``, ``wall``, ``io`` and ``wait`` (sleep until a time passes or stop is set) are
        replaceable for tests that drive time by hand."""
        self.leases = leases
        self.identity = identity
        self.timings = timings
        self._clock = clock
        self._wall = wall
        # The Lease calls run on a thread of their own: in the loop's default pool they queued
        # behind ClickHouse and Kafka work of the same process, and a loaded leader lost its Lease
        # for no fault of the API server. One thread also keeps a renewal that outlived its wait
        # from racing the next one.
        self._pool: ThreadPoolExecutor | None = None
        self._io = io or self._in_own_thread
        self._wait = wait or _sleep_or_stop
        self._valid_until: float | None = None  # our clock: leader until then
        self._observed_version: str | None = None
        self._observed_at = 0.0  # our clock, when the Lease last changed as we saw it
        self.holder: str = ""  # who held the Lease at our last read

    async def _in_own_thread(self, call: Callable[..., Any], *args: Any) -> Any:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(call, *args))

    def holding(self) -> bool:
        """Leader now: renewed successfully less than the renew deadline ago."""
        return self._valid_until is not None and self._clock() < self._valid_until

    async def try_acquire_or_renew(self) -> bool:
        """One round: take or renew the Lease if allowed; True if this process holds it now."""
        started = self._clock()
        lease = await self._io(self.leases.get)
        now = micro_time(self._wall())
        if lease is None:
            created = await self._io(self.leases.create, self._spec(now, now, 0))
            return self._won(created, started)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder
        version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if version != self._observed_version:
            self._observed_version = version
            self._observed_at = self._clock()
        if holder and holder != self.identity:
            duration = _seconds(spec.get("leaseDurationSeconds"), self.timings.duration)
            if self._clock() < self._observed_at + duration:
                return False  # held by another, and renewed within its duration as far as we saw
        ours = holder == self.identity
        acquired = str(spec.get("acquireTime") or now) if ours else now
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        replaced = await self._io(self.leases.replace, lease, self._spec(acquired, now, transitions))
        return self._won(replaced, started)

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.timings.duration,
                "acquireTime": acquired, "renewTime": renewed, "leaseTransitions": transitions}

    def _won(self, written: dict[str, Any] | None, started: float) -> bool:
        if written is None:
            return False
        self._observed_version = str((written.get("metadata") or {}).get("resourceVersion") or "")
        self._observed_at = self._clock()
        self.holder = self.identity
        self._valid_until = started + self.timings.renew_deadline
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Until this process leads (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            try:
                if await self.try_acquire_or_renew():
                    return True
            except Exception as exc:  # API server away: a candidate simply tries again
                log.warning("cannot read or write lease %s/%s: %s", self.leases.namespace, self.leases.name,
                            _first_line(exc))
            await self._wait(stop, self.timings.retry_period)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew every retry period; returns the moment the renew deadline passes without a
        successful renewal (leadership lost), or when ``stop`` is set."""
        while not stop.is_set():
            remaining = self._remaining()
            if remaining <= 0:
                self._valid_until = None
                return
            await self._wait(stop, min(self.timings.retry_period, remaining))
            remaining = self._remaining()
            if stop.is_set() or remaining <= 0:
                continue
            try:
                # Never wait past the deadline for an answer: the loop above must see it pass.
                renewed = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=remaining)
            except TimeoutError:
                log.warning("renewing lease %s/%s takes longer than the %.1fs left before the renew deadline",
                            self.leases.namespace, self.leases.name, remaining)
                continue
            except Exception as exc:  # retried until the deadline
                log.warning("cannot renew lease %s/%s: %s", self.leases.namespace, self.leases.name,
                            _first_line(exc))
                continue
            if not renewed and self.holder != self.identity:
                self._valid_until = None  # someone else holds it: we lost it, whatever our clock says
                return

    def _remaining(self) -> float:
        return 0.0 if self._valid_until is None else self._valid_until - self._clock()

    async def release(self) -> None:
        """Give the Lease up (holder cleared) if we hold it, so a successor need not wait; the
        elector's thread ends (a later ``acquire`` starts another)."""
        was_holding = self.holding()
        self._valid_until = None
        try:
            if was_holding:
                await self._clear_holder()
        except Exception as exc:  # the successor waits the lease duration instead
            log.warning("could not release lease %s/%s: %s", self.leases.namespace, self.leases.name,
                        _first_line(exc))
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    async def _clear_holder(self) -> None:
        lease = await self._io(self.leases.get)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        spec = dict(lease.get("spec") or {})
        spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=micro_time(self._wall()))
        await self._io(self.leases.replace, lease, spec)


Work = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
OnChange = Callable[[bool], None]


async def lead(elector: LeaderElector, work: Work, stop: asyncio.Event,
               on_change: OnChange | None = None) -> None:
    """Run ``work(term)`` during each term of leadership, until ``stop``.

    ``term`` is set when leadership is lost or on stop; ``work`` is cancelled if it has not
    returned by the time leadership is lost (it must not act past that point anyway: it asks
    ``elector.holding()`` before acting). If ``work`` raises, the Lease is released and the
    error propagates: another replica takes over.
    """
    try:
        while not stop.is_set():
            if not await elector.acquire(stop):
                return
            if on_change is not None:
                on_change(True)
            term = asyncio.Event()
            working = asyncio.create_task(work(term), name="leader-work")
            holding = asyncio.create_task(elector.hold(stop), name="leader-hold")
            try:
                await asyncio.wait([working, holding], return_when=asyncio.FIRST_COMPLETED)
                term.set()
                # The work stops at once on its own (it watches ``term``); past the grace it is cancelled.
                await asyncio.wait([working], timeout=elector.timings.duration)
            finally:
                term.set()
                for task in (working, holding):
                    task.cancel()
                await asyncio.wait([working, holding])
            if on_change is not None:
                on_change(False)
            if not working.cancelled() and working.exception() is not None:
                raise working.exception()  # type: ignore[misc]
    finally:
        await elector.release()


def _seconds(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
