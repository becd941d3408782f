"""RS(4,2) coding with zfec and the shard frame: any 4 good shards decode, a corrupt shard is
never used."""

from __future__ import annotations

import itertools
import os

import pytest

from dataplane.erasure.codec import CodecError, ErasureCodec
from dataplane.erasure.holes import HoleKind, classify
from dataplane.erasure.shard_format import (
    HEADER_BYTES,
    JUNK_MARKER,
    Shard,
    ShardFormatError,
    decode_shard,
    encode_shard,
    payload_checksum,
)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 1000, 65_537])
def test_any_four_of_six_blocks_decode(size: int) -> None:
    codec = ErasureCodec(4, 2)
    payload = os.urandom(size)
    blocks = codec.encode(payload)
    assert len(blocks) == 6 and len({len(b) for b in blocks}) == 1
    for chosen in itertools.combinations(range(6), 4):
        assert codec.decode([(i, blocks[i]) for i in chosen], size) == payload


def test_three_blocks_are_not_enough() -> None:
    codec = ErasureCodec(4, 2)
    blocks = codec.encode(b"x" * 100)
    with pytest.raises(CodecError, match="need 4 distinct shards"):
        codec.decode([(0, blocks[0]), (1, blocks[1]), (5, blocks[5]), (5, blocks[5])], 100)


def test_storage_is_one_and_a_half_times_the_payload() -> None:
    codec = ErasureCodec(4, 2)
    blocks = codec.encode(os.urandom(4096))
    assert sum(len(b) for b in blocks) == 4096 * 6 // 4


def test_invalid_code_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid erasure code"):
        ErasureCodec(0, 2)


def _shard(index: int = 2, block: bytes = b"abcdef") -> Shard:
    return Shard(
        writer_id=42,
        stream_id=7,
        offset=1_700_000_000_123_456_789,
        shard_index=index,
        data_shards=4,
        parity_shards=2,
        payload_length=21,
        payload_crc=payload_checksum(b"p"),
        block=block,
    )


def test_shard_frame_round_trips() -> None:
    shard = _shard()
    frame = encode_shard(shard)
    assert len(frame) == HEADER_BYTES + len(shard.block)
    assert decode_shard(frame) == shard


@pytest.mark.parametrize("position", [0, 5, 12, 30, HEADER_BYTES - 1, HEADER_BYTES, -1])
def test_any_flipped_byte_is_detected(position: int) -> None:
    frame = bytearray(encode_shard(_shard()))
    frame[position] ^= 0x40
    with pytest.raises(ShardFormatError):
        decode_shard(bytes(frame))
    assert classify(bytes(frame), 7, _shard().offset, 2).kind is HoleKind.CORRUPT


def test_truncated_frames_and_junk_are_not_shards() -> None:
    frame = encode_shard(_shard())
    for cut in (0, 10, HEADER_BYTES, len(frame) - 1):
        with pytest.raises(ShardFormatError):
            decode_shard(frame[:cut])
    assert classify(JUNK_MARKER, 7, 0, 0).kind is HoleKind.JUNK


def test_a_valid_shard_in_the_wrong_hole_is_corrupt() -> None:
    frame = encode_shard(_shard(index=2))
    offset = _shard().offset
    assert classify(frame, 7, offset, 2).kind is HoleKind.SHARD
    assert classify(frame, 7, offset, 3).kind is HoleKind.CORRUPT  # another hole
    assert classify(frame, 8, offset, 2).kind is HoleKind.CORRUPT  # another stream
    assert classify(frame, 7, offset + 1, 2).kind is HoleKind.CORRUPT  # another offset
