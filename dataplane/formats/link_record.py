"""Link Records (seed 000): what a main's WAL (the ConfirmWAL) keeps of routed data.

A main that appends a batch a proxy wrote to its RouterChannel persists, instead of the
data, a `StreamRecordBatch` with a negative count (a Link Record, `formats/stream_records.py`)
whose payload points at the data::

    magic u8 0x4C | source node i32 | channel offset i64 | position u32 | length u32 |
    timestamp ms i64

(`position`, `length`: the Kafka batch's bytes inside the channel record, which holds the
produce request's whole partition data.) The header's base offset and epoch are the
partition offset and leader epoch; resolving re-patches them into the channel's bytes, so
the result is byte for byte the batch the main appended. Pure (no I/O).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from dataplane.formats.record_batch import patch_batch
from dataplane.formats.stream_records import HEADER_SIZE_BYTES, StreamRecordBatch

LINK_MAGIC = 0x4C
_FORMAT = struct.Struct(">BiqIIq")
LINK_PAYLOAD_BYTES = _FORMAT.size


@dataclass(frozen=True, slots=True)
class LinkRecord:
    source_node_id: int
    channel_offset: int
    position: int
    length: int
    timestamp_ms: int

    def encode(self) -> bytes:
        return _FORMAT.pack(
            LINK_MAGIC,
            self.source_node_id,
            self.channel_offset,
            self.position,
            self.length,
            self.timestamp_ms,
        )

    @classmethod
    def decode(cls, payload: bytes) -> LinkRecord:
        """Raises ValueError on anything but a well-formed link payload."""
        if len(payload) != LINK_PAYLOAD_BYTES or payload[0] != LINK_MAGIC:
            raise ValueError(f"not a link record payload ({len(payload)} bytes)")
        _, source, offset, position, length, ts = _FORMAT.unpack(payload)
        if source < 0 or offset < 0 or length <= 0:
            raise ValueError(f"invalid link record: node {source} offset {offset} length {length}")
        return cls(source, offset, position, length, ts)


def resolve(link_batch: StreamRecordBatch, channel_record: bytes) -> StreamRecordBatch:
    """The data batch a Link Record stands for, from its channel record's bytes.

    Raises ValueError when the channel record does not hold the batch the link describes.
    """
    link = LinkRecord.decode(link_batch.payload)
    end = link.position + link.length
    if end > len(channel_record):
        raise ValueError(
            f"link to {link.position}+{link.length} past the channel record "
            f"({len(channel_record)} bytes) at {link.source_node_id}/{link.channel_offset}"
        )
    data = patch_batch(
        channel_record[link.position : end], link_batch.base_offset, link_batch.epoch
    )
    return StreamRecordBatch(
        link_batch.stream_id,
        link_batch.epoch,
        link_batch.base_offset,
        link_batch.record_count,
        data,
    )


def resolved_size_bytes(link_batch: StreamRecordBatch) -> int:
    """The encoded size of the data batch a Link Record stands for (`resolve`'s result),
    known without its data. Raises ValueError on a malformed link payload."""
    return HEADER_SIZE_BYTES + LinkRecord.decode(link_batch.payload).length
