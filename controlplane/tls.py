"""TLS contexts of the controller API (and the Kafka listener, which uses the same server
context): TLS 1.2+, the server's certificate chain; clients verify against the cluster's CA.
The certificates come from the operator or from `automqctl cluster up --tls` (cli/tls.py)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

CA_FILE_ENV = "AUTOMQ_CONTROLLER_CA_FILE"  # clients: verify the controller API with this CA


def server_ssl_context(cert_file: Path | str, key_file: Path | str) -> ssl.SSLContext:
    """A TLS 1.2+ server context with the server's certificate chain."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx


def client_ssl_context(ca_file: Path | str) -> ssl.SSLContext:
    """A TLS 1.2+ client context that trusts `ca_file` only and checks the host name."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def ca_file_from_env() -> str | None:
    return os.environ.get(CA_FILE_ENV) or None
