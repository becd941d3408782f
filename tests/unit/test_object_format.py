"""Object format: writer/reader roundtrip, block splitting, find_blocks, corruption detection."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.formats.object_format import (
    BLOCK_HEADER_SIZE_BYTES,
    FOOTER_MAGIC,
    FOOTER_SIZE_BYTES,
    INDEX_ENTRY_SIZE_BYTES,
    CorruptObjectError,
    IndexEntry,
    ObjectFullError,
    ObjectWriter,
    StreamRange,
    decode_block,
    find_blocks,
    parse_footer,
    parse_index,
    parse_object,
    slice_index_from_tail,
)
from dataplane.formats.stream_records import StreamRecordBatch


def make_batches(stream_id: int, start: int, n: int, count: int = 3, payload_bytes: int = 100):
    out = []
    offset = start
    for i in range(n):
        out.append(StreamRecordBatch(stream_id, 1, offset, count, bytes([i % 256]) * payload_bytes))
        offset += count
    return out


def read_all(data: bytes) -> list[StreamRecordBatch]:
    _, index = parse_object(data)
    out: list[StreamRecordBatch] = []
    for entry in index:
        out.extend(decode_block(data[entry.position : entry.end_position], entry))
    return out


def test_sizes() -> None:
    assert BLOCK_HEADER_SIZE_BYTES == 14
    assert INDEX_ENTRY_SIZE_BYTES == 36
    assert FOOTER_SIZE_BYTES == 48


def test_single_stream_roundtrip_and_footer_layout() -> None:
    batches = make_batches(5, 1000, 10)
    writer = ObjectWriter()
    writer.add_all(batches)
    obj = writer.finish()
    assert obj.ranges == [StreamRange(5, 1000, 1030)]
    assert read_all(obj.data) == batches
    footer = parse_footer(obj.data[-FOOTER_SIZE_BYTES:], len(obj.data))
    assert struct.unpack(">Q", obj.data[-8:])[0] == FOOTER_MAGIC == 0x88E241B785F4CFF7
    assert footer.index_position + footer.index_length + FOOTER_SIZE_BYTES == len(obj.data)
    assert len(obj.index) == 1 and obj.index[0].record_count == 10
    assert writer.size_bytes == len(obj.data)


def test_multi_stream_interleaved_blocks() -> None:
    writer = ObjectWriter()
    a = make_batches(1, 0, 4)
    b = make_batches(2, 50, 4)
    order = [a[0], a[1], b[0], a[2], b[1], b[2], b[3], a[3]]
    writer.add_all(order)
    obj = writer.finish()
    assert [e.stream_id for e in obj.index] == [1, 2, 1, 2, 1]
    assert obj.ranges == [StreamRange(1, 0, 12), StreamRange(2, 50, 62)]
    assert read_all(obj.data) == order
    assert parse_object(obj.data)[1] == obj.index


def test_block_splitting_at_soft_limit() -> None:
    block_size = 4096
    batches = make_batches(9, 0, 100, payload_bytes=500)  # 533 B each
    writer = ObjectWriter(block_size_bytes=block_size)
    writer.add_all(batches)
    obj = writer.finish()
    per_block = (block_size - BLOCK_HEADER_SIZE_BYTES) // batches[0].size_bytes  # 7
    assert len(obj.index) == -(-100 // per_block)
    for entry in obj.index:
        assert entry.size <= block_size
    assert all(e.record_count == per_block for e in obj.index[:-1])
    # one batch larger than the limit gets a block of its own
    writer = ObjectWriter(block_size_bytes=1024)
    big = StreamRecordBatch(1, 0, 0, 1, bytes(5000))
    small = StreamRecordBatch(1, 0, 1, 1, b"x")
    writer.add_all([big, small])
    obj = writer.finish()
    assert [e.record_count for e in obj.index] == [1, 1]
    assert obj.index[0].size > 1024
    assert read_all(obj.data) == [big, small]


def test_writer_rejects_gaps_and_empty_and_reuse() -> None:
    writer = ObjectWriter()
    writer.add(StreamRecordBatch(1, 0, 0, 2, b""))
    with pytest.raises(ValueError, match="continue"):
        writer.add(StreamRecordBatch(1, 0, 5, 2, b""))
    writer.finish()
    with pytest.raises(ValueError):
        writer.finish()
    with pytest.raises(ValueError, match="empty"):
        ObjectWriter().finish()


def test_max_object_bytes() -> None:
    writer = ObjectWriter(max_object_bytes=2000)
    with pytest.raises(ObjectFullError):
        for b in make_batches(1, 0, 100):
            writer.add(b)
    obj = writer.finish()
    assert len(obj.data) <= 2000
    assert read_all(obj.data)


def test_find_blocks() -> None:
    writer = ObjectWriter(block_size_bytes=1024)
    a = make_batches(
        1, 0, 40, count=10, payload_bytes=200
    )  # 4 batches per block -> 40 offsets/block
    b = make_batches(2, 0, 8, count=1, payload_bytes=200)
    writer.add_all(a[:20] + b + a[20:])
    obj = writer.finish()
    index = parse_object(obj.data)[1]
    a_blocks = [e for e in index if e.stream_id == 1]
    assert [e.start_offset for e in a_blocks] == list(range(0, 400, 40))
    # start inside a block, unlimited bytes
    found = find_blocks(index, 1, 45, 130, 1 << 30)
    assert [e.start_offset for e in found] == [40, 80, 120]
    # max_bytes stops after the block that reaches it; always at least one block
    assert len(find_blocks(index, 1, 45, 400, 1)) == 1
    assert len(find_blocks(index, 1, 45, 400, a_blocks[1].size + 1)) == 2
    # end offset is exclusive
    assert [e.start_offset for e in find_blocks(index, 1, 0, 40, 1 << 30)] == [0]
    # across the interleaved stream 2 block
    found = find_blocks(index, 1, 150, 250, 1 << 30)
    assert [e.start_offset for e in found] == [120, 160, 200, 240]
    # other stream, missing stream, past the end
    assert [e.stream_id for e in find_blocks(index, 2, 0, 8, 1 << 30)] == [2, 2]
    assert find_blocks(index, 3, 0, 10, 100) == []
    assert find_blocks(index, 1, 400, 500, 100) == []
    with pytest.raises(ValueError):
        find_blocks(index, 1, 10, 10, 100)
    # decoded content of the found blocks covers the requested range
    got = [
        x
        for e in find_blocks(index, 1, 45, 130, 1 << 30)
        for x in decode_block(obj.data[e.position : e.end_position], e)
    ]
    assert got[0].base_offset <= 45 and got[-1].last_offset >= 130


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 5), st.binary(max_size=400)),
        min_size=1,
        max_size=60,
    ),
    st.integers(200, 3000),
)
def test_property_roundtrip(ops, block_size) -> None:
    next_offset: dict[int, int] = {}
    batches = []
    for stream, count, payload in ops:
        start = next_offset.get(stream, stream * 1000)
        batches.append(StreamRecordBatch(stream, 0, start, count, payload))
        next_offset[stream] = start + count
    writer = ObjectWriter(block_size_bytes=block_size)
    writer.add_all(batches)
    obj = writer.finish()
    assert read_all(obj.data) == batches
    for r in obj.ranges:
        assert r.end_offset == next_offset[r.stream_id]
        found = find_blocks(obj.index, r.stream_id, r.start_offset, r.end_offset, 1 << 40)
        decoded = [x for e in found for x in decode_block(obj.data[e.position : e.end_position], e)]
        assert decoded == [b for b in batches if b.stream_id == r.stream_id]


def _one_object() -> bytes:
    writer = ObjectWriter(block_size_bytes=1024)
    writer.add_all(make_batches(1, 0, 10) + make_batches(2, 0, 10))
    return writer.finish().data


def test_truncated_object() -> None:
    data = _one_object()
    with pytest.raises(CorruptObjectError, match="truncated"):
        parse_footer(data[-20:], 20)
    with pytest.raises(CorruptObjectError, match="truncated"):
        parse_footer(data[-30:], len(data))
    # object cut short: the tail is no longer a footer
    with pytest.raises(CorruptObjectError):
        parse_object(data[:-10])
    with pytest.raises(CorruptObjectError):
        parse_object(data[:100])


def test_wrong_footer_magic() -> None:
    data = bytearray(_one_object())
    data[-1] ^= 0xFF
    with pytest.raises(CorruptObjectError, match="magic"):
        parse_object(bytes(data))


def test_index_pointing_outside() -> None:
    data = bytearray(_one_object())
    footer = parse_footer(data, len(data))
    # footer: index position beyond the object
    bad = bytearray(data)
    struct.pack_into(">q", bad, len(bad) - FOOTER_SIZE_BYTES, len(bad) + 100)
    with pytest.raises(CorruptObjectError, match="index out of range"):
        parse_object(bytes(bad))
    # an index entry whose block position points outside the data area (CRC recomputed to
    # reach the bounds check)
    import crc32c

    index = bytearray(data[footer.index_position : footer.index_position + footer.index_length])
    struct.pack_into(">q", index, INDEX_ENTRY_SIZE_BYTES + 24, 10**9)
    forged = footer.__class__(
        footer.index_position, footer.index_length, crc32c.crc32c(bytes(index))
    )
    with pytest.raises(CorruptObjectError, match="index out of range"):
        parse_index(bytes(index), forged)
    # last block size running into the index
    index = bytearray(data[footer.index_position : footer.index_position + footer.index_length])
    last = len(index) - INDEX_ENTRY_SIZE_BYTES
    struct.pack_into(">i", index, last + 32, 10**6)
    forged = footer.__class__(
        footer.index_position, footer.index_length, crc32c.crc32c(bytes(index))
    )
    with pytest.raises(CorruptObjectError, match="index out of range"):
        parse_index(bytes(index), forged)


def test_corrupted_index_byte_detected_by_crc() -> None:
    data = bytearray(_one_object())
    footer = parse_footer(data, len(data))
    data[footer.index_position + 3] ^= 0x01
    with pytest.raises(CorruptObjectError, match="CRC"):
        parse_object(bytes(data))


def test_every_corrupted_byte_in_a_block_is_detected() -> None:
    data = _one_object()
    _, index = parse_object(data)
    entry = index[0]
    block = data[entry.position : entry.end_position]
    for i in range(len(block)):
        damaged = bytearray(block)
        damaged[i] ^= 0x40
        with pytest.raises(CorruptObjectError):
            decode_block(bytes(damaged), entry)
        with pytest.raises(CorruptObjectError):
            decode_block(bytes(damaged))


def test_block_truncated_or_mismatching_entry() -> None:
    data = _one_object()
    _, index = parse_object(data)
    entry = index[0]
    block = data[entry.position : entry.end_position]
    with pytest.raises(CorruptObjectError, match="truncated"):
        decode_block(block[:5])
    with pytest.raises(CorruptObjectError):
        decode_block(block[:-1])
    with pytest.raises(CorruptObjectError, match="index"):
        decode_block(block, index[1])


def test_index_structure_checks() -> None:
    with pytest.raises(CorruptObjectError, match="multiple"):
        parse_index(b"\x00" * 35)
    e0 = IndexEntry(1, 0, 10, 1, 0, 100)
    gap = IndexEntry(1, 10, 10, 1, 150, 100)
    with pytest.raises(CorruptObjectError, match="contiguous"):
        parse_index(e0.encode() + gap.encode())
    backwards = IndexEntry(1, 5, 10, 1, 100, 100)
    with pytest.raises(CorruptObjectError, match="backwards"):
        parse_index(e0.encode() + backwards.encode())
    assert parse_index(e0.encode() + IndexEntry(1, 10, 5, 1, 100, 60).encode())[1].end_offset == 15


def test_index_from_tail_read() -> None:
    data = _one_object()
    tail = data[-4096:]
    footer = parse_footer(tail, len(data))
    index_bytes = slice_index_from_tail(tail, len(data), footer)
    assert index_bytes is not None
    assert parse_index(index_bytes, footer) == parse_object(data)[1]
    assert slice_index_from_tail(data[-60:], len(data), footer) is None


def test_encoded_blocks_copy_into_a_new_object_identically():
    """Compaction copies checked block bodies without decoding (`add_encoded`): the new
    object decodes to the same batches, small blocks merge, a flipped byte is caught."""
    from dataplane.formats.object_format import check_block

    batches = [StreamRecordBatch(7, 0, i, 1, bytes([i]) * 100) for i in range(50)]
    src = ObjectWriter(block_size_bytes=1024)
    src.add_all(batches)
    obj = src.finish()
    assert len(obj.index) > 5
    out = ObjectWriter()
    for e in obj.index:
        out.add_encoded(e, check_block(obj.data[e.position : e.end_position], e))
    new = out.finish()
    assert len(new.index) == 1  # merged into one block
    _, index = parse_object(new.data)
    got = [b for e in index for b in decode_block(new.data[e.position : e.end_position], e)]
    assert got == batches
    e = obj.index[0]
    flipped = bytearray(obj.data[e.position : e.end_position])
    flipped[-1] ^= 1
    with pytest.raises(CorruptObjectError):
        check_block(bytes(flipped), e)
    with pytest.raises(ValueError):
        out2 = ObjectWriter()
        out2.add_encoded(
            obj.index[1],
            check_block(obj.data[obj.index[1].position : obj.index[1].end_position], obj.index[1]),
        )
        out2.add_encoded(
            obj.index[3],
            check_block(obj.data[obj.index[3].position : obj.index[3].end_position], obj.index[3]),
        )


def test_a_block_never_spans_more_than_an_i32_of_offsets_or_two_streams() -> None:
    big = 2**30 - 1  # two such batches fit an index entry's i32 offset delta, three do not
    writer = ObjectWriter()
    for i in range(3):
        writer.add(StreamRecordBatch(1, 0, i * big, big, b"x"))
    writer.add(StreamRecordBatch(2, 0, 0, 1, b"y"))
    obj = writer.finish()
    spans = [(e.stream_id, e.start_offset, e.end_offset) for e in obj.index]
    assert spans == [(1, 0, 2 * big), (1, 2 * big, 3 * big), (2, 0, 1)]
    assert read_all(obj.data) == [
        *(StreamRecordBatch(1, 0, i * big, big, b"x") for i in range(3)),
        StreamRecordBatch(2, 0, 0, 1, b"y"),
    ]


def test_batches_of_a_bytes_block_share_it_and_of_a_reusable_buffer_own_their_payloads() -> None:
    """A block decoded from a GET's immutable body may hand out views of it (no copy: the
    catch-up path); one decoded from a buffer its owner may reuse (a bytearray) always gets
    copies, so reusing the buffer never changes batches already handed out."""
    batches = make_batches(3, 0, 4, payload_bytes=1000)
    writer = ObjectWriter()
    writer.add_all(batches)
    data = writer.finish().data
    _, (entry,) = parse_object(data)
    block = memoryview(data)[entry.position : entry.end_position]
    shared = decode_block(block, entry, share_payloads=True)
    assert shared == batches
    assert all(isinstance(b.payload, memoryview) and b.payload.obj is data for b in shared)
    assert all(type(b.owned().payload) is bytes and b.owned() == b for b in shared)
    assert all(type(b.payload) is bytes for b in decode_block(block, entry))  # by default
    buffer = bytearray(data)
    copied = decode_block(
        memoryview(buffer)[entry.position : entry.end_position], entry, share_payloads=True
    )
    buffer[:] = bytes(len(buffer))  # the owner reuses its buffer
    assert copied == batches and all(type(b.payload) is bytes for b in copied)


def test_large_payloads_go_into_the_object_uncopied_small_pieces_joined() -> None:
    """An upload sends a large batch's payload as it is (no copy of the block's body); the
    headers and small batches around it are joined into one part each run; the object
    reads back the same and its block CRC covers every part."""
    from dataplane.formats.object_format import SHARED_PIECE_BYTES

    big = bytes(range(256)) * (SHARED_PIECE_BYTES // 256 + 1)
    batches = [
        StreamRecordBatch(7, 1, 0, 2, b"small-1"),
        StreamRecordBatch(7, 1, 2, 3, b"small-2"),
        StreamRecordBatch(7, 1, 5, 4, big),
        StreamRecordBatch(7, 1, 9, 1, b"small-3"),
    ]
    writer = ObjectWriter(block_size_bytes=4 * SHARED_PIECE_BYTES)
    writer.add_all(batches)
    obj = writer.finish()
    assert any(part is big for part in obj.parts)
    # head, [small-1 + small-2 + big's header], big, [small-3's header + payload], index, footer
    assert len(obj.parts) == 6
    data = obj.data
    assert len(data) == obj.size_bytes
    assert read_all(data) == batches
    _, index = parse_object(data)
    entry = index[0]
    at = entry.position + BLOCK_HEADER_SIZE_BYTES + 2 * 33 + 7 + 7 + 33 + 1000  # inside big
    flipped = bytearray(data)
    flipped[at] ^= 0x01
    with pytest.raises(CorruptObjectError):
        decode_block(bytes(flipped[entry.position : entry.end_position]), entry)
