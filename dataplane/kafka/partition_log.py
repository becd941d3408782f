"""`PartitionLog`: one partition this broker leads (the first `PartitionBackend`).

Its stream is in the storage engine. It validates produced Kafka record batches, deduplicates
idempotent retries (`producer_state.ProducerStateTable`), assigns offsets (patched into
baseOffset and partitionLeaderEpoch) and appends finished batches to the stream, writes
transaction markers and records aborted transactions with the stream, reads, and tells
listeners when new data may be readable.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import ClassVar

from prometheus_client import Counter

from controlplane import topic_configs
from controlplane.image import RangeState
from dataplane.formats.crc32c_combine import COMBINE_PAYS_FROM_BYTES
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import (
    RecordChunks,
    batch_crc32c,
    concat_records,
    patch_batch,
)
from dataplane.kafka import time_index
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    BackendBackpressure,
    LinkBuilder,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
    parse_produced_batches,
)
from dataplane.kafka.producer_state import ProducerStateTable, TxnIndex
from dataplane.kafka.time_index import PieceTimestamps, StoredPiece
from dataplane.kafka.txn.markers import build_marker
from dataplane.s3stream.storage import Stream
from dataplane.s3stream.wal import WALBackpressureError

log = logging.getLogger(__name__)

# how long after a partition opens here a sequence gap from a producer that has not
# appended here yet is answered NOT_LEADER_OR_FOLLOWER (see PartitionLog._refusal)
OPEN_GRACE_S = 10.0
MAX_UNRECORDED_ABORTS = 10_000  # durable aborts waiting to be recorded in the metadata
MAX_ABORTS_PER_RECORD = 1000  # per controller call (the request's limit)

# Kafka's BytesInPerSec / BytesOutPerSec by topic (`automqctl cluster top`, Grafana); a
# broker's own rate is their sum over topics
TOPIC_BYTES_IN = Counter(
    "automq_topic_bytes_in",
    "Kafka record-batch bytes appended to the partitions this broker leads, by topic",
    ["topic"],
)
TOPIC_BYTES_OUT = Counter(
    "automq_topic_bytes_out",
    "record bytes read for Fetch responses from the partitions this broker leads, by topic",
    ["topic"],
)


def forget_topic_metrics(topic: str) -> None:
    """Drop a deleted topic's byte counters from /metrics (a topic created again under its
    name counts from 0, which rates read as a restart)."""
    for counter in (TOPIC_BYTES_IN, TOPIC_BYTES_OUT):
        try:
            counter.remove(topic)
        except KeyError:  # it never counted here
            pass


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
        self._bytes_in = TOPIC_BYTES_IN.labels(topic)  # the topic's counters, looked up once
        self._bytes_out = TOPIC_BYTES_OUT.labels(topic)
        self._listeners: list = []
        self._listeners_lock = threading.Lock()

    # the real partition: its high watermark does not lag; WAL bytes are counted by the
    # caller; admin requests are answered here
    lags_leader = False
    counts_own_wal_bytes = False
    forwards_to_main = False

    @property
    def identity(self) -> object:
        """This partition log (see `PartitionBackend.identity`)."""
        return self

    @property
    def stream_id(self) -> int:
        return self.stream.stream_id

    @property
    def high_watermark(self) -> int:
        return self.stream.next_offset

    @property
    def log_start_offset(self) -> int:
        return self.stream.start_offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark: what a
        read_committed consumer may read up to. An aborted transaction not yet recorded with
        the stream's metadata counts as open: readers that skip the brokers (the Spark
        source, table sync) filter aborts by that metadata, capped at this offset, so it
        must never pass an abort they cannot see yet (one controller commit per abort)."""
        first = self.txns.first_unstable()
        with self._unrecorded_lock:
            if self._unrecorded:
                unrecorded = min(slot.entry[1] for slot in self._unrecorded)
                first = unrecorded if first is None else min(first, unrecorded)
        hw = self.high_watermark
        return hw if first is None else min(first, hw)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return self.txns.aborted_between(start, end)

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        return self.txns.aborted_since(marker_offset)

    def write_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[KafkaError, Future | None]:
        """Append a COMMIT/ABORT marker ending `producer_id`'s transaction here (from the
        transaction coordinator's WriteTxnMarkers). An epoch older than the producer's
        current one is INVALID_PRODUCER_EPOCH (a stale coordinator)."""
        data = build_marker(
            producer_id, producer_epoch, commit, coordinator_epoch, int(time.time() * 1000)
        )
        with self.lock:
            current = self.producers.epoch_of(producer_id)
            if current is not None and producer_epoch < current:
                return KafkaError.INVALID_PRODUCER_EPOCH, None
            try:
                marker_offset, fut = self._append_at_end(data, 1)
            except WALBackpressureError as exc:
                # the coordinator retries the marker (its tick, or the remote one's)
                log.warning(
                    "%s-%d: transaction marker waits for room: %s", self.topic, self.partition, exc
                )
                return KafkaError.REQUEST_TIMED_OUT, None
            self.producers.bump_epoch(producer_id, producer_epoch)
            aborted = self.txns.marker(producer_id, commit, marker_offset)
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
        # the last stable offset may have moved past them: wake waiting fetches
        self.notify()

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

    def _append_at_end(
        self,
        data: bytes | memoryview,
        count: int,
        txn_producer_id: int = -1,
        wal_payload: Callable[[int], bytes] | None = None,
        log_append_time_ms: int | None = None,
    ) -> tuple[int, Future]:
        """Caller holds `lock`. The one place a partition's offsets are assigned: the batch
        gets the stream's next ones (only this partition appends to its stream, under
        `lock`), patched into its baseOffset and partitionLeaderEpoch, and is appended
        finished. A transactional batch (`txn_producer_id` >= 0) opens its producer's
        transaction before it can be read (the last stable offset stays below it), undone
        if the stream refuses it. `wal_payload(base offset)`: what the WAL keeps instead of
        the batch (`Stream.append_at`). `log_append_time_ms`: stamp the batch with it
        (LogAppendTime, `patch_batch`). Returns (base offset, durable future)."""
        base = self.stream.append_offset
        patched = patch_batch(data, base, self.leader_epoch, log_append_time_ms)
        # the batch's own CRC is right (checked on arrival, or written here): the WAL record
        # and the object block take theirs from it instead of reading the batch twice more
        crc = batch_crc32c(patched) if len(patched) >= COMBINE_PAYS_FROM_BYTES else None
        opened = txn_producer_id >= 0 and self.txns.data(txn_producer_id, base)
        try:
            fut = self.stream.append_at(
                base, count, patched, None if wal_payload is None else wal_payload(base), crc
            )
        except BaseException:
            if opened:
                self.txns.forget_data(txn_producer_id, base)
            raise
        self.appended_bytes += len(patched)
        self._bytes_in.inc(len(patched))
        fut.add_done_callback(lambda _: self.notify())
        return base, fut

    # ------------------------------------------------------------ PartitionBackend

    def append(
        self,
        records: bytes | None,
        link: LinkBuilder | None = None,
    ) -> AppendOutcome:
        """Validate a produce request's batches, deduplicate idempotent retries, assign
        offsets (patched into each batch) and append; see `PartitionBackend.append`.

        `link(position, length)` (the zone router's main): the WAL keeps, for the batch at
        `records[position:position+length]`, the Link Record the returned function builds
        from its base offset instead of the data (which is in the proxy's RouterChannel)."""
        # views of the request's records: `_append_at_end` copies each batch once, patching it
        configs = self._configs_fn()
        batches = parse_produced_batches(records, configs, copy=False)
        if isinstance(batches, AppendOutcome):
            return batches
        # LogAppendTime: the batches get this broker's clock (not a zone-routed append's:
        # its WAL keeps a Link Record to the channel's unstamped bytes, which must resolve
        # to what was appended)
        append_time_ms = (
            int(time.time() * 1000)
            if link is None
            and topic_configs.effective(configs, "message.timestamp.type") == "LogAppendTime"
            else None
        )
        if any(b.is_transactional and b.producer_id < 0 for b in batches):
            return AppendOutcome(KafkaError.INVALID_RECORD)  # transactional needs a producer id
        positions = []
        position = 0
        for b in batches:  # the batches lie back to back in `records`
            positions.append(position)
            position += len(b.data)
        try:
            # all or nothing: no batch is appended (nor its producer state recorded) when
            # not all of them fit now
            self.stream.check_room(position)
            with self.lock:
                return self._append_checked(batches, positions, link, append_time_ms)
        except WALBackpressureError as exc:
            raise BackendBackpressure(
                f"{self.topic}-{self.partition}: {exc}",
                exc.room,
                exc.generation,
                self.stream.room_wait_s,
            ) from None

    def _append_checked(
        self,
        batches: list,
        positions: list[int],
        link: LinkBuilder | None,
        log_append_time_ms: int | None = None,
    ) -> AppendOutcome:
        """Caller holds `lock`: `append` once the batches are validated (stamped with
        `log_append_time_ms` on a LogAppendTime topic)."""
        futures: list[Future] = []
        first_base: int | None = None
        for b, position in zip(batches, positions, strict=True):
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
                if verdict in ("error", ProducerStateTable.RESET):
                    error = self._refusal(b.producer_id, KafkaError(value))
                    if verdict != ProducerStateTable.RESET or error != value:
                        self._log_sequence_error(b, last_seq, error)
                        return AppendOutcome(error, -1, futures)
                    self._log_state_reset(b)  # accepted, as Kafka does for lost state
            base, durable = self._append_at_end(
                b.data,
                b.last_offset_delta + 1,
                b.producer_id if b.is_transactional else -1,
                None if link is None else link(position, len(b.data)),
                log_append_time_ms,
            )
            futures.append(durable)
            if first_base is None:
                first_base = base
            if idempotent:
                self.producers.record(
                    b.producer_id, b.producer_epoch, b.base_sequence, last_seq, base
                )
                self._track_undurable(base, durable)
                if time.monotonic() - self._opened_at_s < OPEN_GRACE_S:
                    self._appended_here.add(b.producer_id)
        return AppendOutcome(
            KafkaError.NONE,
            first_base if first_base is not None else -1,
            futures,
            log_append_time_ms=-1 if log_append_time_ms is None else log_append_time_ms,
        )

    def _refusal(self, producer_id: int, error: KafkaError) -> KafkaError:
        """Caller holds `lock`. The answer to a batch the sequence check refused.

        Right after this broker starts serving the partition, a gap from a producer that
        has not appended here yet is most likely the second of two pipelined requests that
        straddled the open: the first was answered NOT_LEADER_OR_FOLLOWER just before. Kafka
        would answer OUT_OF_ORDER_SEQUENCE_NUMBER, on which librdkafka bumps its epoch and
        renumbers what it resends (messages that may be stored already, which then no
        broker can deduplicate); NOT_LEADER_OR_FOLLOWER makes it resend both in order. For
        OPEN_GRACE_S only: a real gap still gets its error after that (a gap against state
        rebuilt from the log, which a WAL loss may have cut short, is then accepted:
        `ProducerStateTable.check`)."""
        if (
            error in (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID)
            and producer_id not in self._appended_here
            and time.monotonic() - self._opened_at_s < OPEN_GRACE_S
        ):
            return KafkaError.NOT_LEADER_OR_FOLLOWER
        return error

    def _log_state_reset(self, batch) -> None:
        """Caller holds `lock`. A producer's sequence skips past the state rebuilt from the
        log (which a WAL loss may have cut short): accepted; once per producer and open."""
        known = self.producers.last_of(batch.producer_id)
        log.warning(
            "%s-%d: producer %d epoch %d resumes at sequence %d, the log knows it up to %s: "
            "accepted (its last batches are not in the log; a WAL loss is named in the "
            "broker logs and cluster status)",
            self.topic,
            self.partition,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            known,
        )

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
        return self._records_out(batches)

    def read_cached(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks | None:
        end = self.high_watermark if end is None else end
        if offset >= end:
            return b""
        batches = self.stream.fetch_cached(offset, end, max_bytes)
        return None if batches is None else self._records_out(batches)

    def _records_out(self, batches: list) -> bytes | memoryview | RecordChunks:
        # not joined: batches read from objects are views of the GET's body (formats/stream_records.py)
        records = concat_records([b.payload for b in batches])
        self._bytes_out.inc(len(records))
        return records

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
