"""Snapshot reads (seed 000), the main's side: `SnapshotServer` answers a proxy's
`GetPartitionSnapshotRequest` (`snapshot_read.py` has the proxy's side).

A poll names, per partition the proxy follows, the offset it has up to; from version 2 in
a snapshot session (`snapshot.SnapshotSessions`, one per broker pair: a poll lists only
what the proxy changed, an answer only the partitions with something new, links packed).
The main answers at once when a partition has news past that offset, else when an append
becomes durable or after the wait: the high watermark, the leader epoch, the last stable
offset and aborted transactions, transaction markers inline, and the places of the linked
batches past the offset (`snapshot.LinkIndex`: channel node, offset, position, length;
never the data).

Version 5: a proxy's own appends (the batches it routed here and learned from its route
answers, `snapshot_read.SnapshotReader.routed`) are no news for its own polls: they do
not wake its long-poll nor put a partition in the answer (still sent when something else
is answered, so the proxy's view stays contiguous); after `OWN_GRACE_S` they count as
news again (a route answer the proxy never got).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import parse_batches
from dataplane.kafka.partition_backend import PartitionResolver
from dataplane.zonerouter.protocol import (
    SNAPSHOT_VERSION,
    GetPartitionSnapshotRequest,
    GetPartitionSnapshotResponse,
)
from dataplane.zonerouter.snapshot import (
    LinkIndex,
    LinkPlace,
    SnapshotSessions,
    holes,
    pack_links,
    page_aborted,
)
from dataplane.zonerouter.snapshot_codec import (
    EPOCH_BITS,
    MAX_PACKED_TOPICS,
    PackedResponse,
    SessionTables,
    pack_error_v6,
    pack_snapshots,
    pack_snapshots_v6,
    unpack_poll,
    unpack_poll_v6,
)

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
# a session whose channel table names this many source nodes starts over (version 6)
MAX_SESSION_CHANNELS = 1024
# a proxy's own appends are news for its polls again once linked this long ago: its route
# answer (and so its copy) should have come long before (version 5)
OWN_GRACE_S = 2.0


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
                (
                    (str(p.topic_id), p.partition),
                    p.fetch_offset,
                    p.aborted_from,
                    getattr(p, "last_stable_offset", -1),  # version 5
                )
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
        named by the session's topic table, `req`'s; 6: the error code packed too, the
        links against the session's channel table)."""
        R = GetPartitionSnapshotResponse[wire_version]
        if wire_version >= 6:
            if error_code:
                return R(packed_partitions=pack_error_v6(error_code))
            tables = self.sessions.tables(
                req.node_id,
                req.session_id,
                req.session_epoch,
                MAX_PACKED_TOPICS - MAX_PARTITIONS_PER_POLL,
                MAX_SESSION_CHANNELS,
            )
            if tables is None:  # superseded, dropped or full: the proxy starts over
                return R(packed_partitions=pack_error_v6(KafkaError.FETCH_SESSION_ID_NOT_FOUND))
            packed = pack_snapshots_v6(partitions, SessionTables(*tables))
            return R(packed_partitions=packed)
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
                req = self._unpack_poll(bytes(req.packed or b""), wire_version)
            except ValueError as exc:
                log.warning("bad packed snapshot poll: %s", exc)
                return self._answer(wire_version, KafkaError.INVALID_REQUEST, [])
        version = min(wire_version, 2)  # versions 3+: version 2's partitions, packed
        # version 6: the codec's partitions, their links packed with the whole answer
        R = PackedResponse if wire_version >= 6 else GetPartitionSnapshotResponse[version]
        asked = self._asked(req, version)
        if isinstance(asked, str):
            error = (
                KafkaError.FETCH_SESSION_ID_NOT_FOUND
                if asked == SnapshotSessions.NOT_FOUND
                else KafkaError.INVALID_FETCH_SESSION_EPOCH
            )
            return self._answer(wire_version, error, [])
        plogs = [self.partitions.get(str(a.topic_id), a.partition) for a in asked]

        # version 5: the proxy's own appends are no news for its polls (it has them)
        own = req.node_id if wire_version >= 5 else None

        def news(a: _Asked, plog) -> bool:
            return self._news(a, plog, version, own)

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

    def _unpack_poll(self, data: bytes, wire_version: int):
        """A packed poll (version 6: its session epoch completed from the session's)."""
        if wire_version < 6:
            return unpack_poll(data, wire_version)
        req = unpack_poll_v6(data)
        if req.incremental:
            req.session_epoch = self.sessions.full_epoch(
                req.node_id, req.session_id, req.session_epoch, EPOCH_BITS
            )
        return req

    def _news(self, a: _Asked, plog, version: int, own: int | None) -> bool:
        """Whether the poll has news of `a`: the partition is gone, its high watermark or
        last stable offset passed what the proxy has (past the proxy `own`'s own
        appends), or aborted transactions past what it knows."""
        if plog is None or plog.stream_id < 0:
            return True
        hw = plog.high_watermark
        return (
            self._moved(plog, a.fetch_offset, hw, own)
            or (version >= 1 and _aborted_past(plog, a.aborted_from))
            # version 2: a partition new in the session at once, so the proxy learns
            # its last stable offset even when nothing is new; then when it grows
            or (version >= 2 and a.lso < 0)
            or (a.lso >= 0 and self._moved(plog, a.lso, min(plog.last_stable_offset, hw), own))
        )

    def _moved(self, plog, start: int, end: int, own: int | None) -> bool:
        """[start, end) holds offsets the proxy `own` (None: any) did not route itself,
        or routed more than OWN_GRACE_S ago (its route answer may have been lost)."""
        if end <= start:
            return False
        if own is None:
            return True
        linked_after_s = time.monotonic() - OWN_GRACE_S
        return not self.index.routed_by(plog.stream_id, start, end, own, linked_after_s)

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
        if isinstance(snap, PackedResponse.PartitionSnapshot):
            snap.links = places  # version 6: packed with the answer (`_answer`)
        elif compact:  # version 4: from the high watermark, no timestamps
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


def _aborted_past(plog, marker_offset: int) -> bool:
    """The partition has an aborted transaction whose marker is at or past the offset."""
    return bool(plog.aborted_since(marker_offset))
