"""Kafka record batch v2 (magic 2): header parsing, validation, offset/epoch patching.

The broker keeps record batches opaque: it reads and validates the 61-byte header, checks
the CRC, and patches ``baseOffset`` and ``partitionLeaderEpoch``. Both fields precede the
CRC'd range (the CRC32C covers ``attributes`` to the end of the batch), so patching never
touches the CRC and the batch stays valid for every client.

Layout (big-endian)::

    offset  size  field
         0     8  baseOffset
         8     4  batchLength           (bytes after this field: total size - 12)
        12     4  partitionLeaderEpoch
        16     1  magic                 (2)
        17     4  crc                   (CRC32C of bytes 21..end, unsigned)
        21     2  attributes            (bits 0-2 compression, 3 timestamp type,
                                         4 transactional, 5 control, 6 delete horizon)
        23     4  lastOffsetDelta
        27     8  baseTimestamp
        35     8  maxTimestamp
        43     8  producerId
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordsCount
        61        records...

Error codes follow Kafka (``ByteBufferLogInputStream``, ``DefaultRecordBatch.ensureValid``,
``ProduceRequest.validateRecords``, ``LogValidator.validateBatch``): broken framing, a size
below the 61-byte header, an unknown magic and a CRC mismatch are CORRUPT_MESSAGE; an old
message format (magic 0/1) in a v3+ Produce is INVALID_RECORD (Kafka 4 no longer converts
formats, so UNSUPPORTED_FOR_MESSAGE_FORMAT is not used); count/offset inconsistencies and
the client-append rules are INVALID_RECORD; a batch above ``max_batch_bytes`` is
MESSAGE_TOO_LARGE. Unlike Kafka, which silently ignores a partial batch at the end of the
buffer, a truncated tail is CORRUPT_MESSAGE here.

Pure module: no I/O, imports nothing from the rest of the project.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import crc32c

from dataplane.formats.crc32c_combine import crc32c_combine
from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError

__all__ = [
    "LOG_OVERHEAD",
    "RECORD_BATCH_OVERHEAD",
    "MAGIC_V2",
    "DEFAULT_MAX_BATCHES",
    "CompressionType",
    "TimestampType",
    "InvalidRecordBatchError",
    "RecordBatchHeader",
    "parse_batches",
    "parse_batch_header",
    "patch_batch",
    "batch_crc32c",
    "patch_batches",
    "build_batch",
    "null_key_records",
    "zigzag_varint",
    "RecordChunks",
    "concat_records",
    "MIN_CHUNK_BYTES",
    "CRC_KEEP_GIL_BELOW_BYTES",
    "crc32c_keeping_gil",
]

LOG_OVERHEAD = 12  # baseOffset + batchLength
RECORD_BATCH_OVERHEAD = 61  # the full v2 header
MAGIC_V2 = 2
DEFAULT_MAX_BATCHES = 10_000

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == RECORD_BATCH_OVERHEAD
_LENGTH = struct.Struct(">i")
_OFFSET = struct.Struct(">q")
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21  # start of the CRC'd range
_MAX_TIMESTAMP_OFFSET = 35
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")
_INT64_MAX = 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# A CRC of fewer bytes than this keeps the GIL (the crc32c package releases it from 32 KiB
# on): a produce's checks run on the event loop, where a release in the middle of a request
# hands the GIL to another thread (a context switch, and a wait of up to the switch interval
# to take it back) for a computation of well under a millisecond.
CRC_KEEP_GIL_BELOW_BYTES = 8 * 1024 * 1024

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_DELETE_HORIZON_BIT = 0x40


class CompressionType(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


@dataclass(slots=True)
class RecordBatchHeader:
    """The header of one v2 batch, where it sits in the buffer, and its bytes. Treat it as
    immutable: it is not frozen only because a frozen dataclass's __init__ costs 5x as much
    (one `object.__setattr__` call per field), paid for every produced batch."""

    position: int  # byte offset of the batch in the parsed buffer
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    # the whole batch (size_in_bytes bytes): a copy, or with copy=False a read-only view of
    # the buffer it was parsed from
    data: bytes | memoryview

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def end(self) -> int:
        """Byte offset just after this batch in the parsed buffer."""
        return self.position + self.size_in_bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> CompressionType:
        """Codec of the records (validated by ``parse_batches``)."""
        return CompressionType(self.attributes & _COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return (
            TimestampType.LOG_APPEND_TIME
            if self.attributes & _TIMESTAMP_TYPE_BIT
            else TimestampType.CREATE_TIME
        )

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _DELETE_HORIZON_BIT)

    @property
    def has_producer_id(self) -> bool:
        """Idempotent/transactional producer batch (producerId >= 0)."""
        return self.producer_id >= 0


def crc32c_keeping_gil(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of `data` continuing `value`; below CRC_KEEP_GIL_BELOW_BYTES without releasing
    the GIL (see there)."""
    keep = len(data) < CRC_KEEP_GIL_BELOW_BYTES
    return crc32c.crc32c(data, value, gil_release_mode=0 if keep else -1)


def _fail(code: KafkaError, message: str) -> InvalidRecordBatchError:
    return InvalidRecordBatchError(code, message)


def _frame_check(view: memoryview, position: int) -> int:
    """Check the framing of the batch at ``position``; returns its size in bytes."""
    remaining = len(view) - position
    if remaining < LOG_OVERHEAD:
        raise _fail(
            KafkaError.CORRUPT_MESSAGE,
            f"truncated batch at byte {position}: {remaining} bytes left",
        )
    (batch_length,) = _LENGTH.unpack_from(view, position + 8)
    if batch_length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD:
        raise _fail(
            KafkaError.CORRUPT_MESSAGE,
            f"batch at byte {position}: batchLength {batch_length} is below the minimum "
            f"{RECORD_BATCH_OVERHEAD - LOG_OVERHEAD}",
        )
    if remaining > _MAGIC_OFFSET:
        magic = view[position + _MAGIC_OFFSET]
        magic = magic - 256 if magic > 127 else magic
        if magic < 0 or magic > MAGIC_V2:
            raise _fail(
                KafkaError.CORRUPT_MESSAGE, f"batch at byte {position}: invalid magic {magic}"
            )
        if magic != MAGIC_V2:
            raise _fail(
                KafkaError.INVALID_RECORD,
                f"batch at byte {position}: magic {magic}; only record batches with magic 2 are accepted",
            )
    size = batch_length + LOG_OVERHEAD
    if size > remaining:
        raise _fail(
            KafkaError.CORRUPT_MESSAGE,
            f"truncated batch at byte {position}: batchLength says {size} bytes, {remaining} left",
        )
    return size


def _as_view(data: bytes | bytearray | memoryview) -> memoryview:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes-like, not {type(data).__name__}")
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def parse_batch_header(
    data: bytes | bytearray | memoryview, position: int = 0, *, copy: bool = True
) -> RecordBatchHeader:
    """Parse and frame-check the batch at ``position`` (no CRC or content checks).

    Checks: 12 bytes to read the length, batchLength >= 49 (a full header), the magic,
    and that the whole batch is present. Raises InvalidRecordBatchError (CORRUPT_MESSAGE,
    or INVALID_RECORD for magic 0/1).

    ``copy=False``: the header's ``data`` is a view of ``data`` when that is read-only
    (bytes), which keeps the whole buffer alive as long as the view; a writable buffer is
    still copied (its bytes could change under the view).
    """
    view = _as_view(data)
    size = _frame_check(view, position)
    fields = _HEADER.unpack_from(view, position)
    batch = view[position : position + size]
    return RecordBatchHeader(
        position, *fields, data=batch if not copy and view.readonly else bytes(batch)
    )


def _check_batch(batch: RecordBatchHeader, *, verify_crc: bool, client_origin: bool) -> None:
    where = f"batch at byte {batch.position}"
    if verify_crc:
        computed = crc32c_keeping_gil(memoryview(batch.data)[_ATTRIBUTES_OFFSET:])
        if computed != batch.crc:
            raise _fail(
                KafkaError.CORRUPT_MESSAGE,
                f"{where} is corrupt: stored crc {batch.crc:#010x}, computed {computed:#010x}",
            )
    codec = batch.attributes & _COMPRESSION_MASK
    if codec > CompressionType.ZSTD:
        raise _fail(
            KafkaError.UNSUPPORTED_COMPRESSION_TYPE, f"{where}: unknown compression type id {codec}"
        )
    count = batch.records_count
    if count < 0:
        raise _fail(KafkaError.INVALID_RECORD, f"{where}: negative record count {count}")
    if client_origin:
        if batch.base_offset != 0:
            raise _fail(
                KafkaError.INVALID_RECORD,
                f"{where}: baseOffset of a client batch must be 0, is {batch.base_offset}",
            )
        if count == 0:
            raise _fail(KafkaError.INVALID_RECORD, f"{where}: invalid reported record count 0")
        if batch.last_offset_delta + 1 != count:
            raise _fail(
                KafkaError.INVALID_RECORD,
                f"{where}: lastOffsetDelta {batch.last_offset_delta} is inconsistent with record count {count}",
            )
        if batch.is_control:
            raise _fail(
                KafkaError.INVALID_RECORD, f"{where}: clients may not write control batches"
            )
        if batch.has_producer_id and batch.base_sequence < 0:
            raise _fail(
                KafkaError.INVALID_RECORD,
                f"{where}: invalid sequence number {batch.base_sequence} with producerId {batch.producer_id}",
            )
    else:
        # Stored data: compaction may leave fewer records than the offset span, even none.
        if batch.last_offset_delta < 0 or batch.last_offset_delta < count - 1:
            raise _fail(
                KafkaError.INVALID_RECORD,
                f"{where}: lastOffsetDelta {batch.last_offset_delta} is inconsistent with record count {count}",
            )
        if batch.base_offset < 0 or batch.base_offset > _INT64_MAX - batch.last_offset_delta:
            raise _fail(
                KafkaError.INVALID_RECORD, f"{where}: baseOffset {batch.base_offset} out of range"
            )


def parse_batches(
    records: bytes | bytearray | memoryview,
    *,
    max_batches: int = DEFAULT_MAX_BATCHES,
    max_batch_bytes: int | None = None,
    verify_crc: bool = True,
    client_origin: bool = True,
    copy: bool = True,
) -> list[RecordBatchHeader]:
    """Parse and validate every batch in ``records`` (e.g. one partition of a Produce).
    ``copy``: see `parse_batch_header`.

    ``client_origin=True`` (the default, for Produce) adds Kafka's checks for batches that
    come from a client: baseOffset 0, recordsCount > 0 and == lastOffsetDelta + 1, no control
    batches, a base sequence for idempotent batches. ``client_origin=False`` is for data read
    back from storage (compacted batches may hold fewer records than their offset span).
    More than ``max_batches`` batches is INVALID_RECORD (a v3+ Produce carries exactly one
    per partition; the handler decides how many it accepts). An empty buffer gives [].

    Raises InvalidRecordBatchError only (TypeError for a non-bytes argument).
    """
    if max_batches < 1:
        raise ValueError("max_batches must be >= 1")
    view = _as_view(records)
    batches: list[RecordBatchHeader] = []
    position = 0
    total = len(view)
    while position < total:  # each step advances by >= 61 bytes
        if len(batches) >= max_batches:
            raise _fail(KafkaError.INVALID_RECORD, f"more than {max_batches} record batches")
        if max_batch_bytes is not None and total - position >= LOG_OVERHEAD:
            (length,) = _LENGTH.unpack_from(view, position + 8)
            if length + LOG_OVERHEAD > max_batch_bytes:
                raise _fail(
                    KafkaError.MESSAGE_TOO_LARGE,
                    f"batch at byte {position} of {length + LOG_OVERHEAD} bytes exceeds {max_batch_bytes}",
                )
        batch = parse_batch_header(view, position, copy=copy)
        _check_batch(batch, verify_crc=verify_crc, client_origin=client_origin)
        batches.append(batch)
        position = batch.end
    return batches


def patch_batch(
    batch: bytes | bytearray | memoryview,
    base_offset: int,
    partition_leader_epoch: int,
    log_append_time_ms: int | None = None,
) -> bytes:
    """A copy of one v2 batch with ``baseOffset`` and ``partitionLeaderEpoch`` replaced.

    Both fields are outside the CRC'd range, so the CRC stays valid. With
    ``log_append_time_ms`` (a topic with message.timestamp.type=LogAppendTime) the batch
    also gets Kafka's LogAppendTime stamp: the timestamp-type attribute bit and that time as
    its ``maxTimestamp`` (readers give every record of such a batch its max timestamp; the
    records themselves are not touched, as Kafka does for v2), and a new CRC: one CRC pass
    over the batch, in the same single copy. ``batch`` must be exactly one complete v2
    batch (else InvalidRecordBatchError); the offsets must fit (0 <= base_offset,
    base_offset + lastOffsetDelta <= 2**63-1; epoch an int32) or ValueError.
    """
    view = _as_view(batch)
    size = _frame_check(view, 0)
    if size != len(view):
        raise _fail(
            KafkaError.CORRUPT_MESSAGE,
            f"patch_batch needs exactly one batch: batchLength says {size} bytes, got {len(view)}",
        )
    fields = _HEADER.unpack_from(view, 0)
    last_offset_delta = fields[6]
    if not 0 <= base_offset <= _INT64_MAX - max(last_offset_delta, 0):
        raise ValueError(f"base_offset {base_offset} out of range")
    if not _INT32_MIN <= partition_leader_epoch <= _INT32_MAX:
        raise ValueError(f"partition_leader_epoch {partition_leader_epoch} is not an int32")
    head = (_OFFSET.pack(base_offset), view[8:12], _LENGTH.pack(partition_leader_epoch))
    if log_append_time_ms is None:
        return b"".join((*head, view[16:]))
    # attributes (+ the timestamp-type bit), lastOffsetDelta and baseTimestamp, the new
    # maxTimestamp, the rest: the CRC continues over the pieces, then one join
    crc_range = (
        _ATTRIBUTES.pack(fields[5] | _TIMESTAMP_TYPE_BIT),
        view[_ATTRIBUTES_OFFSET + 2 : _MAX_TIMESTAMP_OFFSET],
        _OFFSET.pack(log_append_time_ms),
        view[_MAX_TIMESTAMP_OFFSET + 8 :],
    )
    crc = 0
    for piece in crc_range:
        crc = crc32c_keeping_gil(piece, crc)
    return b"".join((*head, view[16:17], _CRC.pack(crc), *crc_range))


def batch_crc32c(batch: bytes | bytearray | memoryview) -> int:
    """The CRC32C of all of `batch`'s bytes, one v2 batch whose own CRC field (of the bytes
    from its attributes on) is right: checked on arrival (`parse_batches`) or written by
    `patch_batch`. Reads only the 21 bytes before that range (`crc32c_combine`)."""
    view = _as_view(batch)
    (stored,) = _CRC.unpack_from(view, _CRC_OFFSET)
    head_crc = crc32c.crc32c(view[:_ATTRIBUTES_OFFSET])
    return crc32c_combine(head_crc, stored, len(view) - _ATTRIBUTES_OFFSET)


def patch_batches(
    records: bytes | bytearray | memoryview,
    base_offset: int,
    partition_leader_epoch: int,
    batches: Sequence[RecordBatchHeader] | None = None,
) -> tuple[bytes, int]:
    """Assign consecutive offsets from ``base_offset`` to every batch of ``records``.

    ``batches`` are the headers from ``parse_batches(records)`` (parsed again if None).
    Returns (patched buffer, next offset to assign). Each batch keeps its offset span
    (lastOffsetDelta + 1 offsets).
    """
    if batches is None:
        batches = parse_batches(
            records, client_origin=False, max_batches=len(records) // RECORD_BATCH_OVERHEAD + 1
        )
    view = _as_view(records)
    parts: list[bytes] = []
    offset = base_offset
    position = 0
    for batch in batches:
        if batch.position != position:
            raise ValueError("batches do not tile the records buffer")
        parts.append(patch_batch(view[batch.position : batch.end], offset, partition_leader_epoch))
        offset += batch.last_offset_delta + 1
        position = batch.end
    if position != len(view):
        raise ValueError("batches do not cover the whole records buffer")
    return b"".join(parts), offset


def zigzag_varint(value: int) -> bytes:
    """Kafka's zig-zag varint, as the fields of a record inside a batch are written."""
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def build_batch(
    records_payload: bytes,
    records_count: int,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    magic: int = MAGIC_V2,
    attributes: int = 0,
    last_offset_delta: int | None = None,
    base_timestamp: int = 0,
    max_timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    crc: int | None = None,
) -> bytes:
    """Assemble a batch from an already-encoded records section, with a correct CRC.

    Every header field can be set, including inconsistent ones (``crc`` overrides the
    computed checksum): tests use it to build invalid batches that still pass the CRC;
    the broker can use it for batches it writes itself (e.g. control batches).
    """
    if last_offset_delta is None:
        last_offset_delta = max(records_count - 1, 0)
    if max_timestamp is None:
        max_timestamp = base_timestamp
    tail = struct.pack(
        ">hiqqqhii",
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    ) + bytes(records_payload)
    checksum = crc32c.crc32c(tail) if crc is None else crc
    batch_length = 4 + 1 + 4 + len(tail)  # partitionLeaderEpoch + magic + crc + tail
    return (
        struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, magic, checksum)
        + tail
    )


def record_timestamps(batch: RecordBatchHeader) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record in one batch, in order (decompressed with
    kafka-python's reader). A LOG_APPEND_TIME batch gives every record the batch's max
    timestamp, as Kafka does. Raises InvalidRecordBatchError when the records cannot be read."""
    from kafka.record.default_records import DefaultRecordBatch

    if batch.timestamp_type == TimestampType.LOG_APPEND_TIME:
        return [(batch.base_offset + i, batch.max_timestamp) for i in range(batch.records_count)]
    try:
        return [(r.offset, r.timestamp) for r in DefaultRecordBatch(batch.data)]
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a corrupt batch
        raise _fail(
            KafkaError.CORRUPT_MESSAGE, f"records of batch at {batch.base_offset}: {exc}"
        ) from None


def null_key_records(batch: RecordBatchHeader) -> list[int]:
    """The indexes (in the batch, from 0) of the records whose key is null: what a
    compacted topic refuses (Kafka's LogValidator). Reads every record (decompressed with
    kafka-python's reader): for compacted topics only. A batch in a codec this process
    cannot decompress (snappy without its library) cannot be checked: [] (it is accepted, as
    the log cleaner keeps such batches whole). Raises InvalidRecordBatchError when the
    records cannot be read."""
    from kafka import codec
    from kafka.record.default_records import DefaultRecordBatch

    if batch.compression == CompressionType.SNAPPY and not codec.has_snappy():
        return []
    try:
        return [i for i, r in enumerate(DefaultRecordBatch(batch.data)) if r.key is None]
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a corrupt batch
        raise _fail(
            KafkaError.CORRUPT_MESSAGE, f"records of batch at byte {batch.position}: {exc}"
        ) from None


class RecordChunks:
    """Consecutive record batches of one partition left in the buffers they were stored in
    (e.g. views of an object's GET body), not joined into one `bytes`: a Fetch answer
    writes them to the socket as they are, saving a copy of every byte read. `len()` is
    their size in bytes, `bytes()` joins them. Immutable; the buffers must not change."""

    __slots__ = ("chunks", "_size")

    def __init__(self, chunks: Sequence[bytes | memoryview]) -> None:
        self.chunks: tuple[bytes | memoryview, ...] = tuple(chunks)
        self._size = sum(len(c) for c in self.chunks)

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks)

    def __repr__(self) -> str:
        return f"RecordChunks({len(self.chunks)} chunks, {self._size} bytes)"


# below this average size, writing each batch as a buffer of its own costs more than
# joining them (one small copy)
MIN_CHUNK_BYTES = 16 * 1024


def concat_records(payloads: Sequence[bytes | memoryview]) -> bytes | memoryview | RecordChunks:
    """Stored record batches as one Fetch record set: a single one as it is; large ones as
    `RecordChunks` (no copy); small ones (averaging below `MIN_CHUNK_BYTES`) joined."""
    if not payloads:
        return b""
    if len(payloads) == 1:
        return payloads[0]
    total = sum(len(p) for p in payloads)
    if total < MIN_CHUNK_BYTES * len(payloads):
        return b"".join(payloads)
    return RecordChunks(payloads)
