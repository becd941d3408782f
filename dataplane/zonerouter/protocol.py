"""The zone router's broker-to-broker API (proxy → main), in Kafka's wire format.

`ZoneRouteRequest` (api key 600, this project's extension, served on the Kafka listener)
names a produce request's record batches by their place in the proxy's RouterChannel and
carries the route epoch they were written in; the main answers after its append is durable.
`GetPartitionSnapshotRequest` (api key 601) is the proxy's incremental poll of a main for
snapshot reads: per partition the high watermark, leader epoch and the places (never the
data) of the durable batches past the proxy's fetch offset (`snapshot.py`); from version 1
also the last stable offset and, incrementally, the aborted transactions (read_committed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kafka.protocol.api_message import ApiMessage

from dataplane.kafka.codec import add_api_message

# 1: batched routes (several partitions and produce requests); 2: compact (the channel is
# the source node's, entries and answers packed as varints, `route_codec.py`); 3: the
# route epoch, source and timeout packed too; 4: route sessions (each topic id once per
# session, the epoch, timeout and first channel offset as deltas; answers' end offsets
# from their base offset); 5: answers packed against the session too (a partition's base
# offset from its last answer's end, its stream when it changed; the request's error code
# and message packed)
ZONE_ROUTE_VERSION = 5
OLDEST_PACKED_ZONE_ROUTE_VERSION = 2  # what a proxy falls back to for a main not upgraded


class ZoneRouteRequest(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


class ZoneRouteResponse(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


add_api_message(ZoneRouteRequest, ZoneRouteResponse)
ZONE_ROUTE_KEY = int(ZoneRouteRequest.API_KEY)


# 1: the last stable offset and the aborted transactions (read_committed via a proxy); 2:
# snapshot sessions (incremental polls and answers, packed links); 3: the answer's
# partitions packed as varints (`snapshot_codec.py`); 4: the poll packed too, and the
# answer names each topic once per session (a topic table both sides keep); 5: each
# polled partition also carries the proxy's last stable offset, and the proxy's own
# appends (learned from its route answers) do not wake its polls; 6: flags bytes leave out
# the usual values (a steady poll is 5 bytes; a link ~4: deltas from the previous link and
# from the session's last channel offset per source node), the error code packed too
SNAPSHOT_VERSION = 6
OLDEST_PACKED_SNAPSHOT_VERSION = 3  # what a proxy falls back to for a main not upgraded yet


class GetPartitionSnapshotRequest(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


class GetPartitionSnapshotResponse(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


add_api_message(GetPartitionSnapshotRequest, GetPartitionSnapshotResponse)
SNAPSHOT_KEY = int(GetPartitionSnapshotRequest.API_KEY)


# the client id in the header of zone routes and snapshot polls: none (2 bytes fewer than
# the broker-to-broker `~b` in every round trip between AZs; the main's handlers of these
# two APIs never read it, and no client sends them)
ZONE_ROUTER_CLIENT_ID = None

NEWEST_RETRY_S = 60.0  # after falling back, the newest version is tried again this often


class VersionProbe:
    """Which version of an API a broker-to-broker caller sends to one peer (a rolling
    upgrade: a peer not upgraded yet closes the connection on a version it does not know).
    The newest until a call at it fails before any call at it was answered; then
    `fallback` for `retry_s`, then the newest again. Used by one thread (a poller or a
    route batcher)."""

    def __init__(
        self,
        newest: int,
        fallback: int,
        retry_s: float = NEWEST_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.newest, self.fallback, self.retry_s = newest, fallback, retry_s
        self._clock = clock
        self._confirmed = False  # the peer answered the newest version
        self._fallback_until = 0.0

    def version(self) -> int:
        return self.fallback if self._clock() < self._fallback_until else self.newest

    def answered(self, version: int) -> None:
        if version == self.newest:
            self._confirmed = True

    def failed(self, version: int) -> None:
        if version == self.newest and not self._confirmed:
            self._fallback_until = self._clock() + self.retry_s
