"""The records inside one Kafka v2 batch, decoded into columns: a lean reader for bulk scans.

kafka-python's `DefaultRecordBatch` builds one Python object per record and decodes every
varint through a generic function call; a scan of millions of records (the Spark source)
spends most of its time there. `decode_records` walks the (decompressed) records section
once with the varints decoded inline (one byte is the common case) and appends each field
to a column list, ready for `pyarrow.array`.

Record layout (Kafka's DefaultRecord; varints are zig-zag)::

    length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
    keyLength varint (-1: null), key, valueLength varint (-1: null), value,
    headerCount varint, [headerKeyLength varint, key utf-8,
                         headerValueLength varint (-1: null), value]

Decompression (gzip, snappy, lz4, zstd) uses kafka-python's codecs, as its reader does. A
record that runs past the section, a length that disagrees with the fields, a negative
header count or key length, or bytes left after the last record raise
`InvalidRecordBatchError` (CORRUPT_MESSAGE). A LOG_APPEND_TIME batch gives every record the
batch's max timestamp, as Kafka does.

Pure module: no I/O; `RecordColumns` is owned by one thread.
"""

from __future__ import annotations

from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.record_batch import (
    RECORD_BATCH_OVERHEAD,
    CompressionType,
    RecordBatchHeader,
    TimestampType,
)

__all__ = ["RecordColumns", "decode_records", "records_section"]


class RecordColumns:
    """Decoded records as parallel lists (one entry per record, in order). Not thread-safe:
    one decoder appends, then the owner reads and `clear()`s."""

    __slots__ = ("keys", "values", "offsets", "timestamps_ms", "timestamp_types", "headers")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps_ms: list[int] = []
        self.timestamp_types: list[int] = []  # 0 create time, 1 log append time
        self.headers: list[list[tuple[str, bytes | None]]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def columns(self) -> tuple[list, ...]:
        """Every column, in the order of `__slots__`."""
        return (
            self.keys,
            self.values,
            self.offsets,
            self.timestamps_ms,
            self.timestamp_types,
            self.headers,
        )

    def clear(self) -> None:
        """Empty every column."""
        for column in self.columns():
            column.clear()


def _corrupt(batch: RecordBatchHeader, why: str) -> InvalidRecordBatchError:
    return InvalidRecordBatchError(
        KafkaError.CORRUPT_MESSAGE, f"records of batch at offset {batch.base_offset}: {why}"
    )


def records_section(batch: RecordBatchHeader) -> bytes:
    """The records section of `batch`, decompressed (kafka-python's codecs)."""
    section = memoryview(batch.data)[RECORD_BATCH_OVERHEAD:]
    codec = batch.compression
    if codec == CompressionType.NONE:
        return bytes(section)
    from kafka import codec as kcodec

    try:
        if codec == CompressionType.GZIP:
            return kcodec.gzip_decode(section)
        if codec == CompressionType.SNAPPY:
            return kcodec.snappy_decode(section.tobytes())
        if codec == CompressionType.LZ4:
            return kcodec.lz4_decode(section.tobytes())
        return kcodec.zstd_decode(section.tobytes())
    except Exception as exc:  # noqa: BLE001 - a missing codec library or corrupt data
        raise _corrupt(batch, f"cannot decompress ({codec.name}): {exc}") from None


def decode_records(batch: RecordBatchHeader, out: RecordColumns) -> None:
    """Append every record of `batch` to `out` (absolute offsets and timestamps). Raises
    InvalidRecordBatchError when the records do not decode; `out` may then hold part of
    the batch's records."""
    data = records_section(batch)
    before = len(out.offsets)
    try:
        end = _decode_into(batch, data, out)
    except IndexError:
        end = len(data) + 1
    if end > len(data):  # a varint or a key/value past the end (slices stop silently)
        raise _corrupt(batch, "a record runs past the end of the records")
    if end != len(data):
        raise _corrupt(batch, f"{len(data) - end} bytes left after the last record")
    out.timestamp_types.extend([int(batch.timestamp_type)] * (len(out.offsets) - before))


def _decode_into(batch: RecordBatchHeader, data: bytes, out: RecordColumns) -> int:  # noqa: C901, PLR0912, PLR0915
    """The record walk, varints inline (one function: a call per varint costs as much as
    the decoding). Returns the position after the last record."""
    base_offset, base_ts = batch.base_offset, batch.base_timestamp
    log_append = batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    max_ts = batch.max_timestamp
    keys, values, offsets = out.keys, out.values, out.offsets
    stamps, headers_col = out.timestamps_ms, out.headers
    pos = 0
    for _ in range(batch.records_count):
        # length
        length = data[pos]
        pos += 1
        if length >= 0x80:
            length, shift = length & 0x7F, 7
            while (b := data[pos]) >= 0x80:
                length |= (b & 0x7F) << shift
                shift += 7
                pos += 1
            length |= b << shift
            pos += 1
        length = (length >> 1) ^ -(length & 1)
        start = pos
        pos += 1  # attributes
        # timestamp delta (varlong)
        v = data[pos]
        pos += 1
        if v >= 0x80:
            v, shift = v & 0x7F, 7
            while (b := data[pos]) >= 0x80:
                v |= (b & 0x7F) << shift
                shift += 7
                pos += 1
            v |= b << shift
            pos += 1
        ts_delta = (v >> 1) ^ -(v & 1)
        # offset delta
        v = data[pos]
        pos += 1
        if v >= 0x80:
            v, shift = v & 0x7F, 7
            while (b := data[pos]) >= 0x80:
                v |= (b & 0x7F) << shift
                shift += 7
                pos += 1
            v |= b << shift
            pos += 1
        offsets.append(base_offset + ((v >> 1) ^ -(v & 1)))
        stamps.append(max_ts if log_append else base_ts + ts_delta)
        # key, value (unrolled: a loop over the two costs a tenth of the walk)
        v = data[pos]
        pos += 1
        if v >= 0x80:
            v, shift = v & 0x7F, 7
            while (b := data[pos]) >= 0x80:
                v |= (b & 0x7F) << shift
                shift += 7
                pos += 1
            v |= b << shift
            pos += 1
        if v & 1:  # zig-zag negative: null
            keys.append(None)
        else:
            v >>= 1
            keys.append(data[pos : pos + v])
            pos += v
        v = data[pos]
        pos += 1
        if v >= 0x80:
            v, shift = v & 0x7F, 7
            while (b := data[pos]) >= 0x80:
                v |= (b & 0x7F) << shift
                shift += 7
                pos += 1
            v |= b << shift
            pos += 1
        if v & 1:
            values.append(None)
        else:
            v >>= 1
            values.append(data[pos : pos + v])
            pos += v
        if data[pos] == 0:  # no headers (zig-zag 0): the common case
            pos += 1
            headers_col.append([])
        else:
            record_headers, pos = _headers(batch, data, pos)
            headers_col.append(record_headers)
        if pos - start != length:
            raise _corrupt(batch, f"a record of {pos - start} bytes says {length}")
    return pos


def _headers(
    batch: RecordBatchHeader, data: bytes, pos: int
) -> tuple[list[tuple[str, bytes | None]], int]:
    """The headers of one record at `pos` (their count first): (headers, position after)."""
    count, pos = _varint(data, pos)
    if count < 0:
        raise _corrupt(batch, f"a negative header count {count}")
    record_headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        key_size, pos = _varint(data, pos)
        if key_size < 0 or pos + key_size > len(data):
            raise _corrupt(batch, f"a header key of {key_size} bytes")
        try:
            name = data[pos : pos + key_size].decode("utf-8")
        except UnicodeDecodeError:
            raise _corrupt(batch, "a header key that is not UTF-8") from None
        pos += key_size
        value_size, pos = _varint(data, pos)
        if value_size < 0:
            record_headers.append((name, None))
        else:
            if pos + value_size > len(data):
                raise IndexError
            record_headers.append((name, data[pos : pos + value_size]))
            pos += value_size
    return record_headers, pos


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """One zig-zag varint at `pos`: (value, position after it)."""
    v, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), pos
        shift += 7
