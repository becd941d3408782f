"""Compact snapshot answers (issue #32, `GetPartitionSnapshotResponse` version 3): the
partitions of an answer packed as zigzag varints instead of fixed-width fields.

A busy broker pair exchanges a poll every ~20 ms, each answering one or two partitions: in
version 2 a partition costs ~56 bytes before its links (a 16-byte topic id, 8-byte high
watermark and last stable offset, ...). Packed, an answer names each topic once, and a
partition is its topic's index, partition, error code, leader epoch, high watermark, the
distance of its last stable offset below it, its aborted transactions, its inline
transaction markers and its packed links (~10 bytes before its links). `unpack_snapshots`
gives objects with the attributes of a version 2 `PartitionSnapshot`, so the proxy applies
either the same way. All functions are pure.

Version 6 (the `_v6` functions) leaves out the usual values behind flags bytes (a steady
poll is 5 bytes, a partition ~6 before its links, a link ~4) and packs links against the
session's `snapshot.LinkTable`, which they change (both sides keep one per session).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from dataplane.formats.varint import get_uvarint, get_zigzag, put_uvarint, put_zigzag
from dataplane.zonerouter.snapshot import LinkPlace, LinkTable

MAX_PACKED_PARTITIONS = 4096
MAX_PACKED_TOPICS = 4096
MAX_PACKED_ITEMS = 65_536  # aborted transactions or markers of one partition
MAX_PACKED_BLOB_BYTES = 16 * 1024 * 1024  # a marker's batch or a partition's packed links


@dataclass
class AbortedTxn:
    """An aborted transaction as a v2 answer names it."""

    producer_id: int
    first_offset: int
    marker_offset: int


@dataclass
class ControlBatch:
    """A transaction marker sent inline, as a v2 answer names it."""

    base_offset: int
    data: bytes


@dataclass
class PartitionSnapshot:
    """One partition of a packed answer, with the attributes of a v2 `PartitionSnapshot`;
    version 6 carries its links unpacked (`links`: they are packed with the whole answer,
    against the session's channel table)."""

    AbortedTransaction: ClassVar[type] = AbortedTxn
    ControlBatch: ClassVar[type] = ControlBatch

    topic_id: uuid.UUID
    partition: int
    error_code: int
    leader_epoch: int = -1
    high_watermark: int = -1
    last_stable_offset: int = -1
    aborted_transactions: list[AbortedTxn] = field(default_factory=list)
    control_batches: list[ControlBatch] = field(default_factory=list)
    packed_links: bytes = b""
    log_start_offset: int = -1
    links: list[LinkPlace] | None = None


class PackedResponse:
    """What a main builds a version 6 answer's partitions of (the classes a v2 response
    names `R.PartitionSnapshot`, `.AbortedTransaction`, `.ControlBatch`)."""

    PartitionSnapshot = PartitionSnapshot


_put = put_zigzag


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def more(self) -> bool:
        return self.pos < len(self.data)

    def int(self) -> int:
        value, self.pos = get_zigzag(self.data, self.pos, "a packed snapshot")
        return value

    def uint(self) -> int:
        value, self.pos = get_uvarint(self.data, self.pos, "a packed snapshot")
        return value

    def count(self, limit: int) -> int:
        n = self.int()
        if not 0 <= n <= limit:
            raise ValueError(f"count {n} out of 0..{limit} in a packed snapshot")
        return n

    def count_u(self, limit: int) -> int:
        """An unsigned count (version 6), at most `limit`."""
        n = self.uint()
        if n > limit:
            raise ValueError(f"count {n} out of 0..{limit} in a packed snapshot")
        return n

    def raw(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise ValueError("truncated bytes in a packed snapshot")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return bytes(out)


def pack_snapshots(partitions: list, session_topics: dict[uuid.UUID, int] | None = None) -> bytes:
    """The partitions of one answer (objects with a v2 `PartitionSnapshot`'s attributes):
    the distinct topics (count, 16 bytes each), then each partition. Version 4: with the
    session's topic table (`session_topics`, extended here), its size first, then only
    the topics new to the session; partitions name a topic by its index in the table."""
    out = bytearray()
    if session_topics is None:
        topics: dict[uuid.UUID, int] = {}
        for snap in partitions:
            topics.setdefault(snap.topic_id, len(topics))
        new = list(topics)
    else:
        topics = session_topics
        _put(out, len(topics))
        new = []
        for snap in partitions:
            if snap.topic_id not in topics:
                topics[snap.topic_id] = len(topics)
                new.append(snap.topic_id)
    _put(out, len(new))
    for topic_id in new:
        out += topic_id.bytes
    for snap in partitions:
        _put(out, topics[snap.topic_id])
        _put(out, snap.partition)
        _put(out, snap.error_code)
        if snap.error_code:
            continue
        _put(out, snap.leader_epoch)
        _put(out, snap.high_watermark)
        _put(out, snap.high_watermark - snap.last_stable_offset)
        aborted = snap.aborted_transactions or []
        _put(out, len(aborted))
        for txn in aborted:
            _put(out, txn.producer_id)
            _put(out, txn.first_offset)
            _put(out, txn.marker_offset)
        controls = getattr(snap, "control_batches", None) or []
        _put(out, len(controls))
        for control in controls:
            _put(out, control.base_offset)
            _put(out, len(control.data))
            out += control.data
        links = bytes(snap.packed_links or b"")
        _put(out, len(links))
        out += links
    return bytes(out)


def unpack_snapshots(
    data: bytes, session_topics: list[uuid.UUID] | None = None
) -> list[PartitionSnapshot]:
    """`pack_snapshots` undone (raises ValueError on bad input); version 4 with the
    session's topic table (`session_topics`, extended here by the answer's new topics;
    a table of another size than the main's is refused)."""
    r = _Reader(data)
    topics: list[uuid.UUID] = [] if session_topics is None else session_topics
    if session_topics is not None:
        size = r.int()
        if size != len(topics):
            raise ValueError(f"the main's session has {size} topics, this proxy {len(topics)}")
    new = r.count(MAX_PACKED_TOPICS - len(topics))
    topics.extend(uuid.UUID(bytes=r.raw(16)) for _ in range(new))
    count = len(topics)
    out: list[PartitionSnapshot] = []
    while r.more():
        if len(out) >= MAX_PACKED_PARTITIONS:
            raise ValueError(f"more than {MAX_PACKED_PARTITIONS} packed partitions")
        index = r.int()
        if not 0 <= index < count:
            raise ValueError(f"topic index {index} of {count} in a packed snapshot")
        snap = PartitionSnapshot(topics[index], r.int(), r.int())
        out.append(snap)
        if snap.error_code:
            continue
        snap.leader_epoch = r.int()
        snap.high_watermark = r.int()
        snap.last_stable_offset = snap.high_watermark - r.int()
        for _ in range(r.count(MAX_PACKED_ITEMS)):
            snap.aborted_transactions.append(AbortedTxn(r.int(), r.int(), r.int()))
        for _ in range(r.count(MAX_PACKED_ITEMS)):
            base = r.int()
            snap.control_batches.append(ControlBatch(base, r.raw(r.count(MAX_PACKED_BLOB_BYTES))))
        snap.packed_links = r.raw(r.count(MAX_PACKED_BLOB_BYTES))
    return out


@dataclass
class SnapshotAnswer:
    """A snapshot answer as the proxy applies it: a version 3 answer unpacked."""

    version: int
    error_code: int
    partitions: list


def answer_view(
    resp,
    session_topics: list[uuid.UUID] | None = None,
    session_links: LinkTable | None = None,
) -> SnapshotAnswer:
    """`resp` (a `GetPartitionSnapshotResponse` of any version) with its partitions as
    objects of a v2 `PartitionSnapshot`'s attributes (raises ValueError on a bad packing);
    version 4 with the poller's session topic table (extended by the answer); version 6
    with its link table too, the links unpacked (`links`)."""
    version = getattr(resp, "version", 0)
    if version >= 6:
        if session_topics is None or session_links is None:
            raise ValueError("a version 6 answer needs its session's tables")
        error_code, partitions = unpack_snapshots_v6(
            bytes(resp.packed_partitions or b""), session_topics, session_links
        )
        return SnapshotAnswer(version, error_code, partitions)
    if version >= 4 and resp.error_code:
        partitions: list = []  # a refused poll: nothing packed (the session starts over)
    elif version >= 4:
        if session_topics is None:
            raise ValueError("a version 4 answer needs its session's topic table")
        partitions = unpack_snapshots(bytes(resp.packed_partitions or b""), session_topics)
    elif version >= 3:
        partitions = unpack_snapshots(bytes(resp.packed_partitions or b""))
    else:
        partitions = list(resp.partitions)
    return SnapshotAnswer(version, resp.error_code, partitions)


@dataclass
class PollPartition:
    """A partition of a poll, as a v2 `PartitionRequest` names it."""

    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    aborted_from: int = -1
    # version 5: the last stable offset the proxy knows (-1: none; the main answered it,
    # or the proxy moved it past non-transactional batches it cached)
    last_stable_offset: int = -1


@dataclass
class PollForgotten:
    """A partition a poll's session no longer follows, as a v2 `ForgottenPartition`."""

    topic_id: uuid.UUID
    partition: int


@dataclass
class PollRequest:
    """A snapshot poll with the attributes of a v2 `GetPartitionSnapshotRequest` (what a
    version 4 request packs, `pack_poll`)."""

    node_id: int
    max_wait_ms: int
    session_id: int
    session_epoch: int
    incremental: bool
    partitions: list[PollPartition] = field(default_factory=list)
    forgotten: list[PollForgotten] = field(default_factory=list)


def pack_poll(poll: PollRequest, version: int = 4) -> bytes:
    """A poll as varints (version 4's `Packed`): node id, max wait, session id and epoch,
    incremental (0/1), the distinct topics (count, 16 bytes each), the partitions (count,
    then topic index, partition, fetch offset, aborted from each; version 5: and the
    fetch offset's distance to the last stable offset, a byte when it is close), the
    forgotten (count, then topic index, partition each). An incremental poll of a steady
    session is ~10 bytes instead of ~24."""
    topics: dict[uuid.UUID, int] = {}
    for item in [*poll.partitions, *poll.forgotten]:
        topics.setdefault(item.topic_id, len(topics))
    out = bytearray()
    for value in (poll.node_id, poll.max_wait_ms, poll.session_id, poll.session_epoch):
        _put(out, value)
    _put(out, 1 if poll.incremental else 0)
    _put(out, len(topics))
    for topic_id in topics:
        out += topic_id.bytes
    _put(out, len(poll.partitions))
    for p in poll.partitions:
        for value in (topics[p.topic_id], p.partition, p.fetch_offset, p.aborted_from):
            _put(out, value)
        if version >= 5:
            _put(out, p.fetch_offset - p.last_stable_offset)
    _put(out, len(poll.forgotten))
    for f in poll.forgotten:
        _put(out, topics[f.topic_id])
        _put(out, f.partition)
    return bytes(out)


def unpack_poll(data: bytes, version: int = 4) -> PollRequest:
    """`pack_poll` undone (raises ValueError on bad input)."""
    r = _Reader(data)
    poll = PollRequest(r.int(), r.int(), r.int(), r.int(), r.int() != 0)
    topics = [uuid.UUID(bytes=r.raw(16)) for _ in range(r.count(MAX_PACKED_TOPICS))]

    def topic() -> uuid.UUID:
        index = r.int()
        if not 0 <= index < len(topics):
            raise ValueError(f"topic index {index} of {len(topics)} in a packed poll")
        return topics[index]

    for _ in range(r.count(MAX_PACKED_PARTITIONS)):
        part = PollPartition(topic(), r.int(), r.int(), r.int())
        if version >= 5:
            part.last_stable_offset = part.fetch_offset - r.int()
        poll.partitions.append(part)
    for _ in range(r.count(MAX_PACKED_PARTITIONS)):
        poll.forgotten.append(PollForgotten(topic(), r.int()))
    if r.more():
        raise ValueError("trailing bytes in a packed poll")
    return poll


# ---------------------------------------------------------------- version 6

MAX_V6_LINKS = 65_536  # links of one partition in an answer
MAX_CHANNEL_SOURCES = 4096  # source nodes a session's channel table names
EPOCH_BITS = 7  # a version 6 poll carries its session epoch's low bits (one byte)
WAIT_UNIT_MS = 10  # a version 6 poll's max wait, in these units (one byte up to 1.27 s)

# which of a link's fields follow (those left out are the previously packed link's)
_LINK_GAP, _LINK_COUNT, _LINK_SOURCE, _LINK_LENGTH = 1, 2, 4, 8
# what a partition's flags say follows
_PART_ERROR, _PART_LSO, _PART_ABORTED, _PART_CONTROLS, _PART_LINKS = 1, 2, 4, 8, 16
# what a poll's flags say follows
_POLL_INCREMENTAL, _POLL_TOPICS, _POLL_PARTITIONS, _POLL_FORGOTTEN = 1, 2, 4, 8


@dataclass
class SessionTables:
    """What a main's version 4+ answers are packed against in one snapshot session: the
    topics by index (version 4) and the links' table (version 6). The main keeps them
    per session (`snapshot.SnapshotSessions`), the proxy mirrors them."""

    topics: dict[uuid.UUID, int] = field(default_factory=dict)
    links: LinkTable = field(default_factory=LinkTable)


def pack_links_v6(links: list[LinkPlace], high_watermark: int, table: LinkTable) -> bytes:
    """Version 6's links of one partition, newest first: a byte of flags, then only the
    fields that differ from what is expected — the link ending where the one packed before
    it starts (the first: at the high watermark; else the distance), the record count,
    source node and length of the link packed before it (`table`'s, across partitions
    and answers) — and always its channel offset, as a delta from the link packed before
    it from the same source (the partition's first from each source: from `table`'s
    newest), and its position. A batch of a steady stream costs ~4 bytes instead of ~9 —
    pure but for `table`, updated."""
    out = bytearray()
    end = high_watermark
    running: dict[int, int] = {}  # per source, the channel offset of the link before
    for link in reversed(links):
        link_end = link.base_offset + link.record_count
        flags = (
            (_LINK_GAP if link_end != end else 0)
            | (_LINK_COUNT if link.record_count != table.count else 0)
            | (_LINK_SOURCE if link.source_node_id != table.source else 0)
            | (_LINK_LENGTH if link.length != table.length else 0)
        )
        out.append(flags)
        if flags & _LINK_GAP:
            put_zigzag(out, end - link_end)
        if flags & _LINK_COUNT:
            put_uvarint(out, link.record_count)
        if flags & _LINK_SOURCE:
            put_uvarint(out, link.source_node_id)
        source = link.source_node_id
        previous = running.get(source, table.channels.get(source, 0))
        put_zigzag(out, link.channel_offset - previous)
        put_uvarint(out, link.position)
        if flags & _LINK_LENGTH:
            put_uvarint(out, link.length)
        if source not in running:
            table.channels[source] = link.channel_offset  # the partition's newest
        running[source] = link.channel_offset
        end = link.base_offset
        table.count, table.source, table.length = link.record_count, source, link.length
    return bytes(out)


def unpack_links_v6(
    data: bytes, high_watermark: int, table: LinkTable, max_links: int = MAX_V6_LINKS
) -> list[LinkPlace]:
    """`pack_links_v6` undone, oldest first (`table` updated as the main did; raises
    ValueError on bad input)."""
    r = _Reader(data)
    out: list[LinkPlace] = []
    end = high_watermark
    running: dict[int, int] = {}
    while r.more():
        if len(out) >= max_links:
            raise ValueError(f"more than {max_links} packed links")
        flags = r.raw(1)[0]
        if flags > 15:
            raise ValueError(f"bad link flags {flags} in a packed snapshot")
        if flags & _LINK_GAP:
            end -= r.int()
        count = r.uint() if flags & _LINK_COUNT else table.count
        source = r.uint() if flags & _LINK_SOURCE else table.source
        channels = table.channels
        if source < 0 or (source not in channels and len(channels) >= MAX_CHANNEL_SOURCES):
            raise ValueError(f"bad source node {source} in a packed snapshot")
        channel = running.get(source, channels.get(source, 0)) + r.int()
        position = r.uint()
        length = r.uint() if flags & _LINK_LENGTH else table.length
        end -= count
        if count < 1 or length < 1 or channel < 0 or end < 0:
            raise ValueError(f"bad link ({count} records at {end}, {length} bytes at {channel})")
        if source not in running:
            channels[source] = channel
        running[source] = channel
        table.count, table.source, table.length = count, source, length
        out.append(LinkPlace(end, count, source, channel, position, length, 0))
    out.reverse()
    return out


def pack_error_v6(error_code: int) -> bytes:
    """A version 6 answer refused as a whole: its error code alone."""
    out = bytearray()
    put_zigzag(out, error_code)
    return bytes(out)


def pack_snapshots_v6(partitions: list, tables: SessionTables) -> bytes:
    """A version 6 answer (its error code 0, then `pack_snapshots`' version 4 content
    tightened): the session's topic count and whether new topics follow in one varint;
    per partition its topic index, partition, a byte of flags saying which of the
    error, the last stable offset's distance below the high watermark, the aborted
    transactions, the markers and the links follow (none of them in a steady answer), the
    leader epoch and high watermark (unsigned), then the links (`pack_links_v6`, from
    each partition's `links`). ~6 bytes a partition before its links instead of ~11."""
    out = bytearray(b"\0")  # no error
    topics = tables.topics
    new: list[uuid.UUID] = []
    for snap in partitions:
        if snap.topic_id not in topics:
            topics[snap.topic_id] = len(topics)
            new.append(snap.topic_id)
    put_uvarint(out, (len(topics) - len(new)) << 1 | (1 if new else 0))
    if new:
        put_uvarint(out, len(new))
        for topic_id in new:
            out += topic_id.bytes
    for snap in partitions:
        put_uvarint(out, topics[snap.topic_id])
        put_uvarint(out, snap.partition)
        if snap.error_code:
            out.append(_PART_ERROR)
            put_zigzag(out, snap.error_code)
            continue
        lso_gap = snap.high_watermark - snap.last_stable_offset
        aborted = snap.aborted_transactions or []
        controls = snap.control_batches or []
        links = pack_links_v6(snap.links or [], snap.high_watermark, tables.links)
        out.append(
            (_PART_LSO if lso_gap else 0)
            | (_PART_ABORTED if aborted else 0)
            | (_PART_CONTROLS if controls else 0)
            | (_PART_LINKS if links else 0)
        )
        put_zigzag(out, snap.leader_epoch)
        put_uvarint(out, snap.high_watermark)
        if lso_gap:
            put_zigzag(out, lso_gap)
        if aborted:
            put_uvarint(out, len(aborted))
            for txn in aborted:
                for value in (txn.producer_id, txn.first_offset, txn.marker_offset):
                    put_zigzag(out, value)
        if controls:
            put_uvarint(out, len(controls))
            for control in controls:
                put_zigzag(out, control.base_offset)
                put_uvarint(out, len(control.data))
                out += control.data
        if links:
            put_uvarint(out, len(links))
            out += links
    return bytes(out)


def unpack_snapshots_v6(data: bytes, tables_topics: list[uuid.UUID], link_table: LinkTable):
    """A version 6 answer undone: (error code, partitions with their `links` unpacked);
    the proxy's mirror of the session's tables (`tables_topics`, `link_table`) changed as
    the main's were. Raises ValueError on bad input (the session then starts over)."""
    r = _Reader(data)
    error_code = r.int()
    if error_code:
        return error_code, []
    head = r.uint()
    if head >> 1 != len(tables_topics):
        raise ValueError(
            f"the main's session has {head >> 1} topics, this proxy {len(tables_topics)}"
        )
    if head & 1:
        new = r.uint()
        if not 0 < new <= MAX_PACKED_TOPICS - len(tables_topics):
            raise ValueError(f"bad new topic count {new} in a packed snapshot")
        tables_topics.extend(uuid.UUID(bytes=r.raw(16)) for _ in range(new))
    out: list[PartitionSnapshot] = []
    while r.more():
        if len(out) >= MAX_PACKED_PARTITIONS:
            raise ValueError(f"more than {MAX_PACKED_PARTITIONS} packed partitions")
        index = r.uint()
        if index >= len(tables_topics):
            raise ValueError(f"topic index {index} of {len(tables_topics)} in a packed snapshot")
        snap = PartitionSnapshot(tables_topics[index], r.uint(), 0, links=[])
        out.append(snap)
        flags = r.raw(1)[0]
        if flags & _PART_ERROR:
            if flags != _PART_ERROR:
                raise ValueError(f"bad partition flags {flags} in a packed snapshot")
            snap.error_code = r.int()
            continue
        if flags > 31:
            raise ValueError(f"bad partition flags {flags} in a packed snapshot")
        snap.leader_epoch = r.int()
        snap.high_watermark = r.uint()
        snap.last_stable_offset = snap.high_watermark - (r.int() if flags & _PART_LSO else 0)
        for _ in range(r.count_u(MAX_PACKED_ITEMS) if flags & _PART_ABORTED else 0):
            snap.aborted_transactions.append(AbortedTxn(r.int(), r.int(), r.int()))
        for _ in range(r.count_u(MAX_PACKED_ITEMS) if flags & _PART_CONTROLS else 0):
            base = r.int()
            snap.control_batches.append(ControlBatch(base, r.raw(r.count_u(MAX_PACKED_BLOB_BYTES))))
        if flags & _PART_LINKS:
            packed = r.raw(r.count_u(MAX_PACKED_BLOB_BYTES))
            snap.links = unpack_links_v6(packed, snap.high_watermark, link_table)
    return 0, out


def pack_poll_v6(poll: PollRequest) -> bytes:
    """A poll as version 6 packs it: node id and session id (unsigned), a byte of flags
    (incremental; whether topics, partitions and forgotten partitions follow), the max
    wait in WAIT_UNIT_MS units (rounded up), the session epoch's low EPOCH_BITS bits (the
    main knows the rest), then what the flags name as in `pack_poll` version 5. A steady
    incremental poll is 5 bytes instead of ~11."""
    topics: dict[uuid.UUID, int] = {}
    for item in [*poll.partitions, *poll.forgotten]:
        topics.setdefault(item.topic_id, len(topics))
    out = bytearray()
    put_uvarint(out, poll.node_id)
    put_uvarint(out, poll.session_id)
    out.append(
        (_POLL_INCREMENTAL if poll.incremental else 0)
        | (_POLL_TOPICS if topics else 0)
        | (_POLL_PARTITIONS if poll.partitions else 0)
        | (_POLL_FORGOTTEN if poll.forgotten else 0)
    )
    put_uvarint(out, math.ceil(max(poll.max_wait_ms, 0) / WAIT_UNIT_MS))
    put_uvarint(out, poll.session_epoch & ((1 << EPOCH_BITS) - 1))
    if topics:
        put_uvarint(out, len(topics))
        for topic_id in topics:
            out += topic_id.bytes
    if poll.partitions:
        put_uvarint(out, len(poll.partitions))
        for p in poll.partitions:
            put_uvarint(out, topics[p.topic_id])
            put_uvarint(out, p.partition)
            put_uvarint(out, p.fetch_offset)
            put_zigzag(out, p.aborted_from)
            put_zigzag(out, p.fetch_offset - p.last_stable_offset)
    if poll.forgotten:
        put_uvarint(out, len(poll.forgotten))
        for f in poll.forgotten:
            put_uvarint(out, topics[f.topic_id])
            put_uvarint(out, f.partition)
    return bytes(out)


def unpack_poll_v6(data: bytes) -> PollRequest:
    """`pack_poll_v6` undone: the session epoch is its low EPOCH_BITS bits (the main's
    session gives the rest, `snapshot.SnapshotSessions.full_epoch`). Raises ValueError on
    bad input."""
    r = _Reader(data)
    node_id, session_id = r.uint(), r.uint()
    flags = r.raw(1)[0]
    if flags > 15:
        raise ValueError(f"bad poll flags {flags} in a packed poll")
    poll = PollRequest(
        node_id, r.uint() * WAIT_UNIT_MS, session_id, r.uint(), bool(flags & _POLL_INCREMENTAL)
    )
    if poll.session_epoch >> EPOCH_BITS or node_id > 0x7FFFFFFF:
        raise ValueError(f"bad node {node_id} or epoch {poll.session_epoch} in a packed poll")
    count = r.count_u(MAX_PACKED_TOPICS) if flags & _POLL_TOPICS else 0
    topics = [uuid.UUID(bytes=r.raw(16)) for _ in range(count)]

    def topic() -> uuid.UUID:
        index = r.uint()
        if index >= len(topics):
            raise ValueError(f"topic index {index} of {len(topics)} in a packed poll")
        return topics[index]

    for _ in range(r.count_u(MAX_PACKED_PARTITIONS) if flags & _POLL_PARTITIONS else 0):
        part = PollPartition(topic(), r.uint(), r.uint(), r.int())
        part.last_stable_offset = part.fetch_offset - r.int()
        poll.partitions.append(part)
    for _ in range(r.count_u(MAX_PACKED_PARTITIONS) if flags & _POLL_FORGOTTEN else 0):
        poll.forgotten.append(PollForgotten(topic(), r.uint()))
    if r.more():
        raise ValueError("trailing bytes in a packed poll")
    return poll
