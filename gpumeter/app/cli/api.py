"""`gpumeter api`: the tenant invoice API (contract 7) on uvicorn, at api.listen.

HTTPS when api.tls_cert and api.tls_key are set (api.client_ca: client certificates required
too); the files are re-read when they change (gpumeter.infra.tls). Requests are limited per
token (api.rate_limit, api.rate_burst); idle keep-alive connections close after
api.keepalive_seconds.
"""

from __future__ import annotations

import argparse
import sys

from gpumeter.app.cli.errors import UsageError
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", help="HOST:PORT (default: api.listen, 127.0.0.1:8791)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    import clickhouse_connect.common
    import uvicorn

    from gpumeter.infra.tls import server_tls
    from pricing.http.app import create_app
    from pricing.http.auth import Tokens
    from pricing.http.ratelimit import RateLimiter
    from pricing.issue import billing

    api = settings.api
    listen = args.listen or api.listen
    host, _, port_text = listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--listen must be HOST:PORT, got {listen!r}")
    tls = server_tls(api.tls_cert, api.tls_key, api.client_ca, name="api")  # ConfigError: exit 2
    tokens = Tokens(api.tokens)
    if api.tokens is None:
        print("gpumeter api: no tokens file (api.tokens): every request but /healthz gets 401",
              file=sys.stderr)
    # Requests run on a thread pool and share one client: without a session, concurrent
    # queries on it are allowed (a session would serialize them, or refuse them as locked).
    clickhouse_connect.common.set_setting("autogenerate_session_id", False)
    with billing(settings) as context:
        app = create_app(context, tokens, RateLimiter(api.rate_limit, api.rate_burst))
        config = uvicorn.Config(
            app, host=host, port=int(port_text), log_level="warning", access_log=False,
            timeout_keep_alive=api.keepalive_seconds,
        )
        config.load()
        if tls is not None:  # uvicorn would build a context once from file names; ours re-reads them
            config.ssl = tls.context
        scheme = "http" if tls is None else "https"
        print(f"gpumeter api listening on {scheme}://{listen}", flush=True)
        uvicorn.Server(config).run()
    return 0
