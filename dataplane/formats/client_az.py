"""A Kafka client's availability zone: from its `client.id` or its address (pure).

AutoMQ's convention is a query-string `client.id` such as
`automq_type=producer&automq_az=az2`; WarpStream's `warpstream_az=az2` is accepted too. A
broker may also map client address ranges (CIDR) to AZs. A client with neither is served as
without a zone router (the real leaders).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

AZ_KEYS = ("automq_az", "warpstream_az")
MAX_AZ_CHARS = 64
_AZ_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_CLIENT_ID_CHARS = 4096


def valid_az(name: str) -> bool:
    """Whether `name` can be an AZ name (letters, digits, '.', '-', '_'; at most 64)."""
    return 0 < len(name) <= MAX_AZ_CHARS and _AZ_RE.match(name) is not None


def az_from_client_id(client_id: str | None) -> str | None:
    """The AZ a `client.id` declares (`...&automq_az=az2&...`), or None.

    Pairs are separated by '&' (',' and ';' also accepted: some clients forbid '&'); the
    first recognised key with a valid value wins; a malformed value is ignored (the client
    is then served as one without an AZ, never refused).
    """
    if not client_id or "=" not in client_id:
        return None
    for pair in re.split(r"[&,;]", client_id[:MAX_CLIENT_ID_CHARS]):
        key, sep, value = pair.partition("=")
        if sep and key.strip().lower() in AZ_KEYS:
            value = value.strip()
            if valid_az(value):
                return value
    return None


@dataclass(frozen=True)
class CidrAzMap:
    """Client address ranges → AZ; the longest matching prefix wins. Immutable (thread-safe)."""

    networks: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = ()

    @classmethod
    def parse(cls, spec: Mapping[str, str]) -> CidrAzMap:
        """From `{"10.0.1.0/24": "az1", ...}`; raises ValueError naming a bad entry."""
        networks = []
        for cidr, az in spec.items():
            try:
                net = ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"invalid CIDR {cidr!r} in the client AZ map: {exc}") from None
            if not valid_az(az):
                raise ValueError(f"invalid AZ name {az!r} for {cidr} in the client AZ map")
            networks.append((net, az))
        networks.sort(key=lambda n: n[0].prefixlen, reverse=True)
        return cls(tuple(networks))

    def az_of(self, host: str) -> str | None:
        """The AZ of the most specific range holding `host`, or None."""
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return None
        for net, az in self.networks:
            if addr.version == net.version and addr in net:
                return az
        return None


# the client id of broker-to-broker requests (`kafka.interbroker.CLIENT_ID`: transaction
# markers, a proxy's forwarded ListOffsets / DeleteRecords): served as the real partition,
# whatever AZ the sending broker's address maps to
BROKER_CLIENT_ID = "automq-txn-coordinator"


def client_az(client_id: str | None, peer_host: str | None, cidrs: CidrAzMap) -> str | None:
    """A client's AZ: declared in its `client.id` first, else from its address, else None
    (a broker's own requests have none)."""
    if client_id == BROKER_CLIENT_ID:
        return None
    return az_from_client_id(client_id) or (cidrs.az_of(peer_host) if peer_host else None)
