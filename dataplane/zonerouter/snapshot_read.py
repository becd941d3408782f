"""Snapshot reads (seed 000), the proxy's side: a proxy serves its AZ's consumers what the
main made durable but has not uploaded yet, reading the data from object storage, never
from the main.

The proxy (`SnapshotReader`) long-polls each main whose partitions its clients fetch with
an incremental `GetPartitionSnapshotRequest` (per partition: the offset it has up to; from
version 2 in a snapshot session, one per broker pair: a poll lists only what the proxy
changed, an answer only the partitions with something new, links packed). The main
(`snapshot_server.SnapshotServer`) answers with the high watermark, the leader epoch and
the places of the linked batches past that offset (never the data). The proxy reads each
batch from the RouterChannel object that holds it (`ChannelReaders`, object storage in its
own region), re-patches its offset and epoch (`link_record.resolve`: byte for byte the
main's batch), puts it in its bounded `SnapshotCache`, and wakes the fetches waiting on
the partition. A fetch below the main's committed end reads object storage through the
BlockCache as before; past it, the cache. Transaction markers (which the main holds
without a link) come inline in the answer (a few bytes each), with the main's last stable
offset and, incrementally, its aborted transactions (read_committed fetches). Every
produce at a main goes through its own RouterChannel (issue #32), so a partition a proxy
starts following is read from its committed end on; a batch the main holds without a link
(its channel append failed) or whose channel record is gone leaves a gap: offsets from it
are served once the main has uploaded them.

The batches this proxy routed itself need no poll (version 5): once a route is answered
(the main made them durable at the offsets the answer names) the zone router hands them
to `SnapshotReader.routed`, which patches and caches them as the snapshot would have, and
the main leaves them out of what wakes this proxy's polls (`snapshot_server.py`). The last
stable offset follows the cache: past it, a run of non-transactional batches cached back
to back moves it on (nothing can open a transaction there).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.link_record import LinkRecord, resolve
from dataplane.formats.record_batch import parse_batch_header, patch_batch
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.kafka.interbroker import BrokerConnection, InterBrokerLogin
from dataplane.zonerouter.channel import ChannelReaders
from dataplane.zonerouter.protocol import (
    OLDEST_PACKED_SNAPSHOT_VERSION,
    SNAPSHOT_KEY,
    SNAPSHOT_VERSION,
    ZONE_ROUTER_CLIENT_ID,
    GetPartitionSnapshotRequest,
    VersionProbe,
)
from dataplane.zonerouter.proxy_partition import ProxyPartition
from dataplane.zonerouter.snapshot import (
    CachedBatch,
    LinkTable,
    SnapshotCache,
    TxnView,
    unpack_links,
)
from dataplane.zonerouter.snapshot_codec import (
    PollForgotten,
    PollPartition,
    PollRequest,
    answer_view,
    pack_poll,
    pack_poll_v6,
)
from dataplane.zonerouter.snapshot_server import (  # SnapshotServer: the main's side
    MAX_SESSION_PARTITIONS,
    next_offset,
)
from dataplane.zonerouter.snapshot_server import (
    SnapshotServer as SnapshotServer,
)
from dataplane.zonerouter.traffic import ZoneTraffic

log = logging.getLogger(__name__)

POLL_WAIT_MS = 200  # what a proxy asks for while the partitions it follows change
# ... and once they stayed the same STEADY_AFTER_S: an idle pair polls half as often (the
# main answers news at once either way; a partition added waits for the poll in flight)
STEADY_POLL_WAIT_MS = 500
STEADY_AFTER_S = 5.0
# polls of one main start at most this often: a main with appends every few ms answers at
# once each time, and each round trip costs CPU on both brokers and ~65 cross-AZ bytes
# (at most 20 ms more latency; 50 polls/s of a busy pair)
MIN_POLL_INTERVAL_S = 0.02
# ... and while the answers name few record bytes (small records at a modest rate: 1,000
# records/s of 100 B is ~33 KB/s per broker pair) a pair's polls cost at most this share of
# them, so the interval grows, up to MAX_POLL_INTERVAL_S (the latency it may add on a
# machine fast enough to answer sooner)
POLL_BYTES_SHARE = 0.03
MAX_POLL_INTERVAL_S = 0.05
PACE_WINDOW_S = 1.0  # the named bytes per second are averaged over about this long
RETRY_S = 0.2  # after a failed poll
IDLE_S = 0.05  # a poller with nothing to ask for looks again after this
ACTIVE_S = 30.0  # a partition nobody fetched for this long is no longer polled
RPC_EXTRA_TIMEOUT_S = 5.0
CACHE_BYTES = 64 * 1024 * 1024


def _patched(
    records: bytes, base_offset: int, end_offset: int, leader_epoch: int
) -> list[CachedBatch]:
    """The batches of a routed produce's `records` as its main appended them: from
    `base_offset`, back to back, up to `end_offset` (else none: the main deduplicated
    some), each with its offsets and `leader_epoch` patched in — pure."""
    out: list[CachedBatch] = []
    offset, position = base_offset, 0
    try:
        while position < len(records):
            header = parse_batch_header(records, position, copy=False)
            count = header.last_offset_delta + 1
            data = patch_batch(header.data, offset, leader_epoch)
            out.append(CachedBatch(offset, offset + count, data))
            offset += count
            position += len(header.data)
    except (InvalidRecordBatchError, ValueError):
        return []
    return out if offset == end_offset else []


def _asked_entry(entry: tuple) -> tuple[tuple[str, int], int, int, int]:
    """A partition to poll as (key, offset, aborted from, last stable offset): the last
    stable offset -1 (none known) when not given."""
    return (entry[0], entry[1], entry[2], entry[3] if len(entry) > 3 else -1)


def _links(version: int, snap) -> list:
    """The links of `snap`, a partition of an answer of `version`: listed (versions 0-1;
    version 6: unpacked with the answer), else packed (`snapshot.unpack_links`; version 4
    from the high watermark and without timestamps). Raises ValueError on a bad packing."""
    if version >= 6 or version < 2:
        return list(snap.links)
    if version >= 4:
        return unpack_links(
            snap.packed_links or b"", start_offset=snap.high_watermark, timestamps=False
        )
    return unpack_links(snap.packed_links or b"")


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


class PollPacer:
    """When a poller's next poll of its main may start: `MIN_POLL_INTERVAL_S` after the
    last one started, longer while its answers name few record bytes per second (a
    round trip then costs at most `POLL_BYTES_SHARE` of them), at most
    `MAX_POLL_INTERVAL_S`. Used by its poller's thread only."""

    def __init__(self) -> None:
        self.named_bytes_per_s = 0.0  # the answers' record bytes, averaged (PACE_WINDOW_S)
        self._answered_at: float | None = None

    def interval_s(self, named_bytes: int, trip_bytes: int, now: float) -> float:
        """After an answer naming `named_bytes` of batches, its round trip `trip_bytes`
        long: how long after the poll's start the next may start."""
        if self._answered_at is not None and now > self._answered_at:
            elapsed = now - self._answered_at
            weight = min(1.0, elapsed / PACE_WINDOW_S)
            rate = named_bytes / elapsed
            self.named_bytes_per_s += weight * (rate - self.named_bytes_per_s)
        self._answered_at = now
        if self.named_bytes_per_s <= 0 or trip_bytes <= 0:
            return MIN_POLL_INTERVAL_S
        paced = trip_bytes / (POLL_BYTES_SHARE * self.named_bytes_per_s)
        return min(MAX_POLL_INTERVAL_S, max(MIN_POLL_INTERVAL_S, paced))


class _PollSession:
    """A poller's snapshot session with one main (version 2), used by that poller's thread
    only: what the main holds for each partition (mirroring its rules: an answer moves the
    offset to `next_offset`, the aborted-from past its markers, the last stable offset to
    the answer's), so a poll lists only the partitions whose offsets this proxy changed
    otherwise (version 5: its last stable offset too, moved past batches it cached), and
    those it forgot. After a failed or refused poll the next one sends the full list."""

    def __init__(self) -> None:
        # 1..63: one byte as a varint (zigzag in versions 4-5), sent with every poll. The
        # main keys sessions by (proxy, id) and a proxy has one session per main: an id
        # taken again after a restart starts with a full poll, which starts the session over
        self.session_id = uuid.uuid4().int % 63 + 1
        self.epoch = 0
        self.full = True
        # (offset, aborted from, last stable offset) the main holds, by partition
        self.have: dict[tuple[str, int], tuple[int, int, int]] = {}
        # version 4: the topics the main's answers named, by index (mirrors its table);
        # version 6: what the main's answers pack links against (mirrors its table)
        self.topics: list[uuid.UUID] = []
        self.links = LinkTable()
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
        """The next poll for `asked` ((key, offset, aborted from[, last stable offset])
        each) at `version`."""
        asked = [_asked_entry(x) for x in asked]
        if self.full:
            epoch, parts, forgotten = 0, list(asked), []
            self.topics = []  # the main starts the session's tables over too
            self.links = LinkTable()
        else:
            epoch = self.epoch + 1
            parts = [x for x in asked if self.have.get(x[0]) != x[1:]]
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
                [PollPartition(uuid.UUID(k[0]), k[1], at, af, lso) for k, at, af, lso in parts],
                [PollForgotten(uuid.UUID(k[0]), k[1]) for k in forgotten],
            )
            packed = pack_poll_v6(poll) if version >= 6 else pack_poll(poll, version)
            return GetPartitionSnapshotRequest[version](packed=packed)
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
                for key, at, aborted_from, _ in parts
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
        for key, at, aborted_from, lso in parts:
            self.have[key] = (at, aborted_from, lso)

    def answered(
        self, key: tuple[str, int], offset: int, markers: list[int], lso: int = -1
    ) -> None:
        """The main answered `key` up to `offset`, these aborted markers (+1 each) and
        last stable offset `lso`."""
        if key in self.have:
            at, aborted_from, known = self.have[key]
            self.have[key] = (max(at, offset), max([aborted_from, *markers]), max(known, lso))

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
        pacer = PollPacer()
        trip_bytes = [0]  # the last round trip's

        def counted(n: int, az: str) -> None:
            trip_bytes[0] = n
            self.traffic.broker(az, n, "snapshot")

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
                        lambda n, az=main.az: counted(n, az),
                        ZONE_ROUTER_CLIENT_ID,
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
                    resp = answer_view(resp, session.topics, session.links)
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
                named = self.apply(resp, image, session)
                now = time.monotonic()
                interval_s = pacer.interval_s(named, trip_bytes[0], now)
                self._stop.wait(max(0.0, interval_s - (now - started)))
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
        committed end or the main's last high watermark, everything up to it answered
        before, extended by the cache's batches from there) and the marker offset from which it asks for aborted
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
                # from what the cache holds back to back (batches routed here may have
                # come before the main's answer naming the ones below them)
                at = self.cache.contiguous_end(key, max(committed, polled.next_at))
                asked.append((key, at, polled.txns.aborted_from, polled.txns.known_lso()))
        return asked

    def apply(self, resp, image: MetadataImage, session: _PollSession | None = None) -> int:
        """Apply a main's snapshot: read the new batches from the channels into the cache,
        note the high watermarks, wake the fetches of partitions that moved; `session`
        learns what the main now holds for each (version 2). Returns the bytes of the
        batches the answer names."""
        named = 0
        version = getattr(resp, "version", 0)
        for snap in resp.partitions:
            key = (str(snap.topic_id), snap.partition)
            with self._lock:
                polled = self._polled.get(key)
            if snap.error_code != KafkaError.NONE:
                if session is not None:
                    session.forget(key)
                if polled is not None:
                    with self._lock:
                        polled.main_hw = polled.next_at = -1
                        self.cache.reset(key)
                continue
            try:
                links = _links(version, snap)
            except ValueError as exc:
                log.warning("bad packed links from a main: %s", exc)
                links = []
            named += sum(loc.length for loc in links)
            if session is not None:
                markers = [t.marker_offset + 1 for t in snap.aborted_transactions]
                session.answered(
                    key,
                    next_offset(snap.high_watermark, links),
                    markers,
                    getattr(snap, "last_stable_offset", -1),
                )
            if polled is None:
                continue
            topic = image.topics.get(key[0])
            state = topic.partitions.get(key[1]) if topic else None
            stream = image.streams.get(state.stream_id) if state else None
            if state is None or stream is None:
                continue
            self._apply_partition(key, polled, snap, links, stream)
        return named

    def _apply_partition(self, key: tuple[str, int], polled: _Polled, snap, links, stream) -> None:
        """One partition of an answer (no error): its transactions, inline markers and
        links into the cache; wakes its fetches when more became readable."""
        committed = stream.end_offset
        before = self.cache.contiguous_end(key, committed)
        lso_before = polled.txns.last_stable_offset(snap.high_watermark, -1)
        polled.txns.apply(
            snap.last_stable_offset,
            [(a.producer_id, a.first_offset, a.marker_offset) for a in snap.aborted_transactions],
        )
        if polled.leader_epoch != snap.leader_epoch:
            with self._lock:
                self.cache.reset(key)
                polled.leader_epoch = snap.leader_epoch
                polled.main_hw = polled.next_at = -1
        self.cache.prune_below(key, committed)
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
            end = loc.base_offset + loc.record_count
            if end <= committed or self.cache.contiguous_end(key, loc.base_offset) >= end:
                continue  # committed, or cached (read before, or routed here)
            data = self._read_batch(stream.stream_id, snap.leader_epoch, loc)
            if data is None:
                break  # a gap: served once the main uploaded it
            if not self.cache.put(key, snap.leader_epoch, CachedBatch(loc.base_offset, end, data)):
                break
        with self._lock:
            polled.main_hw = max(polled.main_hw, snap.high_watermark)
            polled.next_at = max(polled.next_at, next_offset(snap.high_watermark, links))
        self._advance_lso(key, polled)
        if self.cache.contiguous_end(key, committed) > before or (
            polled.txns.last_stable_offset(snap.high_watermark, -1) > lso_before
        ):
            polled.proxy.wake()

    def _advance_lso(self, key: tuple[str, int], polled: _Polled) -> None:
        """Move the partition's last stable offset past the non-transactional batches cached
        back to back from it: every transaction starting below it is decided, and none can
        start inside a batch outside any transaction."""
        lso = polled.txns.known_lso()
        if lso >= 0:
            end = self.cache.plain_end(key, lso)
            if end > lso:
                polled.txns.apply(end, [])

    def routed(
        self,
        proxy: ProxyPartition,
        main_node_id: int,
        leader_epoch: int,
        base_offset: int,
        end_offset: int,
        records: bytes,
    ) -> None:
        """A zone route of `proxy`'s `records` was answered: its main (`main_node_id`, in
        `leader_epoch` as this broker's image said) made them durable at `base_offset` up
        to `end_offset`. When this proxy follows the partition's snapshots (a client
        fetches it here), the batches go into the cache as the main's answer would have
        put them (their offsets and epoch patched), so the fetches waiting on it are
        served now and the main leaves them out of this proxy's polls (version 5).
        Nothing when the answer's offsets do not match the batches (idempotent retries
        answered from the original appends) or the cache knows another leader epoch.
        Thread-safe (called on the partition's worker)."""
        key = (proxy.topic_id, proxy.partition)
        batches = _patched(records, base_offset, end_offset, leader_epoch)
        put = False
        with self._lock:  # the epoch checked and the batches put as one (`apply`)
            polled = self._polled.get(key)
            if polled is None or polled.main_node_id != main_node_id:
                return
            if polled.leader_epoch != leader_epoch:
                return
            for batch in batches:
                if self.cache.contiguous_end(key, batch.base_offset) >= batch.end_offset:
                    continue  # the main's answer came first
                if not self.cache.put(key, leader_epoch, batch, start_over=False):
                    break
                put = True
            if put:  # durable at the main: its high watermark is past them
                polled.main_hw = max(polled.main_hw, end_offset)
        if put:
            self._advance_lso(key, polled)
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
