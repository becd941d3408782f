"""The bytes of one hole: a shard frame or the junk marker (pure, no I/O).

Shard frame, big-endian:
    magic "ECS1" | writer_id u64 | stream_id u64 | offset i64 | shard_index u8 | k u8 | m u8 |
    reserved u8 | payload_length u32 | payload_crc u32 | block_length u32 | frame_crc u32 |
    block
frame_crc is CRC32C over every byte before it and the block; payload_crc is CRC32C of the
decoded payload, so readers only group shards of the same write (same writer id and payload
checksum) and can check the decoded result.

The junk marker is the 4 bytes "ECJ1": a reader wrote it into an empty hole (write-once), so
no shard can land there any more.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

SHARD_MAGIC = b"ECS1"
JUNK_MARKER = b"ECJ1"
_HEADER = struct.Struct(">4sQQqBBBBIII")
_CRC = struct.Struct(">I")
HEADER_BYTES = _HEADER.size + _CRC.size
MAX_BLOCK_BYTES = 16 * 1024 * 1024


class ShardFormatError(ValueError):
    """Bytes that are not a valid shard frame (bad magic, truncated, bad checksum)."""


@dataclass(frozen=True)
class ShardHead:
    """A shard frame's header, unchecked (`peek_head`); a `Shard` is one with its block."""

    writer_id: int
    stream_id: int
    offset: int
    shard_index: int
    data_shards: int
    parity_shards: int
    payload_length: int
    payload_crc: int

    @property
    def write_key(self) -> tuple[int, int, int, int, int]:
        """Shards with equal keys belong to the same write and can be decoded together."""
        return (
            self.writer_id,
            self.payload_crc,
            self.payload_length,
            self.data_shards,
            self.parity_shards,
        )


@dataclass(frozen=True)
class Shard(ShardHead):
    """One coded block of one write, with the header that binds it to its hole."""

    block: bytes


def encode_shard(shard: Shard) -> bytes:
    """The frame of a shard."""
    if len(shard.block) > MAX_BLOCK_BYTES:
        raise ShardFormatError(f"block of {len(shard.block)} bytes exceeds {MAX_BLOCK_BYTES}")
    head = _HEADER.pack(
        SHARD_MAGIC,
        shard.writer_id,
        shard.stream_id,
        shard.offset,
        shard.shard_index,
        shard.data_shards,
        shard.parity_shards,
        0,
        shard.payload_length,
        shard.payload_crc,
        len(shard.block),
    )
    crc = crc32c.crc32c(shard.block, crc32c.crc32c(head))
    return head + _CRC.pack(crc) + shard.block


def decode_shard(frame: bytes) -> Shard:
    """The shard in a frame; raises ShardFormatError for anything that is not a valid frame."""
    if len(frame) < HEADER_BYTES:
        raise ShardFormatError(f"shard frame of {len(frame)} bytes is shorter than its header")
    (
        magic,
        writer_id,
        stream_id,
        offset,
        index,
        k,
        m,
        _res,
        payload_length,
        payload_crc,
        block_length,
    ) = _HEADER.unpack_from(frame)
    if magic != SHARD_MAGIC:
        raise ShardFormatError(f"bad shard magic {magic!r}")
    if len(frame) != HEADER_BYTES + block_length:
        raise ShardFormatError(
            f"shard frame is {len(frame)} bytes, header says {HEADER_BYTES + block_length}"
        )
    (crc,) = _CRC.unpack_from(frame, _HEADER.size)
    block = frame[HEADER_BYTES:]
    if crc32c.crc32c(block, crc32c.crc32c(frame[: _HEADER.size])) != crc:
        raise ShardFormatError("shard checksum mismatch")
    if k < 1 or index >= k + m:
        raise ShardFormatError(f"shard index {index} outside a {k}+{m} code")
    return Shard(
        writer_id, stream_id, offset, index, k, m, payload_length, payload_crc, bytes(block)
    )


def peek_payload_crc(frame: bytes) -> int | None:
    """The payload CRC a shard frame's header names, without checking the frame (None: not
    a shard). Only for finding candidates: whoever uses one decodes and checks it."""
    if len(frame) < _HEADER.size or frame[:4] != SHARD_MAGIC:
        return None
    return _HEADER.unpack_from(frame)[9]


def peek_head(frame: bytes) -> ShardHead | None:
    """The header of a shard frame (or of its first HEADER_BYTES), without checking the
    frame (None: not a shard). For listing candidates only: whoever uses one reads the whole
    frame and checks it."""
    if len(frame) < _HEADER.size or frame[:4] != SHARD_MAGIC:
        return None
    _, writer_id, stream_id, offset, index, k, m, _, length, crc, _ = _HEADER.unpack_from(frame)
    return ShardHead(writer_id, stream_id, offset, index, k, m, length, crc)


def is_junk(frame: bytes) -> bool:
    """Whether a hole's bytes are the junk marker."""
    return frame == JUNK_MARKER


def payload_checksum(payload: bytes) -> int:
    """The CRC32C a write's shards carry for its payload."""
    return crc32c.crc32c(payload)
