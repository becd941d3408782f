"""The idempotent and transactional producer state of one partition.

`ProducerStateTable` checks each idempotent batch's sequence and finds retries (duplicates)
of the last batches of each producer; `TxnIndex` knows the open transactions (they bound the
last stable offset) and the aborted ones (a read_committed fetch reports them);
`rebuild_producer_state` replays the tail of a partition's stream into both when a new leader
opens it, so a producer retrying a batch the previous leader wrote gets it deduplicated.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import (
    InvalidRecordBatchError,
    parse_batches,
)
from dataplane.kafka.txn.markers import marker_of
from dataplane.s3stream.storage import Stream

log = logging.getLogger(__name__)

PRODUCER_BATCHES_KEPT = 5  # Kafka keeps the last 5 batches per producer and partition
MAX_PRODUCERS_PER_PARTITION = 10_000
# how much of a stream's tail is read to rebuild producer state when a partition opens: the
# batches a producer may retry are its last 5 in flight, at the very end of the log
PRODUCER_SCAN_OFFSETS = 4_096
PRODUCER_SCAN_MAX_BYTES = 8 * 1024 * 1024


@dataclass
class _ProducerEntry:
    epoch: int
    # (first_seq, last_seq, base_offset) of the last batches, oldest first
    batches: deque = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))
    # rebuilt from the log (`rebuild_producer_state`), no batch appended through this leader
    # yet: the log may have lost the producer's last acknowledged batches (a WAL loss)
    restored: bool = False


class ProducerStateTable:
    """Idempotent producers of one partition: sequence checks and duplicate detection.

    `knows_every_producer`: every producer with a batch in the partition's log is in the
    table (the partition's first leader built it with an empty log and evicted no producer since). Then a
    producer the table does not know must start at sequence 0: a later sequence means its
    first batch failed here while a later one (pipelined, max.in.flight > 1) arrived, and
    appending that one would make librdkafka take the failed batch for stored (it
    acknowledges every message below a sequence the broker accepted). Kafka accepts any
    sequence from an unknown producer (its state may have gone with retention), as this
    table does when it is not sure. Thread-safety: used under the partition's lock."""

    DUPLICATE = "duplicate"
    APPEND = "append"
    RESET = "reset"  # a gap against state rebuilt from the log: the log may have lost batches

    def __init__(self) -> None:
        self._producers: dict[int, _ProducerEntry] = {}
        self.knows_every_producer = False  # set by `opened_new`

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> tuple[str, int]:
        """("append", 0), ("duplicate", base_offset), ("error", kafka error code) or
        ("reset", UNKNOWN_PRODUCER_ID): a gap against state rebuilt from the log."""
        entry = self._producers.get(producer_id)
        if entry is None:
            if first_seq != 0 and self.knows_every_producer:
                return (
                    "error",
                    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                )  # its first batch is missing
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
            if entry.restored:
                # the state came from the log, which may have lost this producer's last
                # batches (a WAL loss): its state here is not to be trusted, and Kafka
                # accepts any sequence from a producer whose state is gone (librdkafka
                # fails for good on OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID
                # for a batch it has retried); the caller decides (`RESET`)
                return self.RESET, KafkaError.UNKNOWN_PRODUCER_ID
            return "error", KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
        return self.APPEND, 0

    def opened_new(self) -> None:
        """The partition's first leader (stream epoch 0) built the table, its log empty:
        every producer of it appends through this table. (A log with batches may hold
        producers that the bounded replay of its tail, or a compaction, left out; a later
        epoch's empty log may have lost a producer's batches with a WAL.)"""
        self.knows_every_producer = not self._producers

    def _make_room(self) -> None:
        """Evict the oldest producer when the table is full (it no longer knows them all)."""
        if len(self._producers) >= MAX_PRODUCERS_PER_PARTITION:
            self._producers.pop(next(iter(self._producers)))
            self.knows_every_producer = False

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
            if entry is None:
                self._make_room()
            self._producers[producer_id] = _ProducerEntry(epoch)

    def record(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        base_offset: int,
        restored: bool = False,
    ) -> None:
        """Remember an appended batch; ``restored``: read back from the log by
        `rebuild_producer_state` rather than appended through this leader."""
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            if entry is None:
                self._make_room()
            entry = self._producers[producer_id] = _ProducerEntry(epoch)
        entry.batches.append((first_seq, last_seq, base_offset))
        entry.restored = restored


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

    def data(self, producer_id: int, base_offset: int) -> bool:
        """A transactional batch of `producer_id` at `base_offset`; True when it opens the
        producer's transaction here (its first batch)."""
        with self.lock:
            opened = producer_id not in self.ongoing
            self.ongoing.setdefault(producer_id, base_offset)
            return opened

    def forget_data(self, producer_id: int, base_offset: int) -> None:
        """Undo `data` that opened a transaction with a batch that was not appended."""
        with self.lock:
            if self.ongoing.get(producer_id) == base_offset:
                del self.ongoing[producer_id]

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
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                    last_seq,
                    h.base_offset,
                    restored=True,
                )
                seen += 1
    if end == 0 and stream.epoch == 0:
        table.opened_new()
    return seen
