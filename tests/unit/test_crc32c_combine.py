"""`crc32c_combine`: the CRC32C of a concatenation from its parts' CRCs must be exactly the
CRC32C of the bytes (the WAL and object checksums of produced batches are made with it)."""

from __future__ import annotations

import random

import crc32c
import pytest

from dataplane.formats.crc32c_combine import crc32c_combine


@pytest.mark.parametrize(
    "length_a, length_b",
    [
        (0, 0),
        (0, 1),
        (1, 0),
        (21, 1),
        (33, 32 * 1024),
        (7, 65_535),
        (61, 1 << 20),
        (5, 3_000_017),
        (33, (64 << 20) + 3),  # the largest payload a stream record carries, and then some
    ],
)
def test_the_combined_crc_is_the_crc_of_the_concatenation(length_a, length_b):
    rng = random.Random(length_a * 31 + length_b)
    a, b = rng.randbytes(length_a), rng.randbytes(length_b)
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_combining_piece_by_piece_gives_the_whole_runs_crc():
    rng = random.Random(7)
    pieces = [rng.randbytes(rng.randrange(0, 70_000)) for _ in range(40)]
    crc = 0
    for piece in pieces:
        crc = crc32c_combine(crc, crc32c.crc32c(piece), len(piece))
    assert crc == crc32c.crc32c(b"".join(pieces))


def _multiply(a: int, b: int) -> int:
    """zlib's multmodp, bit by bit, for the Castagnoli polynomial (the reference)."""
    product, bit = 0, 1 << 31
    while True:
        if a & bit:
            product ^= b
            if a & (bit - 1) == 0:
                return product
        bit >>= 1
        b = (b >> 1) ^ 0x82F63B78 if b & 1 else b >> 1


def _reference_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """zlib's crc32_combine: CRC(A) times x^(8 len(B)), plus CRC(B), one power at a time."""
    power, factor = 1 << 31, 1 << 30  # 1 and x
    exponent = 8 * length_b
    while exponent:
        if exponent & 1:
            power = _multiply(factor, power)
        factor = _multiply(factor, factor)
        exponent >>= 1
    return (_multiply(power, crc_a) if crc_a else 0) ^ crc_b


def test_the_combine_agrees_with_zlibs_method_over_every_length_bit():
    rng = random.Random(48)
    lengths = [1 << k for k in range(48)] + [rng.randrange(1 << 48) for _ in range(200)]
    for length in lengths:
        crc_a, crc_b = rng.getrandbits(32), rng.getrandbits(32)
        assert crc32c_combine(crc_a, crc_b, length) == _reference_combine(crc_a, crc_b, length)


def test_a_length_out_of_range_is_refused():
    with pytest.raises(ValueError, match="length_b"):
        crc32c_combine(0, 0, -1)
    with pytest.raises(ValueError, match="length_b"):
        crc32c_combine(0, 0, 1 << 48)
