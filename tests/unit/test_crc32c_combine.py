"""`crc32c_combine`: the CRC32C of a concatenation from its parts' CRCs must be exactly the
CRC32C of the bytes (the WAL and object checksums of produced batches are made with it)."""

from __future__ import annotations

import random

import crc32c
import pytest

from dataplane.formats.crc32c_combine import crc32c_combine


@pytest.mark.parametrize(
    "length_a, length_b",
    [(0, 0), (0, 1), (1, 0), (21, 1), (33, 32 * 1024), (7, 65_535), (61, 1 << 20), (5, 3_000_017)],
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


def test_a_length_out_of_range_is_refused():
    with pytest.raises(ValueError, match="length_b"):
        crc32c_combine(0, 0, -1)
    with pytest.raises(ValueError, match="length_b"):
        crc32c_combine(0, 0, 1 << 48)
