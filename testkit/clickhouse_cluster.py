"""A two-shard ClickHouse cluster on this machine, from chdb's served engine (contract 9).

Two chserver processes, each a shard: both know cluster ``gpumeter_cluster`` (``remote_servers``:
shard 1 = the first process's TCP port, shard 2 = the second's) and have ``{shard}`` and
``{replica}`` macros, and both listen on TCP, so a ``Distributed`` table on either reaches the
``_local`` tables of both (docs/operations.md, "ClickHouse clusters").

What chdb cannot do, and what stands in for it here (../shared/reference/cluster-facts.md):

- chdb's LocalServer runs no DDL worker, so ``ON CLUSTER`` is refused. ``DdlWorkerProxy`` plays
  that worker's part: an HTTP proxy in front of shard 1 that forwards every request unchanged,
  except a statement with ``ON CLUSTER <cluster>``, which it runs on every node with that clause
  taken out (what the DDL worker does on each host).
- A Replicated* table accepts DDL but never an insert (no interserver listener), so the same
  proxy creates the never-sharded tables (invoice ledger, invoices, ``schema_migrations``,
  ``schema_lock``, ``insight_runs``) with the plain engine of their Replicated* form, and a
  ``non_replicated_deduplication_window`` for their ``replicated_deduplication_window``. They
  are then one-replica sets on each node; every reader and writer here goes through shard 1,
  as it would through one replica. Replication itself stays untested on this machine
  (docs/contracts.md, Known gaps); point GPUMETER_TEST_CLICKHOUSE_DSN at a real cluster for it.

Sharded tables, Distributed inserts and reads, ``GLOBAL IN``, ``FINAL`` on each shard and
``_block_number`` across shards are the real engine's.
"""

from __future__ import annotations

import http.client
import re
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpumeter.app.runtime.chserver import LocalClickHouse
from gpumeter.infra.tables import Topology

CLUSTER = "gpumeter_cluster"
KEEPER = "  <zookeeper><implementation>testkeeper</implementation></zookeeper>\n"

_ON_CLUSTER = re.compile(r"\s+ON\s+CLUSTER\s+`?(\w+)`?", re.IGNORECASE)
_REPLICATED_ENGINE = re.compile(r"Replicated(\w*MergeTree)\(\s*'[^']*'\s*,\s*'[^']*'\s*(?:,\s*)?")
_DATABASE_DDL = re.compile(r"^\s*(CREATE|DROP)\s+DATABASE\b", re.IGNORECASE)
_REPLICATED_WINDOW = re.compile(r"(?<!non_)replicated_deduplication_window")


def macros(shard: int, replica: str = "r1") -> str:
    return f"  <macros><shard>{shard:02d}</shard><replica>{replica}</replica></macros>\n"


def remote_servers(tcp_ports: list[int], databases: list[str] | None = None) -> str:
    """``CLUSTER`` with one shard per port; ``databases`` gives each shard a default_database."""
    shards = "".join(
        "<shard><replica><host>127.0.0.1</host>"
        f"<port>{port}</port>"
        + (f"<default_database>{databases[n]}</default_database>" if databases else "")
        + "</replica></shard>"
        for n, port in enumerate(tcp_ports))
    return f"  <remote_servers><{CLUSTER}>{shards}</{CLUSTER}></remote_servers>\n"


def as_ddl_worker_runs_it(statement: str, cluster: str) -> str | None:
    """``statement`` as each node runs it (ON CLUSTER taken out; Replicated* engines made plain,
    see the module's docstring); None when it is not ON CLUSTER ``cluster``."""
    match = _ON_CLUSTER.search(statement)
    if match is None or match.group(1) != cluster:
        return None
    local = statement[:match.start()] + statement[match.end():]
    local = _REPLICATED_ENGINE.sub(lambda m: f"{m.group(1)}(", local).replace("MergeTree()", "MergeTree")
    return _REPLICATED_WINDOW.sub("non_replicated_deduplication_window", local)


class DdlWorkerProxy:
    """HTTP proxy in front of ``nodes[0]`` that fans ON CLUSTER statements out to every node."""

    def __init__(self, nodes: list[tuple[str, int]], cluster: str = CLUSTER) -> None:
        self.nodes = nodes
        self.cluster = cluster
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy.handle(self)

            def do_POST(self) -> None:
                proxy.handle(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> DdlWorkerProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        body = _read_body(request)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length", "transfer-encoding", "connection")}
        path, statement, in_query = _statement(request.path, body, headers)
        local = as_ddl_worker_runs_it(statement, self.cluster) if statement is not None else None
        if local is None:
            answer = _forward(self.nodes[0], request.command, request.path, body, headers)
        else:
            # The DDL worker runs a statement in the initiator's database, but a database's own
            # CREATE or DROP outside of it (it may not exist on that node yet).
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query, keep_blank_values=True)
            if _DATABASE_DDL.match(local):
                query.pop("database", None)
            if in_query:
                query["query"] = [local]
            parts = urllib.parse.urlsplit(path)
            target = parts._replace(query=urllib.parse.urlencode(query, doseq=True)).geturl()
            answers = [_forward(node, request.command, target, body if in_query else local.encode(), headers)
                       for node in self.nodes]
            failed = [a for a in answers if a[0] != 200]
            answer = failed[0] if failed else answers[0]
        status, reply_headers, data = answer
        request.send_response(status)
        for key, value in reply_headers:
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                request.send_header(key, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)


def _read_body(request: BaseHTTPRequestHandler) -> bytes:
    if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(request.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while request.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(request.rfile.read(size))
            request.rfile.readline()
    length = int(request.headers.get("Content-Length") or 0)
    return request.rfile.read(length) if length else b""


def _statement(path: str, body: bytes, headers: dict[str, str]) -> tuple[str, str | None, bool]:
    """The request's SQL: the ``query`` parameter (an insert carries its data in the body), else
    the body when it is plain text. The flag says which."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query")
    if query:
        return path, query[0], True
    if "content-encoding" in {k.lower() for k in headers} or "multipart" in headers.get(
            "Content-Type", headers.get("content-type", "")):
        return path, None, False
    try:
        return path, body.decode(), False
    except UnicodeDecodeError:
        return path, None, False


def _forward(node: tuple[str, int], method: str, path: str, body: bytes, headers: dict[str, str]
             ) -> tuple[int, list[tuple[str, str]], bytes]:
    connection = http.client.HTTPConnection(*node, timeout=600)
    try:
        connection.request(method, path, body=body or None, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


@dataclass
class TwoShards:
    """The running cluster: ``url`` (the proxy, no database) is what a DSN points at."""

    nodes: list[LocalClickHouse]
    proxy: DdlWorkerProxy
    topology: Topology

    @property
    def url(self) -> str:
        return self.proxy.url

    def node_urls(self) -> list[str]:
        return [node.url for node in self.nodes]


def two_shard_nodes(home: Path, ports: list[tuple[int, int]]) -> list[LocalClickHouse]:
    """The two chserver processes (not started): ``ports`` = [(http, tcp), (http, tcp)]."""
    cluster = remote_servers([tcp for _, tcp in ports])
    return [LocalClickHouse(home / f"shard{n + 1}", "127.0.0.1", http_port, tcp_port,
                            config_fragment=cluster + macros(n + 1), listen_tcp=True)
            for n, (http_port, tcp_port) in enumerate(ports)]


@contextmanager
def two_shards(home: Path, ports: list[tuple[int, int]]) -> Iterator[TwoShards]:
    nodes = two_shard_nodes(home, ports)
    started: list[LocalClickHouse] = []
    proxy: DdlWorkerProxy | None = None
    try:
        for node in nodes:
            node.start(timeout=90)
            started.append(node)
        proxy = DdlWorkerProxy([(node.host, node.port) for node in nodes]).start()
        yield TwoShards(nodes, proxy, Topology(CLUSTER, sharded=True))
    finally:
        if proxy is not None:
            proxy.stop()
        for node in started:
            node.stop()
