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
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from dataplane.formats.varint import get_zigzag, put_zigzag

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
    """One partition of a packed answer, with the attributes of a v2 `PartitionSnapshot`."""

    topic_id: uuid.UUID
    partition: int
    error_code: int
    leader_epoch: int = -1
    high_watermark: int = -1
    last_stable_offset: int = -1
    aborted_transactions: list[AbortedTxn] = field(default_factory=list)
    control_batches: list[ControlBatch] = field(default_factory=list)
    packed_links: bytes = b""


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

    def count(self, limit: int) -> int:
        n = self.int()
        if not 0 <= n <= limit:
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


def answer_view(resp, session_topics: list[uuid.UUID] | None = None) -> SnapshotAnswer:
    """`resp` (a `GetPartitionSnapshotResponse` of any version) with its partitions as
    objects of a v2 `PartitionSnapshot`'s attributes (raises ValueError on a bad packing);
    version 4 with the poller's session topic table (extended by the answer)."""
    version = getattr(resp, "version", 0)
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
