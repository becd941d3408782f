"""This broker's sending side of the zone router (seed 000): its RouterChannel, its
connections to the mains, its proxy partitions, and the channel's trimming.

Produce through a proxy: `ProxyPartition.append` (`proxy_partition.py`) queues the
request's record batches to the partition's serial worker, which runs `ZoneRouter.forward`:
the batches go into this broker's RouterChannel (an object WAL under
`router-channel/node-<id>` following the active bucket, `channel.py`), then its route (route epoch, source node,
channel offset) goes to the main (`route_handler.ZoneRouteHandler`) in a `ZoneRouteRequest`
batched with the other routes to that main (`route_batch.RouteBatcher`); the main answers
once its appends are durable; the proxy then acknowledges the client.

The main's WAL (the ConfirmWAL) keeps only a Link Record per batch (`formats/link_record.py`);
its LogCache and its uploads hold the data, and its WAL recovery (or another broker's
failover of it) reads the data back from the channel. So the proxy keeps a channel record
until the main has committed the partition's data to object storage (the stream's committed
end in the image reaches what the request appended), then trims it.

A client of an AZ producing at the partition's main goes through the main's own
RouterChannel as well (`own_channel.py`: `begin_own` / `finish_own` here), so the proxies'
snapshot reads find its data in object storage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from controlplane.image import MetadataImage
from dataplane.config import ObjectWALConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.interbroker import BrokerConnection, InterBrokerLogin
from dataplane.kafka.partition_backend import AppendOutcome, PartitionBackend
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal.base import WALError
from dataplane.s3stream.wal.segmented_wal import BucketFollowingWAL
from dataplane.zonerouter.channel import channel_location, open_channel
from dataplane.zonerouter.own_channel import OwnPipeline
from dataplane.zonerouter.protocol import ZONE_ROUTER_CLIENT_ID
from dataplane.zonerouter.proxy_partition import ProxyPartition
from dataplane.zonerouter.route_batch import RouteBatcher
from dataplane.zonerouter.route_handler import ZoneRouteHandler
from dataplane.zonerouter.traffic import ZoneTraffic

if TYPE_CHECKING:
    from dataplane.zonerouter.snapshot_read import SnapshotReader

log = logging.getLogger(__name__)

CHANNEL_CAPACITY_BYTES = 1024 * 1024 * 1024
CHANNEL_TRIM_INTERVAL_S = 1.0
RECENT_CHANNEL_BYTES = 16 * 1024 * 1024
MAX_PROXY_WORKERS = 1024  # partitions proxied at once (one serial worker each)
RPC_EXTRA_TIMEOUT_S = 5.0
ROUTE_EPOCH_WAIT_S = 2.0
UNKNOWN_END = -2


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
        snapshots: SnapshotReader | None = None,
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
        self.channel: BucketFollowingWAL | None = None
        self._lock = threading.Lock()
        self._proxies: dict[tuple[str, int], ProxyPartition] = {}
        # the route batchers (one thread and connection each) by the main's address
        self._batchers: dict[tuple[str, int], RouteBatcher] = {}
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
        self._own_workers: dict[tuple[str, int], OwnPipeline] = {}
        # the channel records this broker wrote last, by offset: its snapshot reads of its
        # own channel need no GET (bounded by RECENT_CHANNEL_BYTES, oldest dropped first)
        self._recent: OrderedDict[int, bytes] = OrderedDict()
        self._recent_bytes = 0
        # the proxy's snapshot reads; None: proxies serve what the mains committed only
        self.snapshots = snapshots

    def start(self) -> None:
        self.channel = open_channel(
            self.objects,
            self.node_id,
            self.node_epoch,
            CHANNEL_CAPACITY_BYTES,
            self.channel_config,
            lambda: self.image_fn().active_bucket_id if self.ready_fn() else None,
        )
        self._acked_end = self.channel.end_offset
        if self.channel.end_offset > self.channel.start_offset:
            self._keep_before = self.channel.start_offset
        self._trimmer.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            proxies = list(self._proxies.values())
            batchers = list(self._batchers.values())
            own = list(self._own_workers.values())
        for proxy in proxies:
            proxy.worker.shutdown(wait=False, cancel_futures=True)
        for pipeline in own:
            pipeline.close()
        for batcher in batchers:
            batcher.close()
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

    def _batcher(self, main) -> RouteBatcher:
        """The route batcher (and pooled connection) of the main `main` (a BrokerState)."""
        with self._lock:
            batcher = self._batchers.get((main.host, main.kafka_port))
            if batcher is None:
                where = channel_location(self.node_id)
                conn = BrokerConnection(
                    main.host,
                    main.kafka_port,
                    self.login,
                    lambda n, az=main.az: self.traffic.broker(az, n, "route"),
                    ZONE_ROUTER_CLIENT_ID,
                )
                batcher = self._batchers[(main.host, main.kafka_port)] = RouteBatcher(
                    conn, self.node_id, where.prefix, main.node_id
                )
            return batcher

    def broker_bytes_counter(self, peer_az: str) -> Callable[[int], None]:
        """Counts bytes exchanged with a broker of `peer_az` (the accounting)."""
        return lambda n: self.traffic.broker(peer_az, n)

    def forward(self, proxy: ProxyPartition, records: bytes, timeout_ms: int) -> AppendOutcome:
        """Channel append + zone route to the main (runs on the partition's worker; the
        route is batched with the others to the same main, `route_batch.py`)."""
        assert self.channel is not None
        image = self.image_fn()
        topic = image.topics.get(proxy.topic_id)
        state = topic.partitions.get(proxy.partition) if topic else None
        main = image.brokers.get(state.leader_node_id) if state else None
        if state is None or main is None or main.fenced:
            return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
        timeout_s = max(timeout_ms, 1) / 1000
        batcher = self._batcher(main)
        ticket = batcher.ticket()
        token = self._start_append()
        try:
            channel_append = self.channel.append_waiting(
                records, min(timeout_s, self.channel_config.queue_wait_timeout_s)
            )
            channel_append.add_done_callback(lambda _: batcher.channel_done(ticket))
            appended = channel_append.result(timeout_s)
        except Exception as exc:  # noqa: BLE001 - the channel failed: the client retries
            batcher.abandon(ticket)
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
            try:
                error, message, base, stream_id, end = batcher.route(
                    ticket, epoch, proxy.topic_id, proxy.partition, appended.offset, timeout_ms
                ).result(timeout_s + 2 * RPC_EXTRA_TIMEOUT_S)
            except (OSError, ConnectionError, ValueError, FutureTimeout) as exc:
                # the main may have appended (and linked) it: keep the record until that
                # is known to be committed
                log.warning("zone route to node %d failed: %s", main.node_id, exc)
                with self._lock:
                    entry.stream_id, entry.end_offset = state.stream_id, UNKNOWN_END
                    entry.answered = True
                return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
            if error != KafkaError.STALE_BROKER_EPOCH or attempt == 2:
                break
            # the main saw a bump we have not: nothing was appended; again in the new epoch
            epoch = self._newer_route_epoch(epoch)
        with self._lock:
            entry.stream_id, entry.end_offset = stream_id, end
            entry.answered = True
            if end >= 0:
                # a lost answer for this stream came before this one: it is covered too
                for other in self._records.values():
                    if other.stream_id == stream_id and other.end_offset == UNKNOWN_END:
                        other.end_offset = end
        if error:
            log.info("zone route to node %d refused (%d): %s", main.node_id, error, message)
            return AppendOutcome(KafkaError(error))
        if self.snapshots is not None and end >= 0:
            # this AZ's fetches of the partition need no snapshot poll for these batches
            self.snapshots.routed(proxy, main.node_id, state.leader_epoch, base, end, records)
        return AppendOutcome(KafkaError.NONE, base)

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

    def existing_own_pipeline(self, topic_id: str, partition: int) -> OwnPipeline | None:
        with self._lock:
            return self._own_workers.get((topic_id, partition))

    def own_pipeline(self, topic_id: str, partition: int) -> OwnPipeline | None:
        """The produce pipeline of a partition led here, through the own channel (None
        past the bound: that produce goes straight to the partition)."""
        with self._lock:
            pipeline = self._own_workers.get((topic_id, partition))
            if pipeline is None and len(self._own_workers) < MAX_PROXY_WORKERS:
                pipeline = OwnPipeline(partition)
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
            return token, self.channel.append_waiting(
                records, self.channel_config.queue_wait_timeout_s
            )
        except Exception as exc:  # noqa: BLE001 - the channel failed: append directly
            with self._lock:
                self._appending.pop(token, None)
            log.warning("RouterChannel append (own produce) failed: %s", exc)
            return None

    def finish_own(
        self,
        handler: ZoneRouteHandler,
        plog: PartitionBackend,
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
                entry.stream_id, entry.end_offset = plog.stream_id, UNKNOWN_END
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
