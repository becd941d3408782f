"""Byte formats of the file WAL (pure: no I/O).

File layout (all integers big-endian)::

    [0,     4096)   reservation slot 0   (owner reservation, see Reservation)
    [4096,  8192)   reservation slot 1
    [8192,  12288)  state slot 0         (trim offset, see WALState)
    [12288, 16384)  state slot 1
    [16384, 16384 + capacity)  data ring

Each slot sits alone in a 4 KiB page, so a torn write damages one slot only.
Slots are written alternately (sequence number ``seq`` + 1 goes to slot
``seq % 2``) and the valid slot (magic + CRC32C) with the highest ``seq`` wins.

The reservation and the trim state are kept in separate slot pairs on purpose:
only a reservation *acquirer* writes reservation slots, the owner only writes
state slots, so a paused old owner that resumes can never overwrite a newer
reservation with a stale copy of its own.

A record in the data ring is a 24-byte header followed by the body; the
record's logical offset L maps to ring position ``L % capacity`` and a record
may wrap around the ring end. A *padding record* (magic "AWLP", zero body,
body not checked) ends a group-commit batch on an alignment boundary (4 KiB by
default) so that every batch starts on a fresh page.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c as _crc32c

__all__ = [
    "DATA_START_BYTES",
    "FORMAT_VERSION",
    "HEADER_AREA_BYTES",
    "RECORD_HEADER_SIZE_BYTES",
    "RECORD_MAGIC",
    "RESERVATION_SLOT_POSITIONS",
    "SLOT_PAGE_BYTES",
    "STATE_SLOT_POSITIONS",
    "RecordHeader",
    "Reservation",
    "WALState",
    "decode_record_header",
    "encode_padding_record",
    "encode_record_header",
    "padding_bytes",
    "latest",
]

FORMAT_VERSION = 1
SLOT_PAGE_BYTES = 4096
RESERVATION_SLOT_POSITIONS = (0, SLOT_PAGE_BYTES)
STATE_SLOT_POSITIONS = (2 * SLOT_PAGE_BYTES, 3 * SLOT_PAGE_BYTES)
HEADER_AREA_BYTES = 4 * SLOT_PAGE_BYTES
DATA_START_BYTES = HEADER_AREA_BYTES

RECORD_MAGIC = 0x41574C52  # "AWLR"
PADDING_MAGIC = 0x41574C50  # "AWLP": fills a batch up to the alignment; carries no data
MAX_ALIGN_BYTES = 64 * 1024
RESERVATION_MAGIC = 0x41575253  # "AWRS"
STATE_MAGIC = 0x41575354  # "AWST"

# magic u32, body_length u32, body_offset i64, body_crc32c u32, header_crc32c u32
_RECORD_HEADER = struct.Struct(">IIqII")
RECORD_HEADER_SIZE_BYTES = _RECORD_HEADER.size  # 24
_RECORD_HEADER_CRC_SPAN = 20

# magic u32, version u16, flags u16, seq u64, capacity u64, node_id i64, node_epoch i64,
# max_batch_bytes u32, crc32c u32
_RESERVATION = struct.Struct(">IHHQQqqII")
RESERVATION_SIZE_BYTES = _RESERVATION.size  # 48

# magic u32, version u16, flags u16, seq u64, capacity u64, trim_offset i64,
# writer_node_id i64, writer_node_epoch i64, reserved u32, crc32c u32
_STATE = struct.Struct(">IHHQQqqqII")
STATE_SIZE_BYTES = _STATE.size  # 56

assert RECORD_HEADER_SIZE_BYTES == 24 and RESERVATION_SIZE_BYTES == 48 and STATE_SIZE_BYTES == 56


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """Decoded 24-byte record header (``is_padding``: a padding record, no data)."""

    body_length: int
    body_offset: int
    body_crc32c: int
    is_padding: bool = False

    @property
    def record_offset(self) -> int:
        """Logical offset of the record (the header's first byte)."""
        return self.body_offset - RECORD_HEADER_SIZE_BYTES


def encode_record_header(body_length: int, body_offset: int, body_crc32c: int) -> bytes:
    """Encode a record header; ``body_offset`` is the logical offset of the body."""
    head = _RECORD_HEADER.pack(RECORD_MAGIC, body_length, body_offset, body_crc32c, 0)
    return head[:_RECORD_HEADER_CRC_SPAN] + _crc32c.crc32c(head[:_RECORD_HEADER_CRC_SPAN]).to_bytes(
        4, "big"
    )


def decode_record_header(buf: bytes | bytearray | memoryview) -> RecordHeader | None:
    """Decode a record header; None when the magic or the header CRC does not match."""
    if len(buf) < RECORD_HEADER_SIZE_BYTES:
        return None
    magic, body_length, body_offset, body_crc, header_crc = _RECORD_HEADER.unpack_from(buf)
    if magic != RECORD_MAGIC and magic != PADDING_MAGIC:
        return None
    if _crc32c.crc32c(bytes(buf[:_RECORD_HEADER_CRC_SPAN])) != header_crc:
        return None
    return RecordHeader(body_length, body_offset, body_crc, magic == PADDING_MAGIC)


def padding_bytes(end_offset: int, align_bytes: int) -> int:
    """Size of the padding record that moves ``end_offset`` to an ``align_bytes`` boundary.

    0 when already aligned or alignment is off (``align_bytes`` <= 1); otherwise at
    least a header (24 B), so it is in ``[24, align_bytes + 24)``.
    """
    if align_bytes <= 1:
        return 0
    pad = -end_offset % align_bytes
    if 0 < pad < RECORD_HEADER_SIZE_BYTES:
        pad += align_bytes
    return pad


def encode_padding_record(offset: int, size_bytes: int) -> bytes:
    """A padding record of ``size_bytes`` (>= 24) at logical ``offset``: header + zeros.

    Its body CRC field is 0 and its body is not verified: it holds no data.
    """
    if size_bytes < RECORD_HEADER_SIZE_BYTES:
        raise ValueError(f"padding of {size_bytes} B is smaller than a header")
    body_length = size_bytes - RECORD_HEADER_SIZE_BYTES
    head = _RECORD_HEADER.pack(PADDING_MAGIC, body_length, offset + RECORD_HEADER_SIZE_BYTES, 0, 0)
    span = head[:_RECORD_HEADER_CRC_SPAN]
    return span + _crc32c.crc32c(span).to_bytes(4, "big") + bytes(body_length)


def _seal(packed: bytes) -> bytes:
    """Replace the trailing 4 bytes of ``packed`` with the CRC32C of the rest."""
    body = packed[:-4]
    return body + _crc32c.crc32c(body).to_bytes(4, "big")


def _crc_ok(raw: bytes | bytearray | memoryview, size: int) -> bool:
    return _crc32c.crc32c(bytes(raw[: size - 4])) == int.from_bytes(raw[size - 4 : size], "big")


@dataclass(frozen=True, slots=True)
class Reservation:
    """Who owns the WAL: only the owner named here may acknowledge appends.

    ``max_batch_bytes`` is the owner's group-commit batch limit: it bounds how
    far past the last valid record a torn or in-flight batch of that owner can
    reach (used to invalidate that range before new appends).
    """

    seq: int
    capacity_bytes: int
    node_id: int
    node_epoch: int
    max_batch_bytes: int

    def encode(self) -> bytes:
        return _seal(
            _RESERVATION.pack(
                RESERVATION_MAGIC,
                FORMAT_VERSION,
                0,
                self.seq,
                self.capacity_bytes,
                self.node_id,
                self.node_epoch,
                self.max_batch_bytes,
                0,
            )
        )

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview) -> Reservation | None:
        """Decode a slot; None when it is not a valid reservation slot."""
        if len(raw) < RESERVATION_SIZE_BYTES or not _crc_ok(raw, RESERVATION_SIZE_BYTES):
            return None
        magic, version, _flags, seq, capacity, node_id, epoch, max_batch, _crc = (
            _RESERVATION.unpack_from(raw)
        )
        if magic != RESERVATION_MAGIC or version != FORMAT_VERSION:
            return None
        return cls(seq, capacity, node_id, epoch, max_batch)

    @property
    def slot_position(self) -> int:
        """File position of the slot this reservation is written to."""
        return RESERVATION_SLOT_POSITIONS[self.seq % 2]


@dataclass(frozen=True, slots=True)
class WALState:
    """The owner's durable progress: the trim offset (start of retained records)."""

    seq: int
    capacity_bytes: int
    trim_offset: int
    writer_node_id: int
    writer_node_epoch: int

    def encode(self) -> bytes:
        return _seal(
            _STATE.pack(
                STATE_MAGIC,
                FORMAT_VERSION,
                0,
                self.seq,
                self.capacity_bytes,
                self.trim_offset,
                self.writer_node_id,
                self.writer_node_epoch,
                0,
                0,
            )
        )

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview) -> WALState | None:
        """Decode a slot; None when it is not a valid state slot."""
        if len(raw) < STATE_SIZE_BYTES or not _crc_ok(raw, STATE_SIZE_BYTES):
            return None
        magic, version, _flags, seq, capacity, trim, node_id, epoch, _res, _crc = (
            _STATE.unpack_from(raw)
        )
        if magic != STATE_MAGIC or version != FORMAT_VERSION or trim < 0:
            return None
        return cls(seq, capacity, trim, node_id, epoch)

    @property
    def slot_position(self) -> int:
        """File position of the slot this state is written to."""
        return STATE_SLOT_POSITIONS[self.seq % 2]


def latest(slots: Sequence[Reservation | WALState | None]):
    """The valid slot with the highest ``seq``, or None when no slot is valid."""
    valid = [s for s in slots if s is not None]
    return max(valid, key=lambda s: s.seq) if valid else None
