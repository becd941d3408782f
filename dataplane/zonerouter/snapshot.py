"""Snapshot reads (seed 000), the pure parts: the main's index of recent Link Records and
the proxy's snapshot-read cache.

A main remembers, per stream, where the batches it linked (but has not uploaded yet) lie in
the RouterChannels (`LinkIndex`): a proxy's incremental GetPartitionSnapshot asks for what
is new past an offset and gets locations, never data (record data does not cross AZs
between brokers). The proxy reads the data from the channel objects in the object store
and keeps it in its `SnapshotCache`, from which it serves offsets the main has not
committed to object storage yet. Both are bounded; thread-safe (one lock each); no I/O.
"""

from __future__ import annotations

import threading
import uuid
from bisect import bisect_right
from collections import OrderedDict, deque
from dataclasses import dataclass

from dataplane.formats.kafka_errors import InvalidRecordBatchError
from dataplane.formats.link_record import LinkRecord
from dataplane.formats.record_batch import parse_batch_header
from dataplane.formats.varint import get_zigzag, put_zigzag

# how many links `LinkIndex.routed_by` looks at before it calls a range news (bounded work
# under the index's lock on every durable append a poll waits for)
MAX_ROUTED_CHECK_LINKS = 1024


@dataclass(frozen=True, slots=True)
class LinkLocation:
    """One batch a main linked: its partition offsets, leader epoch and channel place;
    whether it is transactional (data of a transaction), and when it was linked
    (`time.monotonic()`, seconds)."""

    base_offset: int
    record_count: int
    leader_epoch: int
    link: LinkRecord
    transactional: bool = False
    linked_s: float = 0.0

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.record_count


class LinkIndex:
    """The main's recent Link Records by stream, in offset order (recorded under the
    stream's lock as offsets are assigned). Bounded: at most `max_entries_per_stream` per
    stream (the oldest go first) and `max_entries` in all (taken from the least recently
    appended streams first); entries the stream's committed end passed are dropped
    (`prune`). A proxy asking for an offset the index no longer holds sees a gap and reads
    it once committed. Thread-safe."""

    def __init__(self, max_entries_per_stream: int = 16_384, max_entries: int = 65_536):
        if max_entries_per_stream < 1 or max_entries < 1:
            raise ValueError("LinkIndex bounds must be >= 1")
        self.max_entries_per_stream = max_entries_per_stream
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._streams: OrderedDict[int, deque[LinkLocation]] = OrderedDict()
        self._count = 0

    def record(self, stream_id: int, location: LinkLocation) -> None:
        with self._lock:
            entries = self._streams.get(stream_id)
            if entries is None:
                entries = self._streams[stream_id] = deque()
            else:
                self._streams.move_to_end(stream_id)
            if entries and location.base_offset < entries[-1].end_offset:
                # offsets went back (a new stream epoch): the older ones are void
                self._count -= len(entries)
                entries.clear()
            if len(entries) >= self.max_entries_per_stream:
                entries.popleft()
                self._count -= 1
            entries.append(location)
            self._count += 1
            while self._count > self.max_entries:
                oldest_id, oldest = next(iter(self._streams.items()))
                oldest.popleft()
                self._count -= 1
                if not oldest:
                    del self._streams[oldest_id]

    def prune(self, stream_id: int, committed_end: int) -> None:
        """Drop the entries wholly below `committed_end` (readable from object storage)."""
        with self._lock:
            entries = self._streams.get(stream_id)
            while entries and entries[0].end_offset <= committed_end:
                entries.popleft()
                self._count -= 1
            if entries is not None and not entries:
                del self._streams[stream_id]

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def routed_by(
        self, stream_id: int, start: int, end: int, node_id: int, linked_after_s: float
    ) -> bool:
        """Whether [start, end) holds, back to back, only non-transactional batches from
        `node_id`'s RouterChannel linked after `linked_after_s`: what that proxy routed
        itself and learned from its route answers (True for an empty range; False past
        MAX_ROUTED_CHECK_LINKS links, for a hole or a batch the index no longer holds)."""
        if start >= end:
            return True
        with self._lock:
            entries = self._streams.get(stream_id)
            if not entries:
                return False
            cursor = end  # walking back from the newest: [cursor, end) is checked
            for checked, loc in enumerate(reversed(entries)):
                if loc.base_offset >= end:
                    continue  # linked, not durable yet
                if (
                    checked >= MAX_ROUTED_CHECK_LINKS
                    or loc.end_offset != cursor
                    or loc.link.source_node_id != node_id
                    or loc.transactional
                    or loc.linked_s <= linked_after_s
                ):
                    return False
                cursor = loc.base_offset
                if cursor <= start:
                    return True
            return False

    def since(
        self, stream_id: int, offset: int, up_to: int, max_entries: int
    ) -> list[LinkLocation]:
        """Entries ending past `offset` and at or below `up_to` (the main's high watermark:
        only durable batches), oldest first, at most `max_entries`."""
        with self._lock:
            entries = list(self._streams.get(stream_id, ()))
        out: list[LinkLocation] = []
        for loc in entries:
            if loc.end_offset <= offset:
                continue
            if loc.end_offset > up_to or len(out) >= max_entries:
                break
            out.append(loc)
        return out


@dataclass(frozen=True, slots=True)
class CachedBatch:
    base_offset: int
    end_offset: int
    data: bytes


class _PartitionCache:
    __slots__ = ("leader_epoch", "batches", "bases")

    def __init__(self, leader_epoch: int):
        self.leader_epoch = leader_epoch
        self.batches: list[CachedBatch] = []  # sorted by base offset, not overlapping
        self.bases: list[int] = []


class SnapshotCache:
    """The proxy's snapshot-read cache: the batches of proxied partitions that their mains
    have made durable but maybe not uploaded, keyed by (topic id, partition).

    Policy: at most `max_bytes` in all; over it, the batches inserted first go first (the
    oldest data, which the mains upload first); a batch that does not follow or overlaps
    the partition's cached ones is refused; a new leader epoch empties the partition (the
    new main's snapshot starts over); batches below an offset are dropped by `prune_below`
    (committed: read from object storage). Thread-safe."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024):
        if max_bytes < 1:
            raise ValueError("SnapshotCache max_bytes must be >= 1")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, int], _PartitionCache] = {}
        self._order: deque[tuple[tuple[str, int], CachedBatch]] = deque()  # insertion order
        self.size_bytes = 0

    def _part(self, key: tuple[str, int], leader_epoch: int) -> _PartitionCache:
        part = self._parts.get(key)
        if part is None or part.leader_epoch != leader_epoch:
            if part is not None:
                self.size_bytes -= sum(len(b.data) for b in part.batches)
            part = self._parts[key] = _PartitionCache(leader_epoch)
        return part

    def put(
        self,
        key: tuple[str, int],
        leader_epoch: int,
        batch: CachedBatch,
        start_over: bool = True,
    ) -> bool:
        """Add a batch of the partition in `leader_epoch`; False when refused (overlap).
        The partition's batches of another leader epoch are dropped first (`start_over`),
        or the batch is refused."""
        if batch.end_offset <= batch.base_offset or len(batch.data) > self.max_bytes:
            return False
        with self._lock:
            held = self._parts.get(key)
            if not start_over and held is not None and held.leader_epoch != leader_epoch:
                return False
            part = self._part(key, leader_epoch)
            i = bisect_right(part.bases, batch.base_offset)
            if i > 0 and part.batches[i - 1].end_offset > batch.base_offset:
                return False
            if i < len(part.batches) and part.batches[i].base_offset < batch.end_offset:
                return False
            part.batches.insert(i, batch)
            part.bases.insert(i, batch.base_offset)
            self.size_bytes += len(batch.data)
            self._order.append((key, batch))
            self._evict()
            return True

    def _evict(self) -> None:
        while self.size_bytes > self.max_bytes and self._order:
            key, batch = self._order.popleft()
            part = self._parts.get(key)
            if part is None:
                continue
            i = bisect_right(part.bases, batch.base_offset) - 1
            if i >= 0 and part.batches[i] is batch:
                del part.batches[i]
                del part.bases[i]
                self.size_bytes -= len(batch.data)

    def reset(self, key: tuple[str, int]) -> None:
        with self._lock:
            part = self._parts.pop(key, None)
            if part is not None:
                self.size_bytes -= sum(len(b.data) for b in part.batches)

    def prune_below(self, key: tuple[str, int], offset: int) -> None:
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                return
            n = 0
            while n < len(part.batches) and part.batches[n].end_offset <= offset:
                self.size_bytes -= len(part.batches[n].data)
                n += 1
            if n:
                del part.batches[:n]
                del part.bases[:n]

    def leader_epoch(self, key: tuple[str, int]) -> int | None:
        with self._lock:
            part = self._parts.get(key)
            return None if part is None else part.leader_epoch

    def max_end(self, key: tuple[str, int]) -> int:
        """The end of the partition's last cached batch (-1: none)."""
        with self._lock:
            part = self._parts.get(key)
            return part.batches[-1].end_offset if part and part.batches else -1

    def contiguous_end(self, key: tuple[str, int], start: int) -> int:
        """How far from `start` the cache holds every offset (`start` when it holds none)."""
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                return start
            end = start
            i = max(bisect_right(part.bases, start) - 1, 0)
            for batch in part.batches[i:]:
                if batch.base_offset > end:
                    break
                end = max(end, batch.end_offset)
            return end

    def plain_end(self, key: tuple[str, int], start: int) -> int:
        """How far from `start` the cache holds, back to back, non-transactional data
        batches (`start` when the batch there is not one, or not cached)."""
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                return start
            end = start
            for batch in part.batches[max(bisect_right(part.bases, start) - 1, 0) :]:
                if batch.base_offset != end or not _plain(batch.data):
                    break
                end = batch.end_offset
            return end

    def read(self, key: tuple[str, int], offset: int, end: int, max_bytes: int) -> bytes:
        """The cached batches from the one holding `offset`, contiguous, below `end`, up to
        `max_bytes` (at least one batch, as a Kafka fetch); b"" when `offset` is not cached."""
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                return b""
            i = bisect_right(part.bases, offset) - 1
            if i < 0 or part.batches[i].end_offset <= offset:
                return b""
            out: list[bytes] = []
            size = 0
            expected = part.batches[i].base_offset
            for batch in part.batches[i:]:
                if batch.base_offset != expected or batch.end_offset > end:
                    break
                if out and size + len(batch.data) > max_bytes:
                    break
                out.append(batch.data)
                size += len(batch.data)
                expected = batch.end_offset
            return b"".join(out)


def _plain(data: bytes) -> bool:
    """The batch is client data outside any transaction (no transaction, no marker)."""
    try:
        header = parse_batch_header(data, copy=False)
    except InvalidRecordBatchError:
        return False
    return not header.is_transactional and not header.is_control


# ---------------------------------------------------------------- transactions (read_committed)

# (producer id, first offset, marker offset) of an aborted transaction
AbortedTxn = tuple[int, int, int]


def page_aborted(
    new: list[AbortedTxn], last_stable_offset: int, max_entries: int
) -> tuple[list[AbortedTxn], int]:
    """The main's answer to a proxy that knows the aborted transactions with a marker
    offset below some point: `new` are the ones from that point on (by marker offset), read
    after `last_stable_offset`. Sends at most `max_entries` (the oldest first) and lowers
    the last stable offset to the first offset of every one left out, so the proxy never
    serves a read_committed fetch records of an aborted transaction it does not know yet
    (it asks again from the last marker it got) — pure."""
    sent = new[:max_entries]
    lso = last_stable_offset
    for _, first, _ in new[max_entries:]:
        lso = min(lso, first)
    return sent, lso


class TxnView:
    """The proxy's view of a partition's transactions, from its main's snapshots: the last
    stable offset (-1: not known yet, nothing is stable) and the aborted transactions,
    learned incrementally (each answer carries the ones with a marker at or past
    `aborted_from`). Bounded: the `max_aborted` latest (by marker offset) are kept, as the
    main keeps its own (`partitions.TxnIndex.MAX_ABORTED`). Thread-safe."""

    def __init__(self, max_aborted: int = 100_000):
        if max_aborted < 1:
            raise ValueError("TxnView max_aborted must be >= 1")
        self._lock = threading.Lock()
        self._aborted: deque[AbortedTxn] = deque(maxlen=max_aborted)
        self._known: set[tuple[int, int]] = set()  # (producer id, first offset) held
        self._lso = -1
        self.aborted_from = -1

    def apply(self, last_stable_offset: int, aborted: list[AbortedTxn]) -> None:
        """One answer: its aborted transactions first, then its last stable offset (which
        only grows: a transaction opens at or past the high watermark)."""
        with self._lock:
            for entry in sorted(aborted, key=lambda e: e[2]):
                key = (entry[0], entry[1])
                if key in self._known:
                    continue
                if len(self._aborted) == self._aborted.maxlen:
                    old = self._aborted.popleft()
                    self._known.discard((old[0], old[1]))
                self._aborted.append(entry)
                self._known.add(key)
                self.aborted_from = max(self.aborted_from, entry[2] + 1)
            self._lso = max(self._lso, last_stable_offset)

    def known_lso(self) -> int:
        """The last stable offset as learned (-1: no answer yet)."""
        with self._lock:
            return self._lso

    def last_stable_offset(self, high_watermark: int, floor: int) -> int:
        """What a read_committed fetch may read up to: the main's last stable offset, at
        most `high_watermark` (what this proxy serves); `floor` (the log start) while no
        answer came."""
        with self._lock:
            lso = self._lso
        return floor if lso < 0 else min(lso, high_watermark)

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start, end)."""
        with self._lock:
            return [
                (pid, first) for pid, first, last in self._aborted if first < end and last >= start
            ]


def holes(
    start: int, end: int, linked: list[tuple[int, int]], max_size: int, max_holes: int
) -> list[tuple[int, int]]:
    """The offset ranges in [start, end) that no linked batch ([base, end) each, in offset
    order) covers, of at most `max_size` offsets, the first `max_holes` — pure. (A main's
    transaction markers lie in such holes: it holds them without a link.)"""
    out: list[tuple[int, int]] = []
    cursor = start
    for base, stop in [*linked, (end, end)]:
        if base > cursor and base - cursor <= max_size and len(out) < max_holes:
            out.append((cursor, min(base, end)))
        cursor = max(cursor, stop)
        if cursor >= end:
            break
    return out


# ---------------------------------------------------------------- snapshot sessions (version 2)


@dataclass(frozen=True, slots=True)
class LinkPlace:
    """One link of a snapshot answer: the batch's offsets and its place in a RouterChannel."""

    base_offset: int
    record_count: int
    source_node_id: int
    channel_offset: int
    position: int
    length: int
    timestamp_ms: int


def pack_links(links: list[LinkPlace], start_offset: int = 0, timestamps: bool = True) -> bytes:
    """The links of one partition's answer as zigzag varints, each field a delta from the
    previous link's (base offset from its end, the first from `start_offset`; channel
    offset, timestamp) or absolute: ~10 bytes a link instead of ~40 — pure. Version 4 of
    GetPartitionSnapshot: the first base offset from the answer's high watermark (a byte
    instead of ~3) and no timestamps (the proxy never uses them: ~6 bytes a first link)."""
    out = bytearray()
    end, channel, timestamp = start_offset, 0, 0
    for link in links:
        for value in (
            link.base_offset - end,
            link.record_count,
            link.source_node_id,
            link.channel_offset - channel,
            link.position,
            link.length,
        ):
            put_zigzag(out, value)
        if timestamps:
            put_zigzag(out, link.timestamp_ms - timestamp)
        end, channel = link.base_offset + link.record_count, link.channel_offset
        timestamp = link.timestamp_ms
    return bytes(out)


def unpack_links(
    data: bytes, max_links: int = 65_536, start_offset: int = 0, timestamps: bool = True
) -> list[LinkPlace]:
    """`pack_links` undone (raises ValueError on bad input; without timestamps, each link's
    is 0) — pure."""
    out: list[LinkPlace] = []
    pos, end, channel, timestamp = 0, start_offset, 0, 0
    count = 7 if timestamps else 6
    while pos < len(data):
        if len(out) >= max_links:
            raise ValueError(f"more than {max_links} packed links")
        fields = []
        for _ in range(count):
            value, pos = get_zigzag(data, pos, "packed links")
            fields.append(value)
        base = end + fields[0]
        channel += fields[3]
        timestamp += fields[6] if timestamps else 0
        out.append(LinkPlace(base, fields[1], fields[2], channel, fields[4], fields[5], timestamp))
        end = base + fields[1]
    return out


class LinkTable:
    """What version 6 links are packed against, kept by both sides of a snapshot session:
    per source node the channel offset of the newest link an answer named (a link's
    channel offset is a delta from it), and the record count, source node and length of
    the last link packed (a link that repeats them leaves them out). Only answers the
    proxy got change it (a lost one starts the session over). Used by one thread at a
    time (the session's poll)."""

    def __init__(self) -> None:
        self.channels: dict[int, int] = {}
        self.count, self.source, self.length = 1, -1, -1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinkTable) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"LinkTable({vars(self)})"


class _Session:
    __slots__ = ("epoch", "partitions", "topics", "links")

    def __init__(self) -> None:
        self.epoch = 0
        # (topic id, partition) -> [fetch offset, aborted from, last stable offset answered]
        self.partitions: dict[tuple[str, int], list[int]] = {}
        # version 4: the topics the session's answers named, by index (the proxy mirrors it)
        self.topics: dict[uuid.UUID, int] = {}
        # version 6: what the session's links are packed against (`snapshot_codec`)
        self.links = LinkTable()


class SnapshotSessions:
    """The main's snapshot sessions (version 2 of GetPartitionSnapshot): per proxy (node id,
    session id) the partitions it follows and the offsets it has, so a poll lists only what
    changed and an answer only the partitions with something new; each answer advances the
    offsets (`advance`). Bounded: `max_sessions` (the least recently used dropped: its
    proxy's next incremental poll is refused and it sends its full list again) and
    `max_partitions` per session (more are refused). Thread-safe; no I/O."""

    NOT_FOUND = "session not found"
    BAD_EPOCH = "session epoch out of order"

    def __init__(self, max_sessions: int = 1024, max_partitions: int = 4096):
        if max_sessions < 1 or max_partitions < 1:
            raise ValueError("SnapshotSessions bounds must be >= 1")
        self.max_sessions = max_sessions
        self.max_partitions = max_partitions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[tuple[int, int], _Session] = OrderedDict()

    def update(
        self,
        node_id: int,
        session_id: int,
        epoch: int,
        incremental: bool,
        partitions: list[tuple[tuple[str, int], int, int, int]],
        forgotten: list[tuple[str, int]],
    ) -> dict[tuple[str, int], tuple[int, int, int]] | str:
        """Apply a poll's list ((key, fetch offset, aborted from, last stable offset the
        proxy knows, -1: none or not told) each); the session's partitions and offsets
        after it, or why it is refused (`NOT_FOUND`, `BAD_EPOCH`: the proxy sends its full
        list)."""
        key = (node_id, session_id)
        with self._lock:
            session = self._sessions.get(key)
            if not incremental:
                session = self._sessions[key] = _Session()
            elif session is None:
                return self.NOT_FOUND
            elif epoch != session.epoch + 1:
                return self.BAD_EPOCH
            self._sessions.move_to_end(key)
            session.epoch = epoch
            for part in forgotten:
                session.partitions.pop(part, None)
            for part, offset, aborted_from, lso in partitions:
                entry = session.partitions.get(part)
                if entry is not None:  # offsets the proxy changed: its LSO stays known
                    entry[0], entry[1] = offset, aborted_from
                    entry[2] = max(entry[2], lso) if entry[2] >= 0 else entry[2]
                elif len(session.partitions) < self.max_partitions:
                    # never answered (-1): the next answer holds it, whatever is new
                    session.partitions[part] = [offset, aborted_from, -1]
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return {part: (e[0], e[1], e[2]) for part, e in session.partitions.items()}

    def advance(
        self,
        node_id: int,
        session_id: int,
        epoch: int,
        answered: dict[tuple[str, int], tuple[int, int, int]],
    ) -> None:
        """After an answer of poll `epoch`: each answered partition's (fetch offset, aborted
        from, last stable offset) as the proxy has them now (offsets only grow); nothing when
        a newer poll of the session came meanwhile."""
        with self._lock:
            session = self._sessions.get((node_id, session_id))
            if session is None or session.epoch != epoch:
                return
            for part, (offset, aborted_from, lso) in answered.items():
                entry = session.partitions.get(part)
                if entry is not None:
                    entry[0] = max(entry[0], offset)
                    entry[1] = max(entry[1], aborted_from)
                    entry[2] = max(entry[2], lso)

    def topic_table(
        self, node_id: int, session_id: int, epoch: int, max_topics: int
    ) -> dict[uuid.UUID, int] | None:
        """The topic table of poll `epoch`'s session (version 4 answers name topics by it;
        only that poll's answer extends it: one poll of a session at a time), or None when
        a newer poll came, the session is gone or its table holds `max_topics` (the answer
        is then refused and the proxy starts the session over)."""
        tables = self.tables(node_id, session_id, epoch, max_topics, 1)
        return None if tables is None else tables[0]

    def tables(
        self, node_id: int, session_id: int, epoch: int, max_topics: int, max_channels: int
    ) -> tuple[dict[uuid.UUID, int], LinkTable] | None:
        """The topic and link tables of poll `epoch`'s session (version 6 answers pack
        links against the latter), as `topic_table`; None also when the link table names
        `max_channels` source nodes."""
        with self._lock:
            session = self._sessions.get((node_id, session_id))
            if (
                session is None
                or session.epoch != epoch
                or len(session.topics) >= max_topics
                or len(session.links.channels) >= max_channels
            ):
                return None
            return session.topics, session.links

    def full_epoch(self, node_id: int, session_id: int, low_bits: int, bits: int) -> int:
        """A poll's session epoch from its low `bits` bits (version 6): the one after the
        session's when they match (`low_bits` otherwise, which `update` then refuses)."""
        with self._lock:
            session = self._sessions.get((node_id, session_id))
        if session is None:
            return low_bits
        expected = session.epoch + 1
        return expected if expected & ((1 << bits) - 1) == low_bits else low_bits

    def forget(self, node_id: int, session_id: int, part: tuple[str, int]) -> None:
        """Drop a partition from a session (not led here any more: answered once)."""
        with self._lock:
            session = self._sessions.get((node_id, session_id))
            if session is not None:
                session.partitions.pop(part, None)
