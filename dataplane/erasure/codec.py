"""Reed-Solomon coding of one payload into k data + m parity blocks, with zfec.

No Galois field arithmetic here: zfec does it. The payload is padded to k equal blocks
(zfec needs equal lengths); the payload length travels in each shard's header so the
decoder can strip the padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import zfec

DEFAULT_DATA_SHARDS = 4
DEFAULT_PARITY_SHARDS = 2
MAX_TOTAL_SHARDS = 32


class CodecError(ValueError):
    """Blocks that cannot be decoded (too few, or inconsistent lengths)."""


class ErasureCodec:
    """RS(k, m): encodes a payload into k + m blocks, decodes from any k of them.

    Thread-safe: zfec's Encoder/Decoder hold no per-call state (the instances are reused).
    """

    def __init__(
        self, data_shards: int = DEFAULT_DATA_SHARDS, parity_shards: int = DEFAULT_PARITY_SHARDS
    ):
        if data_shards < 1 or parity_shards < 0 or data_shards + parity_shards > MAX_TOTAL_SHARDS:
            raise ValueError(
                f"invalid erasure code: {data_shards} data + {parity_shards} parity shards "
                f"(need >= 1 data shard, >= 0 parity, <= {MAX_TOTAL_SHARDS} in all)"
            )
        self.data_shards = data_shards
        self.parity_shards = parity_shards
        self.total_shards = data_shards + parity_shards
        self._encoder = zfec.Encoder(data_shards, self.total_shards)
        self._decoder = zfec.Decoder(data_shards, self.total_shards)

    def block_length(self, payload_length: int) -> int:
        """Length of each block for a payload (at least 1 byte: zfec refuses empty blocks)."""
        return max(1, -(-payload_length // self.data_shards))

    def encode(self, payload: bytes) -> list[bytes]:
        """The k + m blocks of `payload`, block i for shard i."""
        size = self.block_length(len(payload))
        padded = payload.ljust(size * self.data_shards, b"\0")
        primary = tuple(padded[i * size : (i + 1) * size] for i in range(self.data_shards))
        return [bytes(b) for b in self._encoder.encode(primary)]

    def decode(self, blocks: Sequence[tuple[int, bytes]], payload_length: int) -> bytes:
        """The payload from any k (index, block) pairs with distinct indexes."""
        chosen: dict[int, bytes] = {}
        for index, block in blocks:
            if not 0 <= index < self.total_shards:
                raise CodecError(f"shard index {index} outside 0..{self.total_shards - 1}")
            chosen.setdefault(index, block)
            if len(chosen) == self.data_shards:
                break
        if len(chosen) < self.data_shards:
            raise CodecError(
                f"need {self.data_shards} distinct shards to decode, have {len(chosen)}"
            )
        size = self.block_length(payload_length)
        if any(len(b) != size for b in chosen.values()):
            raise CodecError(f"blocks must all be {size} bytes for a {payload_length}-byte payload")
        nums = tuple(sorted(chosen))
        primary = self._decoder.decode(tuple(chosen[i] for i in nums), nums)
        return b"".join(bytes(b) for b in primary)[:payload_length]
