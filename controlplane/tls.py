"""TLS contexts of the controller API (and the Kafka listener, which uses the same server
context): TLS 1.2+, the server's certificate chain; clients verify against the cluster's CA.
The certificates come from the operator or from `automqctl cluster up --tls` (cli/tls.py)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

CA_FILE_ENV = "AUTOMQ_CONTROLLER_CA_FILE"  # clients: verify the controller API with this CA


CLIENT_AUTH_MODES = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_ssl_context(
    cert_file: Path | str,
    key_file: Path | str,
    client_auth: str = "none",
    client_ca_file: Path | str | None = None,
) -> ssl.SSLContext:
    """A TLS 1.2+ server context with the server's certificate chain. `client_auth`
    (Kafka's ssl.client.auth: none, requested, required) asks clients for a certificate
    signed by `client_ca_file`."""
    if client_auth not in CLIENT_AUTH_MODES:
        raise ValueError(f"client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_auth != "none":
        if client_ca_file is None:
            raise ValueError(f"ssl client auth {client_auth} needs the CA of client certificates")
        ctx.load_verify_locations(cafile=str(client_ca_file))
        ctx.verify_mode = CLIENT_AUTH_MODES[client_auth]
    return ctx


def client_ssl_context(ca_file: Path | str) -> ssl.SSLContext:
    """A TLS 1.2+ client context that trusts `ca_file` only and checks the host name."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def ca_file_from_env() -> str | None:
    return os.environ.get(CA_FILE_ENV) or None
