"""TLS for the Kafka listener (SSL / SASL_SSL): the server's `ssl.SSLContext`, the same as
the controller API's (controlplane/tls.py). The certificates come from the operator or from
`automqctl cluster up --tls` (cli/tls.py)."""

from __future__ import annotations

from controlplane.tls import server_ssl_context

__all__ = ["server_ssl_context"]
