"""The tenant invoice API (contract 7) as an ASGI app (FastAPI); `gpumeter api` serves it with
uvicorn.

- Every request but ``/healthz`` carries ``Authorization: Bearer <token>``; a missing or unknown
  token is 401. A tenant token sees its own tenant only (access.py).
- A malformed period, format or paper is 400 with one reason: ``{"error": "..."}`` (errors.py).
- Invoices (routes_invoices.py: issued ones from the ledger through an in-process index and
  rendered-bytes cache, drafts from the hourly rollup) and month-to-date usage (routes_usage.py,
  the rollup).
- ``/metrics`` (any valid token: it holds request counts, no tenant data) and ``/openapi.json``.
- Requests per token are limited (ratelimit.py): beyond the limit 429 with ``Retry-After``.
  Requests without a valid token are limited per client address (a 401 flood is limited too);
  ``/healthz`` never is (probes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from pricing.http.access import Authorized
from pricing.http.auth import Tokens, digest
from pricing.http.documents import ERRORS
from pricing.http.errors import install_error_handlers
from pricing.http.ledger_mirror import LedgerMirror
from pricing.http.ratelimit import RateLimiter
from pricing.http.rendered import RenderedCache
from pricing.http.routes_invoices import invoice_routes
from pricing.http.routes_usage import usage_routes
from pricing.issue import Billing

log = logging.getLogger(__name__)


UNLIMITED_PATHS = frozenset({"/healthz"})


def create_app(context: Billing, tokens: Tokens, limiter: RateLimiter | None = None) -> FastAPI:
    """``limiter``: the requests each caller may make (None: unlimited)."""
    app = FastAPI(title="gpumeter invoice API", version="1",
                  description="Tenant invoices and month-to-date usage (DESIGN.md contract 7).",
                  openapi_url=None, docs_url=None, redoc_url=None)
    app.state.tokens = tokens
    registry = CollectorRegistry()
    requests = Counter("gpumeter_api_requests", "API requests by route and status", ["route", "status"],
                       registry=registry)
    latency = Histogram("gpumeter_api_request_seconds", "API request latency by route", ["route"],
                        registry=registry)
    install_error_handlers(app)

    # Added before _measure, so it runs inside it: its 429s are counted and timed too.
    @app.middleware("http")
    async def _limit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if limiter is None or request.url.path in UNLIMITED_PATHS:
            return await call_next(request)
        wait = limiter.take(_caller_key(request, tokens))
        if wait:
            return JSONResponse(
                {"error": f"rate limit: {limiter.rate:g} requests/s (burst {limiter.burst}); "
                          f"retry after {wait} s"},
                status_code=429, headers={"Retry-After": str(wait)})
        return await call_next(request)

    @app.middleware("http")
    async def _measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:  # answered as a 500 by Starlette; counted and logged here
            log.exception("request %s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": "internal error"}, status_code=500)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        requests.labels(route, str(response.status_code)).inc()
        latency.labels(route).observe(time.perf_counter() - started)
        return response

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}, 401: ERRORS[401], 429: ERRORS[429]})
    def metrics(_: Authorized) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", tags=["service"], responses={401: ERRORS[401], 429: ERRORS[429]},
             include_in_schema=True)
    def openapi(_: Authorized) -> dict[str, Any]:
        return app.openapi()

    app.include_router(invoice_routes(context, LedgerMirror(context.client), RenderedCache()))
    app.include_router(usage_routes(context))
    return app


def _caller_key(request: Request, tokens: Tokens) -> str:
    """The bucket a request counts against: its token when valid, else its client address."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token and tokens.caller(token) is not None:
        return "token:" + digest(token)
    return "address:" + (request.client.host if request.client is not None else "unknown")
