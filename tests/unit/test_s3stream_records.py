"""StreamRecordBatch encoding: roundtrip, link records, and corrupt input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.formats.stream_records import (
    HEADER_SIZE_BYTES,
    MAGIC,
    CorruptRecordError,
    StreamRecordBatch,
    decode_all,
)

I64 = st.integers(min_value=0, max_value=2**62)
COUNT = st.integers(min_value=-(2**31) + 1, max_value=2**31 - 1).filter(lambda c: c != 0)


@st.composite
def batches(draw) -> StreamRecordBatch:
    return StreamRecordBatch(
        stream_id=draw(I64),
        epoch=draw(I64),
        base_offset=draw(I64),
        count=draw(COUNT),
        payload=draw(st.binary(max_size=300)),
    )


@settings(max_examples=200, deadline=None)
@given(batches())
def test_roundtrip(batch: StreamRecordBatch) -> None:
    encoded = batch.encode()
    assert len(encoded) == batch.size_bytes == HEADER_SIZE_BYTES + len(batch.payload)
    decoded, next_offset = StreamRecordBatch.decode(encoded)
    assert decoded == batch
    assert next_offset == len(encoded)


@settings(max_examples=50, deadline=None)
@given(st.lists(batches(), min_size=1, max_size=10), st.binary(max_size=20))
def test_decode_sequence_at_offset(items: list[StreamRecordBatch], prefix: bytes) -> None:
    buf = prefix + b"".join(b.encode() for b in items)
    pos = len(prefix)
    out = []
    for _ in items:
        batch, pos = StreamRecordBatch.decode(buf, pos)
        out.append(batch)
    assert out == items and pos == len(buf)
    assert decode_all(buf[len(prefix) :]) == items


def test_exact_layout_big_endian() -> None:
    batch = StreamRecordBatch(stream_id=7, epoch=3, base_offset=100, count=5, payload=b"abc")
    assert batch.encode() == struct.pack(">BqqqiI", 0x22, 7, 3, 100, 5, 3) + b"abc"
    assert HEADER_SIZE_BYTES == 33


def test_link_record_flag_and_offsets() -> None:
    link = StreamRecordBatch(stream_id=1, epoch=0, base_offset=10, count=-4, payload=b"ptr")
    normal = StreamRecordBatch(stream_id=1, epoch=0, base_offset=10, count=4, payload=b"")
    assert link.is_link and not normal.is_link
    assert link.record_count == normal.record_count == 4
    assert link.last_offset == normal.last_offset == 14
    decoded, _ = StreamRecordBatch.decode(link.encode())
    assert decoded.is_link and decoded.count == -4


def test_wrong_magic() -> None:
    raw = bytearray(StreamRecordBatch(1, 0, 0, 1, b"x").encode())
    raw[0] = 0x23
    with pytest.raises(CorruptRecordError, match="magic"):
        StreamRecordBatch.decode(bytes(raw))


def test_negative_payload_length() -> None:
    raw = struct.pack(">Bqqqii", MAGIC, 1, 0, 0, 1, -5) + b"xxxxx"
    with pytest.raises(CorruptRecordError, match="payload length -5"):
        StreamRecordBatch.decode(raw)


@pytest.mark.parametrize(
    "cut", [0, 1, 20, HEADER_SIZE_BYTES - 1, HEADER_SIZE_BYTES, HEADER_SIZE_BYTES + 9]
)
def test_truncation(cut: int) -> None:
    raw = StreamRecordBatch(1, 0, 0, 1, b"0123456789").encode()
    with pytest.raises(CorruptRecordError, match="truncated"):
        StreamRecordBatch.decode(raw[:cut])


def test_zero_count_and_trailing_garbage_are_corrupt() -> None:
    raw = struct.pack(">BqqqiI", MAGIC, 1, 0, 0, 0, 0)
    with pytest.raises(CorruptRecordError, match="count"):
        StreamRecordBatch.decode(raw)
    good = StreamRecordBatch(1, 0, 0, 1, b"x").encode()
    with pytest.raises(CorruptRecordError):
        decode_all(good + b"\x00")


def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        StreamRecordBatch(-1, 0, 0, 1, b"")
    with pytest.raises(ValueError):
        StreamRecordBatch(1, 0, 0, 0, b"")
    with pytest.raises(ValueError):
        StreamRecordBatch(1, 0, 2**63 - 1, 5, b"")
    with pytest.raises(TypeError):
        StreamRecordBatch(1, 0, 0, 1, "text")  # type: ignore[arg-type]
    assert StreamRecordBatch(1, 0, 0, 1, bytearray(b"ab")).payload == b"ab"


@pytest.mark.parametrize(
    "stream_id, epoch, base_offset, count, what",
    [
        (-1, 0, 0, 1, "stream_id"),
        (1, -1, 0, 1, "epoch"),
        (1, 0, -1, 1, "base_offset"),
        (1, 0, 0, -(2**31), "count"),
        (1, 0, 2**63 - 1, 5, "overflows"),
        (1, 0, 2**63 - 3, -5, "overflows"),
    ],
)
def test_decode_refuses_what_the_constructor_refuses(
    stream_id: int, epoch: int, base_offset: int, count: int, what: str
) -> None:
    raw = struct.pack(">BqqqiI", MAGIC, stream_id, epoch, base_offset, count, 1) + b"x"
    with pytest.raises(CorruptRecordError, match=what):
        StreamRecordBatch.decode(raw)
    with pytest.raises(ValueError):
        StreamRecordBatch(stream_id, epoch, base_offset, count, b"x")


@given(batches())
@settings(max_examples=200, deadline=None)
def test_decoded_batch_is_a_complete_equal_object(batch: StreamRecordBatch) -> None:
    decoded, end = StreamRecordBatch.decode(batch.encode())
    assert decoded == batch and hash(decoded) == hash(batch)
    assert type(decoded.payload) is bytes and end == batch.size_bytes
    assert (decoded.record_count, decoded.last_offset) == (batch.record_count, batch.last_offset)
