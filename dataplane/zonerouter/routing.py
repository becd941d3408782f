"""What a client of an AZ is told and served (the zone router's entry into the Kafka APIs).

`ZoneRouting` implements `partition_backend.ClientRouting`: it tells a client its AZ (from
`client.id` or its address), rewrites the leader of every partition in a Metadata response
to the main's proxy in the client's AZ (`proxy_mapping.py`), and resolves a produce or
fetch to the backend this broker serves for that client: the real partition when it is the
main and the client is in its AZ (or has none), a `ProxyPartition` when it is the client's
proxy, and nothing (NOT_LEADER_OR_FOLLOWER) otherwise, so a client that reached the wrong
broker refreshes its metadata. Every client producing to a main (of its AZ or without one)
produces through the main's own RouterChannel (`own_channel.OwnChannelPartition`) when other
AZs have brokers, so the proxies' snapshot reads find every batch in object storage; with
`zone_router.channel_mode = "az_clients"` only a client of a known AZ does (a client without
one is appended straight to the WAL: faster produce, remote reads after the upload).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from controlplane.image import BrokerState, MetadataImage, PartitionState
from dataplane.formats.client_az import CidrAzMap, client_az
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import RecordChunks
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    LinkBuilder,
    OffsetAndTimestamp,
    PartitionBackend,
    PartitionPlacement,
    PartitionResolver,
    place_partition,
)
from dataplane.zonerouter.proxy_mapping import ProxyMapping
from dataplane.zonerouter.traffic import ZoneTraffic


class CountedBackend:
    """A backend as one client sees it: produced and consumed bytes are counted by the
    client's AZ; every other `PartitionBackend` member is the backend's, forwarded by name.
    Its `identity` is the backend's (the fetch long-poll keeps one listener per partition,
    however many views of it a request resolved)."""

    def __init__(self, inner: PartitionBackend, traffic: ZoneTraffic, az: str | None):
        self._inner = inner
        self._traffic = traffic
        self._az = az

    # ------------------------------------------------------------ the backend's members

    @property
    def topic_id(self) -> str:
        return self._inner.topic_id

    @property
    def topic(self) -> str:
        return self._inner.topic

    @property
    def partition(self) -> int:
        return self._inner.partition

    @property
    def identity(self) -> object:
        return self._inner.identity

    @property
    def lags_leader(self) -> bool:
        return self._inner.lags_leader

    @property
    def counts_own_wal_bytes(self) -> bool:
        return self._inner.counts_own_wal_bytes

    @property
    def forwards_to_main(self) -> bool:
        return self._inner.forwards_to_main

    @property
    def stream_id(self) -> int:
        return self._inner.stream_id

    @property
    def leader_epoch(self) -> int:
        return self._inner.leader_epoch

    @property
    def log_start_offset(self) -> int:
        return self._inner.log_start_offset

    @property
    def high_watermark(self) -> int:
        return self._inner.high_watermark

    @property
    def last_stable_offset(self) -> int:
        return self._inner.last_stable_offset

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return self._inner.aborted_transactions(start, end)

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        return self._inner.aborted_since(marker_offset)

    def write_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[KafkaError, Future | None]:
        return self._inner.write_marker(producer_id, producer_epoch, commit, coordinator_epoch)

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp:
        return self._inner.offset_for_timestamp(timestamp_ms)

    def max_timestamp_offset(self) -> OffsetAndTimestamp:
        return self._inner.max_timestamp_offset()

    def delete_records(self, offset: int) -> int:
        return self._inner.delete_records(offset)

    def epoch_end_offset(self, leader_epoch: int) -> tuple[int, int]:
        return self._inner.epoch_end_offset(leader_epoch)

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._inner.add_listener(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        self._inner.remove_listener(callback)

    # ------------------------------------------------------------ counted by the client's AZ

    def append(self, records: bytes | None, link: LinkBuilder | None = None) -> AppendOutcome:
        size = len(records or b"")
        outcome = self._inner.append(records, link)  # raises when there is no room: not counted
        self._traffic.client("produced", self._az, size)
        if outcome.error == 0 and not self._inner.counts_own_wal_bytes:
            # appended to a partition led here: the data went into this broker's WAL (a
            # proxy counts its RouterChannel write, and the main its own, when routed)
            self._traffic.add("wal_data_bytes", size)
        return outcome

    def read(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks:
        data = self._inner.read(offset, max_bytes, end)
        self._traffic.client("consumed", self._az, len(data))
        return data

    def read_cached(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks | None:
        data = self._inner.read_cached(offset, max_bytes, end)
        if data is not None:
            self._traffic.client("consumed", self._az, len(data))
        return data


CHANNEL_ALL = "all"  # zone_router.channel_mode: every produce at a main via its channel
CHANNEL_AZ_CLIENTS = "az_clients"  # only the produce of clients with a known AZ
CHANNEL_MODES = (CHANNEL_ALL, CHANNEL_AZ_CLIENTS)


class ZoneRouting:
    """Thread-safe: the mapping is rebuilt (immutable) when the image's brokers change."""

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        partitions: PartitionResolver,
        proxy_factory: Callable[[str, int], PartitionBackend],
        cidrs: CidrAzMap | None = None,
        traffic: ZoneTraffic | None = None,
        own_channel: Callable[[str, PartitionBackend, bool], PartitionBackend] | None = None,
        channel_mode: str = CHANNEL_ALL,
    ):
        if channel_mode not in CHANNEL_MODES:
            raise ValueError(f"channel mode {channel_mode!r}: one of {', '.join(CHANNEL_MODES)}")
        self.node_id = node_id
        self.image_fn = image_fn
        self.partitions = partitions
        self.proxy_factory = proxy_factory  # (topic_id, partition) -> ProxyPartition
        self.cidrs = cidrs or CidrAzMap()
        self.traffic = traffic
        # (topic id, the partition led here, through the channel?) -> the backend whose
        # produce goes through this broker's own RouterChannel (snapshot reads see its
        # data), or (False) straight to the partition behind what the channel still holds
        self.own_channel = own_channel
        # CHANNEL_ALL: every client's produce through it; CHANNEL_AZ_CLIENTS: only clients
        # of a known AZ (zone_router.channel_mode)
        self.channel_mode = channel_mode
        self._lock = threading.Lock()  # one computation of a new image's mapping at a time
        # (the brokers container it was computed from, the mapping): one attribute, read
        # without the lock on every produce and fetch partition, replaced whole
        self._mapping_of: tuple[object, ProxyMapping] = (None, ProxyMapping([]))

    def mapping(self, image: MetadataImage) -> ProxyMapping:
        """The main → proxy mapping of `image` (cached per brokers container: the image is
        copy-on-write, so an unchanged broker set keeps its dict)."""
        brokers, mapping = self._mapping_of
        if brokers is image.brokers:
            return mapping
        with self._lock:
            brokers, mapping = self._mapping_of
            if brokers is not image.brokers:
                mapping = ProxyMapping.from_image(image)
                self._mapping_of = (image.brokers, mapping)
            return mapping

    def _own_channel_view(
        self, mapping: ProxyMapping, topic_id: str, backend: PartitionBackend, az: str | None
    ) -> PartitionBackend:
        """A partition led here as a client of `az` produces to it. While other AZs have
        brokers, every client's produce (declared AZ or not; "az_clients": only a client of
        an AZ) goes through the own channel: the proxies' snapshot reads find it in object
        storage (seed 000). Once none has (the image lost them), produce goes straight to
        the partition, but behind the produces still in its channel pipeline: a request
        appended at once would overtake them, and an idempotent producer's pipelined
        batches must reach the partition in order (else OUT_OF_ORDER_SEQUENCE_NUMBER, fatal
        to librdkafka once the earlier batches are acked)."""
        assert self.own_channel is not None
        if len(mapping.azs) <= 1:  # no proxies (`has_proxies`)
            return self.own_channel(topic_id, backend, False)
        if self.channel_mode == CHANNEL_ALL or az is not None:
            return self.own_channel(topic_id, backend, True)
        return backend

    def has_proxies(self, image: MetadataImage) -> bool:
        """Brokers of more than one AZ are eligible: this broker's partitions have proxies."""
        return len(self.mapping(image).azs) > 1

    def client_az(
        self, client_id: str | None, peer_host: str | None, rack: str | None = None
    ) -> str | None:
        return client_az(client_id, peer_host, self.cidrs, rack)

    def leader_for(self, image: MetadataImage, leader_node_id: int, az: str | None) -> int:
        return self.mapping(image).route(leader_node_id, az)

    def brokers_for(self, image: MetadataImage, az: str | None) -> list[BrokerState]:
        """The live brokers a client is told about: for a client of an AZ with eligible
        brokers, only those (it never needs another); else all."""
        live = [b for b in sorted(image.brokers.values(), key=lambda b: b.node_id) if not b.fenced]
        if az is None or az not in self.mapping(image).azs:
            return live
        return [b for b in live if b.az == az]

    def placement(
        self, image: MetadataImage, state: PartitionState, az: str | None, live_ids: set[int]
    ) -> PartitionPlacement:
        return place_partition(image, state, az, self.leader_for, live_ids)

    def get(self, topic_id: str, partition: int, az: str | None = None) -> PartitionBackend | None:
        image = self.image_fn()
        topic = image.topics.get(topic_id)
        state = topic.partitions.get(partition) if topic else None
        if state is None:
            return None
        mapping = self.mapping(image)
        if state.erasure_coded:  # leaderless: every broker serves it
            backend = self.partitions.get(topic_id, partition)
        elif mapping.route(state.leader_node_id, az) != self.node_id:
            return None  # this client was told another broker serves it
        elif state.leader_node_id == self.node_id:
            backend = self.partitions.get(topic_id, partition)
            if backend is not None and self.own_channel is not None:
                backend = self._own_channel_view(mapping, topic_id, backend, az)
        else:
            backend = self.proxy_factory(topic_id, partition)
        if backend is None or self.traffic is None:
            return backend
        return CountedBackend(backend, self.traffic, az)  # type: ignore[return-value]
