"""A local certificate authority for `automqctl cluster up --tls` (the `cryptography`
package): `generate_ca_and_server_cert` writes into a directory `ca.pem` (the CA certificate
clients trust), `ca.key`, `server.pem` (the broker certificate + the CA) and `server.key`
(keys mode 0600). The server certificate is valid for the given IP addresses and DNS names."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

CERT_VALIDITY_DAYS = 825


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    """From 5 minutes ago (clocks differ a little) for CERT_VALIDITY_DAYS."""
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=CERT_VALIDITY_DAYS)


def _leaf_cert(common_name: str, issuer, ca_key, usage, valid: tuple, san: list | None = None):
    """A fresh key and a certificate of CN `common_name` for `usage` (an extended key usage
    OID), valid `valid`, for the subject alternative names `san` (None: none), signed by the
    CA `issuer` with `ca_key`: (key, certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
    )
    if san is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def generate_ca_and_server_cert(
    directory: Path, ips: list[str], dns_names: list[str], common_name: str = "automq broker"
) -> dict[str, Path]:
    """Create a CA and a server certificate it signs; the paths by role."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    valid = _validity()

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "automq local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    san = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    san += [x509.DNSName(name) for name in dns_names]
    key, cert = _leaf_cert(
        common_name, ca_name, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, valid, san
    )

    pem = serialization.Encoding.PEM
    private = serialization.PrivateFormat.PKCS8
    paths = {
        "ca_cert": directory / "ca.pem",
        "ca_key": directory / "ca.key",
        "server_cert": directory / "server.pem",
        "server_key": directory / "server.key",
    }
    none = serialization.NoEncryption()
    _write(paths["ca_key"], ca_key.private_bytes(pem, private, none), 0o600)
    _write(paths["server_key"], key.private_bytes(pem, private, none), 0o600)
    _write(paths["ca_cert"], ca_cert.public_bytes(pem), 0o644)
    _write(paths["server_cert"], cert.public_bytes(pem) + ca_cert.public_bytes(pem), 0o644)
    return paths


def generate_client_cert(
    directory: Path, common_name: str, name: str, out: Path | None = None
) -> dict[str, Path]:
    """A client certificate for mutual TLS (`ssl.client.auth=required`), signed by the CA
    in `directory` (ca.pem, ca.key): `<name>.pem` (certificate + CA) and `<name>.key`
    (0600) in `out` (default `directory`). Its CN is the principal brokers see:
    "User:<common_name>"."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_pem = (directory / "ca.pem").read_bytes()
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    key, cert = _leaf_cert(
        common_name, ca_cert.subject, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH, _validity()
    )
    pem = serialization.Encoding.PEM
    out = directory if out is None else out
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {"cert": out / f"{name}.pem", "key": out / f"{name}.key"}
    _write(
        paths["key"],
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    _write(paths["cert"], cert.public_bytes(pem) + ca_pem, 0o644)
    return paths
