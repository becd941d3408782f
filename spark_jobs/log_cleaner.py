"""Kafka's log cleaner for compacted topics, as pure functions over stored batches.

A partition's stream holds one Kafka v2 batch per StreamRecordBatch. Cleaning a range of
it is two passes (as Kafka's `LogCleaner`):

1. `OffsetMap.add_batches` over every batch of the range: key -> offset of its latest record.
   The map is bounded (`max_entries`, default 500 000 keys: about 16 B digest + 8 B offset
   + Python overhead, ~100 MB); it returns False when one object's keys do not fit and the caller
   stops the range at the previous object boundary (the rest is cleaned by a later run).
2. `clean_batch` rewrites each batch keeping a record only when it is the latest of its key
   (and, for a tombstone — a null value — only while younger than `delete.retention.ms`).

The rewritten batch keeps baseOffset, lastOffsetDelta, partitionLeaderEpoch, producer
id/epoch/base sequence, base/max timestamps, attributes and compression; kept records are
copied byte for byte (their offset and timestamp deltas stay valid against the unchanged
base offset and base timestamp), `recordsCount` and the CRC32C are recomputed. A batch left
with no record is kept as an empty batch (as Kafka keeps them for producer state), written
uncompressed as Kafka's `writeEmptyHeader` does, so the stream keeps contiguous offsets:
every StreamRecordBatch keeps its base offset and count, only its payload shrinks.

Not touched (kept whole, their keys not entered in the map): control batches and
transactional batches (an aborted transaction's record must never supersede a committed
one), records with a null key, batches that do not decode (e.g. snappy without a codec).
Keeping them whole is always safe: a record is only ever removed for a strictly newer
record of its key that stays in the log.

Pure module: no I/O. Thread-safety: an OffsetMap belongs to one task (not shared).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import (
    CompressionType,
    InvalidRecordBatchError,
    build_batch,
    parse_batch_header,
)
from dataplane.formats.stream_records import StreamRecordBatch

DEFAULT_MAX_MAP_ENTRIES = 500_000
_COMPRESSION_MASK = 0x07
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20


def key_digest(key: bytes) -> bytes:
    """The map's key: a 16-byte digest (Kafka's cleaner stores an MD5 of the key)."""
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass
class DecodedRecord:
    """One record of a batch: its offset, timestamp, key, whether its value is null, and
    its encoded bytes (length varint included) in the decompressed records section."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    is_tombstone: bool
    raw: bytes


@dataclass
class DecodedBatch:
    """One Kafka batch, decoded; `records` is None when it is kept whole (see module doc)."""

    data: bytes
    base_offset: int
    records: list[DecodedRecord] | None


def decode_batch(payload: bytes) -> DecodedBatch:
    """Decode one stored Kafka batch with kafka-python's reader (the records section
    decompressed once; each record's bytes sliced as the reader walks them)."""
    header = parse_batch_header(memoryview(payload), 0)
    if header.size_in_bytes != len(payload):
        raise InvalidRecordBatchError(
            KafkaError.CORRUPT_MESSAGE, "a stored batch is not exactly one Kafka batch"
        )
    if header.is_control or header.is_transactional:
        return DecodedBatch(payload, header.base_offset, None)
    reader = DefaultRecordBatch(payload)
    try:
        reader._maybe_uncompress()  # noqa: SLF001 - the reader's own decompression
    except Exception:  # noqa: BLE001 - no codec (snappy) or corrupt: kept whole
        return DecodedBatch(payload, header.base_offset, None)
    records: list[DecodedRecord] = []
    buffer = reader._buffer  # noqa: SLF001
    position = reader._pos  # noqa: SLF001
    try:
        for rec in reader:
            end = reader._pos  # noqa: SLF001 - the reader's position after this record
            raw = bytes(buffer[position:end])
            records.append(
                DecodedRecord(rec.offset, rec.timestamp, rec.key, rec.value is None, raw)
            )
            position = end
    except Exception:  # noqa: BLE001 - records that do not decode: kept whole
        return DecodedBatch(payload, header.base_offset, None)
    return DecodedBatch(payload, header.base_offset, records)


class OffsetMap:
    """key digest -> offset of the key's latest record in the range (bounded)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_MAP_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._latest: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def latest(self, key: bytes) -> int | None:
        return self._latest.get(key_digest(key))

    def add_batches(self, batches: list[DecodedBatch]) -> bool:
        """Enter the keys of `batches` (all or none): False, the map unchanged, when they
        do not fit."""
        digests = [
            (key_digest(r.key), r.offset)
            for b in batches
            if b.records is not None
            for r in b.records
            if r.key is not None
        ]
        new = {d for d, _ in digests if d not in self._latest}
        if len(self._latest) + len(new) > self.max_entries:
            return False
        for digest, offset in digests:
            if offset > self._latest.get(digest, -1):
                self._latest[digest] = offset
        return True


@dataclass
class CleanResult:
    """A rewritten batch and how many records it lost."""

    data: bytes
    removed: int
    kept: int


def _keep(record: DecodedRecord, offsets: OffsetMap, tombstone_horizon_ms: int) -> bool:
    if record.key is None:
        return True
    latest = offsets.latest(record.key)
    if latest is not None and latest > record.offset:
        return False  # superseded by a newer record of the key
    if record.is_tombstone and record.timestamp_ms < tombstone_horizon_ms:
        return False  # an expired tombstone (older than delete.retention.ms)
    return True


def clean_batch(
    batch: DecodedBatch, offsets: OffsetMap, now_ms: int, delete_retention_ms: int
) -> CleanResult:
    """The batch without its superseded records and expired tombstones (see module doc);
    the same bytes when nothing is removed."""
    if batch.records is None:
        return CleanResult(batch.data, 0, 0)
    horizon = now_ms - delete_retention_ms
    kept = [r for r in batch.records if _keep(r, offsets, horizon)]
    if len(kept) == len(batch.records):
        return CleanResult(batch.data, 0, len(kept))
    header = parse_batch_header(memoryview(batch.data), 0)
    attributes = header.attributes
    section = b"".join(r.raw for r in kept)
    if not kept:
        attributes &= ~_COMPRESSION_MASK  # Kafka writes empty batches uncompressed
    else:
        section = _compress(CompressionType(attributes & _COMPRESSION_MASK), section)
    data = build_batch(
        section,
        len(kept),
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        magic=header.magic,
        attributes=attributes,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
    )
    return CleanResult(data, len(batch.records) - len(kept), len(kept))


def _compress(kind: CompressionType, section: bytes) -> bytes:
    if kind == CompressionType.NONE:
        return section
    if kind == CompressionType.GZIP:
        return kafka_codec.gzip_encode(section)
    if kind == CompressionType.SNAPPY:
        return kafka_codec.snappy_encode(section)
    if kind == CompressionType.LZ4:
        return kafka_codec.lz4_encode(section)
    return kafka_codec.zstd_encode(section)


def max_timestamp(batch: StreamRecordBatch) -> int:
    """The batch's max timestamp (for min.compaction.lag.ms); -1 when not a Kafka batch."""
    try:
        return parse_batch_header(memoryview(batch.payload), 0).max_timestamp
    except InvalidRecordBatchError:
        return -1


def clean_stream_batch(
    batch: StreamRecordBatch, offsets: OffsetMap, now_ms: int, delete_retention_ms: int
) -> tuple[StreamRecordBatch, int]:
    """The stored batch with its payload cleaned: same stream, epoch, base offset and
    count (the stream's offsets stay contiguous); and how many records it lost."""
    try:
        decoded = decode_batch(batch.payload)
    except InvalidRecordBatchError:
        return batch, 0  # not a Kafka batch: untouched
    result = clean_batch(decoded, offsets, now_ms, delete_retention_ms)
    if not result.removed:
        return batch, 0
    return (
        StreamRecordBatch(
            batch.stream_id, batch.epoch, batch.base_offset, batch.count, result.data
        ),
        result.removed,
    )


def add_stream_batches(offsets: OffsetMap, batches: list[StreamRecordBatch]) -> bool:
    """Pass 1 over stored batches (e.g. one object's), all or none; False when their keys
    do not fit the map. Payloads that are not Kafka batches map nothing."""
    decoded = []
    for batch in batches:
        try:
            decoded.append(decode_batch(batch.payload))
        except InvalidRecordBatchError:
            continue
    return offsets.add_batches(decoded)
