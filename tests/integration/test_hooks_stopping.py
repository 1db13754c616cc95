"""An extender replica stopping by choice (rolling update, scale-in): what is in flight finishes.

kube-scheduler keeps connections to the extender alive and may be halfway through sending a
filter call when the replica is told to stop. The chart's preStop sleep keeps the replica serving
while its endpoint is withdrawn; after that, stopping must refuse new connections but still answer
the call whose body is arriving. The server here is the production aiohttp app on loopback
(testkit.live_hooks); the request is written byte by byte on a raw socket so the stop lands between
its headers and the end of its body.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest

from testkit.live_hooks import LiveHooks
from tests.integration.test_hooks_http import NODES, TENANTS, load, pod

pytestmark = pytest.mark.integration


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # The listener closed while this connection sat in its backlog: the kernel reset it, the
        # server never took it. As much a refusal as a closed port.
        return True


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length (what aiohttp sends for these answers)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(int(line.split(":", 1)[1]) for line in lines[1:]
                  if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of the response body"
        body += chunk
    return status, body[:length]


def stop_with_a_call_in_flight(stoppers: int, *, hang_up: bool = False) -> tuple[int | None, Any, list[Any]]:
    """Send half of a filter call, begin ``stoppers`` concurrent stops of the replica, wait until it
    refuses new connections, then send the rest and read the answer, or with ``hang_up`` close the
    connection instead (the scheduler gave up): (status, answer, what each stop returned)."""
    live = LiveHooks(TENANTS).start()
    live.call(lambda: load(live.state))
    port = live.port
    body = json.dumps({"Pod": pod(), "NodeNames": NODES}).encode()
    half = len(body) // 2
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /kube/filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:half])
            # The server must have the call in hand before it is told to stop: /healthz answering on
            # a second connection means the loop has run past this connection's headers.
            assert live.request("GET", "/healthz")[0] == 200
            stopping = [asyncio.run_coroutine_threadsafe(live.server.stop(), live.loop)
                        for _ in range(stoppers)]
            deadline = time.monotonic() + 20
            while not refuses_connections(port):
                assert time.monotonic() < deadline, "the stopping replica still accepts new connections"
                time.sleep(0.05)
            assert not any(stop.done() for stop in stopping), \
                "the server finished stopping with a call still in flight"

            if hang_up:
                status, decided = None, None
            else:
                sock.sendall(body[half:])
                status, answer = read_response(sock)
                decided = json.loads(answer)
        return status, decided, [stop.result(30) for stop in stopping]
    finally:
        live.stop()  # the server's stop is a no-op once done


def test_a_filter_call_arriving_while_the_replica_stops_is_answered_and_new_connections_are_refused() -> None:
    status, decided, _ = stop_with_a_call_in_flight(1)

    assert status == 200
    # The same answer a running replica gives (test_hooks_http.test_filter_node_names_mode):
    # every node that fits passes, l40s-b (one free GPU) fails, nothing is unresolvable.
    assert decided["NodeNames"] == ["h100-a", "l40s-a", "h100-b", "mystery"]
    assert list(decided["FailedNodes"]) == ["l40s-b"]
    assert decided["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("hang_up", [False, True], ids=["call-answered", "caller-hangs-up"])
def test_a_second_stop_while_the_first_waits_for_a_call_waits_for_it_and_fails_nothing(hang_up: bool) -> None:
    # A signal handler and an exit stack may both stop the replica; the second stop must not tear
    # the server down under the first. aiohttp's cleanup is not reentrant: once the last connection
    # is gone (the caller hung up) the first cleanup ends between two steps of the second.
    status, decided, results = stop_with_a_call_in_flight(2, hang_up=hang_up)

    assert results == [None, None]
    if not hang_up:
        assert status == 200
        assert decided["NodeNames"] == ["h100-a", "l40s-a", "h100-b", "mystery"]
