"""Partitions this broker leads: each is a stream of the storage engine.

`PartitionManager` follows the metadata image: a partition whose leader is this node is
opened (its stream opened with the partition's leader epoch as stream epoch, and the
idempotent-producer state rebuilt from the stream's tail, so a producer retrying a batch the
previous leader wrote gets it deduplicated); one that moved away is closed at once (no new
appends, in-flight ones made durable, its WAL data uploaded, the stream closed) so its new
leader can open it. Streams this node still owns but no longer leads (e.g. moved while it
restarted) are closed too. `PartitionLog` is what the Kafka APIs use: append Kafka record batches
(offsets assigned by patching baseOffset and partitionLeaderEpoch), idempotent-producer
duplicate detection, fetch, and a way to wait for new data.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ClassVar

from controlplane import broker_configs, topic_configs
from controlplane.errors import ControllerError
from controlplane.image import MetadataImage, RangeState
from controlplane.records import StreamState
from controlplane.requests import AbortedTxn, RecordAbortedTxnsRequest
from dataplane.config import MAX_PARTITION_PRODUCE_BYTES
from dataplane.kafka import time_index
from dataplane.kafka.errors import KafkaError
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    OffsetAndTimestamp,
    parse_produced_batches,
)
from dataplane.kafka.record_batch import (
    InvalidRecordBatchError,
    RecordChunks,
    concat_records,
    parse_batches,
    patch_batch,
)
from dataplane.kafka.time_index import PieceTimestamps, StoredPiece
from dataplane.kafka.txn.markers import build_marker, marker_of
from dataplane.s3stream.storage import S3Storage, Stream

log = logging.getLogger(__name__)

# one partition's records in one produce request: at most MAX_PARTITION_PRODUCE_BYTES (each
# batch is also held to its topic's max.message.bytes, Kafka's default 1048588)
PRODUCER_BATCHES_KEPT = 5  # Kafka keeps the last 5 batches per producer and partition
MAX_PRODUCERS_PER_PARTITION = 10_000
# how much of a stream's tail is read to rebuild producer state when a partition opens: the
# batches a producer may retry are its last 5 in flight, at the very end of the log
PRODUCER_SCAN_OFFSETS = 4_096
PRODUCER_SCAN_MAX_BYTES = 8 * 1024 * 1024
# how long after a partition opens here a sequence gap from a producer that has not
# appended here yet is answered NOT_LEADER_OR_FOLLOWER (see PartitionLog._refusal)
OPEN_GRACE_S = 10.0
MAX_UNRECORDED_ABORTS = 10_000  # durable aborts waiting to be recorded in the metadata
MAX_ABORTS_PER_RECORD = 1000  # per controller call (the request's limit)
RECORD_ABORTED_TIMEOUT_S = 10.0
MOVE_WORKERS = 8  # partitions opened in parallel (each is a controller round trip + a tail read)
# records that can change which partitions this node leads or which streams it must close;
# other batches (offset commits into the KV, object commits) need no reconcile
RECONCILE_RECORD_TYPES = frozenset(
    {"topic", "partition", "remove_topic", "create_stream", "stream_epoch", "delete_stream"}
)
RECONCILE_SAFETY_S = 10.0  # a full reconcile at least this often, whatever the deltas said


class OffsetOutOfRangeError(ValueError):
    """An offset past the partition's high watermark (OFFSET_OUT_OF_RANGE)."""


@dataclass
class _ProducerEntry:
    epoch: int
    # (first_seq, last_seq, base_offset) of the last batches, oldest first
    batches: deque = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))


class ProducerStateTable:
    """Idempotent producers of one partition: sequence checks and duplicate detection."""

    DUPLICATE = "duplicate"
    APPEND = "append"

    def __init__(self) -> None:
        self._producers: dict[int, _ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> tuple[str, int]:
        """("append", 0), ("duplicate", base_offset) or ("error", kafka error code)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return self.APPEND, 0  # unknown producer (new, or state lost): accept
        if epoch < entry.epoch:
            return "error", KafkaError.INVALID_PRODUCER_EPOCH
        if epoch > entry.epoch:
            return (
                (self.APPEND, 0)
                if first_seq == 0
                else ("error", KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER)
            )
        for batch_first, batch_last, base in entry.batches:
            if batch_first == first_seq and batch_last == last_seq:
                return self.DUPLICATE, base
        last = entry.batches[-1][1] if entry.batches else -1
        if first_seq != (last + 1) % (2**31):
            return "error", KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
        return self.APPEND, 0

    def entries(self) -> list[tuple[int, int, int]]:
        """(producer id, epoch, last sequence or -1) of every producer known here."""
        return [
            (pid, e.epoch, e.batches[-1][1] if e.batches else -1)
            for pid, e in self._producers.items()
        ]

    def last_of(self, producer_id: int) -> tuple[int, int] | None:
        """(epoch, last sequence or -1) of a producer known here."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return None
        return entry.epoch, entry.batches[-1][1] if entry.batches else -1

    def epoch_of(self, producer_id: int) -> int | None:
        entry = self._producers.get(producer_id)
        return entry.epoch if entry is not None else None

    def bump_epoch(self, producer_id: int, epoch: int) -> None:
        """A transaction marker at `epoch` (a coordinator bump fences the older epochs)."""
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            if entry is None and len(self._producers) >= MAX_PRODUCERS_PER_PARTITION:
                self._producers.pop(next(iter(self._producers)))
            self._producers[producer_id] = _ProducerEntry(epoch)

    def record(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int, base_offset: int
    ) -> None:
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            if entry is None and len(self._producers) >= MAX_PRODUCERS_PER_PARTITION:
                self._producers.pop(next(iter(self._producers)))
            entry = self._producers[producer_id] = _ProducerEntry(epoch)
        entry.batches.append((first_seq, last_seq, base_offset))


class TxnIndex:
    """Transactions of one partition: the first offset of each open transaction (per
    producer id), which bounds the last stable offset, and the aborted transactions
    (producer id, first offset, marker offset) a read_committed fetch reports.

    Thread-safety: changed under the partition's lock; read from any thread (each read
    copies under `lock`).
    """

    MAX_ABORTED = 100_000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ongoing: dict[int, int] = {}  # producer id -> first offset
        self.aborted: deque[tuple[int, int, int]] = deque(maxlen=self.MAX_ABORTED)

    def data(self, producer_id: int, base_offset: int) -> None:
        with self.lock:
            self.ongoing.setdefault(producer_id, base_offset)

    def marker(self, producer_id: int, commit: bool, offset: int) -> tuple[int, int, int] | None:
        """A COMMIT/ABORT marker at `offset`; returns the aborted transaction it ends, if
        any (None for a commit, or a marker of no open transaction)."""
        with self.lock:
            first = self.ongoing.pop(producer_id, None)
            if first is None or commit:
                return None
            entry = (producer_id, first, offset)
            self._add_aborted(entry)
            return entry

    def seed_aborted(self, entries: list[tuple[int, int, int]]) -> None:
        """The partition's aborted transactions as recorded in the metadata (in marker
        order), before the tail read adds the recent ones: a new leader then knows every
        abort since the stream's start, not only those in the tail it reads."""
        with self.lock:
            for entry in entries:
                self._add_aborted(tuple(entry))

    def _add_aborted(self, entry: tuple[int, int, int]) -> None:
        """Caller holds `lock`. Markers come in offset order: one at or below the newest
        known is in the list already (seeded from the metadata, then met in the tail)."""
        if not self.aborted or self.aborted[-1][2] < entry[2]:
            self.aborted.append(entry)

    def first_unstable(self) -> int | None:
        with self.lock:
            return min(self.ongoing.values()) if self.ongoing else None

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions whose
        marker is at or past `marker_offset`, oldest first (a zone-router proxy's
        incremental snapshot; walks only those: markers are recorded in offset order)."""
        with self.lock:
            out = []
            for entry in reversed(self.aborted):
                if entry[2] < marker_offset:
                    break
                out.append(entry)
        out.reverse()
        return out

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end)."""
        with self.lock:
            return [
                (pid, first) for pid, first, last in self.aborted if first < end and last >= start
            ]


class ProducerStateUnavailableError(RuntimeError):
    """The tail of a stream could not be read up to its end: the idempotence table rebuilt
    from it would miss the newest batches (a producer retrying one would get it appended
    twice), so the partition is not served yet."""


PRODUCER_SCAN_ATTEMPTS = 4  # starts tried, each closer to the end (the last: its last offset)


def rebuild_producer_state(
    stream: Stream, table: ProducerStateTable, txns: TxnIndex | None = None
) -> int:
    """Replay the idempotent batches at the tail of `stream` into `table` (bounded read).

    Returns the number of batches seen. Reads at most PRODUCER_SCAN_MAX_BYTES: if the last
    PRODUCER_SCAN_OFFSETS offsets are bigger than that, it starts later (large records).
    The read always reaches the stream's end (the batches a producer may retry are the
    last ones); raises ProducerStateUnavailableError when it cannot (a read that stops
    short of committed offsets: the table would miss the newest batches).
    """
    end = stream.next_offset
    start = max(stream.start_offset, end - PRODUCER_SCAN_OFFSETS)
    batches: list = []
    for attempt in range(PRODUCER_SCAN_ATTEMPTS):
        batches, size, offset = [], 0, start
        while offset < end and size <= PRODUCER_SCAN_MAX_BYTES:
            got = stream.fetch(
                offset, end, max(min(1024 * 1024, PRODUCER_SCAN_MAX_BYTES - size), 1)
            )
            if not got:
                raise ProducerStateUnavailableError(
                    f"stream {stream.stream_id}: its tail read stopped at offset {offset} "
                    f"of [{start}, {end})"
                )
            batches += got
            size += sum(b.size_bytes for b in got)
            offset = got[-1].last_offset
        if offset >= end:
            break
        # too big: start closer to the end, in proportion to the bytes per offset; the
        # last attempt reads from the last offset (one fetch returns at least one batch)
        per_offset = size / max(offset - start, 1)
        closer = end - int(PRODUCER_SCAN_MAX_BYTES / 2 / per_offset)
        if attempt == PRODUCER_SCAN_ATTEMPTS - 2:
            closer = end - 1
        start = max(start, min(closer, end - 1))
    else:
        raise ProducerStateUnavailableError(
            f"stream {stream.stream_id}: its tail [{start}, {end}) was not read to its end"
        )
    seen = 0
    for stored in batches:
        try:
            headers = parse_batches(stored.payload, verify_crc=False, client_origin=False)
        except InvalidRecordBatchError:
            continue  # not a Kafka batch (a raw stream): no producer state
        for h in headers:
            if txns is not None and h.is_transactional and h.producer_id >= 0:
                marker = marker_of(h) if h.is_control else None
                if marker is not None:
                    table.bump_epoch(h.producer_id, h.producer_epoch)
                    txns.marker(h.producer_id, marker.commit, h.base_offset)
                    continue
                if not h.is_control:
                    txns.data(h.producer_id, h.base_offset)
            if h.producer_id >= 0 and h.base_sequence >= 0:
                last_seq = (h.base_sequence + h.last_offset_delta) % (2**31)
                table.record(
                    h.producer_id, h.producer_epoch, h.base_sequence, last_seq, h.base_offset
                )
                seen += 1
    return seen


class ProduceRateMeter:
    """Smoothed produce rate (bytes/s) per stream from cumulative byte counters sampled now
    and then (each heartbeat); what the controller's balancer weighs partitions by.

    A stream's first sample only starts its clock (no rate yet: an unknown rate is better
    than a false 0 for a partition that just moved here); its first full interval gives the
    rate as is, later ones are blended in with an exponential moving average of time
    constant `tau_s`, so a burst of one second does not look like a hot partition.
    """

    def __init__(self, tau_s: float = 5.0):
        self.tau_s = tau_s
        self._state: dict[int, tuple[int, float, float | None]] = {}  # bytes, at s, rate

    def sample(self, counters: dict[int, int], now_s: float) -> dict[int, float]:
        """Rates of the streams in `counters` (stream id -> bytes appended so far) that
        have had a full interval; forgets streams no longer in `counters`."""
        out: dict[int, float] = {}
        state: dict[int, tuple[int, float, float | None]] = {}
        for stream_id, total in counters.items():
            prev = self._state.get(stream_id)
            if prev is None or total < prev[0]:
                # new here, or its counter restarted (reopened at a new epoch)
                state[stream_id] = (total, now_s, None)
                continue
            last_bytes, last_s, rate = prev
            if now_s > last_s:
                instant = (total - last_bytes) / (now_s - last_s)
                alpha = 1.0 - math.exp(-(now_s - last_s) / self.tau_s)
                rate = instant if rate is None else rate + alpha * (instant - rate)
                prev = (total, now_s, rate)
            state[stream_id] = prev
            if rate is not None:
                out[stream_id] = rate
        self._state = state
        return out


@dataclass(slots=True)
class _AbortSlot:
    """An aborted transaction (producer id, first offset, marker offset) on its way into
    the stream's metadata; `state` is changed under the partition's `_unrecorded_lock`."""

    PENDING: ClassVar[str] = "pending"  # the marker's WAL write is not done
    DURABLE: ClassVar[str] = "durable"
    FAILED: ClassVar[str] = "failed"  # the marker was not written: nothing to record

    entry: tuple[int, int, int]
    state: str = PENDING


class PartitionLog:
    """One partition this broker leads (the first `PartitionBackend`): its stream, its
    idempotent-producer state and new-data notification.

    Thread-safety: `append` holds `lock` across the sequence checks and the appends they
    guard; reads go to the stream, which is thread-safe.
    """

    def __init__(
        self,
        topic_id: str,
        topic: str,
        partition: int,
        leader_epoch: int,
        stream: Stream,
        ranges_fn: Callable[[], list[RangeState]] = lambda: [],
        configs_fn: Callable[[], Mapping[str, str]] = dict,
        pieces_fn: Callable[[], list[StoredPiece]] = lambda: [],
        piece_timestamps: PieceTimestamps | None = None,
        record_aborted: Callable[[list[tuple[int, int, int]]], None] | None = None,
        run_later: Callable[[Callable[[], None]], object] | None = None,
    ):
        """`record_aborted(entries)` stores aborted transactions with the stream in the
        metadata (a blocking controller call, run through `run_later`); without it they
        are known only from the tail a new leader reads."""
        self.topic_id = topic_id
        self.topic = topic
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.stream = stream
        self._ranges_fn = ranges_fn  # the stream's epoch ranges in the current metadata
        # the topic's configs in the current metadata: read on every append, so an alter
        # takes effect with the next produce, without reopening the partition
        self._configs_fn = configs_fn
        # the time index: the stream's pieces in object storage and their timestamps
        self._pieces_fn = pieces_fn
        self._piece_timestamps = piece_timestamps or PieceTimestamps()
        self.producers = ProducerStateTable()
        self.txns = TxnIndex()
        self._record_aborted = record_aborted
        self._run_later = run_later
        # aborts not yet recorded with the stream, in marker order (bounded)
        self._unrecorded: deque[_AbortSlot] = deque()
        self._unrecorded_lock = threading.Lock()
        self._recording_lock = threading.Lock()  # one recording at a time, in marker order
        self.lock = threading.Lock()  # sequence check + append are atomic per partition
        # base offset -> durability future of each idempotent batch not durable yet: a retry
        # of one (a duplicate) is answered when, and as, its original is
        self._undurable: dict[int, Future] = {}
        self._sequence_error_logged_s = -math.inf
        # producers that appended here since this epoch opened, tracked for the first
        # OPEN_GRACE_S only (see `_refusal`)
        self._opened_at_s = time.monotonic()
        self._appended_here: set[int] = set()
        self.appended_bytes = 0  # Kafka batch bytes appended since this epoch opened here
        self._listeners: list = []
        self._listeners_lock = threading.Lock()

    @property
    def high_watermark(self) -> int:
        return self.stream.next_offset

    @property
    def log_start_offset(self) -> int:
        return self.stream.start_offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark: what a
        read_committed consumer may read up to."""
        first = self.txns.first_unstable()
        hw = self.high_watermark
        return hw if first is None else min(first, hw)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return self.txns.aborted_between(start, end)

    def write_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[KafkaError, Future | None]:
        """Append a COMMIT/ABORT marker ending `producer_id`'s transaction here (from the
        transaction coordinator's WriteTxnMarkers). An epoch older than the producer's
        current one is INVALID_PRODUCER_EPOCH (a stale coordinator)."""
        data = build_marker(
            producer_id, producer_epoch, commit, coordinator_epoch, int(time.time() * 1000)
        )
        epoch = self.leader_epoch
        with self.lock:
            current = self.producers.epoch_of(producer_id)
            if current is not None and producer_epoch < current:
                return KafkaError.INVALID_PRODUCER_EPOCH, None
            assigned: list[int] = []

            def build(base: int) -> bytes:
                assigned.append(base)
                return patch_batch(data, base, epoch)

            fut = self.append_batch(build, 1)
            self.producers.bump_epoch(producer_id, producer_epoch)
            aborted = self.txns.marker(producer_id, commit, assigned[0])
            slot: _AbortSlot | None = None
            if aborted is not None and self._record_aborted is not None:
                # queued under the partition's lock: the queue is in marker (offset) order
                slot = _AbortSlot(aborted)
                with self._unrecorded_lock:
                    self._unrecorded.append(slot)
                    self._bound_unrecorded()
        if slot is not None:
            fut.add_done_callback(lambda f: self._marker_done(f, slot))
        return KafkaError.NONE, fut

    def _bound_unrecorded(self) -> None:
        """Caller holds `_unrecorded_lock`."""
        while len(self._unrecorded) > MAX_UNRECORDED_ABORTS:
            dropped = self._unrecorded.popleft()
            log.warning(
                "%s-%d: over %d aborted transactions wait to be recorded; dropping %s (a "
                "leader that reads past its tail would not know it)",
                self.topic,
                self.partition,
                MAX_UNRECORDED_ABORTS,
                dropped.entry,
            )

    def _marker_done(self, fut: Future, slot: _AbortSlot) -> None:
        """An abort marker's append finished (the WAL's completion thread): a durable one
        is recorded with the stream, on `run_later`."""
        ok = not fut.cancelled() and fut.exception() is None
        with self._unrecorded_lock:
            slot.state = _AbortSlot.DURABLE if ok else _AbortSlot.FAILED
        if ok and self._run_later is not None:
            self._run_later(self.record_pending_aborts)

    @property
    def has_unrecorded_aborts(self) -> bool:
        with self._unrecorded_lock:
            return bool(self._unrecorded)

    def record_pending_aborts(self) -> None:
        """Record the durable aborts not recorded yet, oldest first, up to the first one
        still waiting for its WAL write (blocking: a controller call). A failure leaves them
        for the next call (the next abort here, the partition manager's retry each second,
        or the close of the partition); the controller skips what it already has."""
        if self._record_aborted is None:
            return
        with self._recording_lock:
            with self._unrecorded_lock:
                batch: list[tuple[int, int, int]] = []
                taken = 0  # leading slots this call settles (recorded, or never written)
                for slot in self._unrecorded:
                    if slot.state == _AbortSlot.PENDING or len(batch) >= MAX_ABORTS_PER_RECORD:
                        break
                    taken += 1
                    if slot.state == _AbortSlot.DURABLE:
                        batch.append(slot.entry)
                if not batch:  # only failed ones (their markers were never written)
                    for _ in range(taken):
                        self._unrecorded.popleft()
                    return
            try:
                self._record_aborted(batch)
            except Exception as exc:
                log.warning(
                    "%s-%d: recording %d aborted transactions failed: %s",
                    self.topic,
                    self.partition,
                    len(batch),
                    exc,
                )
                return
            with self._unrecorded_lock:  # still the first ones: others are only appended
                for _ in range(min(taken, len(self._unrecorded))):
                    self._unrecorded.popleft()

    def queue_unrecorded_aborts(self, recorded_up_to: int) -> None:
        """A new leader: the aborts its tail read found past the last one recorded with the
        stream (its predecessor failed before recording them) are recorded now."""
        with self.txns.lock:
            missing = [e for e in self.txns.aborted if e[2] > recorded_up_to]
        if not missing or self._run_later is None:
            return
        with self._unrecorded_lock:
            self._unrecorded.extendleft(
                _AbortSlot(e, _AbortSlot.DURABLE) for e in reversed(missing)
            )
            self._bound_unrecorded()
        self._run_later(self.record_pending_aborts)

    def add_listener(self, callback) -> None:
        with self._listeners_lock:
            self._listeners.append(callback)

    def remove_listener(self, callback) -> None:
        with self._listeners_lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def notify(self) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for cb in listeners:
            cb()

    def append_batch(self, build, count: int, link=None) -> Future:
        """Append one Kafka batch; `build(base_offset)` returns the patched bytes (`link`:
        see `Stream.append_with`)."""

        def counted(base_offset: int) -> bytes:
            data = build(base_offset)
            self.appended_bytes += len(data)  # under the stream's lock
            return data

        fut = self.stream.append_with(counted, count, link)
        fut.add_done_callback(lambda _: self.notify())
        return fut

    # ------------------------------------------------------------ PartitionBackend

    def append(
        self,
        records: bytes | None,
        link: Callable[[int, int], Callable[[int], bytes]] | None = None,
    ) -> AppendOutcome:
        """Validate a produce request's batches, deduplicate idempotent retries, assign
        offsets (patched into each batch) and append; see `PartitionBackend.append`.

        `link(position, length)` (the zone router's main): the WAL keeps, for the batch at
        `records[position:position+length]`, the Link Record the returned function builds
        from its base offset instead of the data (which is in the proxy's RouterChannel)."""
        max_batch = topic_configs.effective_int(self._configs_fn(), "max.message.bytes")
        # views of the request's records: `build` copies each batch once, patching it
        batches = parse_produced_batches(
            records, MAX_PARTITION_PRODUCE_BYTES, max_batch, copy=False
        )
        if isinstance(batches, AppendOutcome):
            return batches
        if any(b.is_transactional and b.producer_id < 0 for b in batches):
            return AppendOutcome(KafkaError.INVALID_RECORD)  # transactional needs a producer id
        futures: list[Future] = []
        first_base: int | None = None
        epoch = self.leader_epoch
        positions = []
        position = 0
        for b in batches:  # the batches lie back to back in `records`
            positions.append(position)
            position += len(b.data)
        with self.lock:
            for b, position in zip(batches, positions, strict=True):
                count = b.last_offset_delta + 1
                idempotent = b.producer_id >= 0 and b.base_sequence >= 0
                last_seq = (b.base_sequence + b.last_offset_delta) % (2**31)
                if idempotent:
                    verdict, value = self.producers.check(
                        b.producer_id, b.producer_epoch, b.base_sequence, last_seq
                    )
                    if verdict == ProducerStateTable.DUPLICATE:
                        if first_base is None:
                            first_base = value
                        futures += self._original_durable(value)
                        continue
                    if verdict == "error":
                        error = self._refusal(b.producer_id, KafkaError(value))
                        self._log_sequence_error(b, last_seq, error)
                        return AppendOutcome(error, -1, futures)
                assigned: list[int] = []

                def build(
                    base: int,
                    data: bytes | memoryview = b.data,
                    assigned: list[int] = assigned,
                    txn_pid: int = b.producer_id if b.is_transactional else -1,
                ) -> bytes:
                    assigned.append(base)  # called under the stream's lock, before append returns
                    if txn_pid >= 0:
                        # before the batch can be read: the last stable offset stays below it
                        self.txns.data(txn_pid, base)
                    return patch_batch(data, base, epoch)

                futures.append(
                    self.append_batch(
                        build, count, None if link is None else link(position, len(b.data))
                    )
                )
                if first_base is None:
                    first_base = assigned[0]
                if idempotent:
                    self.producers.record(
                        b.producer_id, b.producer_epoch, b.base_sequence, last_seq, assigned[0]
                    )
                    self._track_undurable(assigned[0], futures[-1])
                    if time.monotonic() - self._opened_at_s < OPEN_GRACE_S:
                        self._appended_here.add(b.producer_id)
        return AppendOutcome(KafkaError.NONE, first_base if first_base is not None else -1, futures)

    def _refusal(self, producer_id: int, error: KafkaError) -> KafkaError:
        """Caller holds `lock`. The answer to a batch the sequence check refused.

        Right after this broker starts serving the partition, a gap from a producer that
        has not appended here yet is most likely the second of two pipelined requests that
        straddled the open: the first was answered NOT_LEADER_OR_FOLLOWER just before. Kafka
        would answer OUT_OF_ORDER_SEQUENCE_NUMBER, on which librdkafka bumps its epoch and
        renumbers what it resends (messages that may be stored already, which then no
        broker can deduplicate); NOT_LEADER_OR_FOLLOWER makes it resend both in order. For
        OPEN_GRACE_S only: a real gap still gets its error after that."""
        if (
            error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
            and producer_id not in self._appended_here
            and time.monotonic() - self._opened_at_s < OPEN_GRACE_S
        ):
            return KafkaError.NOT_LEADER_OR_FOLLOWER
        return error

    def _log_sequence_error(self, batch, last_seq: int, error: KafkaError) -> None:
        """Caller holds `lock`. A refused sequence or epoch makes librdkafka bump its epoch
        and renumber what it resends (messages that may be stored already included): worth
        a line when it happens, at most one per partition per second."""
        now = time.monotonic()
        if now - self._sequence_error_logged_s < 1.0:
            return
        self._sequence_error_logged_s = now
        known = self.producers.last_of(batch.producer_id)
        log.warning(
            "%s-%d: %s for producer %d epoch %d sequences %d..%d (known here: %s)",
            self.topic,
            self.partition,
            error.name,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            last_seq,
            "nothing" if known is None else f"epoch {known[0]} last sequence {known[1]}",
        )

    def _track_undurable(self, base_offset: int, durable: Future) -> None:
        """Caller holds `lock`. Bounded by the appends in flight (each leaves when done)."""
        self._undurable[base_offset] = durable
        durable.add_done_callback(lambda _f: self._undurable.pop(base_offset, None))

    def _original_durable(self, base_offset: int) -> list[Future]:
        """Caller holds `lock`. What the answer to a retry of the batch at `base_offset`
        waits for: its original's durability if still in flight (Kafka answers a duplicate
        only once its original is committed), nothing once durable. An original that
        failed left the stream failed: then this raises StorageError (the client retries
        elsewhere) rather than acknowledge offsets that hold nothing."""
        original = self._undurable.get(base_offset)
        if original is None:
            self.stream.check_writable()
            return []
        # a future of its own: whatever happens to the retry's (a caller may cancel what it
        # gave up on) must not happen to the original's
        follower: Future = Future()

        def settle(done: Future) -> None:
            try:
                if done.cancelled():
                    follower.cancel()
                elif done.exception() is not None:
                    follower.set_exception(done.exception())
                else:
                    follower.set_result(done.result())
            except InvalidStateError:
                pass  # the produce layer gave up waiting for it (cancelled)

        original.add_done_callback(settle)
        return [follower]

    def read(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks:
        end = self.high_watermark if end is None else end
        if offset >= end:
            return b""
        batches = self.stream.fetch(offset, end, max_bytes)
        # not joined: batches read from objects are views of the GET's body (records.py)
        return concat_records([b.payload for b in batches])

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp:
        """The first record with a timestamp >= `timestamp_ms`, through the time index
        (`time_index.py`: O(log n) reads)."""
        return time_index.offset_for_timestamp(
            self.stream,
            self._pieces_fn(),
            self.log_start_offset,
            self.high_watermark,
            timestamp_ms,
            self._piece_timestamps,
        )

    def max_timestamp_offset(self) -> OffsetAndTimestamp:
        """The record with the largest timestamp (ListOffsets MAX_TIMESTAMP, -3)."""
        return time_index.max_timestamp_offset(
            self.stream,
            self._pieces_fn(),
            self.log_start_offset,
            self.high_watermark,
            self._piece_timestamps,
        )

    def active_producers(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, first offset of its open transaction or -1)
        for DescribeProducers."""
        with self.lock:
            entries = self.producers.entries()
        with self.txns.lock:
            ongoing = dict(self.txns.ongoing)
        return [(pid, epoch, seq, ongoing.get(pid, -1)) for pid, epoch, seq in entries]

    def configs(self) -> Mapping[str, str]:
        """The topic's configs in force (set ones; the rest are Kafka's defaults)."""
        return self._configs_fn()

    def delete_records(self, offset: int) -> int:
        """Advance the log start offset to `offset` (-1: the high watermark): DeleteRecords
        and retention. Returns the new log start offset; an offset below it changes
        nothing. Data still in the WAL is uploaded first. Blocks: call off the event loop.

        Raises:
            OffsetOutOfRangeError: `offset` is past the high watermark.
        """
        target = self.high_watermark if offset == -1 else offset
        if target < 0 or target > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: cannot delete records below {offset}, "
                f"the high watermark is {self.high_watermark}"
            )
        if target > self.log_start_offset:
            self.stream.trim(target)
        return self.log_start_offset

    def epoch_end_offset(self, leader_epoch: int) -> tuple[int, int]:
        if leader_epoch >= self.leader_epoch:
            return self.leader_epoch, self.high_watermark
        ranges = self._ranges_fn()
        later = [rg for rg in ranges if rg.epoch > leader_epoch]
        earlier = [rg for rg in ranges if rg.epoch <= leader_epoch]
        if not earlier:
            return -1, -1
        return earlier[-1].epoch, (later[0].start_offset if later else self.high_watermark)


class PartitionManager:
    """Opens the partitions this node leads, following the metadata image."""

    def __init__(
        self,
        node_id: int,
        storage: S3Storage,
        image_ready: Callable[[], bool] = lambda: True,
        serving: Callable[[], bool] = lambda: True,
    ):
        self.node_id = node_id
        self.storage = storage
        self.image_ready = image_ready  # False while the metadata image is mid-replay
        # False while this process may be stale (stopped past its session: dataplane/stall.py):
        # then no partition is served, whatever this node believes it leads
        self.serving = serving
        self._closing = 0
        self._logs: dict[tuple[str, int], PartitionLog] = {}  # (topic_id, partition)
        # opened streams not served yet (their producer state could not be rebuilt yet):
        # (leader epoch, stream), closed if the partition moves on before they are served
        self._unserved: dict[tuple[str, int], tuple[int, Stream]] = {}
        self._pool = ThreadPoolExecutor(MOVE_WORKERS, thread_name_prefix="partition-move")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._image: MetadataImage | None = None
        self._dirty = True  # a batch touched partitions or streams since the last run
        self._retry = False  # an open was refused: try again within a second
        self._last_reconcile = 0.0  # monotonic time of the last reconcile
        self._rates = ProduceRateMeter()
        self._rates_lock = threading.Lock()
        # every led partition's time index and the retention check share it
        self.piece_timestamps = PieceTimestamps()
        self._thread = threading.Thread(target=self._run, name="partitions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def on_metadata(self, image: MetadataImage, records: list) -> None:
        """A new image: reconcile if its batch touched partitions or streams (an empty
        batch = a snapshot was loaded, which may have changed anything)."""
        self._image = image
        if not records or any(rec.type in RECONCILE_RECORD_TYPES for rec in records):
            self._dirty = True
            self._wake.set()

    def get(self, topic_id: str, partition: int) -> PartitionLog | None:
        if not self.serving():
            return None
        with self._lock:
            return self._logs.get((topic_id, partition))

    def logs(self) -> list[PartitionLog]:
        with self._lock:
            return list(self._logs.values())

    def produce_rates(self, now_s: float | None = None) -> dict[int, float]:
        """Produce bytes/s of each led partition's stream (see ProduceRateMeter); rounded,
        partitions below 1 B/s left out so an idle broker's heartbeat stays small."""
        with self._lock:
            counters = {plog.stream.stream_id: plog.appended_bytes for plog in self._logs.values()}
        with self._rates_lock:
            rates = self._rates.sample(counters, time.monotonic() if now_s is None else now_s)
        return {sid: round(rate, 1) for sid, rate in rates.items() if rate >= 1.0}

    def led_or_closing(self) -> int:
        """Partitions led here plus those still being closed (uploaded) after a move."""
        with self._lock:
            return len(self._logs) + self._closing

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stop.is_set() or self._image is None or not self.image_ready():
                continue
            self._retry_unrecorded_aborts()
            due = time.monotonic() - self._last_reconcile > RECONCILE_SAFETY_S
            if not (self._dirty or self._retry or due):
                continue
            self._dirty = self._retry = False
            self._last_reconcile = time.monotonic()
            try:
                self.reconcile(self._image)
            except Exception:
                self._retry = True
                log.exception("reconciling partitions failed")

    def reconcile(self, image: MetadataImage) -> None:
        """Close partitions led elsewhere now, open led ones that are not open, close
        orphaned streams of this node."""
        wanted: dict[tuple[str, int], tuple[str, int, int]] = {}
        for topic in list(image.topics.values()):
            for p in list(topic.partitions.values()):
                if p.leader_node_id == self.node_id:
                    wanted[(topic.topic_id, p.partition)] = (
                        topic.name,
                        p.leader_epoch,
                        p.stream_id,
                    )
        with self._lock:
            current = dict(self._logs)
            stale = {
                key: entry
                for key, entry in self._unserved.items()
                if key not in wanted or wanted[key][1] != entry[0]
            }
            for key in stale:
                del self._unserved[key]
        if stale:
            self._close_unserved(stale)
        leaving = []
        for key, plog in current.items():
            spec = wanted.get(key)
            if spec is None or spec[1] != plog.leader_epoch:
                with self._lock:
                    self._logs.pop(key, None)  # produce gets NOT_LEADER_OR_FOLLOWER from now on
                    self._closing += 1
                leaving.append(plog)
        # closes first: a partition that moved away and back must have its old epoch's WAL
        # data uploaded before the new epoch's range starts at the committed end
        if leaving:
            self._close_all(leaving)
        jobs = [
            self._pool.submit(self._open, key, name, epoch, stream_id)
            for key, (name, epoch, stream_id) in wanted.items()
            if not (key in current and current[key].leader_epoch == epoch)
        ]
        for job in jobs:
            job.result()
        self._close_orphans(image, wanted)

    def _close_unserved(self, stale: dict[tuple[str, int], tuple[int, Stream]]) -> None:
        """Close the streams of partitions opened here but never served that moved on (to
        another node, or to a newer epoch here): their new leader's open waits for it."""
        streams = [stream for _epoch, stream in stale.values()]
        try:
            errors = self.storage.close_streams(streams)
        except Exception as exc:
            errors = [exc] * len(streams)
        for (key, entry), error in zip(stale.items(), errors, strict=True):
            if error is None:
                log.info("closed stream %d, opened here but never served", entry[1].stream_id)
                continue
            self._retry = True
            with self._lock:
                self._unserved.setdefault(key, entry)  # tried again at the next reconcile
            log.warning("closing unserved stream %d failed: %s", entry[1].stream_id, error)

    def _retry_unrecorded_aborts(self) -> None:
        """Aborts whose recording failed are tried again (about once a second)."""
        with self._lock:
            logs = [plog for plog in self._logs.values() if plog.has_unrecorded_aborts]
        for plog in logs:
            self._pool.submit(plog.record_pending_aborts)

    def _close_all(self, leaving: list[PartitionLog]) -> None:
        """One upload for all partitions that moved away, then their closes."""
        for plog in leaving:  # while this node still owns the streams
            plog.record_pending_aborts()
        try:
            errors = self.storage.close_streams([plog.stream for plog in leaving])
        except Exception as exc:  # the upload failed: failover (or a retry) covers them
            errors = [exc] * len(leaving)
        finally:
            with self._lock:
                self._closing -= len(leaving)
        for plog, error in zip(leaving, errors):
            if error is None:
                log.info(
                    "no longer leading %s-%d: stream %d uploaded and closed",
                    plog.topic,
                    plog.partition,
                    plog.stream.stream_id,
                )
            else:
                log.warning(
                    "closing %s-%d (stream %d) failed: %s",
                    plog.topic,
                    plog.partition,
                    plog.stream.stream_id,
                    error,
                )

    def _open(self, key: tuple[str, int], name: str, epoch: int, stream_id: int) -> None:
        try:
            stream = self.storage.open_stream(stream_id, epoch)
        except ControllerError as exc:
            self._retry = True
            log.info(
                "cannot open %s-%d yet (stream %d epoch %d): %s",
                name,
                key[1],
                stream_id,
                epoch,
                exc,
            )
            return
        plog = PartitionLog(
            key[0],
            name,
            key[1],
            epoch,
            stream,
            ranges_fn=lambda: self._stream_ranges(stream_id),
            configs_fn=lambda: self._topic_configs(key[0]),
            pieces_fn=lambda: time_index.stored_pieces(self._image, stream_id),
            piece_timestamps=self.piece_timestamps,
            record_aborted=lambda entries: self._record_aborted(stream, entries),
            run_later=self._pool.submit,
        )
        # as the controller had them when it opened the stream for this epoch: everything
        # the previous leader recorded (the image here may not have caught up yet)
        recorded = stream.recorded_aborted_txns
        plog.txns.seed_aborted(recorded)
        try:
            producers = rebuild_producer_state(stream, plog.producers, plog.txns)
        except Exception as exc:
            # serving with an empty idempotence table would append a producer's retry of a
            # batch the previous leader wrote a second time: not serving yet (clients get
            # NOT_LEADER_OR_FOLLOWER and retry); the next reconcile opens it again
            self._retry = True
            with self._lock:
                self._unserved[key] = (epoch, stream)
            log.warning(
                "%s-%d: could not rebuild producer state, not serving it yet: %s",
                name,
                key[1],
                exc,
            )
            return
        plog.queue_unrecorded_aborts(recorded[-1][2] if recorded else -1)
        with self._lock:
            self._unserved.pop(key, None)
            self._logs[key] = plog
        log.info(
            "leading %s-%d (stream %d, epoch %d, next offset %d, %d idempotent batches replayed)",
            name,
            key[1],
            stream_id,
            epoch,
            stream.next_offset,
            producers,
        )

    def _record_aborted(self, stream: Stream, entries: list[tuple[int, int, int]]) -> None:
        """Store a led partition's aborted transactions with its stream (blocking)."""
        self.storage.controller.record_aborted_txns(
            RecordAbortedTxnsRequest(
                node_id=self.storage.node_id,
                node_epoch=self.storage.node_epoch,
                stream_id=stream.stream_id,
                stream_epoch=stream.epoch,
                aborted=[
                    AbortedTxn(producer_id=p, first_offset=f, marker_offset=m)
                    for p, f, m in entries
                ],
            ),
            timeout_s=RECORD_ABORTED_TIMEOUT_S,
        )

    def _topic_configs(self, topic_id: str) -> Mapping[str, str]:
        """The topic's configs in force here in the newest image: its own, else this
        broker's dynamic defaults (controlplane/broker_configs.py), else Kafka's."""
        image = self._image
        topic = image.topics.get(topic_id) if image is not None else None
        if topic is None:
            return {}
        return broker_configs.topic_configs_in_force(image, topic.configs, self.node_id)

    def _stream_ranges(self, stream_id: int) -> list[RangeState]:
        image = self._image
        stream = image.streams.get(stream_id) if image is not None else None
        return list(stream.ranges) if stream is not None else []

    def _close_orphans(self, image: MetadataImage, wanted: dict) -> None:
        """Streams the image says this node has open, that this engine did not open and this
        node does not lead with that epoch: close them so their new leader can open them."""
        open_here = self.storage.open_stream_ids()
        led = {(spec[2], spec[1]) for spec in wanted.values()}
        for stream in list(image.streams.values()):
            if stream.state != StreamState.OPENED or stream.node_id != self.node_id:
                continue
            if stream.stream_id in open_here or (stream.stream_id, stream.epoch) in led:
                continue
            if "topic" not in stream.tags:
                continue  # not a partition's stream: its user closes it
            try:
                self.storage.close_orphan_stream(stream.stream_id, stream.epoch)
                log.info("closed orphaned stream %d (epoch %d)", stream.stream_id, stream.epoch)
            except ControllerError as exc:  # the controller knows better: not orphaned
                log.info(
                    "orphaned stream %d (epoch %d) not closed: %s",
                    stream.stream_id,
                    stream.epoch,
                    exc,
                )
            except Exception as exc:
                self._retry = True
                log.warning("closing orphaned stream %d failed: %s", stream.stream_id, exc)
