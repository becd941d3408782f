"""Per-broker byte counters of the zone router's accounting (`automqctl cost`).

Counted on the data path: bytes produced and consumed by clients, split by whether the
client is in this broker's AZ, in another (cross-AZ), or did not say (unknown); bytes of the
requests this broker sends to other brokers and of their answers (zone routes, snapshot
polls, forwarded coordinator and admin requests), by the other broker's AZ; WAL data bytes
(RouterChannel + the main's WAL) and the proxy's object-store reads; of the cross-AZ broker
bytes, those of snapshot polls and of zone routes and their round trips (what the
brokers' own cross-AZ bytes are made of). The broker reports a snapshot with each
heartbeat. Thread-safe (one lock).
"""

from __future__ import annotations

import threading

# every key a snapshot has (fixed: the heartbeat carries a bounded dict)
KEYS = (
    "produced_bytes",
    "consumed_bytes",
    "produced_same_az_bytes",
    "consumed_same_az_bytes",
    "produced_cross_az_bytes",
    "consumed_cross_az_bytes",
    "produced_unknown_az_bytes",
    "consumed_unknown_az_bytes",
    "broker_same_az_bytes",
    "broker_cross_az_bytes",
    "wal_data_bytes",
    "proxy_read_bytes",
    # of broker_cross_az_bytes: the snapshot polls' and the zone routes' (and round trips)
    "broker_cross_az_snapshot_bytes",
    "broker_cross_az_snapshot_round_trips",
    "broker_cross_az_route_bytes",
    "broker_cross_az_route_round_trips",
)
# the broker-to-broker APIs counted apart (`ZoneTraffic.broker`'s `api`)
APIS = ("snapshot", "route")


class ZoneTraffic:
    """Cumulative counters since the broker started."""

    def __init__(self, az: str):
        self.az = az
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(KEYS, 0)

    def add(self, key: str, n: int) -> None:
        if n:
            with self._lock:
                self._counts[key] += n

    def client(self, direction: str, client_az: str | None, n: int) -> None:
        """`direction` "produced" or "consumed": `n` bytes with a client of `client_az`."""
        if not n:
            return
        where = (
            "unknown_az"
            if client_az is None
            else ("same_az" if client_az == self.az else "cross_az")
        )
        with self._lock:
            self._counts[f"{direction}_bytes"] += n
            self._counts[f"{direction}_{where}_bytes"] += n

    def broker(self, peer_az: str, n: int, api: str | None = None) -> None:
        """`n` bytes of one request to a broker of `peer_az` and its answer; `api` (one of
        `APIS`) counts them apart as well when they cross AZs."""
        if peer_az == self.az:
            self.add("broker_same_az_bytes", n)
            return
        with self._lock:
            self._counts["broker_cross_az_bytes"] += n
            if api is not None:
                self._counts[f"broker_cross_az_{api}_bytes"] += n
                self._counts[f"broker_cross_az_{api}_round_trips"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
