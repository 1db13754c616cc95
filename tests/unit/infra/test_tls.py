"""Reloading server TLS (gpumeter.infra.tls) on certificate files made here; the handshakes
themselves are tests/integration/test_transport_security.py."""

from __future__ import annotations

import logging
import shutil
import ssl
from pathlib import Path

import pytest

from gpumeter.core.config_files import ConfigError
from gpumeter.infra.tls import ReloadingTLS, server_tls
from testkit.certs import CertificateAuthority

pytestmark = pytest.mark.security


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path / "ca")


def served(tmp_path: Path, ca: CertificateAuthority) -> ReloadingTLS:
    first = ca.issue("server", file_stem="first")
    shutil.copyfile(first.certificate, tmp_path / "tls.crt")
    shutil.copyfile(first.key, tmp_path / "tls.key")
    return ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key", name="api")


def test_unchanged_files_keep_the_context(tmp_path: Path, ca: CertificateAuthority) -> None:
    tls = served(tmp_path, ca)
    assert tls.current() is tls.context and tls.current() is tls.context
    assert tls.reloads == 0


def test_a_pair_that_does_not_load_keeps_the_last_good_one_with_one_log_line(
        tmp_path: Path, ca: CertificateAuthority, caplog: pytest.LogCaptureFixture) -> None:
    tls = served(tmp_path, ca)
    second = ca.issue("server", file_stem="second")
    caplog.set_level(logging.WARNING, "gpumeter.infra.tls")
    shutil.copyfile(second.certificate, tmp_path / "tls.crt")  # the key is still the old one
    assert tls.current() is tls.context
    assert tls.current() is tls.context  # tried once per change, not per handshake
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "keeps serving the last certificate" in errors[0]
    assert errors[0].startswith("api TLS: cannot load certificate")
    (tmp_path / "tls.key").unlink()  # missing: the same
    assert tls.current() is tls.context
    shutil.copyfile(second.key, tmp_path / "tls.key")
    fresh = tls.current()
    assert fresh is not tls.context and tls.reloads == 1
    assert fresh.minimum_version == ssl.TLSVersion.TLSv1_2 and fresh.verify_mode == ssl.CERT_NONE


def test_a_client_ca_makes_client_certificates_required(tmp_path: Path, ca: CertificateAuthority) -> None:
    issued = ca.issue("server")
    tls = server_tls(issued.certificate, issued.key, ca.certificate, name="hooks")
    assert tls is not None and tls.context.verify_mode == ssl.CERT_REQUIRED


def test_settings_at_fault_are_named(tmp_path: Path) -> None:
    assert server_tls(None, None, None, name="api") is None
    with pytest.raises(ConfigError, match=r"^api\.tls_cert and api\.tls_key must be set together$"):
        server_tls(tmp_path / "c", None, None, name="api")
    with pytest.raises(ConfigError, match=r"^hooks\.client_ca needs hooks\.tls_cert"):
        server_tls(None, None, tmp_path / "ca", name="hooks")
    with pytest.raises(ConfigError, match=r"^hooks TLS: cannot load certificate .* No such file"):
        server_tls(tmp_path / "c", tmp_path / "k", None, name="hooks")
