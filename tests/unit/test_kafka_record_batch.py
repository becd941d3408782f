"""Record batch v2 parsing, validation and patching, checked against kafka-python's own
record implementation (MemoryRecordsBuilder writes, MemoryRecords reads)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.record_batch import (
    MIN_CHUNK_BYTES,
    RECORD_BATCH_OVERHEAD,
    CompressionType,
    RecordChunks,
    TimestampType,
    build_batch,
    concat_records,
    parse_batch_header,
    parse_batches,
    patch_batch,
    patch_batches,
)

CODECS = {
    CompressionType.NONE: True,
    CompressionType.GZIP: kafka_codec.has_gzip(),
    CompressionType.SNAPPY: kafka_codec.has_snappy(),
    CompressionType.LZ4: kafka_codec.has_lz4(),
    CompressionType.ZSTD: kafka_codec.has_zstd(),
}


def client_batch(
    n: int = 5,
    compression: CompressionType = CompressionType.NONE,
    *,
    producer: tuple[int, int, int] | None = None,
    transactional: bool = False,
    value_size: int = 20,
) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=int(compression), batch_size=1 << 22)
    if producer is not None:
        builder.set_producer_state(*producer, transactional)
    for i in range(n):
        builder.append(
            timestamp=1_700_000_000_000 + i,
            key=b"key-%d" % i,
            value=(b"%05d" % i) * (value_size // 5),
            headers=[("h", b"v%d" % i)],
        )
    builder.close()
    return bytes(builder.buffer())


def read_back(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Records as kafka-python reads them: (batch base offset, offset, key, value)."""
    out = []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        for record in batch:
            out.append((batch.base_offset, record.offset, record.key, record.value))
    return out


def with_byte(data: bytes, index: int, value: int) -> bytes:
    return data[:index] + bytes([value]) + data[index + 1 :]


def expect_error(data: bytes, code: KafkaError, **kwargs) -> InvalidRecordBatchError:
    with pytest.raises(InvalidRecordBatchError) as info:
        parse_batches(data, **kwargs)
    assert info.value.error_code == code, info.value
    return info.value


# --------------------------------------------------------------------------- valid batches


@pytest.mark.parametrize("compression", list(CompressionType), ids=lambda c: c.name)
def test_valid_batch_from_kafka_python(compression: CompressionType) -> None:
    if not CODECS[compression]:
        pytest.skip(f"{compression.name} codec not installed")
    data = client_batch(7, compression)
    (batch,) = parse_batches(data)
    assert batch.position == 0 and batch.size_in_bytes == len(data) and batch.data == data
    assert batch.magic == 2 and batch.base_offset == 0
    assert batch.records_count == 7 and batch.last_offset_delta == 6
    assert batch.compression == compression
    assert batch.timestamp_type == TimestampType.CREATE_TIME
    assert batch.base_timestamp == 1_700_000_000_000 and batch.max_timestamp == 1_700_000_000_006
    assert not batch.is_transactional and not batch.is_control and not batch.has_producer_id
    assert batch.crc == crc32c.crc32c(data[21:])


def test_idempotent_and_transactional_flags() -> None:
    (idem,) = parse_batches(client_batch(3, producer=(4000, 2, 17)))
    assert idem.has_producer_id and not idem.is_transactional
    assert (idem.producer_id, idem.producer_epoch, idem.base_sequence) == (4000, 2, 17)
    (txn,) = parse_batches(client_batch(3, producer=(4001, 0, 0), transactional=True))
    assert txn.is_transactional and txn.has_producer_id


def test_several_batches_positions_and_slices() -> None:
    parts = [client_batch(2), client_batch(4, CompressionType.GZIP), client_batch(1)]
    data = b"".join(parts)
    batches = parse_batches(data)
    assert [b.records_count for b in batches] == [2, 4, 1]
    assert [b.data for b in batches] == parts
    assert [b.position for b in batches] == [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    assert batches[-1].end == len(data)
    assert parse_batches(memoryview(data)) == batches
    assert parse_batches(bytearray(data)) == batches


def test_empty_buffer_has_no_batches() -> None:
    assert parse_batches(b"") == []


def test_parse_batch_header_only_frames() -> None:
    data = client_batch(2)
    bad_crc = with_byte(data, len(data) - 1, data[-1] ^ 0xFF)
    assert parse_batch_header(bad_crc).records_count == 2  # no CRC check at this level


# --------------------------------------------------------------------------- corruption


def test_crc_mismatch_is_corrupt_message() -> None:
    data = client_batch(5)
    for index in (21, 30, 60, 61, len(data) - 1):  # attributes .. last record byte
        err = expect_error(with_byte(data, index, data[index] ^ 0x01), KafkaError.CORRUPT_MESSAGE)
        assert "crc" in err.message
    bad = with_byte(data, len(data) - 1, data[-1] ^ 0x01)
    assert parse_batches(bad, verify_crc=False)[0].records_count == 5
    bad_stored_crc = with_byte(data, 17, data[17] ^ 0x80)
    expect_error(bad_stored_crc, KafkaError.CORRUPT_MESSAGE)


def test_fields_before_the_crc_range_do_not_break_the_crc() -> None:
    data = client_batch(3)
    changed = struct.pack(">q", 0) + data[8:12] + struct.pack(">i", 99) + data[16:]
    assert parse_batches(changed)[0].partition_leader_epoch == 99


def test_every_truncation_is_corrupt_message() -> None:
    data = client_batch(3)
    for cut in range(1, len(data)):
        expect_error(data[:cut], KafkaError.CORRUPT_MESSAGE)
    two = data + client_batch(2)
    for cut in range(len(data) + 1, len(two)):
        expect_error(two[:cut], KafkaError.CORRUPT_MESSAGE)


def test_trailing_garbage_is_corrupt_message() -> None:
    expect_error(client_batch(2) + b"\x00" * 5, KafkaError.CORRUPT_MESSAGE)


@pytest.mark.parametrize("length", [-1, 0, 13, RECORD_BATCH_OVERHEAD - 13])
def test_batch_length_below_header_is_corrupt(length: int) -> None:
    data = client_batch(2)
    expect_error(data[:8] + struct.pack(">i", length) + data[12:], KafkaError.CORRUPT_MESSAGE)


def test_batch_length_beyond_buffer_is_corrupt() -> None:
    data = client_batch(2)
    expect_error(data[:8] + struct.pack(">i", len(data)) + data[12:], KafkaError.CORRUPT_MESSAGE)


def test_max_batch_bytes_is_message_too_large() -> None:
    data = client_batch(50, value_size=100)
    expect_error(data, KafkaError.MESSAGE_TOO_LARGE, max_batch_bytes=len(data) - 1)
    assert parse_batches(data, max_batch_bytes=len(data))


@pytest.mark.parametrize(
    "magic,code",
    [
        (0, KafkaError.INVALID_RECORD),
        (1, KafkaError.INVALID_RECORD),
        (3, KafkaError.CORRUPT_MESSAGE),
        (0xFF, KafkaError.CORRUPT_MESSAGE),
    ],
)
def test_wrong_magic(magic: int, code: KafkaError) -> None:
    data = client_batch(2)
    expect_error(with_byte(data, 16, magic), code)  # the magic is outside the CRC range


def test_unknown_compression_codec() -> None:
    batch = build_batch(b"", 1, attributes=5, last_offset_delta=0)
    expect_error(batch, KafkaError.UNSUPPORTED_COMPRESSION_TYPE)


# --------------------------------------------------------------------------- count / offsets


def test_build_batch_matches_kafka_python() -> None:
    data = client_batch(4, producer=(7, 1, 9))
    (h,) = parse_batches(data)
    rebuilt = build_batch(
        data[RECORD_BATCH_OVERHEAD:],
        h.records_count,
        partition_leader_epoch=h.partition_leader_epoch,
        attributes=h.attributes,
        base_timestamp=h.base_timestamp,
        max_timestamp=h.max_timestamp,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )
    assert rebuilt == data


def test_negative_count_is_invalid_record() -> None:
    batch = build_batch(b"", -1, last_offset_delta=0)
    expect_error(batch, KafkaError.INVALID_RECORD)
    expect_error(batch, KafkaError.INVALID_RECORD, client_origin=False)


def test_count_inconsistent_with_last_offset_delta() -> None:
    data = client_batch(3)
    payload = data[RECORD_BATCH_OVERHEAD:]
    for count, delta in ((3, 1), (3, 3), (0, 0), (0, -1)):
        expect_error(
            build_batch(payload, count, last_offset_delta=delta), KafkaError.INVALID_RECORD
        )
    # Stored (compacted) data may have fewer records than its offset span, not more.
    assert parse_batches(build_batch(payload, 3, last_offset_delta=9), client_origin=False)
    assert parse_batches(build_batch(b"", 0, last_offset_delta=4), client_origin=False)
    expect_error(
        build_batch(payload, 3, last_offset_delta=1), KafkaError.INVALID_RECORD, client_origin=False
    )
    expect_error(
        build_batch(b"", 0, last_offset_delta=-1), KafkaError.INVALID_RECORD, client_origin=False
    )


def test_client_rules() -> None:
    payload = client_batch(1)[RECORD_BATCH_OVERHEAD:]
    # baseOffset must be 0
    nonzero = build_batch(payload, 1, base_offset=10)
    expect_error(nonzero, KafkaError.INVALID_RECORD)
    assert parse_batches(nonzero, client_origin=False)[0].base_offset == 10
    # no control batches from clients
    control = build_batch(
        payload, 1, attributes=0x20 | 0x10, producer_id=5, producer_epoch=0, base_sequence=0
    )
    expect_error(control, KafkaError.INVALID_RECORD)
    (parsed,) = parse_batches(control, client_origin=False)
    assert parsed.is_control and parsed.is_transactional
    # an idempotent batch needs a base sequence
    expect_error(
        build_batch(payload, 1, producer_id=5, producer_epoch=0, base_sequence=-1),
        KafkaError.INVALID_RECORD,
    )


def test_max_batches() -> None:
    data = client_batch(1) * 3
    expect_error(data, KafkaError.INVALID_RECORD, max_batches=2)
    assert len(parse_batches(data, max_batches=3)) == 3
    with pytest.raises(ValueError):
        parse_batches(data, max_batches=0)


def test_log_append_time_flag() -> None:
    payload = client_batch(1)[RECORD_BATCH_OVERHEAD:]
    (batch,) = parse_batches(build_batch(payload, 1, attributes=0x08 | 0x40))
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME and batch.has_delete_horizon


# --------------------------------------------------------------------------- patching


@pytest.mark.parametrize(
    "compression", [CompressionType.NONE, CompressionType.GZIP], ids=lambda c: c.name
)
def test_patched_batch_is_read_by_kafka_python(compression: CompressionType) -> None:
    data = client_batch(5, compression)
    before = read_back(data)
    patched = patch_batch(data, 1_000_000, 42)

    assert len(patched) == len(data) and patched[16:] == data[16:]  # CRC and records untouched
    (header,) = parse_batches(patched, client_origin=False)
    assert header.base_offset == 1_000_000 and header.partition_leader_epoch == 42
    assert header.last_offset == 1_000_004
    after = read_back(patched)
    assert [(o, k, v) for _, o, k, v in after] == [(1_000_000 + o, k, v) for _, o, k, v in before]
    assert {b for b, _, _, _ in after} == {1_000_000}


def test_patch_batches_assigns_consecutive_offsets() -> None:
    data = client_batch(2) + client_batch(3, CompressionType.GZIP) + client_batch(1)
    patched, next_offset = patch_batches(data, 500, 7)
    assert next_offset == 506
    assert [
        (b.base_offset, b.last_offset, b.partition_leader_epoch)
        for b in parse_batches(patched, client_origin=False)
    ] == [
        (500, 501, 7),
        (502, 504, 7),
        (505, 505, 7),
    ]
    assert [o for _, o, _, _ in read_back(patched)] == list(range(500, 506))
    # with pre-parsed headers
    assert patch_batches(data, 500, 7, parse_batches(data)) == (patched, 506)
    assert patch_batches(b"", 9, 1) == (b"", 9)


def test_patch_batch_rejects_bad_input() -> None:
    data = client_batch(2)
    with pytest.raises(InvalidRecordBatchError):
        patch_batch(data + data, 0, 0)  # two batches
    with pytest.raises(InvalidRecordBatchError):
        patch_batch(data[:-1], 0, 0)
    with pytest.raises(InvalidRecordBatchError):
        patch_batch(with_byte(data, 16, 1), 0, 0)
    with pytest.raises(ValueError):
        patch_batch(data, -1, 0)
    with pytest.raises(ValueError):
        patch_batch(data, 2**63 - 1, 0)  # last offset would overflow
    with pytest.raises(ValueError):
        patch_batch(data, 0, 2**31)
    with pytest.raises(TypeError):
        patch_batch("text", 0, 0)  # type: ignore[arg-type]


def test_default_batch_builder_interop() -> None:
    """A batch from kafka-python's lower-level builder (what its producer uses) parses too."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(4):
        builder.append(i, timestamp=1000 + i, key=None, value=b"x" * i, headers=[])
    data = bytes(builder.build())
    (batch,) = parse_batches(data)
    assert batch.records_count == 4 and batch.max_timestamp == 1003


def test_stored_batches_become_one_record_set_without_copying_large_ones() -> None:
    """A Fetch's record set: one stored batch as it is, large ones as their own buffers
    (`RecordChunks`, written to the socket one after the other), small ones joined (a copy
    of a few bytes costs less than a buffer each)."""
    big = [memoryview(bytes([i]) * MIN_CHUNK_BYTES) for i in range(3)]
    chunks = concat_records(big)
    assert isinstance(chunks, RecordChunks) and len(chunks) == 3 * MIN_CHUNK_BYTES
    assert all(c is b for c, b in zip(chunks.chunks, big, strict=True))
    assert bytes(chunks) == b"".join(big)
    small = [b"a" * 100, memoryview(b"b" * 200)]
    assert concat_records(small) == b"a" * 100 + b"b" * 200
    assert concat_records([big[0]]) is big[0]
    assert concat_records([]) == b""


def test_crc_keeping_the_gil_is_crc32c() -> None:
    """The produce path's CRC (the GIL kept below CRC_KEEP_GIL_BELOW_BYTES) is CRC32C,
    chained like crc32c's, on both sides of the threshold."""
    import os

    import crc32c

    from dataplane.formats.record_batch import CRC_KEEP_GIL_BELOW_BYTES, crc32c_keeping_gil

    for size in (0, 1, 40_000, CRC_KEEP_GIL_BELOW_BYTES - 1, CRC_KEEP_GIL_BELOW_BYTES):
        data = os.urandom(size)
        assert crc32c_keeping_gil(data) == crc32c.crc32c(data)
        assert crc32c_keeping_gil(memoryview(data), 12345) == crc32c.crc32c(data, 12345)
