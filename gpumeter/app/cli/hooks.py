"""`gpumeter hooks [--dry-run]`: the scheduler extender HTTP service and the quota actuator.

One event loop runs the extender (contract 6), the actuator (evictions, Volcano queues) and
owns the extender's state; the feeds (Kubernetes watches, Kafka, the tenants file) read in
threads and hand values to the loop. SIGTERM or SIGINT stops everything cleanly.

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
from typing import Any

from gpumeter.app.cli.errors import Failure
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import load_tenants

log = logging.getLogger(__name__)

READY_POLL_SECONDS = 0.5
STOP_TIMEOUT_SECONDS = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="actuator records every decision and acts on none (default: hooks.dry_run)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    dry_run = bool(getattr(args, "dry_run", False) or settings.hooks.dry_run)
    return asyncio.run(serve(settings, dry_run=dry_run))


async def serve(settings: Settings, *, dry_run: bool, stop: asyncio.Event | None = None,
                api: Any = None) -> int:
    """Run until ``stop`` is set (or a signal); ``api`` overrides the Kubernetes client (tests)."""
    from kubernetes.config import ConfigException

    from scheduler_hooks.cluster.feeds import (
        Feed,
        KafkaFeed,
        TenantsFileFeed,
        kube_api_client,
        kube_feeds,
        loop_poster,
        start_all,
        stop_all,
    )
    from scheduler_hooks.cluster.state import HooksState
    from scheduler_hooks.extender.server import HooksServer, freeze_heap, server_ssl_context

    hooks = settings.hooks
    tenants = load_tenants(settings.tenants)  # a bad file is exit 2 before anything starts
    ssl_context = server_ssl_context(hooks.tls_cert, hooks.tls_key, hooks.client_ca)
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

    state = HooksState(tenants)
    post = loop_poster(loop)
    feeds: list[Feed] = [*kube_feeds(api, state, post),
                         KafkaFeed(settings.kafka, state, post, client_id=hooks.group)]
    if settings.tenants is not None:
        feeds.append(TenantsFileFeed(settings.tenants, state, post,
                                     every_seconds=settings.quota.reload_seconds))
    server = HooksServer(state, hooks.listen, ssl_context=ssl_context)
    try:
        await server.start()
    except OSError as exc:
        raise Failure(f"cannot listen on {hooks.listen}: {exc.strerror or exc}") from None
    start_all(feeds)
    print(f"gpumeter hooks: extender on {server.url}{' (actuator dry run)' if dry_run else ''}; "
          f"loading {', '.join(state.waiting_for)}", file=sys.stderr, flush=True)

    from scheduler_hooks.actuator.service import Actuator

    actuator = Actuator.from_settings(settings, dry_run=dry_run, registry=server.metrics.registry)
    tasks = [
        asyncio.create_task(actuator.run(stop), name="actuator"),
        asyncio.create_task(_announce_ready(state, stop, freeze_heap), name="readiness"),
    ]
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait([stopping, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done and tasks[0].exception() is not None:
            raise Failure(f"actuator failed: {tasks[0].exception()}")
        if not stopping.done():
            await stopping  # the actuator ended on its own: keep serving the extender
    finally:
        stop.set()
        _, pending = await asyncio.wait([*tasks, stopping], timeout=STOP_TIMEOUT_SECONDS)
        for task in pending:
            task.cancel()
        await asyncio.to_thread(stop_all, feeds)
        await server.stop()
        with contextlib.suppress(Exception):
            api.close()
    return 0


async def _announce_ready(state: Any, stop: asyncio.Event, settle: Any) -> None:
    while not state.ready:
        if stop.is_set():
            return
        await asyncio.sleep(READY_POLL_SECONDS)
    settle()
    print(f"gpumeter hooks: ready ({state.node_count} nodes with placement, "
          f"{len(state.blocked)} tenants blocked)", file=sys.stderr, flush=True)
