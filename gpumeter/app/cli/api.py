"""`gpumeter api`: the tenant invoice API (contract 7) on uvicorn, at api.listen."""

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

    from pricing.http.app import create_app
    from pricing.http.auth import Tokens
    from pricing.issue import billing

    listen = args.listen or settings.api.listen
    host, _, port_text = listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--listen must be HOST:PORT, got {listen!r}")
    tokens = Tokens(settings.api.tokens)
    if settings.api.tokens is None:
        print("gpumeter api: no tokens file (api.tokens): every request but /healthz gets 401",
              file=sys.stderr)
    # Requests run on a thread pool and share one client: without a session, concurrent
    # queries on it are allowed (a session would serialize them, or refuse them as locked).
    clickhouse_connect.common.set_setting("autogenerate_session_id", False)
    with billing(settings) as context:
        app = create_app(context, tokens)
        print(f"gpumeter api listening on http://{listen}", flush=True)
        uvicorn.run(app, host=host, port=int(port_text), log_level="warning", access_log=False)
    return 0
