"""The lean record decoder (dataplane/formats/records.py) returns what kafka-python's reader
returns, for every codec and the varint edge cases, and rejects corrupt records clearly."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from dataplane.formats.kafka_errors import InvalidRecordBatchError
from dataplane.formats.record_batch import (
    RECORD_BATCH_OVERHEAD,
    build_batch,
    parse_batch_header,
    zigzag_varint,
)
from dataplane.formats.records import RecordColumns, decode_records

CODECS = (0, 1, 2, 3, 4)  # none, gzip, snappy, lz4, zstd


def _records() -> list[tuple]:
    """(offset delta, timestamp, key, value, headers): nulls, empties, large sizes and
    deltas (multi-byte varints), negative timestamp deltas, several headers."""
    return [
        (0, 5_000, b"k0", b"v0", []),
        (1, 4_000, None, b"x" * 300, [("h", b"1"), ("\u00e9", None), ("", b"")]),
        (2, 1 << 40, b"", None, []),
        (3, 5_001, b"k" * 20_000, b"", [("big", b"y" * 200)]),
        (4, 5_002, None, None, []),
    ]


def _batch(codec: int, *, log_append: bool = False, base_offset: int = 1_000_000) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, 0, 0, 1 << 24)
    for delta, ts, key, value, headers in _records():
        builder.append(delta, ts, key, value, headers)
    data = bytes(builder.build())
    if log_append:
        header = parse_batch_header(memoryview(data), 0)
        data = build_batch(
            data[RECORD_BATCH_OVERHEAD:],
            header.records_count,
            attributes=header.attributes | 0x08,
            base_timestamp=header.base_timestamp,
            max_timestamp=7_777,
        )
    return base_offset.to_bytes(8, "big") + data[8:]


def _expected(data: bytes) -> list[tuple]:
    return [
        (r.key, r.value, r.offset, r.timestamp, r.timestamp_type, list(r.headers))
        for r in DefaultRecordBatch(data)
    ]


def _decoded(data: bytes) -> list[tuple]:
    out = RecordColumns()
    decode_records(parse_batch_header(data, 0), out)
    return [
        tuple(row)
        for row in zip(
            out.keys,
            out.values,
            out.offsets,
            out.timestamps_ms,
            out.timestamp_types,
            out.headers,
            strict=True,
        )
    ]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("log_append", [False, True])
def test_every_codec_decodes_as_kafka_pythons_reader(codec: int, log_append: bool) -> None:
    data = _batch(codec, log_append=log_append)
    assert _decoded(data) == _expected(data)
    if log_append:
        assert {row[3] for row in _decoded(data)} == {7_777}


def test_columns_append_across_batches_and_clear() -> None:
    out = RecordColumns()
    decode_records(parse_batch_header(_batch(0, base_offset=0), 0), out)
    decode_records(parse_batch_header(_batch(4, base_offset=5), 0), out)
    assert out.offsets == list(range(10))
    assert all(len(c) == 10 for c in out.columns())
    out.clear()
    assert len(out) == 0 and all(not c for c in out.columns())


def _record(key: bytes, value: bytes, *, length_delta: int = 0) -> bytes:
    body = (
        b"\x00"
        + zigzag_varint(0)
        + zigzag_varint(0)
        + zigzag_varint(len(key))
        + key
        + zigzag_varint(len(value))
        + value
        + zigzag_varint(0)
    )
    return zigzag_varint(len(body) + length_delta) + body


@pytest.mark.parametrize(
    ("section", "count", "why"),
    [
        (_record(b"k", b"v")[:-3], 1, "runs past the end"),
        (_record(b"k", b"v") + b"\x00\x00", 1, "bytes left after the last record"),
        (_record(b"k", b"v", length_delta=1), 1, "says"),
        (_record(b"k", b"v"), 2, "runs past the end"),
        (_record(b"k", b"v")[:-1] + zigzag_varint(-1), 1, "negative header count"),
    ],
)
def test_corrupt_records_are_rejected(section: bytes, count: int, why: str) -> None:
    batch = parse_batch_header(build_batch(section, count), 0)
    with pytest.raises(InvalidRecordBatchError, match=why):
        decode_records(batch, RecordColumns())


def test_undecompressable_records_name_the_codec() -> None:
    data = bytearray(_batch(4))
    data[RECORD_BATCH_OVERHEAD : RECORD_BATCH_OVERHEAD + 8] = b"\xff" * 8
    with pytest.raises(InvalidRecordBatchError, match="cannot decompress \\(ZSTD\\)"):
        decode_records(parse_batch_header(bytes(data), 0), RecordColumns())
