"""Main → proxy mapping (pure): every broker gets exactly one proxy in each other AZ, and
the proxies of an AZ share the mains equally.

Per AZ, the mains of the other AZs are dealt to that AZ's eligible brokers (unfenced, not
shutting down) so each serves `n // k` or `n // k + 1` of them (n mains, k proxies): the
mains, in the order of their hash, each take the proxy they rank highest (rendezvous
hashing: the highest `hash(main, proxy)`) among those with room. A broker joining or
leaving an AZ moves mostly the mains it takes or held, a few more to keep the shares equal.
Mains that cannot lead (fenced, shutting down) get their highest-ranked proxy without
counting in the shares. Computed from the metadata image alone, so every broker computes
the same mapping for the same image.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

VIRTUAL_NODES = 64  # kept for callers that pass it; the shares no longer use a ring


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
        del virtual_nodes  # the equal shares need no ring
        places = sorted(brokers, key=lambda b: b.node_id)
        self._az_of = {b.node_id: b.az for b in places}
        self._eligible = {b.node_id for b in places if b.eligible}
        proxies_by_az: dict[str, list[int]] = {}
        for b in places:
            if b.eligible:
                proxies_by_az.setdefault(b.az, []).append(b.node_id)
        # (main, az) -> the proxy in az serving main's partitions to clients of az
        self._proxy: dict[tuple[int, str], int] = {}
        for az, proxies in proxies_by_az.items():
            mains = [b for b in places if b.az != az]
            for main, proxy in _deal(mains, proxies).items():
                self._proxy[(main, az)] = proxy
        self._proxies_by_az = proxies_by_az
        self._azs = frozenset(proxies_by_az)

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
        return self._azs

    def az_of(self, node_id: int) -> str | None:
        return self._az_of.get(node_id)

    def proxy_of(self, main_node_id: int, az: str) -> int | None:
        """The broker in `az` that serves `main_node_id`'s partitions to clients of `az`:
        the main itself when it is in `az`; None when `az` has no eligible broker."""
        if self._az_of.get(main_node_id) == az:
            return main_node_id
        proxy = self._proxy.get((main_node_id, az))
        if proxy is None and az in self._azs:  # a main not registered (yet): by its rank
            return _ranked(main_node_id, self._proxies_by_az[az])
        return proxy

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
        return sorted(m for (m, a), p in self._proxy.items() if a == az and p == proxy_node_id)


def _score(main_node_id: int, proxy_node_id: int) -> int:
    return _hash(f"main-{main_node_id}-proxy-{proxy_node_id}")


def _ranked(main_node_id: int, proxies: list[int]) -> int | None:
    """The proxy `main_node_id` ranks highest (rendezvous hashing), None if none."""
    if not proxies:
        return None
    return max(proxies, key=lambda p: (_score(main_node_id, p), -p))


def _deal(mains: list[BrokerPlace], proxies: list[int]) -> dict[int, int]:
    """Deal `mains` to `proxies` (sorted ids, non-empty): each eligible main, in the order
    of its hash, takes its highest-ranked proxy with room; a proxy has room below `n // k`,
    or at `n // k` while fewer than `n % k` proxies hold one more. Every proxy ends with
    `n // k` or `n // k + 1` eligible mains. Ineligible mains take their ranked proxy."""
    leading = sorted(
        (b.node_id for b in mains if b.eligible), key=lambda m: (_hash(f"main-{m}"), m)
    )
    base, extra = divmod(len(leading), len(proxies))
    load = dict.fromkeys(proxies, 0)
    full = 0  # proxies holding base + 1
    dealt: dict[int, int] = {}
    for main in leading:
        for proxy in sorted(proxies, key=lambda p: (-_score(main, p), p)):
            if load[proxy] < base or (load[proxy] == base and full < extra):
                full += load[proxy] == base
                load[proxy] += 1
                dealt[main] = proxy
                break
    for b in mains:
        if not b.eligible:
            dealt[b.node_id] = _ranked(b.node_id, proxies)  # type: ignore[assignment]
    return dealt
