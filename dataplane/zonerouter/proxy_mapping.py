"""Main → proxy mapping (pure): every broker gets exactly one proxy in each other AZ.

As AutoMQ's `ProxyNodeMapping`: per AZ, a consistent-hash ring of that AZ's eligible brokers
(unfenced, not shutting down) with `VIRTUAL_NODES` points each; a main's proxy in an AZ is
the owner of the first point clockwise from the main's hash. Adding or removing a broker in
an AZ moves only the mains whose point it takes or held. Computed from the metadata image
alone, so every broker computes the same mapping for the same image.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

VIRTUAL_NODES = 64


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class BrokerPlace:
    """A broker as the mapping sees it."""

    node_id: int
    az: str
    eligible: bool  # may serve as a proxy (unfenced, not shutting down)


class ProxyMapping:
    """The proxies of every main for one image. Immutable after construction (thread-safe)."""

    def __init__(self, brokers: Iterable[BrokerPlace], virtual_nodes: int = VIRTUAL_NODES):
        places = sorted(brokers, key=lambda b: b.node_id)
        self._az_of = {b.node_id: b.az for b in places}
        self._eligible = {b.node_id for b in places if b.eligible}
        rings: dict[str, list[tuple[int, int]]] = {}
        for b in places:
            if b.eligible:
                for i in range(virtual_nodes):
                    rings.setdefault(b.az, []).append(
                        (_hash(f"node-{b.node_id}-vn-{i}"), b.node_id)
                    )
        self._rings = {az: sorted(points) for az, points in rings.items()}
        self._keys = {az: [h for h, _ in points] for az, points in self._rings.items()}

    @classmethod
    def from_image(cls, image) -> ProxyMapping:
        """From a `MetadataImage`'s registered brokers."""
        return cls(
            BrokerPlace(b.node_id, b.az, not b.fenced and not b.shutting_down)
            for b in image.brokers.values()
        )

    @property
    def azs(self) -> frozenset[str]:
        """AZs with at least one eligible broker."""
        return frozenset(self._rings)

    def az_of(self, node_id: int) -> str | None:
        return self._az_of.get(node_id)

    def proxy_of(self, main_node_id: int, az: str) -> int | None:
        """The broker in `az` that serves `main_node_id`'s partitions to clients of `az`:
        the main itself when it is in `az`; None when `az` has no eligible broker."""
        if self._az_of.get(main_node_id) == az:
            return main_node_id
        ring = self._rings.get(az)
        if not ring:
            return None
        i = bisect.bisect_right(self._keys[az], _hash(f"main-{main_node_id}")) % len(ring)
        return ring[i][1]

    def route(self, main_node_id: int, client_az: str | None) -> int:
        """The broker a client of `client_az` is told leads a partition of `main_node_id`:
        the proxy in the client's AZ, or the main itself (a client without an AZ, the main's
        own AZ, or an AZ with no eligible broker: the fallback to the real leader)."""
        if client_az is None:
            return main_node_id
        proxy = self.proxy_of(main_node_id, client_az)
        return main_node_id if proxy is None else proxy

    def mains_of(self, proxy_node_id: int) -> list[int]:
        """The mains in other AZs `proxy_node_id` is the proxy of."""
        az = self._az_of.get(proxy_node_id)
        if az is None or proxy_node_id not in self._eligible:
            return []
        return [
            m
            for m, m_az in self._az_of.items()
            if m_az != az and self.proxy_of(m, az) == proxy_node_id
        ]
