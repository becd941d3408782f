"""The compacted-topic cleaner (spark_jobs/log_cleaner.py): latest record per key, expired
tombstones dropped, offsets and batch headers unchanged, empty batches kept, CRC valid."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from dataplane.formats.record_batch import parse_batch_header, parse_batches, patch_batch
from dataplane.formats.stream_records import StreamRecordBatch
from spark_jobs.log_cleaner import (
    OffsetMap,
    add_stream_batches,
    clean_stream_batch,
    decode_batch,
)

NOW_MS = 10_000_000
DAY_MS = 86_400_000
GZIP, LZ4, ZSTD = 1, 3, 4


def kbatch(
    base: int,
    records: list[tuple[bytes | None, bytes | None, int]],
    compression: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
) -> bytes:
    """A Kafka batch (as the broker stores it: baseOffset patched) of (key, value, ts)."""
    pid, epoch, seq = producer
    # kafka-python writes a batch uncompressed when compression does not shrink it: values
    # of 1 KiB make it shrink (and a compressed input must really be compressed)
    records = [(k, None if v is None else v * 1024, ts) for k, v, ts in records]
    b = DefaultRecordBatchBuilder(2, compression, transactional, pid, epoch, seq, 1 << 20)
    for i, (key, value, ts) in enumerate(records):
        assert b.append(i, ts, key, value, []) is not None
    data = patch_batch(bytes(b.build()), base, 7)
    assert parse_batch_header(data).compression == compression
    return data


def stored(base: int, data: bytes) -> StreamRecordBatch:
    count = parse_batch_header(data).last_offset_delta + 1
    return StreamRecordBatch(3, 1, base, count, data)


def clean(batches: list[StreamRecordBatch], retention_ms: int = DAY_MS, max_keys: int = 1000):
    offsets = OffsetMap(max_keys)
    for b in batches:
        assert add_stream_batches(offsets, [b])
    return [clean_stream_batch(b, offsets, NOW_MS, retention_ms) for b in batches]


def read(batch: StreamRecordBatch) -> list[tuple[int, bytes | None, bytes | None]]:
    parse_batches(batch.payload, client_origin=False)  # framing and CRC32C valid
    return [
        (r.offset, r.key, None if r.value is None else r.value[: len(r.value) // 1024])
        for r in DefaultRecordBatch(batch.payload)
    ]


@pytest.mark.parametrize("compression", [0, GZIP, LZ4, ZSTD])
def test_keeps_the_latest_record_per_key_at_its_offset(compression):
    t = NOW_MS - 1000
    b1 = stored(0, kbatch(0, [(b"a", b"1", t), (b"b", b"1", t), (b"a", b"2", t)], compression))
    b2 = stored(3, kbatch(3, [(b"b", b"2", t), (b"c", b"1", t)], compression))
    out = clean([b1, b2])
    assert [removed for _, removed in out] == [2, 0]
    assert read(out[0][0]) == [(2, b"a", b"2")]
    assert out[1][0] is b2  # nothing removed: the very same batch
    h = parse_batch_header(out[0][0].payload)
    assert h.compression == compression and h.records_count == 1 and h.last_offset_delta == 2
    assert (out[0][0].base_offset, out[0][0].count) == (0, 3)  # the stream's view unchanged


def test_header_fields_are_kept_and_the_crc_recomputed():
    t = NOW_MS - 5000
    data = kbatch(40, [(b"k", b"old", t), (b"k", b"new", t + 7)], GZIP, producer=(55, 3, 100))
    before = parse_batch_header(data)
    ((cleaned, removed),) = clean([stored(40, data)])
    after = parse_batch_header(cleaned.payload)
    assert removed == 1
    for field in (
        "base_offset",
        "partition_leader_epoch",
        "attributes",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
    ):
        assert getattr(after, field) == getattr(before, field), field
    assert after.crc != before.crc and after.records_count == 1
    assert DefaultRecordBatch(cleaned.payload).validate_crc()
    rec = next(iter(DefaultRecordBatch(cleaned.payload)))
    assert (rec.offset, rec.timestamp, rec.value) == (41, t + 7, b"new" * 1024)


def test_a_batch_left_with_no_record_stays_as_an_empty_batch():
    t = NOW_MS - 1000
    b1 = stored(0, kbatch(0, [(b"a", b"1", t), (b"a", b"2", t)], LZ4, producer=(9, 0, 0)))
    b2 = stored(2, kbatch(2, [(b"a", b"3", t)], LZ4, producer=(9, 0, 2)))
    (empty, removed), _ = clean([b1, b2])
    assert removed == 2
    h = parse_batch_header(empty.payload)
    assert h.records_count == 0 and h.last_offset_delta == 1 and h.base_offset == 0
    assert h.compression == 0  # Kafka writes empty batches uncompressed
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 0, 0)
    assert (empty.base_offset, empty.count) == (0, 2)
    assert read(empty) == []


def test_tombstones_are_dropped_only_after_delete_retention():
    old, young = NOW_MS - DAY_MS - 1, NOW_MS - 1000
    batches = [
        stored(0, kbatch(0, [(b"a", b"1", old), (b"b", b"1", old), (b"c", b"1", old)])),
        stored(3, kbatch(3, [(b"a", None, old), (b"b", None, young)])),
    ]
    out = clean(batches)
    assert read(out[0][0]) == [(2, b"c", b"1")]  # a and b superseded by their tombstones
    assert read(out[1][0]) == [(4, b"b", None)]  # a's tombstone expired, b's is young
    # a shorter delete.retention.ms: b's tombstone goes too
    out = clean(batches, retention_ms=500)
    assert read(out[1][0]) == []


def test_transactional_control_and_null_key_records_are_kept_whole():
    t = NOW_MS - 1000
    txn = stored(
        0, kbatch(0, [(b"a", b"t", t), (b"a", b"t2", t)], producer=(5, 0, 0), transactional=True)
    )
    plain = stored(2, kbatch(2, [(None, b"x", t), (None, b"y", t), (b"a", b"1", t)]))
    out = clean([txn, plain])
    assert out[0] == (txn, 0)  # a transaction may abort: never compacted, keys not mapped
    assert out[1] == (plain, 0)  # null keys are never removed
    assert decode_batch(txn.payload).records is None


def test_the_offset_map_is_bounded():
    t = NOW_MS - 1000
    offsets = OffsetMap(max_entries=3)
    assert add_stream_batches(offsets, [stored(0, kbatch(0, [(b"a", b"1", t), (b"b", b"1", t)]))])
    c = stored(2, kbatch(2, [(b"c", b"1", t)]))
    d = stored(3, kbatch(3, [(b"d", b"1", t)]))
    assert not add_stream_batches(offsets, [c, d])  # one object's keys do not fit: none enter
    assert len(offsets) == 2 and offsets.latest(b"c") is None
    assert add_stream_batches(offsets, [stored(4, kbatch(4, [(b"a", b"2", t), (b"c", b"1", t)]))])
    assert offsets.latest(b"a") == 4 and len(offsets) == 3
    with pytest.raises(ValueError):
        OffsetMap(0)


def test_a_raw_stream_payload_is_left_alone():
    raw = StreamRecordBatch(3, 1, 0, 1, b"not a kafka batch")
    offsets = OffsetMap(10)
    assert add_stream_batches(offsets, [raw])
    assert clean_stream_batch(raw, offsets, NOW_MS, DAY_MS) == (raw, 0)
