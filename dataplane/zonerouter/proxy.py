"""Produce and fetch through a proxy (seed 000), and the main's side of the zone route.

Produce: a `ProxyPartition.append` hands the request's record batches to the partition's
serial worker, which appends them to this broker's RouterChannel (an `ObjectWAL` under
`router-channel/node-<id>`, readable by any node at a channel offset), then sends a
`ZoneRouteRequest` (route epoch, source node, channel offset) to the main. The main
(`ZoneRouteHandler`) refuses a fenced route epoch, reads the batches from the channel,
appends them to the partition, and answers once its append is durable; the proxy then
acknowledges the client. The channel record is released (trimmed) once the main answered.

Fetch: a `ProxyPartition` serves what the main has committed to object storage (the
stream's committed end in the metadata image), read through this broker's BlockCache, and
past it what the snapshot reads (`snapshot_read.py`) found in the RouterChannels.
The main's WAL (the ConfirmWAL) keeps only a Link Record per batch (`link_record.py`);
its LogCache and its uploads hold the data, and its WAL recovery (or another broker's
failover of it) reads the data back from the channel. So the proxy keeps a channel record
until the main has committed the partition's data to object storage (the stream's committed
end in the image reaches what the request appended), then trims it.

A client of an AZ producing at the partition's main goes through the main's own
RouterChannel as well (`OwnChannelPartition`), so the proxies' snapshot reads find its data
in object storage.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from kafka.protocol.admin import DeleteRecordsRequest
from kafka.protocol.consumer import ListOffsetsRequest

from controlplane.image import MetadataImage
from dataplane.config import ObjectWALConfig
from dataplane.kafka.errors import KafkaError
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    BackendError,
    OffsetAndTimestamp,
    PartitionResolver,
)
from dataplane.kafka.partitions import OffsetOutOfRangeError
from dataplane.kafka.record_batch import parse_batch_header
from dataplane.kafka.txn.marker_client import InterBrokerLogin, _connect, _roundtrip
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.records import HEADER_SIZE_BYTES, StreamRecordBatch
from dataplane.s3stream.wal.base import WALError
from dataplane.s3stream.wal.object_wal import (
    ObjectWAL,
    ObjectWALLocation,
    ObjectWALReader,
    WALTrimmedError,
)
from dataplane.zonerouter.link_record import LINK_PAYLOAD_BYTES, LinkRecord, resolve
from dataplane.zonerouter.protocol import (
    ZONE_ROUTE_KEY,
    ZONE_ROUTE_VERSION,
    ZoneRouteRequest,
    ZoneRouteResponse,
)
from dataplane.zonerouter.snapshot import LinkIndex, LinkLocation
from dataplane.zonerouter.traffic import ZoneTraffic

log = logging.getLogger(__name__)

CHANNEL_BUCKET_ID = 0
CHANNEL_CAPACITY_BYTES = 1024 * 1024 * 1024
CHANNEL_TRIM_INTERVAL_S = 1.0
RECENT_CHANNEL_BYTES = 16 * 1024 * 1024
MAX_PROXY_WORKERS = 1024  # partitions proxied at once (one serial worker each)
RPC_EXTRA_TIMEOUT_S = 5.0
FORWARD_TIMEOUT_S = 10.0  # a request a proxy forwards to the main (ListOffsets, DeleteRecords)
LIST_OFFSETS_VERSION = 7
DELETE_RECORDS_VERSION = 2
ROUTE_EPOCH_WAIT_S = 2.0
UNKNOWN_END = -2


def channel_location(node_id: int) -> ObjectWALLocation:
    """Where broker `node_id`'s RouterChannel lives (derived, never taken from a request)."""
    return ObjectWALLocation(CHANNEL_BUCKET_ID, f"router-channel/node-{node_id}")


class ChannelReaders:
    """Readers of every broker's RouterChannel (one per source node); resolves Link
    Records for a main's WAL recovery. Thread-safe."""

    def __init__(self, objects: ObjectStorage):
        self.objects = objects
        self._readers: dict[int, ObjectWALReader] = {}
        self._lock = threading.Lock()

    def reader(self, source_node_id: int) -> ObjectWALReader:
        with self._lock:
            reader = self._readers.get(source_node_id)
            if reader is None:
                reader = ObjectWALReader(self.objects, channel_location(source_node_id))
                self._readers[source_node_id] = reader
            return reader

    def resolve(self, link_batch: StreamRecordBatch) -> StreamRecordBatch:
        """The data a Link Record points at (raises WALTrimmedError / ValueError)."""
        link = LinkRecord.decode(link_batch.payload)
        record = self.reader(link.source_node_id).read(link.channel_offset)
        return resolve(link_batch, record.data)


class _ChannelRecord:
    """One record of this proxy's channel until it may be trimmed."""

    __slots__ = ("next_offset", "answered", "stream_id", "end_offset", "stream_epoch")

    def __init__(self, next_offset: int):
        self.next_offset = next_offset
        self.answered = False
        self.stream_id = -1  # -1: no Link Record of the main points here
        # the stream offset its committed end must reach; UNKNOWN_END: the main's answer
        # was lost (learned from the next answer for the stream, or a new stream epoch)
        self.end_offset = -1
        self.stream_epoch = -1


class _MainConnection:
    """One blocking connection to a main; requests are serialized on it (thread-safe).
    `on_bytes` gets the bytes of each request and its answer (the zone router's
    broker-to-broker accounting)."""

    def __init__(
        self,
        host: str,
        port: int,
        login: InterBrokerLogin | None,
        on_bytes: Callable[[int], None] | None = None,
    ):
        self.host, self.port, self.login = host, port, login
        self.on_bytes = on_bytes
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def call(
        self,
        req,
        timeout_s: float,
        api_key: int = ZONE_ROUTE_KEY,
        version: int = ZONE_ROUTE_VERSION,
    ):
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = _connect(self.host, self.port, timeout_s, self.login)
                self._sock.settimeout(timeout_s)
                sizes: list[int] = []
                resp = _roundtrip(self._sock, req, api_key, version, sizes)
                if self.on_bytes is not None:
                    self.on_bytes(sum(sizes))
                return resp
            except BaseException:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class ZoneRouter:
    """This broker's proxy side: its RouterChannel, connections to mains, proxy partitions.

    Thread-safe. `start()` opens the channel (claiming it at this node epoch); `close()`
    stops the workers and closes the channel.
    """

    def __init__(
        self,
        node_id: int,
        node_epoch: int,
        objects: ObjectStorage,
        image_fn: Callable[[], MetadataImage],
        read_committed: Callable[[int, int, int, int], list],
        traffic: ZoneTraffic,
        login: InterBrokerLogin | None = None,
        channel_config: ObjectWALConfig | None = None,
        ready_fn: Callable[[], bool] = lambda: True,
    ):
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.objects = objects
        self.image_fn = image_fn
        self.read_committed = read_committed  # (stream id, start, end, max bytes) -> batches
        self.traffic = traffic
        self.login = login
        self.ready_fn = ready_fn  # the metadata image is caught up
        self.channel_config = channel_config or ObjectWALConfig()
        self.channel: ObjectWAL | None = None
        self._lock = threading.Lock()
        self._proxies: dict[tuple[str, int], ProxyPartition] = {}
        self._connections: dict[tuple[str, int], _MainConnection] = {}
        # channel records not trimmed yet, by channel offset
        self._records: dict[int, _ChannelRecord] = {}
        # appends whose offset is not yet known, by token: the channel's durable end when
        # each started (its offset is at or past it: nothing from there on is trimmed)
        self._appending: dict[int, int] = {}
        self._append_token = 0
        self._acked_end = 0
        # a previous incarnation's records (below the offset) may back a main's uncommitted
        # Link Records (their answers died with it): kept until the committed route epoch
        # reaches the epoch current when this one started (learned from the first caught-up
        # image: every old record was written in an epoch at or below it)
        self._keep_before: int | None = None
        self._keep_until_epoch: int | None = None
        self._stop = threading.Event()
        self._trimmer = threading.Thread(target=self._trim_loop, name="channel-trim", daemon=True)
        # serial workers of the partitions led here that clients of an AZ produce to
        # through this broker's own channel (bounded as the proxies' workers)
        self._own_workers: dict[tuple[str, int], _OwnPipeline] = {}
        # the channel records this broker wrote last, by offset: its snapshot reads of its
        # own channel need no GET (bounded by RECENT_CHANNEL_BYTES, oldest dropped first)
        self._recent: OrderedDict[int, bytes] = OrderedDict()
        self._recent_bytes = 0
        # the proxy's snapshot reads (`snapshot_read.SnapshotReader`, set by the node);
        # None: proxies serve what the mains committed only
        self.snapshots = None

    def start(self) -> None:
        self.channel = ObjectWAL.open(
            self.objects,
            channel_location(self.node_id),
            self.node_id,
            self.node_epoch,
            capacity_bytes=CHANNEL_CAPACITY_BYTES,
            config=self.channel_config,
        )
        self._acked_end = self.channel.end_offset
        if self.channel.end_offset > self.channel.start_offset:
            self._keep_before = self.channel.start_offset
        self._trimmer.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            proxies = list(self._proxies.values())
            conns = list(self._connections.values())
            own = list(self._own_workers.values())
        for proxy in proxies:
            proxy.worker.shutdown(wait=False, cancel_futures=True)
        for pipeline in own:
            pipeline.close()
        for conn in conns:
            conn.close()
        if self.snapshots is not None:
            self.snapshots.close()
        if self.channel is not None:
            self.channel.close()

    # ------------------------------------------------------------------ partitions

    def proxy_partition(self, topic_id: str, partition: int) -> ProxyPartition | None:
        with self._lock:
            proxy = self._proxies.get((topic_id, partition))
            if proxy is None and len(self._proxies) < MAX_PROXY_WORKERS:
                proxy = ProxyPartition(self, topic_id, partition)
                self._proxies[(topic_id, partition)] = proxy
            return proxy

    def on_metadata(self, image: MetadataImage) -> None:
        """Wake the fetches waiting on proxied partitions (a main's commit may have made
        more readable) and drop proxies of deleted topics."""
        with self._lock:
            proxies = list(self._proxies.items())
        for key, proxy in proxies:
            if key[0] not in image.topics:
                with self._lock:
                    self._proxies.pop(key, None)
                proxy.worker.shutdown(wait=False, cancel_futures=True)
            proxy.wake()
        with self._lock:
            own = list(self._own_workers.items())
        for key, pipeline in own:
            topic = image.topics.get(key[0])
            state = topic.partitions.get(key[1]) if topic else None
            if state is None or state.leader_node_id != self.node_id:
                with self._lock:
                    self._own_workers.pop(key, None)
                pipeline.close()  # queued appends still run (and fail if moved)

    # ------------------------------------------------------------------ produce path

    def _connection(self, host: str, port: int, az: str) -> _MainConnection:
        """The pooled connection to the main at (host, port), in AZ `az`."""
        with self._lock:
            conn = self._connections.get((host, port))
            if conn is None:
                conn = self._connections[(host, port)] = _MainConnection(
                    host, port, self.login, self.broker_bytes_counter(az)
                )
            return conn

    def broker_bytes_counter(self, peer_az: str) -> Callable[[int], None]:
        """Counts bytes exchanged with a broker of `peer_az` (the accounting)."""
        return lambda n: self.traffic.broker(peer_az, n)

    def forward(self, proxy: ProxyPartition, records: bytes, timeout_ms: int) -> AppendOutcome:
        """Channel append + zone route to the main (runs on the partition's worker)."""
        assert self.channel is not None
        image = self.image_fn()
        topic = image.topics.get(proxy.topic_id)
        state = topic.partitions.get(proxy.partition) if topic else None
        main = image.brokers.get(state.leader_node_id) if state else None
        if state is None or main is None or main.fenced:
            return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
        timeout_s = max(timeout_ms, 1) / 1000
        token = self._start_append()
        try:
            appended = self.channel.append(records).result(timeout_s)
        except Exception as exc:  # noqa: BLE001 - the channel failed: the client retries
            with self._lock:
                self._appending.pop(token, None)
            log.warning("RouterChannel append failed: %s", exc)
            return AppendOutcome(KafkaError.KAFKA_STORAGE_ERROR)
        entry = _ChannelRecord(appended.offset + appended.size_bytes)
        entry.stream_epoch = state.leader_epoch  # = the stream's epoch at this main
        with self._lock:
            self._records[appended.offset] = entry
            self._appending.pop(token, None)
            self._remember(appended.offset, records)
        self.traffic.add("wal_data_bytes", len(records))
        epoch = image.route_epoch.current_epoch
        for attempt in (1, 2):
            req = ZoneRouteRequest[ZONE_ROUTE_VERSION](
                route_epoch=epoch,
                source_node_id=self.node_id,
                channel_bucket_id=CHANNEL_BUCKET_ID,
                channel_prefix=channel_location(self.node_id).prefix,
                channel_offset=appended.offset,
                topic_id=uuid.UUID(proxy.topic_id),
                partition=proxy.partition,
                timeout_ms=timeout_ms,
            )
            try:
                resp = self._connection(main.host, main.kafka_port, main.az).call(
                    req, timeout_s + RPC_EXTRA_TIMEOUT_S
                )
            except (OSError, ConnectionError) as exc:
                # the main may have appended (and linked) it: keep the record until that
                # is known to be committed
                log.warning("zone route to node %d failed: %s", main.node_id, exc)
                with self._lock:
                    entry.stream_id, entry.end_offset = state.stream_id, UNKNOWN_END
                    entry.answered = True
                return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
            if resp.error_code != KafkaError.STALE_BROKER_EPOCH or attempt == 2:
                break
            # the main saw a bump we have not: nothing was appended; again in the new epoch
            epoch = self._newer_route_epoch(epoch)
        with self._lock:
            entry.stream_id, entry.end_offset = resp.stream_id, resp.end_offset
            entry.answered = True
            if resp.end_offset >= 0:
                # a lost answer for this stream came before this one: it is covered too
                for other in self._records.values():
                    if other.stream_id == resp.stream_id and other.end_offset == UNKNOWN_END:
                        other.end_offset = resp.end_offset
        if resp.error_code:
            log.info(
                "zone route to node %d refused (%d): %s",
                main.node_id,
                resp.error_code,
                resp.error_message,
            )
            return AppendOutcome(KafkaError(resp.error_code))
        return AppendOutcome(KafkaError.NONE, resp.base_offset)

    def _remember(self, offset: int, records: bytes) -> None:
        """Keep a channel record this broker wrote (under `_lock`)."""
        self._recent[offset] = records
        self._recent_bytes += len(records)
        while self._recent_bytes > RECENT_CHANNEL_BYTES:
            _, dropped = self._recent.popitem(last=False)
            self._recent_bytes -= len(dropped)

    def recent_record(self, offset: int) -> bytes | None:
        """The data of this broker's channel record at `offset`, if still remembered."""
        with self._lock:
            return self._recent.get(offset)

    def existing_own_pipeline(self, topic_id: str, partition: int) -> _OwnPipeline | None:
        with self._lock:
            return self._own_workers.get((topic_id, partition))

    def own_pipeline(self, topic_id: str, partition: int) -> _OwnPipeline | None:
        """The produce pipeline of a partition led here, through the own channel (None
        past the bound: that produce goes straight to the partition)."""
        with self._lock:
            pipeline = self._own_workers.get((topic_id, partition))
            if pipeline is None and len(self._own_workers) < MAX_PROXY_WORKERS:
                pipeline = _OwnPipeline(partition)
                self._own_workers[(topic_id, partition)] = pipeline
            return pipeline

    def _start_append(self) -> int:
        """Register a channel append about to start (see `_appending`); its token."""
        assert self.channel is not None
        floor = self.channel.end_offset  # read first: the record lands at or past it
        with self._lock:
            token = self._append_token
            self._append_token += 1
            self._appending[token] = floor
            return token

    def begin_own(self, records: bytes) -> tuple[int, Future] | None:
        """Start the channel append of a produce to a partition led here (nothing from its
        possible offset on is trimmed until `finish_own`). None: no channel."""
        if self.channel is None:
            return None
        token = self._start_append()
        try:
            return token, self.channel.append(records)
        except Exception as exc:  # noqa: BLE001 - the channel failed: append directly
            with self._lock:
                self._appending.pop(token, None)
            log.warning("RouterChannel append (own produce) failed: %s", exc)
            return None

    def finish_own(
        self,
        handler: ZoneRouteHandler,
        plog,
        records: bytes,
        token: int,
        channel_append: Future,
    ) -> AppendOutcome | None:
        """Once its channel append is done: append the produce to the partition with Link
        Records in the WAL (the data is in this broker's own RouterChannel, readable by
        the proxies' snapshot reads). None when the channel append failed (the caller
        appends directly)."""
        try:
            appended = channel_append.result(0)
        except Exception as exc:  # noqa: BLE001 - the channel failed: append directly
            log.warning("RouterChannel append (own produce) failed: %s", exc)
            with self._lock:
                self._appending.pop(token, None)
            return None
        entry = _ChannelRecord(appended.offset + appended.size_bytes)
        entry.stream_epoch = plog.leader_epoch
        with self._lock:
            self._records[appended.offset] = entry
            self._appending.pop(token, None)
            self._remember(appended.offset, records)
        self.traffic.add("wal_data_bytes", len(records))
        try:
            outcome, stream_id, end = handler.append_own(
                self.node_id, appended.offset, records, plog
            )
        except BaseException:
            with self._lock:  # it may have been linked: kept until known committed
                entry.stream_id, entry.end_offset = plog_stream_id(plog), UNKNOWN_END
                entry.answered = True
            raise
        with self._lock:
            entry.stream_id, entry.end_offset = stream_id, end
            entry.answered = True
            if end >= 0:
                for other in self._records.values():
                    if other.stream_id == stream_id and other.end_offset == UNKNOWN_END:
                        other.end_offset = end
        return outcome

    def _newer_route_epoch(self, epoch: int) -> int:
        """The current route epoch once this broker's image is past `epoch` (bounded)."""
        deadline = time.monotonic() + ROUTE_EPOCH_WAIT_S
        while time.monotonic() < deadline:
            current = self.image_fn().route_epoch.current_epoch
            if current > epoch:
                return current
            time.sleep(0.01)
        return self.image_fn().route_epoch.current_epoch

    def trim_point(self) -> int | None:
        """The channel offset below which no record is needed any more: answered, and any
        Link Record to it committed by its main (the stream's committed end in the image
        reached the request's end), and below where every append whose offset is not
        known yet may land (appends run all the time under load: they must not stop the
        trims); None when nothing may be trimmed."""
        image = self.image_fn()
        with self._lock:
            floor = min(self._appending.values(), default=None)
            up_to = self._trim_point(image, floor)
            return up_to if floor is None or up_to is None else min(up_to, floor)

    def _trim_point(self, image: MetadataImage, floor: int | None) -> int | None:
        """`trim_point` under `_lock`."""
        if self._keep_before is not None:
            if self._keep_until_epoch is None:
                if not self.ready_fn():
                    return self._keep_before
                self._keep_until_epoch = image.route_epoch.current_epoch
            if image.route_epoch.committed_epoch < self._keep_until_epoch:
                return self._keep_before
            self._keep_before = None
        up_to = self._acked_end
        for offset in sorted(self._records):
            entry = self._records[offset]
            if not entry.answered or (floor is not None and offset >= floor):
                return offset
            stream = image.streams.get(entry.stream_id)
            # needed while the main that may hold links to it still has the stream (a
            # new stream epoch: the old main's WAL was recovered and committed) and
            # its committed end has not reached them (or is unknown: a lost answer)
            if (
                entry.stream_id >= 0
                and entry.end_offset != -1
                and stream is not None
                and stream.epoch == entry.stream_epoch
                and (entry.end_offset == UNKNOWN_END or stream.end_offset < entry.end_offset)
            ):
                return offset
            del self._records[offset]
            up_to = self._acked_end = max(self._acked_end, entry.next_offset)
        return up_to

    def _trim_loop(self) -> None:
        while not self._stop.wait(CHANNEL_TRIM_INTERVAL_S):
            up_to = self.trim_point()
            if up_to is None:
                continue
            try:
                if self.channel is not None and up_to > self.channel.start_offset:
                    self.channel.trim(up_to)
            except (WALError, ValueError) as exc:
                log.warning("RouterChannel trim to %d failed: %s", up_to, exc)


class ProxyPartition:
    """A partition whose main is in another AZ, served to this AZ's clients (a
    `PartitionBackend`). Its state is read from the current metadata image on each call.
    Thread-safe: appends are queued to one serial worker (the partition's order)."""

    # it serves what the main committed: a fetch past that waits instead of OFFSET_OUT_OF_RANGE
    lags_leader = True
    forwards_to_main = True  # DeleteRecords (and timestamp lookups) are the main's
    counts_own_wal_bytes = True  # its RouterChannel write is counted by the router

    def __init__(self, router: ZoneRouter, topic_id: str, partition: int):
        self.router = router
        self.topic_id = topic_id
        self.partition = partition
        self.worker = ThreadPoolExecutor(1, thread_name_prefix=f"proxy-{partition}")
        self._listeners: list[Callable[[], None]] = []
        self._listeners_lock = threading.Lock()

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

    def append(self, records: bytes | None, timeout_ms: int = 30_000) -> AppendOutcome:
        if not records:
            return AppendOutcome(KafkaError.CORRUPT_MESSAGE)
        try:
            fut: Future = self.worker.submit(self.router.forward, self, records, timeout_ms)
        except RuntimeError:  # the worker was shut down (topic deleted, broker stopping)
            return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
        return AppendOutcome(KafkaError.NONE, -1, [fut])

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
        conn = _MainConnection(
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


def plog_stream_id(plog) -> int:
    stream = getattr(plog, "stream", None)
    return stream.stream_id if stream is not None else -1


class OwnChannelPartition:
    """A partition this broker leads, as a client that declared an AZ sees it when zone
    routing is on: its produce goes through this broker's own RouterChannel (the data in
    object storage once, readable by the proxies' snapshot reads; a Link Record in the
    WAL), everything else is the partition's. Thread-safe: appends are queued to the
    partition's serial worker (the produce order); the durable futures complete the
    outcome."""

    counts_own_wal_bytes = True  # the channel (or direct) write is counted here

    def __init__(
        self,
        router: ZoneRouter,
        handler: ZoneRouteHandler,
        plog,
        topic_id: str,
        wanted: Callable[[], bool] = lambda: True,
    ):
        self._plog = plog
        self._router = router
        self._handler = handler
        self._topic_id = topic_id
        self._wanted = wanted  # a proxy reads the partition (its snapshot reads need it)

    def __getattr__(self, name: str):
        return getattr(self._plog, name)

    def __eq__(self, other: object) -> bool:
        return self._plog is getattr(other, "_plog", getattr(other, "_inner", other))

    def __hash__(self) -> int:
        return id(self._plog)

    def _direct(self, records: bytes | None) -> AppendOutcome:
        outcome = self._plog.append(records)
        if outcome.error == KafkaError.NONE:
            self._router.traffic.add("wal_data_bytes", len(records or b""))
        return outcome

    def append(self, records: bytes | None, timeout_ms: int = 30_000) -> AppendOutcome:
        """Called on the event loop (produce requests in their order)."""
        key = (self._topic_id, self._plog.partition)
        if not self._wanted():
            # no proxy reads the partition: straight to it, once the produce requests
            # still in the pipeline are appended (their order is kept)
            pipeline = self._router.existing_own_pipeline(*key)
            if pipeline is None or pipeline.pending == 0:
                return self._direct(records)
        pipeline = self._router.own_pipeline(*key)
        if not records or pipeline is None:
            return self._direct(records)
        done: Future = Future()
        with pipeline.lock:
            pipeline.pending += 1
        try:
            pipeline.worker.submit(self._begin, pipeline, records, done)
        except RuntimeError:  # the pipeline was closed (leadership moved, stopping)
            with pipeline.lock:
                pipeline.pending -= 1
            return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
        return AppendOutcome(KafkaError.NONE, -1, [done])

    def _begin(self, pipeline: _OwnPipeline, records: bytes, done: Future) -> None:
        """On the pipeline's worker (the produce order): start the channel append and
        queue the rest behind the earlier produce requests."""
        started = self._router.begin_own(records)
        with pipeline.lock:
            pipeline.items.append((started, records, done))
        if started is None:
            self._drain(pipeline)
        else:
            started[1].add_done_callback(lambda _: self._drain(pipeline))

    def _drain(self, pipeline: _OwnPipeline) -> None:
        """Append, in order, every queued produce whose channel append is done."""
        with pipeline.lock:
            while pipeline.items:
                started, records, done = pipeline.items[0]
                if started is not None and not started[1].done():
                    return
                pipeline.items.popleft()
                pipeline.pending -= 1  # appended to the partition just below: in order
                try:
                    outcome = None
                    if started is not None:
                        token, channel_append = started
                        outcome = self._router.finish_own(
                            self._handler, self._plog, records, token, channel_append
                        )
                    if outcome is None:
                        outcome = self._direct(records)
                except BaseException as exc:  # noqa: BLE001 - handed to the produce
                    done.set_exception(exc)
                    continue
                _complete_when_durable(outcome, done)


def _complete_when_durable(outcome: AppendOutcome, done: Future) -> None:
    """Resolve `done` with `outcome` (its error and base offset) once all its appends are
    durable, or with the first failure."""
    durable = list(outcome.durable)
    result = AppendOutcome(outcome.error, outcome.base_offset)
    if outcome.error != KafkaError.NONE or not durable:
        done.set_result(result)
        return
    remaining = [len(durable)]
    lock = threading.Lock()

    def settled(fut: Future) -> None:
        exc = fut.exception()
        with lock:
            remaining[0] -= 1
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            elif remaining[0] == 0:
                done.set_result(result)

    for fut in durable:
        fut.add_done_callback(settled)


class _OwnPipeline:
    """The produce requests of one partition led here going through the own channel, in
    their order: a serial worker starts each channel append; each is appended to the
    partition once it and every earlier one are done (channel appends run in parallel,
    the partition sees them in order). Thread-safe (`lock`)."""

    def __init__(self, partition: int):
        self.worker = ThreadPoolExecutor(1, thread_name_prefix=f"own-{partition}")
        self.lock = threading.Lock()
        self.pending = 0  # produce requests queued, not yet appended to the partition
        # (token and channel append, or None: append directly), data, the produce's future
        self.items: deque[tuple[tuple[int, Future] | None, bytes, Future]] = deque()

    def close(self) -> None:
        self.worker.shutdown(wait=False)


class ZoneRouteHandler:
    """The main's side of `ZoneRouteRequest` (a Kafka API handler). Thread-safe; the append
    happens on the event loop as a client's produce does."""

    def __init__(
        self,
        image_fn: Callable[[], MetadataImage],
        partitions: PartitionResolver,
        channels: ChannelReaders,
        traffic: ZoneTraffic,
        io: Callable | None,
    ):
        self.image_fn = image_fn
        self.partitions = partitions
        self.channels = channels
        self.traffic = traffic
        self.io = io  # run a blocking call off the event loop: await io(fn, *args)
        # accepted requests whose links may not be committed yet (the persisted epoch)
        self._pending: dict[int, dict] = {}
        self._pending_lock = threading.Lock()
        self._next_token = 0
        # where recent links' data lies, for the proxies' snapshot reads (set by the node)
        self.link_index: LinkIndex | None = None
        self.snapshot_server = None  # its GetPartitionSnapshot handler (snapshot_read.py)

    def registrations(self) -> list:
        extra = self.snapshot_server.registrations() if self.snapshot_server else []
        return [(ZoneRouteRequest, 0, 0, self.zone_route), *extra]

    def _track(self, route_epoch: int) -> tuple[int, dict]:
        """Count a request of `route_epoch` as pending (under `_pending_lock`)."""
        token = self._next_token
        self._next_token += 1
        entry = {"epoch": route_epoch, "done": False, "stream_id": -1, "end": -1}
        entry["stream_epoch"] = -1
        self._pending[token] = entry
        return token, entry

    def _untrack_if_unlinked(self, token: int, entry: dict) -> None:
        with self._pending_lock:
            entry["done"] = True
            if entry["end"] < 0:  # nothing linked
                self._pending.pop(token, None)

    def _link_append(
        self, source: int, channel_offset: int, data: bytes, plog, entry: dict
    ) -> tuple[AppendOutcome, int, int]:
        """Append `data` (the channel record at `channel_offset` of node `source`) to the
        partition with Link Records in the WAL; records every link in the snapshot index.
        Returns the outcome, the stream id and the end offset of the last link (-1: none).
        Thread-safe (the partition's lock orders appends)."""
        now_ms = int(time.time() * 1000)
        ends: list[int] = []  # the end offset of every batch written as a Link Record
        stream = getattr(plog, "stream", None)
        stream_id = stream.stream_id if stream is not None else -1
        leader_epoch = plog.leader_epoch
        index = self.link_index

        def link(position: int, length: int) -> Callable[[int], bytes]:
            self.traffic.add("wal_data_bytes", HEADER_SIZE_BYTES + LINK_PAYLOAD_BYTES)
            count = parse_batch_header(data, position).last_offset_delta + 1

            def build(base: int) -> bytes:  # under the stream's lock, before append returns
                ends.append(base + count)
                record = LinkRecord(source, channel_offset, position, length, now_ms)
                if index is not None and stream_id >= 0:
                    index.record(stream_id, LinkLocation(base, count, leader_epoch, record))
                return record.encode()

            return build

        outcome = plog.append(data, link=link)
        if index is not None and stream_id >= 0:
            committed = self.image_fn().streams.get(stream_id)
            if committed is not None:
                index.prune(stream_id, committed.end_offset)
        # the proxy keeps the channel record until the stream's committed end reaches the
        # end of what links to it (-1: no link was written)
        end = max(ends, default=-1)
        with self._pending_lock:
            entry["stream_id"], entry["end"] = stream_id, end
            entry["stream_epoch"] = plog.leader_epoch
        return outcome, stream_id, end

    def append_own(
        self, node_id: int, channel_offset: int, data: bytes, plog
    ) -> tuple[AppendOutcome, int, int]:
        """The main's own produce routed through its own RouterChannel (a client of an AZ
        producing to a partition led here): `data` is the channel record at
        `channel_offset`; appended with Link Records, tracked in the current route epoch
        as a proxy's request is. Thread-safe; called off the event loop."""
        with self._pending_lock:
            token, entry = self._track(self.image_fn().route_epoch.current_epoch)
        try:
            return self._link_append(node_id, channel_offset, data, plog, entry)
        finally:
            self._untrack_if_unlinked(token, entry)

    def persisted_epoch(self) -> int:
        """The largest route epoch P (at most the fenced one, which this main refuses from
        now on) such that every request it accepted in an epoch <= P is committed: its Link
        Records uploaded (the stream's committed end reached them, or the stream moved to a
        new epoch after a failover). Reported with heartbeats; the controller's minimum over
        the brokers is the committed route epoch."""
        with self._pending_lock:
            image = self.image_fn()
            fenced = image.route_epoch.fenced_epoch
            for token, entry in list(self._pending.items()):
                if not entry["done"] or entry["end"] < 0:
                    continue
                stream = image.streams.get(entry["stream_id"])
                if (
                    stream is None
                    or stream.epoch != entry["stream_epoch"]
                    or stream.end_offset >= entry["end"]
                ):
                    del self._pending[token]
            blocking = [entry["epoch"] for entry in self._pending.values()]
        return min(fenced, min(blocking) - 1) if blocking else fenced

    def persisted_epoch_forcing_commit(self, request_upload: Callable[[], None]) -> int:
        """`persisted_epoch()`, and when it lags the fenced epoch (links accepted in a
        fenced epoch are not uploaded yet) ask the storage engine to upload now: the
        ConfirmWAL is committed up to the fenced epoch at least once per route epoch
        (`route_epoch_interval_ms`, 10 s) whatever the upload interval, so the committed
        epoch advances and proxies can trim their channels. Called with every heartbeat."""
        persisted = self.persisted_epoch()
        if persisted < self.image_fn().route_epoch.fenced_epoch:
            request_upload()
        return persisted

    @staticmethod
    def _answer(
        error: KafkaError,
        message: str | None = None,
        base: int = -1,
        start: int = -1,
        stream_id: int = -1,
        end: int = -1,
    ):
        return ZoneRouteResponse[ZONE_ROUTE_VERSION](
            error_code=error,
            error_message=message,
            base_offset=base,
            log_start_offset=start,
            stream_id=stream_id,
            end_offset=end,
        )

    async def zone_route(self, req, ctx):
        with self._pending_lock:
            # checked and tracked at once against a fresh image: a persisted epoch reported
            # meanwhile either sees this request or is below its epoch
            image = self.image_fn()
            fenced = image.route_epoch.fenced_epoch
            if req.route_epoch <= fenced:
                return self._answer(
                    KafkaError.STALE_BROKER_EPOCH,
                    f"route epoch {req.route_epoch} is fenced (fenced route epoch {fenced})",
                )
            token, entry = self._track(req.route_epoch)
        try:
            return await self._checked(req, image, entry)
        finally:
            self._untrack_if_unlinked(token, entry)

    async def _checked(self, req, image: MetadataImage, entry: dict):
        source = req.source_node_id
        expected = channel_location(source)
        if (
            source not in image.brokers
            or req.channel_bucket_id != expected.bucket_id
            or req.channel_prefix != expected.prefix
        ):
            return self._answer(
                KafkaError.INVALID_REQUEST,
                f"no RouterChannel of node {source} at "
                f"{req.channel_bucket_id}/{req.channel_prefix!r}",
            )
        plog = self.partitions.get(str(req.topic_id), req.partition)
        if plog is None:
            return self._answer(KafkaError.NOT_LEADER_OR_FOLLOWER, "not the partition's main")
        assert self.io is not None
        try:
            record = await self.io(self.channels.reader(source).read, req.channel_offset)
        except WALTrimmedError as exc:
            return self._answer(KafkaError.INVALID_REQUEST, f"channel offset trimmed: {exc}")
        except ValueError as exc:
            return self._answer(KafkaError.INVALID_REQUEST, f"bad channel offset: {exc}")
        except Exception as exc:  # noqa: BLE001 - the store failed: the proxy retries
            return self._answer(KafkaError.KAFKA_STORAGE_ERROR, f"channel read failed: {exc}")
        outcome, stream_id, end = self._link_append(
            source, req.channel_offset, record.data, plog, entry
        )
        start = plog.log_start_offset
        if outcome.error != KafkaError.NONE:
            return self._answer(outcome.error, None, -1, start, stream_id, end)
        deadline = time.monotonic() + max(req.timeout_ms, 1) / 1000
        for fut in outcome.durable:
            try:
                await asyncio.wait_for(
                    asyncio.wrap_future(fut), max(deadline - time.monotonic(), 0.001)
                )
            except TimeoutError:
                error, message = KafkaError.REQUEST_TIMED_OUT, "append not durable in time"
                return self._answer(error, message, -1, start, stream_id, end)
            except Exception as exc:  # noqa: BLE001 - fenced, WAL failed
                error, message = KafkaError.NOT_LEADER_OR_FOLLOWER, str(exc)[:200]
                return self._answer(error, message, -1, start, stream_id, end)
        return self._answer(KafkaError.NONE, None, outcome.base_offset, start, stream_id, end)
