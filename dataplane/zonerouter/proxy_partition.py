"""A partition whose main is in another AZ, served to this AZ's clients (seed 000).

`ProxyPartition` is a `PartitionBackend`. Produce: `append` hands the request's record
batches to the partition's serial worker, which runs the router's `forward` (the batches
into this broker's RouterChannel, then a zone route to the main, `zone_router.py`); the
durable future resolves to the main's answer (an `AppendOutcome`). Fetch: what the main
has committed to object storage (the stream's committed end in the metadata image), read
through this broker's BlockCache, and past it what the snapshot reads (`snapshot_read.py`)
found in the RouterChannels. Timestamp lookups and DeleteRecords are asked of the main.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from kafka.protocol.admin import DeleteRecordsRequest
from kafka.protocol.consumer import ListOffsetsRequest

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.interbroker import BrokerConnection, InterBrokerLogin
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    BackendError,
    LinkBuilder,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
)
from dataplane.zonerouter.traffic import ZoneTraffic

FORWARD_TIMEOUT_S = 10.0  # a request a proxy forwards to the main (ListOffsets, DeleteRecords)
LIST_OFFSETS_VERSION = 7
DELETE_RECORDS_VERSION = 2


class ProxyRouter(Protocol):
    """What a proxy partition needs of this broker's zone router (`ZoneRouter`)."""

    image_fn: Callable[[], MetadataImage]
    read_committed: Callable[[int, int, int, int], list]
    traffic: ZoneTraffic
    login: InterBrokerLogin | None
    # the snapshot reads (`snapshot_read.SnapshotReader`); None: what the mains committed only
    snapshots: Any

    def broker_bytes_counter(self, peer_az: str) -> Callable[[int], None]: ...

    def forward(self, proxy: ProxyPartition, records: bytes, timeout_ms: int) -> AppendOutcome: ...


class ProxyPartition:
    """A partition whose main is in another AZ, served to this AZ's clients (a
    `PartitionBackend`). Its state is read from the current metadata image on each call.
    Thread-safe: appends are queued to one serial worker (the partition's order)."""

    # it serves what the main committed: a fetch past that waits instead of OFFSET_OUT_OF_RANGE
    lags_leader = True
    forwards_to_main = True  # DeleteRecords (and timestamp lookups) are the main's
    counts_own_wal_bytes = True  # its RouterChannel write is counted by the router
    stream_id = -1  # the partition's stream is the main's: none here

    def __init__(self, router: ProxyRouter, topic_id: str, partition: int):
        self.router = router
        self.topic_id = topic_id
        self.partition = partition
        self.worker = ThreadPoolExecutor(1, thread_name_prefix=f"proxy-{partition}")
        self._listeners: list[Callable[[], None]] = []
        self._listeners_lock = threading.Lock()

    @property
    def identity(self) -> object:
        """The partition itself (one proxy per partition: every view of it is this one)."""
        return self

    def _state(self):
        image = self.router.image_fn()
        topic = image.topics.get(self.topic_id)
        part = topic.partitions.get(self.partition) if topic else None
        stream = image.streams.get(part.stream_id) if part else None
        return topic, part, stream

    @property
    def topic(self) -> str:
        topic = self._state()[0]
        return topic.name if topic else ""

    @property
    def leader_epoch(self) -> int:
        part = self._state()[1]
        return part.leader_epoch if part else -1

    @property
    def log_start_offset(self) -> int:
        stream = self._state()[2]
        return stream.start_offset if stream else 0

    @property
    def high_watermark(self) -> int:
        """What the main has committed to object storage, extended by the snapshot reads
        (what the main made durable and this broker read from the RouterChannels)."""
        _, part, stream = self._state()
        committed = stream.end_offset if stream else 0
        snapshots = self.router.snapshots
        if snapshots is None or part is None:
            return committed
        return snapshots.high_watermark(self, part.leader_node_id, committed)

    @property
    def last_stable_offset(self) -> int:
        """The main's last stable offset as its latest snapshot told (every aborted
        transaction below it is known here), at most this proxy's high watermark; the log
        start until the first snapshot (a read_committed fetch waits)."""
        _, part, stream = self._state()
        start = stream.start_offset if stream else 0
        snapshots = self.router.snapshots
        if snapshots is None or part is None:
            return start  # transactions are known only from the main's snapshots
        return snapshots.last_stable_offset(self, part.leader_node_id, self.high_watermark, start)

    def append(
        self, records: bytes | None, link: LinkBuilder | None = None, timeout_ms: int = 30_000
    ) -> AppendOutcome:
        if link is not None:  # a proxy has no stream to keep Link Records in
            raise BackendError(KafkaError.NOT_LEADER_OR_FOLLOWER, "a proxy keeps no Link Records")
        if not records:
            return AppendOutcome(KafkaError.CORRUPT_MESSAGE)
        # a view of the request's frame (the produce decoder's) would keep the whole frame
        # alive in the router's recent records: a copy of its own
        records = bytes(records)
        try:
            fut: Future = self.worker.submit(self.router.forward, self, records, timeout_ms)
        except RuntimeError:  # the worker was shut down (topic deleted, broker stopping)
            return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
        return AppendOutcome(KafkaError.NONE, -1, [fut], forwarded=True)

    def read(self, offset: int, max_bytes: int, end: int | None = None) -> bytes:
        _, part, stream = self._state()
        if stream is None:
            return b""
        snapshots = self.router.snapshots
        if snapshots is not None and offset >= stream.end_offset:
            # past the main's uploads: from the snapshot-read cache (b"" when not there)
            return snapshots.read(
                self, offset, self.high_watermark if end is None else end, max_bytes
            )
        end = stream.end_offset if end is None else min(end, stream.end_offset)
        batches = self.router.read_committed(stream.stream_id, offset, end, max_bytes)
        data = b"".join(b.payload for b in batches)
        self.router.traffic.add("proxy_read_bytes", len(data))
        return data

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        return []  # known from the main's snapshots, served by the main

    def read_cached(self, offset: int, max_bytes: int, end: int | None = None) -> None:
        """Reads go through the snapshot cache or the main's objects: always off the loop."""
        return None

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """The main's aborted transactions overlapping [start, end) (from its snapshots;
        complete below `last_stable_offset`, where read_committed fetches stop)."""
        part = self._state()[1]
        snapshots = self.router.snapshots
        if snapshots is None or part is None:
            return []
        return snapshots.aborted_transactions(self, part.leader_node_id, start, end)

    def write_marker(self, producer_id, producer_epoch, commit, coordinator_epoch):
        return KafkaError.NOT_LEADER_OR_FOLLOWER, None

    def _ask_main(self, req, api_key: int, version: int):
        """Send `req` to the partition's main (a short-lived connection, as this broker;
        a client without an AZ there, so the main answers from its partition); raises
        BackendError when there is no live main or it does not answer. Blocks."""
        part = self._state()[1]
        main = self.router.image_fn().brokers.get(part.leader_node_id) if part else None
        if main is None or main.fenced:
            raise BackendError(KafkaError.NOT_LEADER_OR_FOLLOWER, "the main is not live")
        conn = BrokerConnection(
            main.host, main.kafka_port, self.router.login, self.router.broker_bytes_counter(main.az)
        )
        try:
            return conn.call(req, FORWARD_TIMEOUT_S, api_key, version)
        except (OSError, ConnectionError, ValueError) as exc:
            raise BackendError(
                KafkaError.NOT_LEADER_OR_FOLLOWER, f"main {main.node_id} did not answer: {exc}"
            ) from None
        finally:
            conn.close()

    def _list_offset(self, timestamp: int) -> OffsetAndTimestamp:
        """ListOffsets of one timestamp, answered by the main (its time index)."""
        Q = ListOffsetsRequest[LIST_OFFSETS_VERSION]
        T = Q.ListOffsetsTopic
        req = Q(
            replica_id=-1,
            isolation_level=0,
            topics=[
                T(
                    name=self.topic,
                    partitions=[
                        T.ListOffsetsPartition(
                            partition_index=self.partition,
                            current_leader_epoch=-1,
                            timestamp=timestamp,
                        )
                    ],
                )
            ],
        )
        resp = self._ask_main(req, int(ListOffsetsRequest.API_KEY), LIST_OFFSETS_VERSION)
        (answer,) = resp.topics[0].partitions
        if answer.error_code:
            raise BackendError(KafkaError(answer.error_code), "the main refused ListOffsets")
        return OffsetAndTimestamp(answer.offset, answer.timestamp)

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp:
        """Asked of the main (the time index reads its stream). Blocks."""
        return self._list_offset(timestamp_ms)

    def max_timestamp_offset(self) -> OffsetAndTimestamp:
        """Asked of the main. Blocks."""
        return self._list_offset(-3)

    def delete_records(self, offset: int) -> int:
        """Forwarded to the main (DeleteRecords moves its stream's start); its low
        watermark, or its error. Blocks."""
        Q = DeleteRecordsRequest[DELETE_RECORDS_VERSION]
        T = Q.DeleteRecordsTopic
        req = Q(
            topics=[
                T(
                    name=self.topic,
                    partitions=[
                        T.DeleteRecordsPartition(partition_index=self.partition, offset=offset)
                    ],
                )
            ],
            timeout_ms=int(FORWARD_TIMEOUT_S * 1000),
        )
        resp = self._ask_main(req, int(DeleteRecordsRequest.API_KEY), DELETE_RECORDS_VERSION)
        (answer,) = resp.topics[0].partitions
        if answer.error_code == KafkaError.OFFSET_OUT_OF_RANGE:
            raise OffsetOutOfRangeError(f"{self.topic}-{self.partition}: past the high watermark")
        if answer.error_code:
            raise BackendError(KafkaError(answer.error_code), "the main refused DeleteRecords")
        return answer.low_watermark

    def epoch_end_offset(self, leader_epoch: int) -> tuple[int, int]:
        _, part, stream = self._state()
        if part is None or stream is None:
            return -1, -1
        hw = stream.end_offset
        if leader_epoch >= part.leader_epoch:
            return part.leader_epoch, hw
        later = [rg for rg in stream.ranges if rg.epoch > leader_epoch]
        earlier = [rg for rg in stream.ranges if rg.epoch <= leader_epoch]
        if not earlier:
            return -1, -1
        return earlier[-1].epoch, (later[0].start_offset if later else hw)

    def add_listener(self, callback: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with self._listeners_lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def wake(self) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for callback in listeners:
            callback()
