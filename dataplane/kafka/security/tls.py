"""TLS for the Kafka listener (SSL / SASL_SSL): the server's `ssl.SSLContext`, the same as
the controller API's (controlplane/tls.py), optionally asking for client certificates
(Kafka's ssl.client.auth); on an SSL listener a client certificate's CN is the connection's
principal ("User:<CN>", for ACLs). The certificates come from the operator or from
`automqctl cluster up --tls` (cli/tls.py)."""

from __future__ import annotations

from typing import Any

from controlplane.tls import CLIENT_AUTH_MODES, server_ssl_context

__all__ = ["CLIENT_AUTH_MODES", "principal_of_certificate", "server_ssl_context"]


def principal_of_certificate(peercert: Any) -> str | None:
    """ "User:<CN>" of a verified client certificate (`SSLSocket.getpeercert()`'s dict), or
    None when there is none or it has no common name. Pure."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for attribute in rdn:
            if len(attribute) == 2 and attribute[0] == "commonName" and attribute[1]:
                return f"User:{attribute[1]}"
    return None
