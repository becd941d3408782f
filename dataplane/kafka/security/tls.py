"""TLS for the Kafka listener (SSL / SASL_SSL): the server's `ssl.SSLContext`. The
certificates come from the operator or from `automqctl cluster up --tls` (cli/tls.py)."""

from __future__ import annotations

import ssl
from pathlib import Path


def server_ssl_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context with the broker's certificate chain."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx
