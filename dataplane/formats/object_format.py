"""Object format of the S3Stream engine (stream-set objects and stream objects).

An object is ``[data block]* [index block] [footer]``:

* **data block** — batches of ONE stream with contiguous offsets. 14-byte header
  (big-endian)::

      magic         u8   0x5A
      flags         u8   0 (no flag defined; non-zero is rejected)
      batch_count   u32  number of StreamRecordBatches in the body
      body_length   u32  bytes after the header
      crc32c        u32  CRC32C (Castagnoli) of header bytes [0, 10) followed by the body

  It is AutoMQ's 10-byte block header plus a CRC32C, so a flipped byte anywhere
  in a block (header or body) is detected when the block is decoded.
  Blocks have a soft size limit (``block_size_bytes``, default 512 KiB): a batch
  that does not fit the current block starts a new one; a single batch larger
  than the limit gets a block of its own.
* **index block** — one 36-byte entry per data block, in block order::

      stream_id         i64
      start_offset      i64  first stream offset in the block
      end_offset_delta  i32  end (exclusive) - start
      record_count      i32  number of StreamRecordBatches in the block
      position          i64  byte position of the block in the object
      size              i32  block size in bytes, header included

* **footer** — 48 bytes at the very end::

      index_position  i64  (0)
      index_length    i32  (8)   bytes, a multiple of 36
      index_crc32c    u32  (12)  CRC32C of the index block
      format_version  u16  (16)  1
      reserved        22 zero bytes (18)
      magic           u64  (40)  0x88E241B785F4CFF7 (AutoMQ's object magic)

Blocks are contiguous from position 0 and the index follows the last block
immediately, so ``index_position + index_length + 48 == object size``.

All functions here are pure (no I/O). Parsers validate everything and raise
:class:`CorruptObjectError` with a message that names the problem.
"""

from __future__ import annotations

import bisect
import functools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import crc32c as _crc32c

from dataplane.formats.crc32c_combine import COMBINE_PAYS_FROM_BYTES, crc32c_combine
from dataplane.formats.stream_records import (
    HEADER_SIZE_BYTES as BATCH_HEADER_SIZE_BYTES,
)
from dataplane.formats.stream_records import (
    CorruptRecordError,
    StreamRecordBatch,
)

__all__ = [
    "BLOCK_HEADER_SIZE_BYTES",
    "DATA_BLOCK_MAGIC",
    "DEFAULT_BLOCK_SIZE_BYTES",
    "FOOTER_MAGIC",
    "FOOTER_SIZE_BYTES",
    "FORMAT_VERSION",
    "INDEX_ENTRY_SIZE_BYTES",
    "CorruptObjectError",
    "Footer",
    "IndexEntry",
    "ObjectFullError",
    "ObjectWriter",
    "StreamRange",
    "WrittenObject",
    "decode_block",
    "encode_index",
    "find_blocks",
    "parse_footer",
    "parse_index",
    "parse_object",
    "slice_index_from_tail",
]

DATA_BLOCK_MAGIC = 0x5A
FORMAT_VERSION = 1
FOOTER_MAGIC = 0x88E241B785F4CFF7
DEFAULT_BLOCK_SIZE_BYTES = 512 * 1024
MAX_BLOCK_SIZE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_OBJECT_BYTES = 1024 * 1024 * 1024
MAX_OBJECT_BYTES = 1 << 40
MAX_INDEX_ENTRIES = 1_000_000
MAX_BATCHES_PER_BLOCK = 1_000_000

_BLOCK_HEADER = struct.Struct(">BBIII")
_BLOCK_HEADER_CRC_SPAN = 10  # bytes of the header covered by the CRC
BLOCK_HEADER_SIZE_BYTES = _BLOCK_HEADER.size  # 14
_INDEX_ENTRY = struct.Struct(">qqiiqi")
INDEX_ENTRY_SIZE_BYTES = _INDEX_ENTRY.size  # 36
_FOOTER = struct.Struct(">qiIH22xQ")
FOOTER_SIZE_BYTES = _FOOTER.size  # 48
_FOOTER_RESERVED = slice(18, 40)

_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1
_MIN_BLOCK_BYTES = BLOCK_HEADER_SIZE_BYTES + BATCH_HEADER_SIZE_BYTES

assert BLOCK_HEADER_SIZE_BYTES == 14 and INDEX_ENTRY_SIZE_BYTES == 36 and FOOTER_SIZE_BYTES == 48


class CorruptObjectError(ValueError):
    """Object bytes fail validation (truncated, wrong magic, bad CRC, index out of range...)."""


class ObjectFullError(ValueError):
    """Adding the batch would make the object exceed ``max_object_bytes``."""


# ------------------------------------------------------------------------------ value types
@dataclass(frozen=True, slots=True)
class IndexEntry:
    """Location and offset range of one data block."""

    stream_id: int
    start_offset: int
    end_offset_delta: int
    record_count: int
    position: int
    size: int

    @property
    def end_offset(self) -> int:
        """Exclusive end offset of the block."""
        return self.start_offset + self.end_offset_delta

    @property
    def end_position(self) -> int:
        """Byte position just past the block."""
        return self.position + self.size

    def encode(self) -> bytes:
        """The 36-byte encoding."""
        return _INDEX_ENTRY.pack(
            self.stream_id,
            self.start_offset,
            self.end_offset_delta,
            self.record_count,
            self.position,
            self.size,
        )


@dataclass(frozen=True, slots=True)
class Footer:
    """Decoded footer."""

    index_position: int
    index_length: int
    index_crc32c: int
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        """The 48-byte encoding."""
        return _FOOTER.pack(
            self.index_position,
            self.index_length,
            self.index_crc32c,
            self.format_version,
            FOOTER_MAGIC,
        )


@dataclass(frozen=True, slots=True)
class StreamRange:
    """The offsets ``[start_offset, end_offset)`` of one stream held by an object."""

    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class WrittenObject:
    """Result of :meth:`ObjectWriter.finish`: the object's bytes as `parts` (block
    headers and bodies, index, footer, in order: an upload sends them without joining)."""

    parts: tuple[bytes | bytearray | memoryview, ...]
    ranges: list[StreamRange]
    index: list[IndexEntry]
    size_bytes: int

    @functools.cached_property
    def data(self) -> bytes:
        """The whole object as one `bytes` (joined on first use)."""
        return b"".join(self.parts)


# ------------------------------------------------------------------------------ writer
@dataclass(slots=True)
class _OpenBlock:
    stream_id: int
    start_offset: int
    end_offset: int
    # the encoded batches as pieces (headers, payloads), joined once when the block closes:
    # appending to one bytearray re-copied it as it grew
    pieces: list[bytes | memoryview] = field(default_factory=list)
    body_size: int = 0
    batch_count: int = 0
    # CRC32C of the body so far: a payload whose CRC its batch carries is not read again
    body_crc32c: int = 0


class ObjectWriter:
    """Builds one object in memory from batches.

    Batches of one stream must be added in offset order with no gap
    (``base_offset`` == the previous batch's ``last_offset``). Streams may
    interleave; switching stream always starts a new data block, so every
    block holds exactly one stream.

    Args:
        block_size_bytes: soft limit of a data block (body + header).
        max_object_bytes: hard limit of the finished object; :meth:`add`
            raises :class:`ObjectFullError` beyond it.
    """

    def __init__(
        self,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
    ) -> None:
        if not _MIN_BLOCK_BYTES <= block_size_bytes <= MAX_BLOCK_SIZE_BYTES:
            raise ValueError(
                f"block_size_bytes={block_size_bytes} must be in "
                f"{_MIN_BLOCK_BYTES}..{MAX_BLOCK_SIZE_BYTES}"
            )
        if not FOOTER_SIZE_BYTES < max_object_bytes <= MAX_OBJECT_BYTES:
            raise ValueError(f"max_object_bytes={max_object_bytes} out of range")
        self._block_size_bytes = block_size_bytes
        self._max_object_bytes = max_object_bytes
        self._blocks: list[bytes | bytearray | memoryview] = []  # block heads, body parts
        self._index: list[IndexEntry] = []
        self._position = 0
        self._open: _OpenBlock | None = None
        self._ranges: dict[int, list[int]] = {}  # stream_id -> [start, end]
        self._finished = False

    @property
    def size_bytes(self) -> int:
        """Size the object would have if finished now."""
        entries = len(self._index)
        pending = 0
        if self._open is not None:
            entries += 1
            pending = BLOCK_HEADER_SIZE_BYTES + self._open.body_size
        return self._position + pending + entries * INDEX_ENTRY_SIZE_BYTES + FOOTER_SIZE_BYTES

    @property
    def empty(self) -> bool:
        """True when no batch has been added."""
        return not self._ranges

    def add(self, batch: StreamRecordBatch) -> None:
        """Append one batch.

        Raises:
            ValueError: the batch does not continue its stream's offsets, or the
                writer is finished.
            ObjectFullError: the object would exceed ``max_object_bytes``.
        """
        if self._finished:
            raise ValueError("writer already finished")
        # one call per Kafka batch of an upload: the batch's properties are read once
        stream_id, base_offset, count = batch.stream_id, batch.base_offset, batch.count
        last_offset = base_offset + (count if count > 0 else -count)
        size = BATCH_HEADER_SIZE_BYTES + len(batch.payload)
        known = self._ranges.get(stream_id)
        if known is not None and base_offset != known[1]:
            raise ValueError(
                f"stream {stream_id}: batch base_offset {base_offset} does not "
                f"continue the stream at {known[1]}"
            )
        block = self._open
        if block is not None and (
            block.stream_id != stream_id
            or BLOCK_HEADER_SIZE_BYTES + block.body_size + size > self._block_size_bytes
            or last_offset - block.start_offset > _I32_MAX
            or block.batch_count >= MAX_BATCHES_PER_BLOCK
        ):
            self._close_block()
            block = None
        new_block_overhead = (
            BLOCK_HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES if block is None else 0
        )
        if self.size_bytes + new_block_overhead + size > self._max_object_bytes:
            raise ObjectFullError(
                f"adding {size} B would exceed max_object_bytes={self._max_object_bytes}"
            )
        if block is None:
            block = _OpenBlock(stream_id, base_offset, base_offset)
            self._open = block
        header, payload = batch.encode_header(), batch.payload
        crc = _crc32c.crc32c(header, block.body_crc32c)
        if batch.payload_crc32c is not None and len(payload) >= COMBINE_PAYS_FROM_BYTES:
            block.body_crc32c = crc32c_combine(crc, batch.payload_crc32c, len(payload))
        else:
            block.body_crc32c = _crc32c.crc32c(payload, crc)
        block.pieces += (header, payload)
        block.body_size += size
        block.batch_count += 1
        block.end_offset = last_offset
        if known is None:
            self._ranges[stream_id] = [base_offset, last_offset]
        else:
            known[1] = last_offset

    def add_encoded(self, entry: IndexEntry, body: bytes | bytearray | memoryview) -> None:
        """Append a checked data block's body (its encoded batches, see `check_block`)
        without decoding it: compaction copies blocks at memory speed. The batches join the
        open block of their stream when they fit, like `add`.

        Raises:
            ValueError: the block does not continue its stream's offsets, or finished.
            ObjectFullError: the object would exceed ``max_object_bytes``.
        """
        if self._finished:
            raise ValueError("writer already finished")
        sid, start, end = entry.stream_id, entry.start_offset, entry.end_offset
        known = self._ranges.get(sid)
        if known is not None and start != known[1]:
            raise ValueError(
                f"stream {sid}: block start {start} does not continue the stream at {known[1]}"
            )
        block = self._open
        if block is not None and (
            block.stream_id != sid
            or BLOCK_HEADER_SIZE_BYTES + block.body_size + len(body) > self._block_size_bytes
            or end - block.start_offset > _I32_MAX
            or block.batch_count + entry.record_count > MAX_BATCHES_PER_BLOCK
        ):
            self._close_block()
            block = None
        overhead = BLOCK_HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES if block is None else 0
        if self.size_bytes + overhead + len(body) > self._max_object_bytes:
            raise ObjectFullError(
                f"adding {len(body)} B would exceed max_object_bytes={self._max_object_bytes}"
            )
        if block is None:
            block = _OpenBlock(sid, start, start)
            self._open = block
        if not isinstance(body, bytes) and not (
            isinstance(body, memoryview) and isinstance(body.obj, bytes)
        ):
            body = bytes(body)  # a buffer that may change: copy (immutable bytes are kept)
        block.pieces.append(body)
        block.body_crc32c = _crc32c.crc32c(body, block.body_crc32c)
        block.body_size += len(body)
        block.batch_count += entry.record_count
        block.end_offset = end
        if known is None:
            self._ranges[sid] = [start, end]
        else:
            known[1] = end

    def add_all(self, batches: Iterable[StreamRecordBatch]) -> None:
        """Add batches in iteration order."""
        for batch in batches:
            self.add(batch)

    def _close_block(self) -> None:
        block = self._open
        if block is None:
            return
        self._open = None
        # the block's body as parts: payloads of at least SHARED_PIECE_BYTES are kept as
        # they are (an upload sends them without a copy), runs of smaller pieces (the batch
        # headers, small batches) are joined, so the body is never copied whole
        body = _coalesced(block.pieces)
        head = _block_head(block.body_crc32c, block.body_size, block.batch_count)
        size = len(head) + block.body_size
        entry = IndexEntry(
            stream_id=block.stream_id,
            start_offset=block.start_offset,
            end_offset_delta=block.end_offset - block.start_offset,
            record_count=block.batch_count,
            position=self._position,
            size=size,
        )
        self._blocks.append(head)
        self._blocks += body
        self._index.append(entry)
        self._position += size

    def finish(self) -> WrittenObject:
        """Close the last block, append index and footer and return the object.

        Raises:
            ValueError: no batch was added, or already finished.
        """
        if self._finished:
            raise ValueError("writer already finished")
        if self.empty:
            raise ValueError("cannot finish an empty object")
        self._close_block()
        self._finished = True
        index_bytes = encode_index(self._index)
        footer = Footer(
            index_position=self._position,
            index_length=len(index_bytes),
            index_crc32c=_crc32c.crc32c(index_bytes),
        )
        parts = (*self._blocks, index_bytes, footer.encode())
        self._blocks = []
        ranges = [StreamRange(sid, r[0], r[1]) for sid, r in sorted(self._ranges.items())]
        return WrittenObject(
            parts=parts,
            ranges=ranges,
            index=list(self._index),
            size_bytes=sum(len(p) for p in parts),
        )


def _block_head(body_crc32c: int, body_size: int, batch_count: int) -> bytes:
    """The header of the data block whose body (`body_size` bytes) has the CRC32C
    `body_crc32c`, the block's CRC32C included."""
    head = _BLOCK_HEADER.pack(DATA_BLOCK_MAGIC, 0, batch_count, body_size, 0)[
        :_BLOCK_HEADER_CRC_SPAN
    ]
    crc = crc32c_combine(_crc32c.crc32c(head), body_crc32c, body_size)
    return head + crc.to_bytes(4, "big")


# a piece of a block's body at least this large is kept as it is in the object's parts;
# smaller ones are joined with their neighbours (a part per small piece would cost a send
# call each when the object is uploaded)
SHARED_PIECE_BYTES = 64 * 1024


def _coalesced(pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """`pieces` with every run of pieces below SHARED_PIECE_BYTES joined into one."""
    parts: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    for piece in pieces:
        if len(piece) >= SHARED_PIECE_BYTES:
            if run:
                parts.append(run[0] if len(run) == 1 else b"".join(run))
                run = []
            parts.append(piece)
        else:
            run.append(piece)
    if run:
        parts.append(run[0] if len(run) == 1 else b"".join(run))
    return parts


def check_block(block_bytes: bytes | bytearray | memoryview, entry: IndexEntry) -> memoryview:
    """Check a data block's framing and CRC32C against its index entry without decoding
    its batches; the body (the encoded batches). The CRC covers every byte, so a block that
    passes holds exactly what its writer (which validated each batch) wrote.

    Raises:
        CorruptObjectError: wrong size, magic, flags, lengths, batch count or CRC.
    """
    view = memoryview(block_bytes)
    if len(view) != entry.size or entry.size < BLOCK_HEADER_SIZE_BYTES:
        raise CorruptObjectError(f"block is {len(view)} B but the index says {entry.size} B")
    magic, flags, batch_count, body_length, crc = _BLOCK_HEADER.unpack_from(view)
    if magic != DATA_BLOCK_MAGIC or flags != 0:
        raise CorruptObjectError(f"bad data block header (magic 0x{magic:02x}, flags {flags})")
    if body_length != len(view) - BLOCK_HEADER_SIZE_BYTES or batch_count != entry.record_count:
        raise CorruptObjectError(f"data block header does not match its index entry {entry}")
    body = view[BLOCK_HEADER_SIZE_BYTES:]
    actual = _crc32c.crc32c(body, _crc32c.crc32c(view[:_BLOCK_HEADER_CRC_SPAN]))
    if actual != crc:
        raise CorruptObjectError(f"data block CRC32C mismatch: 0x{actual:08x} != 0x{crc:08x}")
    return body


def encode_index(entries: Sequence[IndexEntry]) -> bytes:
    """Concatenate the 36-byte encodings of ``entries``."""
    return b"".join(entry.encode() for entry in entries)


# ------------------------------------------------------------------------------ readers
def parse_footer(tail_bytes: bytes | bytearray | memoryview, object_size: int) -> Footer:
    """Decode the footer from the last bytes of an object.

    Args:
        tail_bytes: the last ``len(tail_bytes)`` bytes of the object (at least 48;
            more is allowed, e.g. a tail read that also covers the index).
        object_size: total object size in bytes.

    Raises:
        CorruptObjectError: truncated object, wrong magic, unknown version,
            non-zero reserved bytes, or an index range outside the object.
    """
    if object_size < FOOTER_SIZE_BYTES:
        raise CorruptObjectError(
            f"truncated object: {object_size} B is smaller than the {FOOTER_SIZE_BYTES} B footer"
        )
    if len(tail_bytes) < FOOTER_SIZE_BYTES:
        raise CorruptObjectError(
            f"truncated footer: got {len(tail_bytes)} B, need {FOOTER_SIZE_BYTES} B"
        )
    if len(tail_bytes) > object_size:
        raise CorruptObjectError(
            f"tail of {len(tail_bytes)} B is longer than the object ({object_size} B)"
        )
    raw = memoryview(tail_bytes)[-FOOTER_SIZE_BYTES:]
    index_position, index_length, index_crc, version, magic = _FOOTER.unpack(raw)
    if magic != FOOTER_MAGIC:
        raise CorruptObjectError(
            f"wrong footer magic 0x{magic:016x} (expected 0x{FOOTER_MAGIC:016x}): "
            "not an object or truncated"
        )
    if version != FORMAT_VERSION:
        raise CorruptObjectError(f"unsupported object format version {version}")
    if any(raw[_FOOTER_RESERVED]):
        raise CorruptObjectError("footer reserved bytes are not zero")
    if index_length < 0 or index_length % INDEX_ENTRY_SIZE_BYTES != 0:
        raise CorruptObjectError(
            f"index length {index_length} is not a multiple of {INDEX_ENTRY_SIZE_BYTES}"
        )
    if index_length > MAX_INDEX_ENTRIES * INDEX_ENTRY_SIZE_BYTES:
        raise CorruptObjectError(f"index length {index_length} exceeds the limit")
    if index_position < 0 or index_position + index_length + FOOTER_SIZE_BYTES != object_size:
        raise CorruptObjectError(
            f"index out of range: position {index_position} + length {index_length} + footer "
            f"{FOOTER_SIZE_BYTES} != object size {object_size}"
        )
    return Footer(index_position, index_length, index_crc, version)


def slice_index_from_tail(
    tail_bytes: bytes | bytearray | memoryview, object_size: int, footer: Footer
) -> bytes | None:
    """Return the index block if ``tail_bytes`` (the object's last bytes) covers it, else None."""
    tail_start = object_size - len(tail_bytes)
    if footer.index_position < tail_start:
        return None
    start = footer.index_position - tail_start
    return bytes(memoryview(tail_bytes)[start : start + footer.index_length])


def parse_index(
    index_bytes: bytes | bytearray | memoryview, footer: Footer | None = None
) -> list[IndexEntry]:
    """Decode and validate an index block.

    With ``footer`` (recommended) the CRC and the length are checked, and
    the blocks must exactly fill ``[0, footer.index_position)``.
    Without it only the structure is checked (contiguous blocks from 0,
    per-stream offset order).

    Raises:
        CorruptObjectError: on any inconsistency.
    """
    size = len(index_bytes)
    if size % INDEX_ENTRY_SIZE_BYTES != 0:
        raise CorruptObjectError(
            f"truncated index: {size} B is not a multiple of {INDEX_ENTRY_SIZE_BYTES}"
        )
    if size > MAX_INDEX_ENTRIES * INDEX_ENTRY_SIZE_BYTES:
        raise CorruptObjectError(f"index of {size} B exceeds the limit")
    if footer is not None:
        if size != footer.index_length:
            raise CorruptObjectError(
                f"index length {size} B does not match the footer ({footer.index_length} B)"
            )
        actual = _crc32c.crc32c(index_bytes)
        if actual != footer.index_crc32c:
            raise CorruptObjectError(
                f"index CRC32C mismatch: 0x{actual:08x} != 0x{footer.index_crc32c:08x}"
            )
    entries: list[IndexEntry] = []
    stream_ends: dict[int, int] = {}
    expected_position = 0
    for i, fields in enumerate(_INDEX_ENTRY.iter_unpack(index_bytes)):
        entry = IndexEntry(*fields)
        _validate_entry(i, entry, expected_position)
        previous_end = stream_ends.get(entry.stream_id)
        if previous_end is not None and entry.start_offset < previous_end:
            raise CorruptObjectError(
                f"index entry {i}: stream {entry.stream_id} offsets go backwards "
                f"({entry.start_offset} < {previous_end})"
            )
        stream_ends[entry.stream_id] = entry.end_offset
        expected_position = entry.end_position
        entries.append(entry)
    if footer is not None and expected_position != footer.index_position:
        raise CorruptObjectError(
            f"index out of range: blocks end at {expected_position}, "
            f"index starts at {footer.index_position}"
        )
    return entries


def _validate_entry(i: int, entry: IndexEntry, expected_position: int) -> None:
    if entry.stream_id < 0 or entry.start_offset < 0:
        raise CorruptObjectError(f"index entry {i}: negative stream id or offset")
    if entry.end_offset_delta <= 0 or entry.end_offset > _I64_MAX:
        raise CorruptObjectError(
            f"index entry {i}: invalid end_offset_delta {entry.end_offset_delta}"
        )
    if entry.record_count <= 0 or entry.record_count > MAX_BATCHES_PER_BLOCK:
        raise CorruptObjectError(f"index entry {i}: invalid record_count {entry.record_count}")
    if entry.size < _MIN_BLOCK_BYTES:
        raise CorruptObjectError(f"index entry {i}: block size {entry.size} B too small")
    if entry.position != expected_position:
        raise CorruptObjectError(
            f"index out of range: entry {i} points at {entry.position}, "
            f"expected {expected_position} (blocks must be contiguous)"
        )


def parse_object(data: bytes | bytearray | memoryview) -> tuple[Footer, list[IndexEntry]]:
    """Parse footer and index of a whole object held in memory."""
    footer = parse_footer(data, len(data))
    view = memoryview(data)
    index_bytes = view[footer.index_position : footer.index_position + footer.index_length]
    return footer, parse_index(index_bytes, footer)


def find_blocks(
    index: Sequence[IndexEntry],
    stream_id: int,
    start_offset: int,
    end_offset: int,
    max_bytes: int,
) -> list[IndexEntry]:
    """Blocks of ``stream_id`` that overlap ``[start_offset, end_offset)``, in offset order.

    The first returned block contains ``start_offset`` (or is the first block
    after it). Blocks are added until their total ``size`` reaches
    ``max_bytes``; at least one block is returned when any overlaps.
    ``index`` must come from :func:`parse_index` (per-stream offset order).
    Cost: O(len(index)).
    """
    if start_offset < 0 or end_offset <= start_offset:
        raise ValueError(f"invalid range [{start_offset}, {end_offset})")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes={max_bytes} must be positive")
    entries = [e for e in index if e.stream_id == stream_id]
    ends = [e.end_offset for e in entries]
    i = bisect.bisect_right(ends, start_offset)
    found: list[IndexEntry] = []
    total_bytes = 0
    while i < len(entries) and entries[i].start_offset < end_offset and total_bytes < max_bytes:
        found.append(entries[i])
        total_bytes += entries[i].size
        i += 1
    return found


def decode_block(
    block_bytes: bytes | bytearray | memoryview,
    entry: IndexEntry | None = None,
    share_payloads: bool = False,
) -> list[StreamRecordBatch]:
    """Validate and decode one data block.

    With ``entry`` the block is also checked against its index entry (size,
    stream, offsets, record count). With ``share_payloads`` and an immutable buffer
    (``bytes``, or a read-only memoryview of a buffer nobody changes: a GET's body, as
    ``ObjectStorage.get_range_async`` returns it) the batches' payloads are read-only
    views of it, not copies (see stream_records.py: they keep the whole buffer alive); from any
    writable buffer (which its owner may reuse) they are copies. A read-only view is taken
    as the promise that its buffer never changes.

    Raises:
        CorruptObjectError: truncated block, wrong magic, CRC mismatch, bad
            record bounds, mixed streams, offset gaps, or index mismatch.
    """
    view = memoryview(block_bytes)
    size = len(view)
    if size < BLOCK_HEADER_SIZE_BYTES:
        raise CorruptObjectError(f"truncated block: {size} B < {BLOCK_HEADER_SIZE_BYTES} B header")
    if entry is not None and size != entry.size:
        raise CorruptObjectError(f"block is {size} B but the index says {entry.size} B")
    magic, flags, batch_count, body_length, crc = _BLOCK_HEADER.unpack_from(view)
    if magic != DATA_BLOCK_MAGIC:
        raise CorruptObjectError(
            f"wrong data block magic 0x{magic:02x} (expected 0x{DATA_BLOCK_MAGIC:02x})"
        )
    if body_length != size - BLOCK_HEADER_SIZE_BYTES:
        raise CorruptObjectError(
            f"block body length {body_length} B does not match the block "
            f"({size - BLOCK_HEADER_SIZE_BYTES} B after the header)"
        )
    body = view[BLOCK_HEADER_SIZE_BYTES:]
    actual = _crc32c.crc32c(body, _crc32c.crc32c(view[:_BLOCK_HEADER_CRC_SPAN]))
    if actual != crc:
        raise CorruptObjectError(f"data block CRC32C mismatch: 0x{actual:08x} != 0x{crc:08x}")
    if flags != 0:
        raise CorruptObjectError(f"unknown data block flags 0x{flags:02x}")
    if not 0 < batch_count <= MAX_BATCHES_PER_BLOCK:
        raise CorruptObjectError(f"invalid batch count {batch_count}")
    batches: list[StreamRecordBatch] = []
    pos = 0
    decode = StreamRecordBatch.decode
    # bytes, or a read-only view whose buffer never changes (a GET's body: see the docstring)
    share = share_payloads and view.readonly
    try:
        batch, pos = decode(body, pos, share)
        batches.append(batch)
        stream_id, next_offset = batch.stream_id, batch.last_offset
        for _ in range(batch_count - 1):
            batch, pos = decode(body, pos, share)
            if batch.stream_id != stream_id:
                raise CorruptObjectError(f"block mixes streams {stream_id} and {batch.stream_id}")
            if batch.base_offset != next_offset:
                raise CorruptObjectError(
                    f"offset gap in block: {next_offset} -> {batch.base_offset}"
                )
            next_offset = batch.last_offset
            batches.append(batch)
    except CorruptRecordError as exc:
        raise CorruptObjectError(f"bad record in data block: {exc}") from exc
    if pos != body_length:
        raise CorruptObjectError(f"block has {body_length - pos} B after its {batch_count} batches")
    if entry is not None:
        first, last = batches[0], batches[-1]
        if (
            first.stream_id != entry.stream_id
            or first.base_offset != entry.start_offset
            or last.last_offset != entry.end_offset
            or batch_count != entry.record_count
        ):
            raise CorruptObjectError(
                f"block (stream {first.stream_id}, [{first.base_offset}, {last.last_offset}), "
                f"{batch_count} batches) does not match its index entry {entry}"
            )
    return batches
