"""Which listeners may start: one on a non-loopback address needs authentication (SASL on
the Kafka listener, the cluster secret on the controller API) unless the operator says
`allow_insecure`. Pure."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def insecure_listener_error(
    what: str, host: str, authenticated: bool, allow_insecure: bool = False
) -> str | None:
    """Why the listener `what` on `host` must not start, or None if it may."""
    if authenticated or allow_insecure or is_loopback(host):
        return None
    return (
        f"refusing to serve {what} on {host} without authentication: enable it "
        "or set allow_insecure"
    )
