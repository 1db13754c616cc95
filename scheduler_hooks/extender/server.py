"""The extender's HTTP surface (contract 6): kube-scheduler and Volcano verbs over aiohttp.

Routes: ``POST /kube/{filter,prioritize,preempt}``, ``POST /volcano/{predicate,prioritize,
preemptable,reclaimable,queueOverused,jobEnqueueable,jobReady}``, ``GET /healthz``,
``/readyz``, ``/metrics``. Answers come from memory (``HooksState``), decided on the event loop
thread that also owns every state mutation; a body over 128 KiB is decoded and checked (and
its answer encoded) on a worker thread, so that a 16 MiB request never holds the loop the
actuator shares; a NodeNames request up to 1 MiB is read natively on the loop instead (quicker
than the hop, ``INLINE_READ_BYTES``).

Errors are JSON ``{"error": reason}``, never HTML and never a traceback:

- body over 16 MiB: 413 (refused from ``Content-Length`` before reading when it is sent);
- a body with a ``Content-Encoding`` (gzip, deflate, br...): 415, unread (nothing inflates it);
- not JSON, not UTF-8, NaN/Infinity, nested too deeply, or a shape the wire modules reject: 400;
- a verb before the state is loaded: 503 with what it waits for. Both schedulers treat a
  non-200 answer as the extender failing: with ``ignorable: false`` the pod waits and is
  retried, which is the point: an extender that has not read the quota state yet must not
  let a blocked tenant through by answering from an empty one;
- unknown path 404, wrong method 405.

Request JSON is parsed (orjson) with floats as Python floats: both schedulers send Go float64s,
and Volcano's victims are echoed back, so they must go out as the same JSON numbers they came in.

TLS (contract 6): ``hooks.tls_cert`` + ``hooks.tls_key`` serve HTTPS; with ``hooks.client_ca``
a client certificate signed by that CA is required (``ssl.CERT_REQUIRED``), the one way
kube-scheduler's extender ``tlsConfig`` can authenticate; only that CA is trusted for clients.
The three files are re-read when they change (a rotated certificate or CA is served to new
connections without a restart; a pair that does not load keeps the last good one).

Keep-alive: an idle connection is closed after ``hooks.keepalive_seconds`` (75 s by default,
above the 60 s idle time of common load balancers; aiohttp's own default is an hour).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from gpumeter.core.config_files import ConfigError
from gpumeter.infra.tls import server_tls
from scheduler_hooks.cluster.kube_json import WireError
from scheduler_hooks.cluster.state import HooksState
from scheduler_hooks.extender import wire_kube, wire_volcano
from scheduler_hooks.extender.policy import Policy

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_BODY_LABEL = "16 MiB"


@dataclass(frozen=True)
class Verb:
    """One route: ``parse`` turns the decoded document into checked arguments and reads no state
    (it may run on a worker thread); ``decide`` answers from the policy, on the loop that owns
    every state mutation. ``decide`` answers a JSON value, or bytes it has encoded itself.
    ``read``, where set, is tried on the raw body first (where ``parse`` runs): arguments
    for ``decide`` read without decoding the whole body, or None to decode and ``parse``."""

    parse: Callable[[Any], Any]
    decide: Callable[[Any, Policy], Any]
    read: Callable[[bytes], Any] | None = None


KUBE_VERBS: dict[str, Verb] = {
    "filter": Verb(wire_kube.parse_extender_args, wire_kube.decide_filter, wire_kube.read_extender_args),
    "prioritize": Verb(wire_kube.parse_extender_args, wire_kube.decide_prioritize_encoded,
                       wire_kube.read_extender_args),
    "preempt": Verb(wire_kube.parse_preemption_args, wire_kube.decide_preempt),
}
VOLCANO_VERBS: dict[str, Verb] = {
    "predicate": Verb(wire_volcano.parse_predicate, wire_volcano.decide_predicate),
    "prioritize": Verb(wire_volcano.parse_prioritize, wire_volcano.decide_prioritize),
    "preemptable": Verb(wire_volcano.parse_preemptable, wire_volcano.decide_evictions),
    "reclaimable": Verb(wire_volcano.parse_reclaimable, wire_volcano.decide_evictions),
    "queueOverused": Verb(wire_volcano.parse_queue_overused, wire_volcano.decide_queue_overused),
    "jobEnqueueable": Verb(wire_volcano.parse_job_enqueueable, wire_volcano.decide_job_enqueueable),
    "jobReady": Verb(wire_volcano.parse_job_ready, wire_volcano.decide_job_ready),
}
# A body up to this size is decoded, checked and encoded on the loop: a few milliseconds at
# most, and 5,000 NodeNames (about 70 KB) stay clear of a thread hop (p99 < 5 ms). A larger one
# is decoded and checked, and its answer encoded, on a worker thread; the loop runs the policy
# only (C-level passes over the request's names, or one short step per victim).
INLINE_BODY_BYTES = 128 * 1024
# A NodeNames body up to this size is read natively on the loop (wire_kube.read_extender_args:
# about a millisecond a MiB, the names never decoded into Python; a Pod over 64 KiB is left to
# the decoder), and so is its answer written (decide): 70,000 names. A larger body is read on
# a worker thread.
INLINE_READ_BYTES = 1024 * 1024
# Worker threads for large bodies: two at a time at most (the GIL makes more no faster); more
# large requests wait their turn in the executor's queue while the loop goes on serving.
LARGE_BODY_WORKERS = 2
# Latency buckets around the target (p99 < 5 ms at 5,000 nodes).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
UNKNOWN_ROUTE = "unknown"
DEFAULT_KEEPALIVE_SECONDS = 75.0
# How long a stopping server waits for its calls in flight: well inside the chart's
# terminationGracePeriodSeconds (30) after its preStop sleep; a scheduler call takes milliseconds.
DRAIN_SECONDS = 10.0


class BadRequest(Exception):
    """Input the wire cannot take; answered 400 with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode(body: bytes) -> Any:
    """One JSON document; BadRequest with a short reason otherwise.

    orjson parses (it refuses NaN/Infinity, bad UTF-8, nesting deeper than 1,024 and numbers
    that overflow a double, as we want: nothing Go's float64/int64 wire types can carry is
    refused). What it refuses is parsed again by the standard library only to word the reason;
    a document that library takes anyway (a number past a double, nesting past 1,024) is
    refused too: contract 6 answers 400 for JSON that parses but does not fit.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        refused = exc
    try:
        # UTF-8 only (RFC 8259 for JSON between systems): json.loads(bytes) would guess UTF-16/32.
        json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"not UTF-8 JSON: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadRequest("not JSON: nested too deeply") from None
    except ValueError:  # an integer past Python's conversion limit (4,300 digits)
        raise BadRequest("JSON the extender does not take: a number beyond 64 bits") from None
    raise BadRequest(f"JSON the extender does not take: {str(refused).split(':')[0]}")


def _refuse_constant(name: str) -> Any:
    raise BadRequest(f"not JSON: non-standard constant {name!r}")


def encode(answer: Any) -> bytes:
    if isinstance(answer, bytes):  # already JSON (no JSON value is bytes: orjson refuses them)
        return answer
    try:
        return orjson.dumps(answer)
    except TypeError:  # an integer beyond 64 bits echoed back (Volcano victims)
        return json.dumps(answer, separators=(",", ":"), allow_nan=False).encode()


def json_response(answer: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(answer), status=status, content_type="application/json")


def error_response(status: int, reason: str, **extra: Any) -> web.Response:
    return json_response({"error": reason, **extra}, status)


class HooksMetrics:
    """Prometheus series of the service, in a registry of its own (several servers per process in tests)."""

    def __init__(self, state: HooksState, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "gpumeter_hooks_requests", "Extender HTTP requests by verb and status code",
            ["verb", "code"], registry=self.registry,
        )
        self.latency = Histogram(
            "gpumeter_hooks_request_seconds", "Extender request latency by verb (body read to answer)",
            ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        gauges: dict[str, tuple[str, Callable[[], float]]] = {
            "gpumeter_hooks_ready": ("1 once quota state and topology are loaded", lambda: state.ready),
            "gpumeter_hooks_blocked_tenants": ("Tenants refused new GPU pods", lambda: len(state.blocked)),
            "gpumeter_hooks_nodes": ("Nodes with placement information", lambda: state.node_count),
            "gpumeter_hooks_pods": ("Pods watched", lambda: state.watched_pods),
            "gpumeter_hooks_quota_events": ("Distinct quota events folded", lambda: state.quota_events),
        }
        for name, (doc, read) in gauges.items():
            Gauge(name, doc, registry=self.registry).set_function(read)

    def observe(self, verb: str, code: int, seconds: float) -> None:
        self.requests.labels(verb, str(code)).inc()
        self.latency.labels(verb).observe(seconds)


class InFlight:
    """The requests being handled now, so a stopping server can wait for them.

    aiohttp's own graceful close is not enough: once it closes a connection it drops the bytes
    that still arrive on it, so a call whose body was on its way when the replica began to stop
    would hang until the shutdown timeout and be cut off."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """True once nothing is in flight; False when ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


def build_app(state: HooksState, metrics: HooksMetrics | None = None,
              in_flight: InFlight | None = None) -> web.Application:
    """The aiohttp application answering from ``state``; ``in_flight`` counts its requests."""
    metrics = metrics or HooksMetrics(state)
    in_flight = in_flight or InFlight()

    @web.middleware
    async def instrument(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        route = request.match_info.route
        verb = route.name if route is not None and route.name else UNKNOWN_ROUTE
        in_flight.enter()
        try:
            response = await handler(request)
        except web.HTTPRequestEntityTooLarge:
            response = error_response(413, f"request body exceeds {MAX_BODY_LABEL}")
        except web.HTTPException as exc:  # 404 and 405 from the router
            response = error_response(exc.status, exc.reason)
        except Exception:  # a bug, never bad input (the fuzz test holds us to that)
            log.exception("hooks: %s %s failed", request.method, request.path)
            response = error_response(500, "internal error")
        finally:
            in_flight.leave()
        metrics.observe(verb, response.status, time.perf_counter() - started)
        return response

    app = web.Application(middlewares=[instrument], client_max_size=MAX_BODY_BYTES)
    policy = Policy(state.view)  # the view is live: built once over the state's own dicts
    workers = ThreadPoolExecutor(LARGE_BODY_WORKERS, thread_name_prefix="hooks-large-body")

    async def stop_workers(app: web.Application) -> None:
        workers.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(stop_workers)
    for prefix, verbs in (("kube", KUBE_VERBS), ("volcano", VOLCANO_VERBS)):
        for name, verb in verbs.items():
            app.router.add_post(f"/{prefix}/{name}", _verb_handler(state, policy, verb, workers),
                                name=f"{prefix}.{name}")

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if state.ready:
            return json_response({"ready": True})
        return json_response({"ready": False, "waiting_for": state.waiting_for}, 503)

    async def prometheus(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(metrics.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", prometheus, name="metrics")
    return app


def _verb_handler(state: HooksState, policy: Policy, verb: Verb,
                  workers: ThreadPoolExecutor) -> Callable[[web.Request], Awaitable[web.Response]]:
    def parse(body: bytes) -> Any:
        return verb.parse(decode(body))

    def read_or_parse(body: bytes) -> Any:
        args = verb.read(body) if verb.read is not None else None
        return parse(body) if args is None else args

    async def handle(request: web.Request) -> web.Response:
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            # Neither scheduler compresses a request; inflating one would cost in proportion to
            # what it inflates to, not to what was sent (a 2 MB gzip stream is 2 GB of zeros).
            return error_response(415, f"Content-Encoding {encoding!r} is not accepted: send JSON as it is")
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            return error_response(413, f"request body of {length} bytes exceeds {MAX_BODY_LABEL}")
        # Read as it arrives, 413 as soon as more than MAX_BODY_BYTES came (client_max_size):
        # a chunked body never grows past the limit in memory.
        body = await request.read()
        if not state.ready:
            return error_response(503, "not ready: state still loading", waiting_for=state.waiting_for)
        large = len(body) > INLINE_BODY_BYTES
        loop = asyncio.get_running_loop()
        try:
            # Decoding and checking cost in proportion to the body; off the loop when large, so
            # the actuator (same loop with --role all) and other requests go on meanwhile. The
            # native reader (``read``) is quick enough for the loop up to INLINE_READ_BYTES: a
            # hop to a worker thread and back costs more than it saves there.
            if len(body) > INLINE_READ_BYTES:
                args = await loop.run_in_executor(workers, read_or_parse, body)
            else:
                args = verb.read(body) if verb.read is not None else None
                if args is None:
                    args = await loop.run_in_executor(workers, parse, body) if large else parse(body)
            answer = verb.decide(args, policy)
        except (BadRequest, WireError) as exc:
            return error_response(400, exc.reason)
        if isinstance(answer, bytes):  # encoded by decide already: nothing left to do off the loop
            payload = answer
        else:
            payload = await loop.run_in_executor(workers, encode, answer) if large else encode(answer)
        return web.Response(body=payload, status=200, content_type="application/json")

    return handle


# -- serving -----------------------------------------------------------------------------------


def freeze_heap() -> None:
    """Once the state is loaded: move every object alive now out of the collector's sight.

    The loaded state (topologies, score tables, pods) is hundreds of thousands of long-lived
    objects; a full collection walking them all takes tens of milliseconds, and whichever
    request triggers it pays that (p99). Frozen objects are never scanned; later garbage is
    collected as usual.
    """
    gc.collect()
    gc.freeze()



def server_ssl_context(cert: Path | None, key: Path | None, client_ca: Path | None) -> ssl.SSLContext | None:
    """HTTPS when cert and key are set; a client CA makes client certificates required. The
    files are re-read when they change (gpumeter.infra.tls): new handshakes get the new ones."""
    tls = server_tls(cert, key, client_ca, name="hooks")
    return None if tls is None else tls.context


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"hooks.listen must be HOST:PORT, got {listen!r}")
    return host, int(port)


class HooksServer:
    """The app on a TCP site; port 0 picks a free port (``port`` tells which)."""

    def __init__(
        self,
        state: HooksState,
        listen: str = "127.0.0.1:8790",
        *,
        ssl_context: ssl.SSLContext | None = None,
        metrics: HooksMetrics | None = None,
        keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
    ) -> None:
        self.state = state
        self.host, self._port = parse_listen(listen)
        self.ssl_context = ssl_context
        self.metrics = metrics or HooksMetrics(state)
        self.keepalive_seconds = keepalive_seconds
        self.in_flight = InFlight()
        self._runner: web.AppRunner | None = None
        # aiohttp's cleanup is not reentrant: a second stop (a signal and an exit stack, say)
        # waits for the first and then finds nothing left to stop.
        self._stopping = asyncio.Lock()

    async def start(self) -> None:
        # No access log: the scheduler calls several times per pod; /metrics counts them.
        # auto_decompress off: a compressed body is refused (415), never inflated by the parser
        # on the event loop before any handler runs.
        self._runner = web.AppRunner(build_app(self.state, self.metrics, self.in_flight), access_log=None,
                                     keepalive_timeout=self.keepalive_seconds, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port, ssl_context=self.ssl_context)
        await site.start()
        addresses = self._runner.addresses  # where the site listens: the port when 0 was asked
        if addresses:
            self._port = int(addresses[0][1])

    async def stop(self) -> None:
        """Refuse new connections, let the calls in flight finish (their bodies may still be
        arriving; at most DRAIN_SECONDS), then close the kept-alive connections. Safe to call again,
        also while a stop is under way: it returns once the server has stopped."""
        async with self._stopping:
            if self._runner is None:
                return
            for site in list(self._runner.sites):
                await site.stop()
            if not await self.in_flight.drained(DRAIN_SECONDS):
                log.warning("hooks: stopping with %d call(s) still in flight after %.0f s",
                            self.in_flight.count, DRAIN_SECONDS)
            await self._runner.cleanup()
            self._runner = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self._port}"
