"""Leaderless erasure-coded partitions behind the PartitionBackend seam (issue #14).

A topic created with `automq.partition.mode=erasure` has partitions with no leader: each
partition's record batches are Reed-Solomon coded (k data + m parity shards, zfec) and shard
i of every offset is kept by the shard store of broker `shard_stores[i]` (one store per
broker, `dataplane/erasure/store_server.py`). Any broker serves any such partition:

- **Produce**: the receiving broker is the writer. Each record batch is written whole as one
  erasure-coded offset (`ErasureWriter`); the produce is answered once k holes hold it
  (durable on each store), the other m shards finish in the background. Offsets are the
  writer's clock in ns rounded up to a multiple of `OFFSET_ALIGNMENT` (65,536), so a batch
  of up to 65,536 records at offset o takes o .. o+n-1 without overlapping another write's
  batch: offsets are sparse, which Kafka clients accept. The stored batch keeps the
  client's baseOffset; a read patches in the offset the write won (outside the batch CRC).
- **Fetch**: `ErasureReader` fills the empty holes below the visible end (now - read delay)
  and decodes offsets from any k consistent shards; the high watermark is the visible end
  (rounded up to the alignment, so a consumer's position after a read batch is never above
  it). An offset that cannot be decided yet (too many stores unreachable) stops the read
  there: nothing is skipped, the consumer waits.
- **Limits** (documented in docs/operations.md): no transactions (transactional batches are
  refused with INVALID_RECORD); an idempotent producer's retry to the same broker gets the
  first attempt's write (the last 10,000 batches per partition are remembered in memory); a
  retry on another broker is looked up in the shard stores by payload CRC (`_find_earlier`,
  best effort: a first attempt not found is stored again);
  ListOffsets by timestamp scans from the target time's offset.
- **Sealing** (`erasure_seal.py`): decided offsets older than the seal delay are written
  into object storage as a stream object and dropped from the shard stores; reads below
  the sealed end come from the object store; retention and DeleteRecords trim them.

Thread-safety: every method may be called from any thread; the writer and reader are
thread-safe and the partition keeps no other mutable state but its listener list (locked).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from controlplane.calls import ControllerCalls
from controlplane.erasure_placement import ErasureSettings, erasure_settings
from controlplane.image import MetadataImage, StreamMetaState
from dataplane.config import SealConfig
from dataplane.erasure.codec import ErasureCodec
from dataplane.erasure.embedded import KAFKA_OFFSET_ALIGNMENT as OFFSET_ALIGNMENT
from dataplane.erasure.embedded import BrokerShardStore
from dataplane.erasure.reader import (
    CorruptWriteError,
    ErasureReader,
    ReadUnavailableError,
    SealedRangeError,
)
from dataplane.erasure.shard_format import payload_checksum
from dataplane.erasure.store import HoleStore
from dataplane.erasure.writer import ErasureWriter, ShardStore, WriteFailedError
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import (
    InvalidRecordBatchError,
    parse_batch_header,
    parse_batches,
    patch_batch,
)
from dataplane.formats.seal_format import offset_of, sealed_records, slot_of
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.kafka.erasure_seal import ErasureSealer, sealed_end
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    BackendError,
    LinkBuilder,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
    PartitionResolver,
    parse_produced_batches,
)
from dataplane.objectstore import ObjectStorage

log = logging.getLogger(__name__)

MAX_FETCH_RECORDS = 500  # offsets decoded per fetch
WRITE_THREADS = 32
LISTENER_TICK_S = 0.2  # waiting fetches re-read this often (the visible end moves with time)
MAX_TIMESTAMP_SCAN_READS = 200
MAX_RECENT_PRODUCER_BATCHES = 10_000  # idempotent batches remembered per partition
MAX_SEALED_READS = 100  # object-store reads per fetch of sealed offsets
MAX_DEDUP_CANDIDATES = 4  # earlier offsets a possibly retried batch checks
DEDUP_WAIT_MARGIN_MS = 200  # beyond the read delay, for a candidate to be decided
DEDUP_POLL_S = 0.02


def aligned_up(offset: int) -> int:
    return -(-offset // OFFSET_ALIGNMENT) * OFFSET_ALIGNMENT


class ErasurePartition:
    """One erasure-coded partition as the Kafka APIs see it (a PartitionBackend)."""

    def __init__(
        self,
        topic_id: str,
        topic: str,
        partition: int,
        stream_id: int,
        leader_epoch: int,
        stores: Sequence[ShardStore],
        settings: ErasureSettings,
        write_pool: ThreadPoolExecutor,
        configs_fn: Callable[[], Mapping[str, str]] = dict,
        stream_fn: Callable[[], StreamMetaState | None] = lambda: None,
        read_sealed: Callable[[int, int, int, int], list[StreamRecordBatch]] | None = None,
        sealer_fn: Callable[[], ErasureSealer | None] = lambda: None,
    ):
        self.topic_id = topic_id
        self.topic = topic
        self.partition = partition
        self.erasure_stream_id = stream_id  # its stream in the metadata (in the shard stores)
        self._leader_epoch = leader_epoch
        codec = ErasureCodec(settings.data_shards, settings.parity_shards)
        self.writer = ErasureWriter(stores, stream_id, codec, offset_alignment=OFFSET_ALIGNMENT)
        self.reader = ErasureReader(stores, stream_id, codec, read_delay_ms=settings.read_delay_ms)
        self._pool = write_pool
        self.seal_delay_ms = settings.seal_delay_ms
        self._configs_fn = configs_fn
        # the partition's stream in the metadata (its sealed end and start), the object
        # store's read path for sealed offsets, the broker's sealer (DeleteRecords)
        self._stream_fn = stream_fn
        self._read_sealed = read_sealed
        self._sealer_fn = sealer_fn
        self._recent: OrderedDict[tuple, Future] = OrderedDict()  # idempotent batch -> write
        # (producer id, epoch) -> the sequence its next batch has, as this broker saw it
        self._producer_next: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._listeners_lock = threading.Lock()

    def close(self) -> None:
        self.writer.close()
        self.reader.close()

    # ------------------------------------------------------------ offsets

    @property
    def leader_epoch(self) -> int:
        return self._leader_epoch

    def _sealed_span(self) -> tuple[int, int] | None:
        """(start, end) of the sealed offsets in slots, None when nothing is sealed."""
        stream = self._stream_fn()
        end = sealed_end(stream)
        if stream is None or end is None:
            return None
        return stream.start_offset, end

    @property
    def log_start_offset(self) -> int:
        """0 until the first seal (the stores hold everything), then the stream's start
        (retention and DeleteRecords move it)."""
        span = self._sealed_span()
        return 0 if span is None else offset_of(span[0])

    # no local stream (its data is in the shard stores), answered here, by any broker
    lags_leader = False
    counts_own_wal_bytes = False
    forwards_to_main = False
    stream_id = -1

    @property
    def identity(self) -> object:
        """This partition (see `PartitionBackend.identity`)."""
        return self

    @property
    def high_watermark(self) -> int:
        """The visible end: offsets below it are decided by readers."""
        return aligned_up(max(self.reader.visible_end(), 0))

    @property
    def last_stable_offset(self) -> int:
        return self.high_watermark

    # ------------------------------------------------------------ produce

    def append(self, records: bytes | None, link: LinkBuilder | None = None) -> AppendOutcome:
        """Validate the batches now (on the caller's thread: cheap), write them in the
        background; the outcome's futures complete when each batch won an offset."""
        if link is not None:
            raise BackendError(KafkaError.NOT_LEADER_OR_FOLLOWER, "no Link Records here")
        # as a leader partition: a batch above the topic's max.message.bytes is refused whole
        batches = parse_produced_batches(records, self._configs_fn())
        if isinstance(batches, AppendOutcome):
            return batches
        if any(b.is_transactional for b in batches):
            return AppendOutcome(KafkaError.INVALID_RECORD)  # no transactions on erasure topics
        if any(b.last_offset_delta + 1 > OFFSET_ALIGNMENT for b in batches):
            return AppendOutcome(KafkaError.INVALID_RECORD)
        payloads = [b.data for b in batches]
        # an idempotent producer's retry to this broker gets the first attempt's write
        # (in flight or won) instead of a second copy
        key = None
        if all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches):
            key = tuple((b.producer_id, b.producer_epoch, b.base_sequence) for b in batches)
        with self._recent_lock:
            done = self._recent.get(key) if key is not None else None
            if done is not None and done.done() and done.exception() is not None:
                done = None  # that attempt failed: write again
            if done is None:
                # a batch that does not continue what this broker saw of its producer may
                # be a retry whose first attempt went to another broker: look for it first
                lookup = False
                if key is not None:
                    producer = (batches[0].producer_id, batches[0].producer_epoch)
                    lookup = self._producer_next.get(producer) != batches[0].base_sequence
                    last = batches[-1]
                    self._producer_next[producer] = last.base_sequence + last.last_offset_delta + 1
                    self._producer_next.move_to_end(producer)
                    while len(self._producer_next) > MAX_RECENT_PRODUCER_BATCHES:
                        self._producer_next.popitem(last=False)
                done = self._pool.submit(self._write, payloads, lookup)
                if key is not None:
                    self._recent[key] = done
                    while len(self._recent) > MAX_RECENT_PRODUCER_BATCHES:
                        self._recent.popitem(last=False)
        return AppendOutcome(KafkaError.NONE, -1, [done], base_offset_future=done)

    def _find_earlier(self, payload: bytes) -> int | None:
        """The offset where these very batch bytes were already decided (an idempotent
        producer's retry whose first attempt another broker wrote), else None. The stores
        index their recent shards by payload CRC; a candidate is waited for until readers
        decide it (at most the read delay and a margin) and counts only if it holds these
        bytes. A first attempt whose shards reach the stores after this look is not found
        (the client may then see its batch twice, as without idempotence)."""
        candidates = self.reader.find_written(payload_checksum(payload)) or []
        for candidate in candidates[-MAX_DEDUP_CANDIDATES:]:
            deadline = time.monotonic() + (self.reader.read_delay_ms + DEDUP_WAIT_MARGIN_MS) / 1000
            while candidate >= self.reader.visible_end() and time.monotonic() < deadline:
                time.sleep(DEDUP_POLL_S)
            if candidate >= self.reader.visible_end() or candidate < self.log_start_offset:
                continue
            expected = patch_batch(payload, candidate, self._leader_epoch)
            data = self.read(candidate, len(payload) + 1024, self.high_watermark)
            if data[: len(expected)] == expected:
                return candidate
        return None

    def _write(self, payloads: list[bytes], lookup: bool = False) -> int:
        """Writes the batches in order; returns the first one's offset. Raises
        WriteFailedError when no offset could be won (the client retries). With `lookup`,
        a batch already decided elsewhere (a retry) is not written again."""
        first = -1
        for payload in payloads:
            found = self._find_earlier(payload) if lookup else None
            offset = found if found is not None else self.writer.append(payload)
            if first < 0:
                first = offset
        self._notify()
        return first

    # ------------------------------------------------------------ fetch

    def read(self, offset: int, max_bytes: int, end: int | None = None) -> bytes:
        """The decided batches from the one holding `offset` (its aligned start) below
        `end`, at least one batch when there is one."""
        end = self.high_watermark if end is None else end
        start = offset - offset % OFFSET_ALIGNMENT
        span = self._sealed_span() if self._read_sealed is not None else None
        if span is not None and start < offset_of(span[1]):
            data, through = self._read_sealed_batches(offset, max_bytes, end, span)
            if data or not through:
                return data
            # only fillers up to the sealed end: the next batch is in the stores
            start = offset = max(offset, offset_of(span[1]))
        parts: list[bytes] = []
        size = 0
        try:
            result = self.reader.read(start, max_records=MAX_FETCH_RECORDS, max_bytes=max_bytes)
        except SealedRangeError as exc:  # sealed since our metadata: read it there next time
            log.info("%s-%d: %s", self.topic, self.partition, exc)
            return b""
        except ReadUnavailableError as exc:  # too few stores: the consumer waits and retries
            log.warning("%s-%d: %s", self.topic, self.partition, exc)
            return b""
        except CorruptWriteError as exc:  # never skipped: the read stops here
            log.error("%s-%d: %s", self.topic, self.partition, exc)
            return b""
        for hole_offset, payload in result.records:
            if hole_offset >= end or (parts and size + len(payload) > max_bytes):
                break
            try:
                header = parse_batch_header(payload)
                if hole_offset + header.last_offset_delta < offset:
                    continue  # ends before the fetch offset: Kafka never returns it
                batch = patch_batch(payload, hole_offset, self._leader_epoch)
            except (InvalidRecordBatchError, ValueError) as exc:
                # not one Kafka batch (e.g. an embedded writer's own payload): no Kafka
                # record is there, and every reader passes it the same way
                log.warning(
                    "%s-%d offset %d: not a record batch: %s",
                    self.topic,
                    self.partition,
                    hole_offset,
                    exc,
                )
                continue
            parts.append(batch)
            size += len(batch)
        return b"".join(parts)

    def _read_sealed_batches(
        self, offset: int, max_bytes: int, end: int, span: tuple[int, int]
    ) -> tuple[bytes, bool]:
        """Sealed batches from the one holding `offset`, from the object store (through
        the storage engine's read path and BlockCache); and whether the read went through
        to the sealed end (only then may a read continue in the stores)."""
        assert self._read_sealed is not None
        slot = max(slot_of(offset), span[0])
        parts: list[bytes] = []
        size = 0
        for _ in range(MAX_SEALED_READS):
            if slot >= span[1]:
                return b"".join(parts), True
            if size >= max_bytes:
                break
            batches = self._read_sealed(
                self.erasure_stream_id, slot, span[1], max(max_bytes, 1 << 16)
            )
            if not batches:
                break  # e.g. trimmed meanwhile: never skip ahead to the stores
            for kafka_offset, payload in sealed_records(batches):
                header = parse_batch_header(payload)
                if kafka_offset >= end or (parts and size + len(payload) > max_bytes):
                    return b"".join(parts), False
                if kafka_offset + header.last_offset_delta < offset:
                    continue
                batch = patch_batch(payload, kafka_offset, self._leader_epoch)
                parts.append(batch)
                size += len(batch)
            slot = max(slot, batches[-1].last_offset)
        return b"".join(parts), False

    def read_cached(self, offset: int, max_bytes: int, end: int | None = None) -> None:
        """Reads go to the shard stores or sealed objects: always off the loop."""
        return None

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return []

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        return []  # no transactions on erasure-coded topics

    def write_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[KafkaError, Future | None]:
        return KafkaError.INVALID_TXN_STATE, None

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp:
        """The first batch at or after the target's clock offset (minus the read delay's
        worth of skew) with a record at or after the target; a bounded scan."""
        position = max(0, (timestamp_ms - self.reader.read_delay_ms) * 1_000_000)
        position -= position % OFFSET_ALIGNMENT
        hw = self.high_watermark
        for _ in range(MAX_TIMESTAMP_SCAN_READS):
            if position >= hw:
                break
            data = self.read(position, 1 << 20, hw)
            if not data:
                break
            for b in parse_batches(data, client_origin=False, verify_crc=False):
                if b.max_timestamp >= timestamp_ms:
                    return OffsetAndTimestamp(b.base_offset, b.max_timestamp)
                position = b.base_offset + OFFSET_ALIGNMENT
        return OffsetAndTimestamp(-1, -1)

    def max_timestamp_offset(self) -> OffsetAndTimestamp:
        return OffsetAndTimestamp(-1, -1)

    def delete_records(self, offset: int) -> int:
        """Move the log start to the batch holding `offset` (-1: the high watermark). Only
        sealed offsets can be deleted: the partition is sealed up to the offset first (the
        visible end at most), and the start stops at the sealed end. Returns the new log
        start offset."""
        sealer = self._sealer_fn()
        if sealer is None:
            raise ValueError("DeleteRecords needs object storage (this broker has none)")
        hw = self.high_watermark
        if offset == -1:
            offset = hw
        if offset < 0 or offset > hw:
            raise OffsetOutOfRangeError(f"offset {offset} is outside [0, {hw}]")
        if offset <= self.log_start_offset:
            return self.log_start_offset
        span = self._sealed_span()
        if span is None or offset_of(span[1]) < offset:
            sealer.seal(self, up_to=min(offset + OFFSET_ALIGNMENT, self.reader.visible_end()))
            span = self._sealed_span()
        if span is None:
            return self.log_start_offset  # nothing stored: nothing to delete
        target = min(slot_of(offset), span[1])
        if target > span[0]:
            sealer.trim(self, target)
        return max(self.log_start_offset, offset_of(target))

    def epoch_end_offset(self, leader_epoch: int) -> tuple[int, int]:
        if leader_epoch < 0:
            return -1, -1
        return self._leader_epoch, self.high_watermark

    # ------------------------------------------------------------ listeners

    def add_listener(self, callback: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with self._listeners_lock:
            try:
                self._listeners.remove(callback)
            except ValueError:
                pass

    def _notify(self) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback()
            except Exception:
                log.exception("fetch listener failed")


class ErasurePartitions:
    """The PartitionResolver of a broker: erasure-coded partitions are served here (any
    broker serves them), every other partition by `leaders` (the PartitionManager).

    Thread-safe. Partitions are created on first use from the current image and dropped
    when their topic is gone; a ticker wakes waiting fetches so they re-read as the
    visible end moves.
    """

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        leaders: PartitionResolver,
        local_store: HoleStore | None = None,
        store_timeout_ms: int = 2_000,
        store_for: Callable[[int], ShardStore] | None = None,
        store_secret: str | None = None,
        controller: ControllerCalls | None = None,
        objects: ObjectStorage | None = None,
        node_epoch_fn: Callable[[], int] | None = None,
        read_sealed: Callable[[int, int, int, int], list[StreamRecordBatch]] | None = None,
        seal_config: SealConfig | None = None,
    ):
        """With `controller`, `objects`, `node_epoch_fn` and `read_sealed` (the storage
        engine's `read_committed`), decided offsets are sealed into object storage
        (`erasure_seal.ErasureSealer`) and read back from there."""
        self.node_id = node_id
        self.image_fn = image_fn
        self.leaders = leaders
        self.local_store = local_store
        self.store_timeout_ms = store_timeout_ms
        self.store_secret = store_secret  # sent to the other brokers' shard stores
        # broker id -> its shard store (default: this broker's own in process, others over
        # HTTP at their registered address); tests pass their own
        self._partitions: dict[tuple[str, int], ErasurePartition] = {}
        self._stores: dict[int, ShardStore] = {}
        self._store_for = store_for or self._broker_store
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="erasure-produce")
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="erasure-ticker", daemon=True)
        self._ticker.start()
        self.read_sealed = read_sealed
        self.sealer: ErasureSealer | None = None
        if controller is not None and objects is not None and read_sealed is not None:
            self.sealer = ErasureSealer(
                node_id,
                node_epoch_fn or (lambda: 0),
                image_fn,
                controller,
                objects,
                self._erasure_partition,
                seal_config,
                local_store=local_store,
            )
            self.sealer.start()

    def stop(self) -> None:
        self._stop.set()
        if self.sealer is not None:
            self.sealer.stop()
        with self._lock:
            partitions = list(self._partitions.values())
            self._partitions.clear()
        for p in partitions:
            p.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _broker_store(self, node_id: int) -> ShardStore:
        local = (self.node_id, self.local_store) if self.local_store is not None else None
        return BrokerShardStore(
            node_id, self.image_fn, local, self.store_timeout_ms, self.store_secret
        )

    def _store(self, node_id: int) -> ShardStore:
        store = self._stores.get(node_id)
        if store is None:
            store = self._stores[node_id] = self._store_for(node_id)
        return store

    def _erasure_partition(self, topic_id: str, partition: int) -> ErasurePartition | None:
        found = self.get(topic_id, partition)
        return found if isinstance(found, ErasurePartition) else None

    def get(self, topic_id: str, partition: int):
        image = self.image_fn()
        topic = image.topics.get(topic_id)
        state = topic.partitions.get(partition) if topic is not None else None
        if state is None or not state.erasure_coded:
            return self.leaders.get(topic_id, partition)
        settings = erasure_settings(topic.configs)
        if settings is None or settings.total_shards != len(state.shard_stores):
            return None
        key = (topic_id, partition)
        with self._lock:
            found = self._partitions.get(key)
            if found is not None and found.erasure_stream_id == state.stream_id:
                return found
            stores = [self._store(n) for n in state.shard_stores]
            created = ErasurePartition(
                topic_id,
                topic.name,
                partition,
                state.stream_id,
                state.leader_epoch,
                stores,
                settings,
                self._pool,
                lambda: self._configs_of(topic_id),
                lambda sid=state.stream_id: self.image_fn().streams.get(sid),
                self.read_sealed,
                lambda: self.sealer,
            )
            self._partitions[key] = created
        if found is not None:
            found.close()
        return created

    def _configs_of(self, topic_id: str) -> Mapping[str, str]:
        topic = self.image_fn().topics.get(topic_id)
        return topic.configs if topic is not None else {}

    def _tick(self) -> None:
        while not self._stop.wait(LISTENER_TICK_S):
            image = self.image_fn()
            with self._lock:
                gone = [k for k in self._partitions if k[0] not in image.topics]
                dropped = [self._partitions.pop(k) for k in gone]
                partitions = list(self._partitions.values())
            for p in dropped:
                p.close()
            for p in partitions:
                p._notify()


__all__ = [
    "BrokerShardStore",
    "ErasurePartition",
    "ErasurePartitions",
    "OFFSET_ALIGNMENT",
    "WriteFailedError",
]
