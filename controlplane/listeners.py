"""Kafka listeners: parsing Kafka-style `listeners` / `listener.security.protocol.map`
specs into `BrokerEndpoint`s, and which listeners may start: one on a non-loopback address
needs authentication (SASL on a Kafka listener, the cluster secret on the controller API)
unless the operator says `allow_insecure`. Pure."""

from __future__ import annotations

import ipaddress
import re

from controlplane.records import BrokerEndpoint

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
MAX_LISTENERS = 16  # = requests.MAX_LISTENERS_PER_BROKER
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ENTRY = re.compile(r"^(?P<name>[^:/]+)://(?P<host>\[[^\]]*\]|[^:\[\]]*):(?P<port>\d{1,5})$")


class ListenerSpecError(ValueError):
    """An invalid listener spec; the message is one line for the operator."""


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
        "or set allow_insecure (`automqctl node run --allow-insecure`, only on a private "
        "network you trust)"
    )


def _name(raw: str) -> str:
    name = raw.strip()
    if not _NAME.match(name):
        raise ListenerSpecError(
            f"bad listener name {raw!r}: letters, digits, '_' and '-' only (at most 64)"
        )
    return name.upper()


def _protocol(raw: str, listener: str) -> str:
    protocol = raw.strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ListenerSpecError(
            f"listener {listener}: unknown security protocol {raw.strip()!r} "
            f"(one of {', '.join(SECURITY_PROTOCOLS)})"
        )
    return protocol


def parse_protocol_map(text: str | None) -> dict[str, str]:
    """`listener.security.protocol.map` ("INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL") -> {name:
    protocol}. Empty or None: {} (then listener names must be protocol names)."""
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        if item.count(":") != 1:
            raise ListenerSpecError(f"bad protocol map entry {item.strip()!r}: want NAME:PROTOCOL")
        raw_name, raw_protocol = item.split(":")
        name = _name(raw_name)
        if name in mapping:
            raise ListenerSpecError(f"listener {name} is mapped twice")
        mapping[name] = _protocol(raw_protocol, name)
    return mapping


def _resolve(name: str, mapping: dict[str, str]) -> str:
    if name in mapping:
        return mapping[name]
    if name in SECURITY_PROTOCOLS:
        return name
    raise ListenerSpecError(
        f"listener {name} has no security protocol: name it after one "
        f"({', '.join(SECURITY_PROTOCOLS)}) or map it (NAME:PROTOCOL)"
    )


def parse_listeners(
    text: str, protocol_map: str | None = None, default_host: str = "127.0.0.1"
) -> list[BrokerEndpoint]:
    """Kafka's `listeners` ("PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093", or named
    listeners with `protocol_map`) -> endpoints, in order (the first is the inter-broker
    listener). An empty host means `default_host`. Raises ListenerSpecError on an unknown
    protocol, a bad entry, or a duplicate name or port."""
    mapping = parse_protocol_map(protocol_map)
    items = [i.strip() for i in (text or "").split(",") if i.strip()]
    if not items:
        raise ListenerSpecError("no listeners given (e.g. PLAINTEXT://127.0.0.1:9092)")
    if len(items) > MAX_LISTENERS:
        raise ListenerSpecError(f"at most {MAX_LISTENERS} listeners, got {len(items)}")
    endpoints: list[BrokerEndpoint] = []
    for item in items:
        match = _ENTRY.match(item)
        if match is None:
            raise ListenerSpecError(f"bad listener {item!r}: want NAME://HOST:PORT")
        name = _name(match["name"])
        port = int(match["port"])
        if port > 65535:
            raise ListenerSpecError(f"listener {name}: port {port} is out of range")
        host = match["host"].strip("[]") or default_host
        endpoints.append(
            BrokerEndpoint(
                name=name, host=host, port=port, security_protocol=_resolve(name, mapping)
            )
        )
    check_unique(endpoints)
    return endpoints


def parse_advertised_listeners(text: str, listeners: list[BrokerEndpoint]) -> list[BrokerEndpoint]:
    """Kafka's `advertised.listeners` ("EXTERNAL://broker1.example.com:9093"): the address
    clients are told for some of `listeners` (by name; the protocol is the listener's).
    Returns every listener as advertised, in `listeners` order: one not named is advertised
    as it binds. Raises ListenerSpecError for an unknown name, a name given twice, or a
    wildcard address (0.0.0.0, ::) advertised."""
    by_name = {e.name.upper(): e for e in listeners}
    advertised: dict[str, BrokerEndpoint] = {}
    for item in (i.strip() for i in (text or "").split(",")):
        if not item:
            continue
        match = _ENTRY.match(item)
        if match is None:
            raise ListenerSpecError(f"bad advertised listener {item!r}: want NAME://HOST:PORT")
        name = _name(match["name"])
        if name not in by_name:
            raise ListenerSpecError(f"advertised listener {name} is not one of the listeners")
        if name in advertised:
            raise ListenerSpecError(f"advertised listener {name} is given twice")
        host, port = match["host"].strip("[]"), int(match["port"])
        if not host or port == 0 or port > 65535:
            raise ListenerSpecError(f"advertised listener {name} needs a host and a port")
        advertised[name] = by_name[name].model_copy(update={"host": host, "port": port})
    out = [advertised.get(e.name.upper(), e) for e in listeners]
    for e in out:
        if _is_wildcard(e.host):
            raise ListenerSpecError(
                f"listener {e.name} binds {e.host}: give it an address clients can reach "
                "in advertised listeners"
            )
    return out


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def parse_listener_kinds(text: str) -> list[tuple[str, str]]:
    """`cluster up --listeners` ("PLAINTEXT,SASL_SSL" or "INTERNAL:PLAINTEXT,EXTERNAL:SSL")
    -> [(name, protocol)] in order; ports are chosen by `cluster up`."""
    items = [i.strip() for i in (text or "").split(",") if i.strip()]
    if not items:
        raise ListenerSpecError("no listeners given (e.g. --listeners PLAINTEXT,SASL_SSL)")
    if len(items) > MAX_LISTENERS:
        raise ListenerSpecError(f"at most {MAX_LISTENERS} listeners, got {len(items)}")
    kinds: list[tuple[str, str]] = []
    for item in items:
        if item.count(":") > 1 or "/" in item:
            raise ListenerSpecError(f"bad listener {item!r}: want PROTOCOL or NAME:PROTOCOL")
        if ":" in item:
            raw_name, raw_protocol = item.split(":")
            name = _name(raw_name)
            kinds.append((name, _protocol(raw_protocol, name)))
        else:
            name = _name(item)
            kinds.append((name, _resolve(name, {})))
    names = [n for n, _ in kinds]
    duplicate = sorted({n for n in names if names.count(n) > 1})
    if duplicate:
        raise ListenerSpecError(f"duplicate listener name {duplicate[0]}")
    return kinds


def check_unique(endpoints: list[BrokerEndpoint]) -> None:
    """Listener names and (non-zero) ports are unique on one broker."""
    seen_names: set[str] = set()
    seen_ports: dict[int, str] = {}
    for e in endpoints:
        if e.name.upper() in seen_names:
            raise ListenerSpecError(f"duplicate listener name {e.name}")
        seen_names.add(e.name.upper())
        if e.port and e.port in seen_ports:
            raise ListenerSpecError(
                f"listeners {seen_ports[e.port]} and {e.name} both use port {e.port}"
            )
        seen_ports[e.port] = e.name


def listeners_error(
    endpoints: list[BrokerEndpoint],
    *,
    sasl_enabled: bool,
    tls_configured: bool,
    allow_insecure: bool = False,
    ssl_client_auth: bool = False,
) -> str | None:
    """Why these listeners must not start, or None: a SASL listener needs SASL users set up
    (`sasl_enabled`), an SSL one a certificate, and each listener on a non-loopback address
    authentication (SASL, or TLS with client certificates required) unless
    `allow_insecure`."""
    try:
        check_unique(endpoints)
    except ListenerSpecError as exc:
        return str(exc)
    for e in endpoints:
        if e.security_protocol in SASL_PROTOCOLS and not sasl_enabled:
            return f"listener {e.name} is {e.security_protocol} but SASL is not set up (--sasl)"
        if e.security_protocol in TLS_PROTOCOLS and not tls_configured:
            return (
                f"listener {e.name} is {e.security_protocol} but no TLS certificate is set (--tls)"
            )
        authenticated = e.security_protocol in SASL_PROTOCOLS or (
            e.security_protocol == "SSL" and ssl_client_auth
        )
        refused = insecure_listener_error(
            f"Kafka listener {e.name}", e.host, authenticated, allow_insecure
        )
        if refused:
            return refused
    return None
