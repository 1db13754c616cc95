"""The local ClickHouse server: chdb's ClickHouse engine serving ClickHouse's own HTTP interface.

This leans on an internal chdb API (pinned in pyproject: chdb==4.4.0), kept in this one
module. ``chdb._chdb.query(sql, "TabSeparated", path=DIR)`` runs ClickHouse's
LocalServer; inside that call ``SYSTEM START LISTEN HTTP`` opens the HTTP port from the
``config.xml`` in the working directory, and the listener lives while the call runs, so
the same call continues with a query that never ends. SIGTERM stops it; data persists.
Run it as its own process (`python -m gpumeter.app.runtime.chserver`): it works once per
process and not beside ``chdb.connect()``. It binds to loopback only, because the
built-in ``default`` user has no password.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpumeter.app.runtime.process import log_tail, read_pid, spawn, stop

PINNED_CHDB = "4.4.0"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# The never-ending query that keeps LocalServer, and so the listener, alive.
# max_block_size=1 keeps each sleep below ClickHouse's 3 s per-block limit.
SERVE_SQL = (
    "SYSTEM START LISTEN HTTP; "
    "SELECT sleepEachRow(1) FROM system.numbers SETTINGS max_block_size = 1 FORMAT Null"
)
# A cluster member also answers the native protocol: Distributed tables reach their shards by it.
LISTEN_TCP = "SYSTEM START LISTEN TCP; "


def config_xml(http_port: int, tcp_port: int, host: str, fragment: str = "") -> str:
    """The server's config; ``fragment`` adds elements of its own (tests of cluster DDL give it
    ``<zookeeper>``, ``<macros>`` and ``<remote_servers>``)."""
    return (
        "<clickhouse>\n"
        f"  <http_port>{http_port}</http_port>\n"
        f"  <tcp_port>{tcp_port}</tcp_port>\n"
        f"  <listen_host>{host}</listen_host>\n"
        f"{fragment}"
        "</clickhouse>\n"
    )


def self_test() -> None:
    """Fail with one clear line when this chdb cannot serve: wrong version or missing API."""
    try:
        import chdb
        from chdb import _chdb
    except ImportError as exc:
        raise SystemExit(
            f"chserver: chdb is not installed ({exc}); pip install chdb=={PINNED_CHDB}"
        ) from None
    version = getattr(chdb, "__version__", "unknown")
    if version != PINNED_CHDB:
        raise SystemExit(
            f"chserver: chdb {version} is installed, but the local server is verified with "
            f"chdb {PINNED_CHDB} only (it uses an internal API); install chdb=={PINNED_CHDB}"
        )
    if not callable(getattr(_chdb, "query", None)):
        raise SystemExit("chserver: chdb._chdb.query is missing; the local server cannot start")


def serve(data_path: Path, http_port: int, tcp_port: int, host: str, fragment: str = "",
          listen_tcp: bool = False) -> None:
    """Blocks for the life of the server. Must run in a process of its own."""
    if host not in LOOPBACK:
        raise SystemExit(f"chserver: refusing to listen on {host}: the default user has no password")
    self_test()
    from chdb import _chdb

    workdir = data_path.parent
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.xml").write_text(config_xml(http_port, tcp_port, host, fragment))
    import os

    os.chdir(workdir)  # LocalServer reads config.xml from the working directory
    print(f"chserver: serving {data_path} on http://{host}:{http_port}", flush=True)
    sql = (LISTEN_TCP if listen_tcp else "") + SERVE_SQL
    _chdb.query(sql, "TabSeparated", path=str(data_path))  # type: ignore[attr-defined]
    raise SystemExit("chserver: the serving query ended unexpectedly")


@dataclass(frozen=True)
class LocalClickHouse:
    home: Path  # data_dir/clickhouse
    host: str = "127.0.0.1"
    port: int = 8123
    tcp_port: int = 9000
    config_fragment: str = ""  # XML elements added to config.xml
    listen_tcp: bool = False  # also serve the native protocol on tcp_port (cluster members)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "clickhouse.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "clickhouse.log"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/ping", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 60.0) -> bool:
        """Start the server unless one answers; True when this call started it."""
        if self.answers():
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "gpumeter.app.runtime.chserver", "--path", str(self.home / "data"),
            "--host", self.host, "--port", str(self.port), "--tcp-port", str(self.tcp_port),
        ]
        if self.config_fragment:
            fragment = self.home / "config-fragment.xml"
            fragment.write_text(self.config_fragment)
            argv += ["--config-fragment", str(fragment)]
        if self.listen_tcp:
            argv.append("--listen-tcp")
        process = spawn(argv, self.log_file, self.pid_file, self.home)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.answers():
                return True
            if process.poll() is not None:
                raise RuntimeError(f"local ClickHouse server exited: {log_tail(self.log_file, 5)}")
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"local ClickHouse server did not answer on {self.url} within {timeout:.0f} s")

    def stop(self) -> bool:
        return stop(self.pid_file, timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve ClickHouse HTTP from chdb's engine (loopback only)")
    parser.add_argument("--path", type=Path, required=True, help="data directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--tcp-port", type=int, default=9000)
    parser.add_argument("--config-fragment", type=Path, help="a file of XML elements added to config.xml")
    parser.add_argument("--listen-tcp", action="store_true",
                        help="also serve the native protocol on --tcp-port (Distributed tables use it)")
    args = parser.parse_args(argv)
    fragment = args.config_fragment.read_text() if args.config_fragment else ""
    serve(args.path, args.port, args.tcp_port, args.host, fragment, args.listen_tcp)


if __name__ == "__main__":
    main()
