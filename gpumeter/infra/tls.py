"""Server TLS whose certificate, key and client CA are re-read when their files change.

Both HTTPS services (the hooks, contract 6; the invoice API, contract 7) serve from files an
operator or cert-manager replaces in place (a Kubernetes Secret volume swaps them atomically; a
hand copy writes one file, then the other). A certificate read once expires in place, and with
the extender's ``ignorable: false`` that stops all GPU scheduling.

How: the server is given one ``ssl.SSLContext`` (``ReloadingTLS.context``) for good. Its
``sni_callback`` runs at the ClientHello of every handshake (with or without SNI); it stats the
files and, when one changed, builds a fresh context from them and switches the connection to it
(``SSLSocket.context = ...``, OpenSSL's ``SSL_set_SSL_CTX``: the certificate, key and the
verify store of client certificates follow the new context). A fresh context rather than
loading into the old one, because a context can add trusted CAs but never drop one, and because
loading a certificate whose key is not written yet would leave the live context without a key.

A pair that does not load (half written, key not matching, not PEM) is reported in one log line
and the last good context keeps serving; the next change of any file is tried again.

Settings do not change at run time: whether a client certificate is required is fixed at start
(the verify mode stays the starting context's).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path

from gpumeter.core.config_files import ConfigError

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(paths: tuple[Path, ...]) -> Stamp:
    """Inode, modification time and size of each file (None while it is missing): a Secret
    volume's update swaps a symlink, so the inode changes even when the time does not."""
    stamps: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((stat.st_ino, stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


def _build(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """A server context from the files; OSError or ssl.SSLError when they do not load."""
    # A bare server context: create_default_context() would also trust the system CAs for
    # client certificates, letting any publicly signed certificate in.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # No TLS 1.3 session tickets: a resumed session skips the client certificate check, so a
    # ticket would outlive the rotation of the client CA that admitted it.
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=str(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
        # TLS 1.2 would still resume sessions from OpenSSL's server cache (which Python cannot
        # turn off) without checking the certificate again, for 5 minutes after its CA is
        # dropped. TLS 1.3 without tickets resumes nothing; Go (kube-scheduler) speaks it.
        context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


class ReloadingTLS:
    """``context``: hand it to the server once; every new handshake is served from the files as
    they are now (or as they last loaded)."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None, *, name: str = "tls") -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.name = name  # the settings' prefix, in messages ("hooks", "api")
        self._paths = (cert, key) if client_ca is None else (cert, key, client_ca)
        self._lock = threading.Lock()  # handshakes of a threaded server may race to reload
        self._stamp = _stamp(self._paths)
        try:
            self.context = _build(cert, key, client_ca)
        except (OSError, ssl.SSLError) as exc:  # at start the operator's error: exit 2
            raise ConfigError(f"{name} TLS: {self._describe(exc)}") from None
        self._current = self.context
        self.reloads = 0  # successful re-reads, for tests and logs
        self.context.sni_callback = self._on_hello

    def current(self) -> ssl.SSLContext:
        """The context new handshakes get: re-read first when a file changed."""
        stamp = _stamp(self._paths)
        if stamp == self._stamp:
            return self._current
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
            return self._current

    def _reload(self) -> None:
        try:
            fresh = _build(self.cert, self.key, self.client_ca)
        except (OSError, ssl.SSLError) as exc:
            log.error("%s TLS: %s; keeps serving the last certificate that loaded", self.name,
                      self._describe(exc))
            return
        self._current = fresh
        self.reloads += 1
        log.warning("%s TLS: certificate%s re-read from %s", self.name,
                    " and client CA" if self.client_ca is not None else "", self.cert)

    def _describe(self, exc: OSError | ssl.SSLError) -> str:
        files = f"certificate {self.cert} and key {self.key}"
        if self.client_ca is not None:
            files += f" with client CA {self.client_ca}"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"cannot load {files}: {reason}"

    def _on_hello(self, connection: ssl.SSLSocket | ssl.SSLObject, server_name: str | None,
                  context: ssl.SSLContext) -> None:
        try:
            current = self.current()
            if current is not context:
                connection.context = current
        except Exception:  # never fail a handshake over the reload itself: serve what loaded last
            log.exception("%s TLS: re-reading the certificate failed", self.name)


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None, *,
               name: str) -> ReloadingTLS | None:
    """TLS when ``cert`` and ``key`` are set (settings ``<name>.tls_cert``, ``<name>.tls_key``,
    ``<name>.client_ca``); None for plain HTTP. ConfigError names the settings at fault."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigError(f"{name}.client_ca needs {name}.tls_cert and {name}.tls_key")
        return None
    if cert is None or key is None:
        raise ConfigError(f"{name}.tls_cert and {name}.tls_key must be set together")
    return ReloadingTLS(cert, key, client_ca, name=name)
