"""A Kafka client's availability zone: from its `client.id`, its rack or its address (pure).

AutoMQ's convention is a query-string `client.id` such as
`automq_type=producer&automq_az=az2`; WarpStream's `warpstream_az=az2` is accepted too.
A consumer's `client.rack` (KIP-392: the rack id of its Fetch requests, v11+) comes next,
then the broker's map of client address ranges (CIDR) to AZs. A client with none of them
is served as without a zone router (the real leaders).
"""

from __future__ import annotations

import functools
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


MAX_CACHED_HOSTS = 4096  # client addresses whose AZ is remembered (per map)


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
        if not self.networks:
            return None  # no map: nothing to parse (every request asks)
        return self._az_of_address(host)

    @functools.lru_cache(maxsize=MAX_CACHED_HOSTS)  # noqa: B019 - immutable, few instances
    def _az_of_address(self, host: str) -> str | None:
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return None
        for net, az in self.networks:
            if addr.version == net.version and addr in net:
                return az
        return None


MAX_CIDR_SPEC_CHARS = 100_000


def parse_az_cidrs(spec: str) -> dict[str, str]:
    """`az1=10.0.0.0/16,az2=10.1.0.0/16,az2=10.2.0.0/16` (an AZ may repeat; as `cluster up
    --client-az-cidrs` takes it) as the broker config's map `{cidr: az}`; ValueError names
    a bad entry. An empty spec is an empty map."""
    if len(spec) > MAX_CIDR_SPEC_CHARS:
        raise ValueError(f"client AZ CIDRs: over {MAX_CIDR_SPEC_CHARS} characters")
    out: dict[str, str] = {}
    for item in (i.strip() for i in spec.split(",")):
        if not item:
            continue
        az, sep, cidr = (part.strip() for part in item.partition("="))
        if not sep or not az or not cidr:
            raise ValueError(f"client AZ CIDRs: {item!r} is not AZ=CIDR (e.g. az1=10.0.0.0/16)")
        if out.get(cidr, az) != az:
            raise ValueError(f"client AZ CIDRs: {cidr} is given to both {out[cidr]} and {az}")
        out[cidr] = az
    CidrAzMap.parse(out)  # ValueError names a bad CIDR or AZ name
    return out


# the client id of broker-to-broker requests (`kafka.interbroker.CLIENT_ID`: transaction
# markers, a proxy's forwarded ListOffsets / DeleteRecords): served as the real partition,
# whatever AZ the sending broker's address maps to. Short (issue #32): it is in the header
# of every zone route and snapshot poll between AZs. The previous id is still recognized
# (brokers of the previous release during a rolling upgrade).
BROKER_CLIENT_ID = "~b"
LEGACY_BROKER_CLIENT_ID = "automq-txn-coordinator"


def client_az(
    client_id: str | None, peer_host: str | None, cidrs: CidrAzMap, rack: str | None = None
) -> str | None:
    """A client's AZ: declared in its `client.id` first (`automq_az=`), else its
    `client.rack` (KIP-392: the rack id the Fetch requests from its host carried,
    `rack`), else from its address (the CIDR map), else None (a broker's own requests have
    none). A rack that cannot be an AZ name is ignored."""
    if client_id == BROKER_CLIENT_ID or client_id == LEGACY_BROKER_CLIENT_ID:
        return None
    declared = az_from_client_id(client_id)
    if declared is not None:
        return declared
    if rack and valid_az(rack):
        return rack
    return cidrs.az_of(peer_host) if peer_host else None
