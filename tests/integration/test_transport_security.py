"""Transport security of the invoice API and the hooks (issue 31, point 5; contracts 6 and 7).

- Certificates rotate in place: a client keeps calling over HTTPS while the test replaces the
  served certificate (first with a half-written file, then a new CA-signed pair written one file
  at a time) and the client CA; the client sees the new certificate's serial without a restart,
  and no call fails but the one refused by design (a client certificate of the retired CA).
- The API limits requests per token: a burst beyond it is 429 with Retry-After, another token is
  untouched, and after Retry-After seconds the token is served again; unknown tokens are limited
  per client address.
- An idle keep-alive connection is closed by the server after its configured idle time.

Everything is the real server: `gpumeter api` as a subprocess on real ClickHouse, the extender's
aiohttp server (testkit.live_hooks). Certificates are made here (testkit.certs).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509

from gpumeter.core.settings import Settings, settings_env
from scheduler_hooks.extender.server import server_ssl_context
from testkit.certs import CertificateAuthority, Issued
from testkit.live_hooks import LiveHooks
from tests.services import REPO, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.security]

WAIT = 60.0


# -- certificates ------------------------------------------------------------------------------


@dataclass
class Pki:
    server_ca: CertificateAuthority
    client_ca_old: CertificateAuthority
    client_ca_new: CertificateAuthority
    first: Issued  # the server certificate served at start
    second: Issued  # the one rotated in
    client_old: Issued  # a client certificate of the CA retired by the rotation
    client_new: Issued
    served: Path  # what the server is configured with: tls.crt, tls.key, ca.crt

    @property
    def cert(self) -> Path:
        return self.served / "tls.crt"

    @property
    def key(self) -> Path:
        return self.served / "tls.key"

    @property
    def client_ca(self) -> Path:
        return self.served / "ca.crt"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    server_ca = CertificateAuthority(tmp_path / "server-ca", "server CA")
    client_ca_old = CertificateAuthority(tmp_path / "client-ca-old", "client CA old")
    client_ca_new = CertificateAuthority(tmp_path / "client-ca-new", "client CA new")
    made = Pki(
        server_ca, client_ca_old, client_ca_new,
        first=server_ca.issue("server", file_stem="first"),
        second=server_ca.issue("server", file_stem="second"),
        client_old=client_ca_old.issue("scheduler", server=False),
        client_new=client_ca_new.issue("scheduler", server=False),
        served=tmp_path / "served",
    )
    made.served.mkdir()
    shutil.copyfile(made.first.certificate, made.cert)
    shutil.copyfile(made.first.key, made.key)
    shutil.copyfile(client_ca_old.certificate, made.client_ca)
    return made


def serial(issued: Issued) -> int:
    return x509.load_pem_x509_certificate(issued.certificate.read_bytes()).serial_number


def client_context(pki: Pki, identity: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.server_ca.certificate))  # verifies the server
    if identity is not None:
        context.load_cert_chain(identity.certificate, identity.key)
    return context


def https_call(port: int, context: ssl.SSLContext, path: str = "/healthz") -> int:
    """One GET on a fresh connection (a new handshake): the serial of the certificate served."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    try:
        connection.connect()
        assert isinstance(connection.sock, ssl.SSLSocket)
        served = connection.sock.getpeercert(binary_form=True)
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
    finally:
        connection.close()
    assert served is not None
    return x509.load_der_x509_certificate(served).serial_number


@dataclass
class Caller:
    """Calls ``port`` over HTTPS in a thread, one new connection per call, until stopped; the
    identity (client certificate) may change between calls."""

    port: int
    pki: Pki
    identity: Issued | None
    seen: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Caller:
        self._thread = threading.Thread(target=self._run, name="https-caller", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.seen.append(https_call(self.port, client_context(self.pki, self.identity)))
            except Exception as exc:  # recorded: the test asserts there are none
                self.failures.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)

    def more_calls(self, count: int = 3) -> None:
        """Wait until ``count`` more calls have succeeded (each one a handshake after now)."""
        target = len(self.seen) + count
        wait_until(lambda: len(self.seen) >= target or self.failures, WAIT, f"{count} more HTTPS calls")
        assert not self.failures, self.failures

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def refused(port: int, context: ssl.SSLContext) -> bool:
    try:
        https_call(port, context)
    except (ssl.SSLError, ConnectionError):
        return True
    return False


def rotate_while_calling(port: int, pki: Pki, client_ca: bool) -> None:
    """The rotation scenario against a server on ``port`` serving ``pki.served``."""
    caller = Caller(port, pki, pki.client_old if client_ca else None).start()
    try:
        caller.more_calls()
        assert set(caller.seen) == {serial(pki.first)}

        # A half-written certificate is not served: the old pair stays.
        pki.cert.write_bytes(pki.second.certificate.read_bytes()[:200])
        caller.more_calls()
        # The new pair written one file at a time: the new certificate beside the old key
        # does not load either, then the key completes it.
        shutil.copyfile(pki.second.certificate, pki.cert)
        caller.more_calls()
        shutil.copyfile(pki.second.key, pki.key)
        wait_until(lambda: caller.seen[-1] == serial(pki.second) or caller.failures, WAIT,
                   "the client sees the rotated certificate")
        assert not caller.failures, caller.failures
        before = caller.seen.index(serial(pki.second))
        assert set(caller.seen[:before]) == {serial(pki.first)}
        caller.more_calls()
        assert set(caller.seen[before:]) == {serial(pki.second)}  # never the old one again
        if not client_ca:
            return

        # Client CA rotation: first both CAs, the client moves to its new certificate, then the
        # old CA is dropped. Calls keep succeeding throughout; the old certificate is refused.
        pki.client_ca.write_bytes(pki.client_ca_old.certificate.read_bytes()
                                  + pki.client_ca_new.certificate.read_bytes())
        wait_until(lambda: https_call(port, client_context(pki, pki.client_new)), WAIT,
                   "a client certificate of the new CA accepted")
        caller.identity = pki.client_new
        caller.more_calls()
        pki.client_ca.write_bytes(pki.client_ca_new.certificate.read_bytes())
        wait_until(lambda: refused(port, client_context(pki, pki.client_old)), WAIT,
                   "a client certificate of the retired CA refused")
        caller.more_calls()
        assert refused(port, client_context(pki, None))  # and no certificate still refused
    finally:
        caller.stop()
    assert not caller.failures, caller.failures


# -- the API -----------------------------------------------------------------------------------


@dataclass
class RunningApi:
    process: subprocess.Popen[bytes]
    log: Path
    port: int

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def start_api(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., RunningApi]]:
    """``start(**api_settings)`` -> `gpumeter api` running on a free port with those settings,
    answering /healthz; stopped after the test."""
    started: list[RunningApi] = []

    def start(tokens: dict[str, str] | None = None, **api: object) -> RunningApi:
        configured = settings.model_copy(deep=True)
        for name, value in api.items():
            setattr(configured.api, name, value)
        if tokens:
            path = tmp_path / "tokens.yaml"
            path.write_text(json.dumps({"tokens": [
                {"sha256": hashlib.sha256(token.encode()).hexdigest(), "tenant": tenant}
                for tenant, token in tokens.items()]}))
            configured.api.tokens = path
        port = free_port()
        configured.api.listen = f"127.0.0.1:{port}"
        log = tmp_path / f"api-{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "gpumeter.app.cli", "api"],
                                       env=settings_env(configured), cwd=REPO, stdout=out,
                                       stderr=subprocess.STDOUT)
        running = RunningApi(process, log, port)
        started.append(running)
        wait_until(lambda: "listening on" in running.output() or process.poll() is not None, WAIT,
                   "gpumeter api listening")
        assert process.poll() is None, running.output()
        return running

    yield start
    for running in started:
        running.process.terminate()
        running.process.wait(timeout=30)


def test_api_serves_https_and_takes_a_rotated_certificate_and_client_ca_without_restart(
        start_api: Callable[..., RunningApi], pki: Pki) -> None:
    api = start_api(tls_cert=pki.cert, tls_key=pki.key, client_ca=pki.client_ca)
    assert f"https://127.0.0.1:{api.port}" in api.output()
    rotate_while_calling(api.port, pki, client_ca=True)
    assert "keeps serving" in api.output()  # the half-written pair was reported, not served
    assert api.process.poll() is None


def test_api_tls_needs_cert_and_key_together(settings: Settings, pki: Pki) -> None:
    from tests.services import run_cli

    settings.api.tls_cert = pki.cert
    result = run_cli(settings, "api", "--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2
    assert "api.tls_cert and api.tls_key must be set together" in result.stderr


# -- the hooks ---------------------------------------------------------------------------------


def test_hooks_take_a_rotated_certificate_and_client_ca_without_restart(pki: Pki) -> None:
    live = LiveHooks(ssl_context=server_ssl_context(pki.cert, pki.key, pki.client_ca)).start()
    try:
        rotate_while_calling(live.port, pki, client_ca=True)
    finally:
        live.stop()


def test_hooks_without_client_ca_take_a_rotated_certificate(pki: Pki) -> None:
    live = LiveHooks(ssl_context=server_ssl_context(pki.cert, pki.key, None)).start()
    try:
        rotate_while_calling(live.port, pki, client_ca=False)
    finally:
        live.stop()


def test_with_a_client_ca_no_session_is_resumed_past_a_ca_rotation(pki: Pki) -> None:
    """A resumed session skips the client certificate check: with a client CA the hooks speak
    TLS 1.3 only and send no session tickets, so every connection shows its certificate."""
    live = LiveHooks(ssl_context=server_ssl_context(pki.cert, pki.key, pki.client_ca)).start()
    try:
        old_tls = client_context(pki, pki.client_old)
        old_tls.maximum_version = ssl.TLSVersion.TLSv1_2
        assert refused(live.port, old_tls)
        context = client_context(pki, pki.client_old)
        with socket.create_connection(("127.0.0.1", live.port)) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as first:
            first.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert first.recv(12) == b"HTTP/1.1 200"
            session = first.session
        with socket.create_connection(("127.0.0.1", live.port)) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as second:
            second.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert second.recv(12) == b"HTTP/1.1 200"
            assert not second.session_reused
    finally:
        live.stop()


# -- keep-alive --------------------------------------------------------------------------------


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF), False while it is still open."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def idle_connection(port: int) -> socket.socket:
    """A connection that made one keep-alive request and then sits idle."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n")
    received = b""
    while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received
    return sock


def test_the_api_closes_an_idle_keep_alive_connection(start_api: Callable[..., RunningApi]) -> None:
    api = start_api(keepalive_seconds=1)
    with idle_connection(api.port) as sock:
        # An hour of keep-alive would hold it open far past this wait.
        wait_until(lambda: closed_by_server(sock), 30, "the API closes the idle connection")


def test_the_hooks_close_an_idle_keep_alive_connection() -> None:
    live = LiveHooks(keepalive_seconds=1).start()
    try:
        with idle_connection(live.port) as sock:
            wait_until(lambda: closed_by_server(sock), 30, "the hooks close the idle connection")
    finally:
        live.stop()


# -- rate limits ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def get(port: int, path: str, token: str | None) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def until_limited(port: int, token: str | None, most: int = 200) -> tuple[list[int], Answer]:
    """Calls as fast as possible until one is 429: the statuses before it and that answer."""
    statuses: list[int] = []
    for _ in range(most):
        answer = get(port, "/metrics", token)
        if answer.status == 429:
            return statuses, answer
        statuses.append(answer.status)
    raise AssertionError(f"no 429 after {most} calls: {statuses}")


def test_api_rate_limit_per_token_answers_429_with_retry_after(start_api: Callable[..., RunningApi]) -> None:
    tokens = {"team-a": "tok-a-91f2", "team-b": "tok-b-03aa"}
    api = start_api(tokens=tokens, rate_limit=2, rate_burst=5)
    served, limited = until_limited(api.port, tokens["team-a"])
    # At least the burst went through first, all served; the refill over the calls' own time adds few.
    assert len(served) >= 5 and set(served) == {200}
    # One request's worth at 2/s is half a second: whole seconds (RFC 9110), rounded up.
    retry_after = int(limited.headers["retry-after"])
    assert retry_after == 1
    assert json.loads(limited.body)["error"].startswith("rate limit")
    # Another token has a bucket of its own; /healthz is never limited.
    assert get(api.port, "/metrics", tokens["team-b"]).status == 200
    assert all(get(api.port, "/healthz", None).status == 200 for _ in range(20))
    time.sleep(retry_after)  # what a client is told to do; then it is served again
    assert get(api.port, "/metrics", tokens["team-a"]).status == 200


def test_api_unknown_tokens_are_401_then_limited_per_client_address(
        start_api: Callable[..., RunningApi]) -> None:
    tokens = {"team-a": "tok-a-91f2"}
    # One request every 4 s: the bucket does not refill between the calls below.
    api = start_api(tokens=tokens, rate_limit=0.25, rate_burst=5)
    unknown, limited = until_limited(api.port, "not-a-token")
    assert len(unknown) >= 5 and set(unknown) == {401}
    assert int(limited.headers["retry-after"]) >= 1
    # No token at all shares the address's bucket: limited at once.
    assert get(api.port, "/metrics", None).status == 429
    assert get(api.port, "/metrics", tokens["team-a"]).status == 200  # a valid token is not held back
