"""Certificates made in the test (``cryptography``): a CA, servers and clients it signs.

Nothing is fetched or committed: each test that needs TLS (Kafka's SASL_SSL listener, the
hooks' and the API's HTTPS) makes its own CA in its temporary directory.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    certificate: Path  # PEM certificate
    key: Path  # PEM private key, PKCS#8, unencrypted
    bundle: Path  # key then certificate in one PEM (what Kafka's PEM keystore reads)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CertificateAuthority:
    """A throwaway CA writing its files under ``directory``."""

    def __init__(self, directory: Path, name: str = "gpumeter test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name)).issuer_name(_name(name))
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.certificate = directory / f"{name.replace(' ', '-')}.pem"
        self.certificate.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, server: bool = True,
              hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), valid_for: timedelta = timedelta(days=1),
              file_stem: str | None = None) -> Issued:
        """A leaf certificate for a server (``hosts`` as subject alternative names) or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(self._certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + valid_for)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        stem = file_stem or common_name.replace(" ", "-")
        issued = Issued(self.directory / f"{stem}.crt", self.directory / f"{stem}.key",
                        self.directory / f"{stem}-bundle.pem")
        certificate_pem = certificate.public_bytes(serialization.Encoding.PEM)
        issued.certificate.write_bytes(certificate_pem)
        issued.key.write_bytes(_pkcs8(key))
        issued.key.chmod(0o600)
        issued.bundle.write_bytes(_pkcs8(key) + certificate_pem)
        return issued
