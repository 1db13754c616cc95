"""`gpumeter hooks [--role extender|actuator|all] [--dry-run]`: the scheduler extender HTTP
service and the quota actuator (contracts 6 and 9).

``--role`` (default ``all``, what the local runtime runs):

- ``extender``: the HTTP extender and the feeds its answers come from (Kubernetes watches, the
  quota-state and topology topics, the tenants file). Stateless: run several replicas behind a
  Service. It takes no Lease and consumes no quota events as the actuator does.
- ``actuator``: the quota actuator alone, no HTTP listener (nothing to probe but the process:
  it exits 1 when it fails beyond retrying). It acts only while it holds the
  ``coordination.k8s.io/v1`` Lease ``hooks.lease_name`` in ``hooks.lease_namespace``
  (scheduler_hooks/actuator/leader.py); run two or more replicas, one acts.
- ``all``: both in one process; the actuator still takes the Lease first.

One event loop runs everything; the extender's feeds read in threads and hand values to the
loop. SIGTERM or SIGINT stops everything cleanly (and releases the Lease, so another replica
takes over at once).

``--dry-run`` (or ``hooks.dry_run``) is the actuator's: it records every decision and acts on
none. The extender answers as always: its refusals act only on pods not yet placed, and a
scheduler can be pointed away from it (or made ``ignorable``) at any time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any, Literal

from gpumeter.app.cli.errors import Failure
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import load_tenants
from gpumeter.infra import kafka_log
from gpumeter.infra.kafka_log import KafkaErrorsCollector, KafkaErrorThrottle

log = logging.getLogger(__name__)

READY_POLL_SECONDS = 0.5
STOP_TIMEOUT_SECONDS = 15.0
ROLES = ("extender", "actuator", "all")
Role = Literal["extender", "actuator", "all"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", choices=ROLES, default="all",
                        help="extender: the HTTP extender only (stateless, any number of replicas); "
                             "actuator: the quota actuator only, acting while it holds the Lease "
                             "hooks.lease_name; all (default): both")
    parser.add_argument("--dry-run", action="store_true",
                        help="actuator records every decision and acts on none (default: hooks.dry_run)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    dry_run = bool(getattr(args, "dry_run", False) or settings.hooks.dry_run)
    return asyncio.run(serve(settings, dry_run=dry_run, role=getattr(args, "role", "all")))


async def serve(settings: Settings, *, dry_run: bool, role: Role = "all",
                stop: asyncio.Event | None = None, api: Any = None) -> int:
    """Run until ``stop`` is set (or a signal); ``api`` overrides the Kubernetes client (tests)."""
    from kubernetes.config import ConfigException

    from scheduler_hooks.cluster.feeds import kube_api_client

    extender = role in ("extender", "all")
    actuator = role in ("actuator", "all")
    tenants = load_tenants(settings.tenants)  # a bad file is exit 2 before anything starts
    if api is None:
        try:
            api = kube_api_client()
        except ConfigException as exc:
            raise Failure(f"no Kubernetes access (no in-cluster account, no kubeconfig): {exc}") from None

    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)

    async with contextlib.AsyncExitStack() as running:
        running.callback(_close_quietly, api)
        # aiokafka logs every failed connection while a broker is away: one line per kind a minute.
        kafka_errors = KafkaErrorThrottle()
        kafka_log.install(kafka_errors)
        running.callback(kafka_log.uninstall, kafka_errors)
        main: list[asyncio.Task[Any]] = []
        registry = None  # with the extender, the actuator's series are on its /metrics too
        if extender:
            readiness, registry = await _start_extender(settings, tenants, api, stop, running,
                                                        dry_run=dry_run and actuator)
            if registry is not None:
                registry.register(KafkaErrorsCollector(kafka_errors, "gpumeter_hooks"))
            main.append(readiness)
        if actuator:
            main.append(asyncio.create_task(_actuate(settings, api, stop, dry_run=dry_run, registry=registry),
                                            name="actuator"))
        stopping = asyncio.create_task(stop.wait(), name="stop")
        try:
            if actuator:
                done, _ = await asyncio.wait([stopping, main[-1]], return_when=asyncio.FIRST_COMPLETED)
                if main[-1] in done and main[-1].exception() is not None:
                    raise Failure(f"actuator failed: {main[-1].exception()}")
            if not stopping.done():
                await stopping  # the actuator ended on its own: keep serving the extender
        finally:
            stop.set()
            _, pending = await asyncio.wait([*main, stopping], timeout=STOP_TIMEOUT_SECONDS)
            for task in pending:
                task.cancel()
    return 0


async def _start_extender(settings: Settings, tenants: Any, api: Any, stop: asyncio.Event,
                          running: contextlib.AsyncExitStack, *,
                          dry_run: bool) -> tuple[asyncio.Task[Any], Any]:
    """The extender's feeds and HTTP server, stopped when ``running`` closes; its readiness task
    and the Prometheus registry its ``/metrics`` serves."""
    from gpumeter.infra.grants import GrantsReader
    from quota.grants import fold
    from scheduler_hooks.cluster.feeds import (
        Feed,
        GrantsFeed,
        KafkaFeed,
        TenantsFileFeed,
        kube_feeds,
        loop_poster,
        start_all,
        stop_all,
    )
    from scheduler_hooks.cluster.state import HooksState
    from scheduler_hooks.extender.server import HooksServer, freeze_heap, server_ssl_context

    hooks = settings.hooks
    ssl_context = server_ssl_context(hooks.tls_cert, hooks.tls_key, hooks.client_ca)
    state = HooksState(tenants)
    post = loop_poster(asyncio.get_running_loop())
    feeds: list[Feed] = [*kube_feeds(api, state, post),
                         KafkaFeed(settings.kafka, state, post, client_id=hooks.group)]
    if settings.tenants is not None:
        feeds.append(TenantsFileFeed(settings.tenants, state, post,
                                     every_seconds=settings.quota.reload_seconds))
        feeds.append(GrantsFeed(GrantsReader(settings.clickhouse.connection_dsn(), fold), state, post,
                                every_seconds=settings.quota.grants_poll_seconds))
    server = HooksServer(state, hooks.listen, ssl_context=ssl_context,
                         keepalive_seconds=hooks.keepalive_seconds)
    try:
        await server.start()
    except OSError as exc:
        raise Failure(f"cannot listen on {hooks.listen}: {exc.strerror or exc}") from None
    running.push_async_callback(server.stop)
    start_all(feeds)
    running.push_async_callback(asyncio.to_thread, stop_all, feeds)
    print(f"gpumeter hooks: extender on {server.url}{' (actuator dry run)' if dry_run else ''}; "
          f"loading {', '.join(state.waiting_for)}", file=sys.stderr, flush=True)
    return (asyncio.create_task(_announce_ready(state, stop, freeze_heap), name="readiness"),
            server.metrics.registry)


async def _actuate(settings: Settings, api: Any, stop: asyncio.Event, *, dry_run: bool,
                   registry: Any = None) -> None:
    """The actuator during each term of leadership of the Lease, until ``stop``; ``registry``:
    where its Prometheus series go (None: nowhere served, ``--role actuator`` has no listener)."""
    from kubernetes import client as k8s

    from scheduler_hooks.actuator import leader
    from scheduler_hooks.actuator.service import Actuator, untrusted_events_counter

    hooks = settings.hooks
    timings = leader.LeaseTimings(hooks.lease_duration_seconds, hooks.renew_deadline_seconds,
                                  hooks.retry_period_seconds)
    leases = leader.LeaseClient(k8s.CoordinationV1Api(api), hooks.lease_namespace, hooks.lease_name,
                         request_timeout=hooks.renew_deadline_seconds)
    elector = leader.LeaderElector(leases, leader.default_identity(), timings)
    untrusted = untrusted_events_counter(registry)  # one series across terms
    where = f"{hooks.lease_namespace}/{hooks.lease_name}"
    print(f"gpumeter hooks: actuator {elector.identity} waiting for lease {where}"
          f"{' (dry run)' if dry_run else ''}", file=sys.stderr, flush=True)

    def said(leading: bool) -> None:
        if leading:
            print(f"gpumeter hooks: actuator {elector.identity} holds lease {where}: acting",
                  file=sys.stderr, flush=True)
        elif not stop.is_set():
            print(f"gpumeter hooks: actuator {elector.identity} lost lease {where}: stopped acting, "
                  "trying to take it again", file=sys.stderr, flush=True)

    async def term(ended: asyncio.Event) -> None:
        # A fresh actuator each term: nothing decided in an earlier term is trusted, it starts from
        # the committed offsets and the pods' annotations as any successor does.
        actuator = Actuator.from_settings(settings, dry_run=dry_run, api=api, untrusted=untrusted,
                                          may_act=elector.holding, instance=elector.identity)
        await actuator.run(ended)

    await leader.lead(elector, term, stop, on_change=said)


def _close_quietly(api: Any) -> None:
    with contextlib.suppress(Exception):
        api.close()


async def _announce_ready(state: Any, stop: asyncio.Event, settle: Any) -> None:
    while not state.ready:
        if stop.is_set():
            return
        await asyncio.sleep(READY_POLL_SECONDS)
    settle()
    print(f"gpumeter hooks: ready ({state.node_count} nodes with placement, "
          f"{len(state.blocked)} tenants blocked)", file=sys.stderr, flush=True)
