"""Snapshot reads (seed 000): a proxy serves its AZ's consumers what the main made durable
but has not uploaded yet, reading the data from object storage, never from the main.

The proxy (`SnapshotReader`) long-polls each main whose partitions its clients fetch with
an incremental `GetPartitionSnapshotRequest` (per partition: the offset it has up to; from
version 2 in a snapshot session, one per broker pair: a poll lists only what the proxy
changed, an answer only the partitions with something new, links packed). The
main (`SnapshotServer`) answers at once when a partition's high watermark is past that
offset, else when an append becomes durable or after the wait: the high watermark, the
leader epoch and the places of the linked batches past the offset (`snapshot.LinkIndex`:
channel node, offset, position, length; about 40 bytes each, never the data). The proxy
reads each batch from the RouterChannel object that holds it (`ChannelReaders`, object
storage in its own region), re-patches its offset and epoch (`link_record.resolve`: byte
for byte the main's batch), puts it in its bounded `SnapshotCache`, and wakes the fetches
waiting on the partition. A fetch below the main's committed end reads object storage
through the BlockCache as before; past it, the cache. Transaction markers (which the main
holds without a link) come inline in the answer (a few bytes each), with the main's last
stable offset and, incrementally, its aborted transactions (read_committed fetches). Every
produce at a main goes through its own RouterChannel (issue #32), so a partition a proxy
starts following is read from its committed end on; a batch the main holds without a link
(its channel append failed) or whose channel record is gone leaves a gap: offsets from it
are served once the main has uploaded them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.link_record import LinkRecord, resolve
from dataplane.formats.record_batch import parse_batch_header, parse_batches
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.kafka.interbroker import BrokerConnection, InterBrokerLogin
from dataplane.kafka.partition_backend import PartitionResolver
from dataplane.zonerouter.channel import ChannelReaders
from dataplane.zonerouter.protocol import (
    OLDEST_PACKED_SNAPSHOT_VERSION,
    SNAPSHOT_KEY,
    SNAPSHOT_VERSION,
    GetPartitionSnapshotRequest,
    GetPartitionSnapshotResponse,
    VersionProbe,
)
from dataplane.zonerouter.proxy_partition import ProxyPartition
from dataplane.zonerouter.snapshot import (
    CachedBatch,
    LinkIndex,
    LinkPlace,
    SnapshotCache,
    SnapshotSessions,
    TxnView,
    holes,
    pack_links,
    page_aborted,
    unpack_links,
)
from dataplane.zonerouter.snapshot_codec import (
    MAX_PACKED_TOPICS,
    PollForgotten,
    PollPartition,
    PollRequest,
    answer_view,
    pack_poll,
    pack_snapshots,
    unpack_poll,
)
from dataplane.zonerouter.traffic import ZoneTraffic

log = logging.getLogger(__name__)

MAX_PARTITIONS_PER_POLL = 256  # in one answer (versions 0-1: in one poll)
MAX_SESSION_PARTITIONS = 4096  # a proxy follows at most this many of one main
MAX_LINKS_PER_PARTITION = 512
MAX_ABORTED_PER_PARTITION = 1024  # aborted transactions per partition per answer
# transaction markers sent inline: holes between links of at most this many offsets, this
# many per partition per answer (a hole holding client data is read from the main's log
# cache and left out: its data does not cross AZs)
MAX_CONTROL_HOLE_OFFSETS = 8
MAX_CONTROL_HOLES = 16
CONTROL_READ_BYTES = 4096
MAX_WAIT_MS = 500  # the longest a main holds a poll
POLL_WAIT_MS = 200  # what a proxy asks for while the partitions it follows change
# ... and once they stayed the same STEADY_AFTER_S: an idle pair polls half as often (the
# main answers news at once either way; a partition added waits for the poll in flight)
STEADY_POLL_WAIT_MS = 500
STEADY_AFTER_S = 5.0
# polls of one main start at most this often: a main with appends every few ms answers at
# once each time, and each round trip costs CPU on both brokers and ~100 cross-AZ bytes
# (at most 20 ms more latency; 50 polls/s of a busy pair; 40 ms saved no bytes at 100 B)
MIN_POLL_INTERVAL_S = 0.02
RETRY_S = 0.2  # after a failed poll
IDLE_S = 0.05  # a poller with nothing to ask for looks again after this
ACTIVE_S = 30.0  # a partition nobody fetched for this long is no longer polled
RPC_EXTRA_TIMEOUT_S = 5.0
CACHE_BYTES = 64 * 1024 * 1024


class SnapshotServer:
    """The main's side of GetPartitionSnapshot (a Kafka API handler on the event loop); from
    version 2 with snapshot sessions (`snapshot.SnapshotSessions`): a proxy's poll lists
    only what changed and the answer only the partitions with something new, the links
    packed (~10 bytes each). Thread-safe."""

    def __init__(
        self,
        partitions: PartitionResolver,
        index: LinkIndex,
        io: Callable | None = None,
        sessions: SnapshotSessions | None = None,
    ):
        self.partitions = partitions
        self.index = index
        # run a blocking call off the event loop (`await io(fn, *args)`); None: markers
        # are not sent inline (the proxies read them once uploaded)
        self.io = io
        self.sessions = sessions or SnapshotSessions(max_partitions=MAX_SESSION_PARTITIONS)

    def registrations(self) -> list:
        return [(GetPartitionSnapshotRequest, 0, SNAPSHOT_VERSION, self.get_partition_snapshot)]

    def _asked(self, req, version: int) -> list[_Asked] | str:
        """The partitions a poll asks about: listed (versions 0-1), or its session's after
        the poll's changes (version 2; a string: why the session is refused)."""
        if version < 2:
            return [
                _Asked(p.topic_id, p.partition, p.fetch_offset, getattr(p, "aborted_from", -1))
                for p in list(req.partitions)[:MAX_PARTITIONS_PER_POLL]
            ]
        state = self.sessions.update(
            req.node_id,
            req.session_id,
            req.session_epoch,
            req.incremental,
            [
                ((str(p.topic_id), p.partition), p.fetch_offset, p.aborted_from)
                for p in req.partitions
            ],
            [(str(f.topic_id), f.partition) for f in req.forgotten],
        )
        if isinstance(state, str):
            return state
        return [
            _Asked(uuid.UUID(key[0]), key[1], offset, aborted_from, lso)
            for key, (offset, aborted_from, lso) in state.items()
        ]

    def _answer(self, wire_version: int, error_code: int, partitions: list, req=None):
        """The answer at `wire_version` (3: the version 2 partitions packed; 4: their topics
        named by the session's topic table, `req`'s)."""
        R = GetPartitionSnapshotResponse[wire_version]
        if wire_version >= 4:
            if error_code:
                return R(error_code=error_code, packed_partitions=b"")
            table = self.sessions.topic_table(
                req.node_id,
                req.session_id,
                req.session_epoch,
                MAX_PACKED_TOPICS - MAX_PARTITIONS_PER_POLL,
            )
            if table is None:  # superseded, dropped or full: the proxy starts over
                return R(error_code=KafkaError.FETCH_SESSION_ID_NOT_FOUND, packed_partitions=b"")
            return R(error_code=error_code, packed_partitions=pack_snapshots(partitions, table))
        if wire_version >= 3:
            return R(error_code=error_code, packed_partitions=pack_snapshots(partitions))
        return R(error_code=error_code, partitions=partitions)

    async def get_partition_snapshot(self, req, ctx):
        wire_version = getattr(ctx, "api_version", 0)
        if wire_version >= 4:  # version 3's fields, packed
            try:
                req = unpack_poll(bytes(req.packed or b""))
            except ValueError as exc:
                log.warning("bad packed snapshot poll: %s", exc)
                return self._answer(wire_version, KafkaError.INVALID_REQUEST, [])
        version = min(wire_version, 2)  # versions 3-4: version 2's partitions, packed
        R = GetPartitionSnapshotResponse[version]
        asked = self._asked(req, version)
        if isinstance(asked, str):
            error = (
                KafkaError.FETCH_SESSION_ID_NOT_FOUND
                if asked == SnapshotSessions.NOT_FOUND
                else KafkaError.INVALID_FETCH_SESSION_EPOCH
            )
            return self._answer(wire_version, error, [])
        plogs = [self.partitions.get(str(a.topic_id), a.partition) for a in asked]

        def news(a: _Asked, plog) -> bool:
            return (
                plog is None
                or plog.stream_id < 0
                or plog.high_watermark > a.fetch_offset
                or (version >= 1 and _aborted_past(plog, a.aborted_from))
                # version 2: a partition new in the session at once, so the proxy learns
                # its last stable offset even when nothing is new; then when it grows
                or (version >= 2 and a.lso < 0)
                or (a.lso >= 0 and min(plog.last_stable_offset, plog.high_watermark) > a.lso)
            )

        def ready() -> bool:
            return any(news(a, plog) for a, plog in zip(asked, plogs, strict=True))

        wait_s = min(max(req.max_wait_ms, 0), MAX_WAIT_MS) / 1000
        if wait_s > 0 and asked and not ready():
            await self._wait(plogs, ready, wait_s)
        out = []
        answered: dict[tuple[str, int], tuple[int, int, int]] = {}
        for a, plog in zip(asked, plogs, strict=True):
            if version >= 2 and (not news(a, plog) or len(out) >= MAX_PARTITIONS_PER_POLL):
                continue  # nothing new (version 2: left out of the answer)
            snap, next_offset = await self._snapshot(R, version, a, plog, wire_version >= 4)
            out.append(snap)
            if version >= 2:
                key = (str(a.topic_id), a.partition)
                if snap.error_code:
                    self.sessions.forget(req.node_id, req.session_id, key)
                else:
                    markers = [t.marker_offset + 1 for t in snap.aborted_transactions]
                    aborted_from = max([a.aborted_from, *markers])
                    answered[key] = (next_offset, aborted_from, snap.last_stable_offset)
        if version >= 2:
            self.sessions.advance(req.node_id, req.session_id, req.session_epoch, answered)
        return self._answer(wire_version, KafkaError.NONE, out, req)

    @staticmethod
    async def _wait(plogs: list, ready: Callable[[], bool], wait_s: float) -> None:
        """Until a partition's durable append makes `ready()` true, or `wait_s`."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:  # on the appending thread
            loop.call_soon_threadsafe(woken.set)

        live = [plog for plog in plogs if plog is not None]
        for plog in live:
            plog.add_listener(wake)
        try:
            deadline = loop.time() + wait_s
            while True:
                woken.clear()  # before the check: an append after it sets it again
                if ready():
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(woken.wait(), remaining)
                except TimeoutError:
                    break
        finally:
            for plog in live:
                plog.remove_listener(wake)

    async def _snapshot(self, R, version: int, a: _Asked, plog, compact: bool = False):
        """One partition's answer: its high watermark, leader epoch, last stable offset and
        aborted transactions, inline markers and the links past the asked offset; and the
        offset the proxy has up to once it got them (the next poll asks from there)."""
        snap = R.PartitionSnapshot(
            topic_id=a.topic_id,
            partition=a.partition,
            error_code=KafkaError.NONE,
            leader_epoch=-1,
            high_watermark=-1,
            log_start_offset=-1,
        )
        if version < 2:
            snap.links = []
        if plog is None or plog.stream_id < 0:
            snap.error_code = KafkaError.NOT_LEADER_OR_FOLLOWER
            return snap, -1
        # the high watermark first, then the last stable offset (at most it: an append
        # in between must not leave the proxy with an LSO below the high watermark it
        # asks from, which the main would not answer again until the next append),
        # then the aborted list: every transaction starting below the LSO is decided,
        # so its abort (if any) is in the list
        hw = plog.high_watermark
        if version >= 1:
            lso = min(plog.last_stable_offset, hw)
            new = plog.aborted_since(a.aborted_from)
            sent, snap.last_stable_offset = page_aborted(new, lso, MAX_ABORTED_PER_PARTITION)
            snap.aborted_transactions = [
                R.PartitionSnapshot.AbortedTransaction(
                    producer_id=pid, first_offset=first, marker_offset=marker
                )
                for pid, first, marker in sent
            ]
        snap.leader_epoch = plog.leader_epoch
        snap.high_watermark = hw
        snap.log_start_offset = plog.log_start_offset
        locations = self.index.since(plog.stream_id, a.fetch_offset, hw, MAX_LINKS_PER_PARTITION)
        if version >= 1 and self.io is not None:
            linked = [(loc.base_offset, loc.end_offset) for loc in locations]
            # past the last link only when every link up to the high watermark is here
            end = hw if len(locations) < MAX_LINKS_PER_PARTITION else linked[-1][1]
            snap.control_batches = await self._control_batches(
                R,
                plog,
                holes(a.fetch_offset, end, linked, MAX_CONTROL_HOLE_OFFSETS, MAX_CONTROL_HOLES),
            )
        places = [
            LinkPlace(
                loc.base_offset,
                loc.record_count,
                loc.link.source_node_id,
                loc.link.channel_offset,
                loc.link.position,
                loc.link.length,
                loc.link.timestamp_ms,
            )
            for loc in locations
        ]
        if compact:  # version 4: from the high watermark, no timestamps
            snap.packed_links = pack_links(places, start_offset=hw, timestamps=False)
        elif version >= 2:
            snap.packed_links = pack_links(places)
        else:
            snap.links = [
                R.PartitionSnapshot.LinkLocation(
                    base_offset=p.base_offset,
                    record_count=p.record_count,
                    source_node_id=p.source_node_id,
                    channel_offset=p.channel_offset,
                    position=p.position,
                    length=p.length,
                    timestamp_ms=p.timestamp_ms,
                )
                for p in places
            ]
        return snap, next_offset(hw, locations)

    async def _control_batches(self, R, plog, gaps: list[tuple[int, int]]) -> list:
        """The control batches (transaction markers) at the start of each hole, byte for
        byte (read from the main's log cache, off the event loop)."""
        out = []
        for start, end in gaps:
            try:
                data = await self.io(plog.read, start, CONTROL_READ_BYTES, end)
                batches = parse_batches(bytes(data), verify_crc=False, client_origin=False)
            except Exception as exc:  # noqa: BLE001 - left out: read once uploaded
                log.debug("control batches at %d: %s", start, exc)
                continue
            expected = start
            for batch in batches:
                if not batch.is_control or batch.base_offset != expected:
                    break  # client data (not sent across AZs) or not where expected
                out.append(
                    R.PartitionSnapshot.ControlBatch(base_offset=batch.base_offset, data=batch.data)
                )
                expected = batch.base_offset + batch.last_offset_delta + 1
        return out


def next_offset(high_watermark: int, locations: list) -> int:
    """Where a proxy has every link up to once it got an answer's (`end_offset` each):
    the high watermark, or the last link's end when the answer held the most it may."""
    if len(locations) >= MAX_LINKS_PER_PARTITION:
        return locations[-1].base_offset + locations[-1].record_count
    return high_watermark


@dataclass(frozen=True, slots=True)
class _Asked:
    """A partition a poll asks about: the offset and the aborted transactions' marker
    offset the proxy has up to, and the last stable offset it was answered (-1: none)."""

    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    aborted_from: int
    lso: int = -1


def _link_packing(version: int, snap) -> dict:
    """How an answer of `version` packs `snap`'s links (`snapshot.unpack_links`' keywords):
    version 4 from the high watermark and without timestamps."""
    if version >= 4:
        return {"start_offset": snap.high_watermark, "timestamps": False}
    return {}


def _aborted_past(plog, marker_offset: int) -> bool:
    """The partition has an aborted transaction whose marker is at or past the offset."""
    return bool(plog.aborted_since(marker_offset))


@dataclass
class _Polled:
    """A proxied partition the snapshot reads follow (under the reader's lock)."""

    proxy: ProxyPartition
    main_node_id: int
    touched: float
    main_hw: int = -1  # the main's high watermark in its last answer (-1: none yet)
    leader_epoch: int = -1
    next_at: int = -1  # every link below it was answered (read or skipped as a gap)
    # the main's last stable offset and aborted transactions (read_committed fetches);
    # kept across leader epochs: offsets and decided transactions survive a failover
    txns: TxnView = field(default_factory=TxnView)


class _PollSession:
    """A poller's snapshot session with one main (version 2), used by that poller's thread
    only: what the main holds for each partition (mirroring its rules: an answer moves the
    offset to `next_offset`, the aborted-from past its markers), so a poll lists only the
    partitions whose offsets this proxy changed otherwise, and those it forgot. After a
    failed or refused poll the next one sends the full list."""

    def __init__(self) -> None:
        # 31 bits: 5 bytes as a varint (version 4), still unique per proxy in practice
        self.session_id = uuid.uuid4().int & ((1 << 31) - 1) or 1
        self.epoch = 0
        self.full = True
        self.have: dict[tuple[str, int], tuple[int, int]] = {}
        # version 4: the topics the main's answers named, by index (mirrors its table)
        self.topics: list[uuid.UUID] = []
        self._pending: tuple[int, list, list] = (0, [], [])
        self._keys: frozenset = frozenset()
        self._keys_changed_at = 0.0

    def wait_ms(self, asked: list, short_ms: int, now: float) -> int:
        """How long the next poll for `asked` may be held: `short_ms` while the partitions
        followed changed in the last STEADY_AFTER_S, then up to STEADY_POLL_WAIT_MS."""
        keys = frozenset(x[0] for x in asked)
        if keys != self._keys:
            self._keys, self._keys_changed_at = keys, now
        if now - self._keys_changed_at < STEADY_AFTER_S:
            return short_ms
        return max(short_ms, STEADY_POLL_WAIT_MS)

    def request(
        self, node_id: int, max_wait_ms: int, asked: list, version: int = SNAPSHOT_VERSION
    ) -> object:
        """The next poll for `asked` ((key, offset, aborted from) each) at `version`."""
        if self.full:
            epoch, parts, forgotten = 0, list(asked), []
            self.topics = []  # the main starts the session's table over too
        else:
            epoch = self.epoch + 1
            parts = [x for x in asked if self.have.get(x[0]) != (x[1], x[2])]
            keys = {x[0] for x in asked}
            forgotten = [key for key in self.have if key not in keys]
        self._pending = (epoch, parts, forgotten)
        if version >= 4:
            poll = PollRequest(
                node_id,
                max_wait_ms,
                self.session_id,
                epoch,
                not self.full,
                [PollPartition(uuid.UUID(k[0]), k[1], at, af) for k, at, af in parts],
                [PollForgotten(uuid.UUID(k[0]), k[1]) for k in forgotten],
            )
            return GetPartitionSnapshotRequest[version](packed=pack_poll(poll))
        Q = GetPartitionSnapshotRequest[version]
        return Q(
            node_id=node_id,
            max_wait_ms=max_wait_ms,
            session_id=self.session_id,
            session_epoch=epoch,
            incremental=not self.full,
            partitions=[
                Q.PartitionRequest(
                    topic_id=uuid.UUID(key[0]),
                    partition=key[1],
                    fetch_offset=at,
                    aborted_from=aborted_from,
                )
                for key, at, aborted_from in parts
            ],  # fmt: skip
            forgotten=[
                Q.ForgottenPartition(topic_id=uuid.UUID(key[0]), partition=key[1])
                for key in forgotten
            ],
        )

    def sent(self, asked: list) -> None:
        """The last `request` was answered: the main holds what it listed."""
        epoch, parts, forgotten = self._pending
        if self.full:
            self.have = {}
        self.full = False
        self.epoch = epoch
        for key in forgotten:
            self.have.pop(key, None)
        for key, at, aborted_from in parts:
            self.have[key] = (at, aborted_from)

    def answered(self, key: tuple[str, int], offset: int, markers: list[int]) -> None:
        """The main answered `key` up to `offset` and these aborted markers (+1 each)."""
        if key in self.have:
            at, aborted_from = self.have[key]
            self.have[key] = (max(at, offset), max([aborted_from, *markers]))

    def forget(self, key: tuple[str, int]) -> None:
        self.have.pop(key, None)

    def failed(self) -> None:
        """A poll failed or was refused: the main's state is unknown."""
        self.full = True
        self.have = {}


class SnapshotReader:
    """The proxy's snapshot reads: one polling thread per main (started when a client
    first fetches one of its partitions here), one connection each, the shared bounded
    `SnapshotCache`. Thread-safe; `close()` stops the pollers."""

    def __init__(
        self,
        image_fn: Callable[[], MetadataImage],
        channels: ChannelReaders,
        traffic: ZoneTraffic,
        node_id: int,
        login: InterBrokerLogin | None = None,
        cache_bytes: int = CACHE_BYTES,
        poll_wait_ms: int = POLL_WAIT_MS,
        own_records: Callable[[int], bytes | None] = lambda offset: None,
    ):
        self.image_fn = image_fn
        self.channels = channels
        self.traffic = traffic
        self.node_id = node_id
        self.login = login
        self.poll_wait_ms = poll_wait_ms
        self.own_records = own_records  # this broker's channel records it still holds
        self.cache = SnapshotCache(cache_bytes)
        self._lock = threading.Lock()
        self._polled: dict[tuple[str, int], _Polled] = {}
        self._pollers: dict[int, threading.Thread] = {}
        self._stop = threading.Event()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            pollers = list(self._pollers.values())
        for thread in pollers:
            thread.join(1.0)

    # ------------------------------------------------------------ the fetch side

    def _touch(self, proxy: ProxyPartition, main_node_id: int) -> _Polled:
        key = (proxy.topic_id, proxy.partition)
        with self._lock:
            polled = self._polled.get(key)
            if polled is None or polled.main_node_id != main_node_id:
                if polled is not None:  # a new main: its snapshot starts over
                    self.cache.reset(key)
                polled = self._polled[key] = _Polled(proxy, main_node_id, time.monotonic())
            else:
                polled.touched = time.monotonic()
            if main_node_id not in self._pollers and not self._stop.is_set():
                thread = threading.Thread(
                    target=self._poll_loop,
                    args=(main_node_id,),
                    name=f"snapshot-read-{main_node_id}",
                    daemon=True,
                )
                self._pollers[main_node_id] = thread
                thread.start()
            return polled

    def high_watermark(self, proxy: ProxyPartition, main_node_id: int, committed: int) -> int:
        """How far a fetch of `proxy` may read: the main's committed end, extended by the
        contiguous cached batches (at most the main's high watermark)."""
        polled = self._touch(proxy, main_node_id)
        key = (proxy.topic_id, proxy.partition)
        end = self.cache.contiguous_end(key, committed)
        if polled.main_hw >= 0:
            end = min(end, polled.main_hw)
        return max(committed, end)

    def last_stable_offset(
        self, proxy: ProxyPartition, main_node_id: int, high_watermark: int, floor: int
    ) -> int:
        """What a read_committed fetch of `proxy` may read up to: the main's last stable
        offset in its latest snapshot (every aborted transaction below it known here), at
        most `high_watermark`; `floor` until the first snapshot answered."""
        return self._touch(proxy, main_node_id).txns.last_stable_offset(high_watermark, floor)

    def aborted_transactions(
        self, proxy: ProxyPartition, main_node_id: int, start: int, end: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the main's aborted transactions overlapping
        [start, end), as far as its snapshots told (complete below the last stable offset)."""
        return self._touch(proxy, main_node_id).txns.aborted_between(start, end)

    def read(self, proxy: ProxyPartition, offset: int, end: int, max_bytes: int) -> bytes:
        return self.cache.read((proxy.topic_id, proxy.partition), offset, end, max_bytes)

    # ------------------------------------------------------------ the polling side

    def _poll_loop(self, main_node_id: int) -> None:
        conn: BrokerConnection | None = None
        session = _PollSession()
        versions = VersionProbe(SNAPSHOT_VERSION, OLDEST_PACKED_SNAPSHOT_VERSION)
        try:
            while not self._stop.is_set():
                image = self.image_fn()
                main = image.brokers.get(main_node_id)
                asked = self._asked(main_node_id, image)
                if not asked or main is None or main.fenced:
                    self._stop.wait(IDLE_S)
                    continue
                if conn is None or (conn.host, conn.port) != (main.host, main.kafka_port):
                    if conn is not None:
                        conn.close()
                    conn = BrokerConnection(
                        main.host,
                        main.kafka_port,
                        self.login,
                        lambda n, az=main.az: self.traffic.broker(az, n),
                    )
                    session = _PollSession()  # a new main address: a new session
                    versions = VersionProbe(SNAPSHOT_VERSION, OLDEST_PACKED_SNAPSHOT_VERSION)
                version = versions.version()
                started = time.monotonic()
                wait_ms = session.wait_ms(asked, self.poll_wait_ms, started)
                req = session.request(self.node_id, wait_ms, asked, version)
                try:
                    resp = conn.call(
                        req,
                        wait_ms / 1000 + RPC_EXTRA_TIMEOUT_S,
                        SNAPSHOT_KEY,
                        version,
                    )
                    resp = answer_view(resp, session.topics)
                except (OSError, ConnectionError, ValueError) as exc:
                    log.debug("snapshot poll of node %d failed: %s", main_node_id, exc)
                    versions.failed(version)
                    session.failed()
                    self._stop.wait(RETRY_S)
                    continue
                versions.answered(version)
                if resp.error_code:  # the main lost the session: the full list next
                    session.failed()
                    continue
                session.sent(asked)
                self.apply(resp, image, session)
                self._stop.wait(max(0.0, MIN_POLL_INTERVAL_S - (time.monotonic() - started)))
        except Exception:  # noqa: BLE001 - logged; a later fetch starts a new poller
            log.exception("snapshot reads of node %d stopped", main_node_id)
        finally:
            if conn is not None:
                conn.close()
            with self._lock:
                if self._pollers.get(main_node_id) is threading.current_thread():
                    del self._pollers[main_node_id]

    def _asked(
        self, main_node_id: int, image: MetadataImage
    ) -> list[tuple[tuple[str, int], int, int]]:
        """The partitions of the main to poll and the offset each is known up to (the
        committed end, the cache's end, the main's last high watermark: everything up to
        it was answered before) and the marker offset from which it asks for aborted
        transactions; forgets partitions idle for ACTIVE_S or led elsewhere."""
        now = time.monotonic()
        asked = []
        with self._lock:
            for key, polled in list(self._polled.items()):
                topic = image.topics.get(key[0])
                state = topic.partitions.get(key[1]) if topic else None
                if (
                    state is None
                    or now - polled.touched > ACTIVE_S
                    or state.leader_node_id != polled.main_node_id
                ):
                    if polled.main_node_id == main_node_id:
                        del self._polled[key]
                        self.cache.reset(key)
                    continue
                if polled.main_node_id != main_node_id or len(asked) >= MAX_SESSION_PARTITIONS:
                    continue
                stream = image.streams.get(state.stream_id)
                committed = stream.end_offset if stream is not None else 0
                at = max(committed, self.cache.max_end(key), polled.next_at)
                asked.append((key, at, polled.txns.aborted_from))
        return asked

    def apply(self, resp, image: MetadataImage, session: _PollSession | None = None) -> None:
        """Apply a main's snapshot: read the new batches from the channels into the cache,
        note the high watermarks, wake the fetches of partitions that moved; `session`
        learns what the main now holds for each (version 2)."""
        packed_links = getattr(resp, "version", 0) >= 2
        for snap in resp.partitions:
            key = (str(snap.topic_id), snap.partition)
            with self._lock:
                polled = self._polled.get(key)
            if snap.error_code != KafkaError.NONE:
                if session is not None:
                    session.forget(key)
                if polled is not None:
                    polled.main_hw = polled.next_at = -1
                    self.cache.reset(key)
                continue
            try:
                links = (
                    unpack_links(snap.packed_links or b"", **_link_packing(resp.version, snap))
                    if packed_links
                    else list(snap.links)
                )
            except ValueError as exc:
                log.warning("bad packed links from a main: %s", exc)
                links = []
            if session is not None:
                markers = [t.marker_offset + 1 for t in snap.aborted_transactions]
                session.answered(key, next_offset(snap.high_watermark, links), markers)
            if polled is None:
                continue
            topic = image.topics.get(key[0])
            state = topic.partitions.get(key[1]) if topic else None
            stream = image.streams.get(state.stream_id) if state else None
            if state is None or stream is None:
                continue
            committed = stream.end_offset
            before = self.cache.contiguous_end(key, committed)
            lso_before = polled.txns.last_stable_offset(snap.high_watermark, -1)
            polled.txns.apply(
                snap.last_stable_offset,
                [
                    (a.producer_id, a.first_offset, a.marker_offset)
                    for a in snap.aborted_transactions
                ],
            )
            if polled.leader_epoch != snap.leader_epoch:
                self.cache.reset(key)
                polled.leader_epoch = snap.leader_epoch
                polled.main_hw = polled.next_at = -1
            self.cache.prune_below(key, committed)
            have = max(committed, self.cache.max_end(key))
            for control in getattr(snap, "control_batches", None) or []:
                # a marker the main holds without a link: its bytes came in the answer
                try:
                    header = parse_batch_header(control.data)
                except InvalidRecordBatchError:
                    continue
                end = control.base_offset + header.last_offset_delta + 1
                if end > committed:
                    self.cache.put(
                        key, snap.leader_epoch, CachedBatch(control.base_offset, end, control.data)
                    )
            for loc in links:
                if loc.base_offset + loc.record_count <= have:
                    continue
                data = self._read_batch(stream.stream_id, snap.leader_epoch, loc)
                if data is None:
                    break  # a gap: served once the main uploaded it
                batch = CachedBatch(loc.base_offset, loc.base_offset + loc.record_count, data)
                if not self.cache.put(key, snap.leader_epoch, batch):
                    break
                have = batch.end_offset
            polled.main_hw = max(polled.main_hw, snap.high_watermark)
            polled.next_at = max(polled.next_at, next_offset(snap.high_watermark, links))
            if self.cache.contiguous_end(key, committed) > before or (
                polled.txns.last_stable_offset(snap.high_watermark, -1) > lso_before
            ):
                polled.proxy.wake()

    def _read_batch(self, stream_id: int, leader_epoch: int, loc) -> bytes | None:
        """The batch a link location names, from its RouterChannel object (None: gone or
        unreadable)."""
        link = LinkRecord(
            loc.source_node_id, loc.channel_offset, loc.position, loc.length, loc.timestamp_ms
        )
        try:
            data = None
            if loc.source_node_id == self.node_id:
                data = self.own_records(loc.channel_offset)
            stored = data is None
            if stored:
                data = self.channels.reader(loc.source_node_id).read(loc.channel_offset).data
            batch = resolve(
                StreamRecordBatch(
                    stream_id, leader_epoch, loc.base_offset, loc.record_count, link.encode()
                ),
                data,
            )
        except Exception as exc:  # noqa: BLE001 - trimmed, store down: a gap
            log.debug(
                "snapshot read of %d@%d failed: %s", loc.source_node_id, loc.channel_offset, exc
            )
            return None
        if stored:
            self.traffic.add("proxy_read_bytes", len(batch.payload))
        return batch.payload
