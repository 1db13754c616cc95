"""The real extender server (scheduler_hooks.extender.server) on a free loopback port, in a thread.

Not a fake: the aiohttp app, the state and the feeds are the production ones; this only gives
them an event loop of their own so synchronous tests can talk real HTTP to them. State
mutations go through ``call`` so they run on the loop thread, as the feeds' do in production.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpumeter.core.tenants import TenantsFile
from scheduler_hooks.cluster.feeds import Feed, loop_poster, start_all, stop_all
from scheduler_hooks.cluster.state import HooksState
from scheduler_hooks.extender.server import DEFAULT_KEEPALIVE_SECONDS, HooksServer

T = TypeVar("T")


class LiveHooks:
    """``start()`` -> serving on ``port``; ``stop()`` stops feeds, server and loop."""

    def __init__(self, tenants: TenantsFile | None = None, *, ssl_context: ssl.SSLContext | None = None,
                 listen: str = "127.0.0.1:0", keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="live-hooks", daemon=True)
        self._thread.start()
        self.state: HooksState = self.call(lambda: HooksState(tenants))
        self.server = HooksServer(self.state, listen, ssl_context=ssl_context,
                                  keepalive_seconds=keepalive_seconds)
        self.feeds: list[Feed] = []
        self.post = loop_poster(self.loop)

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn()`` on the loop thread (where the state lives) and return its result."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def start(self) -> LiveHooks:
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    def add_feeds(self, feeds: Sequence[Feed]) -> None:
        self.feeds.extend(feeds)
        start_all(feeds)

    def stop(self) -> None:
        stop_all(self.feeds)
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, *,
                context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
        """One real HTTP(S) request on a fresh connection: (status, body)."""
        if context is not None:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=30, context=context)
        else:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def post_json(self, path: str, document: Any) -> tuple[int, Any]:
        status, body = self.request("POST", path, json.dumps(document).encode(),
                                    {"Content-Type": "application/json"})
        return status, json.loads(body)
