"""How sealed erasure-coded records sit in a stream object (pure, no I/O).

A Kafka offset of an erasure-coded partition is the writer's clock in ns aligned to
2^16 (`SLOT_BITS`): a batch at offset o holds at most 2^16 records, o .. o + n - 1. In the
partition's stream (the object store's view) the batch lives at stream offset o >> 16, its
*slot*. Stream record batches have 32-bit counts and data blocks 32-bit offset spans, so
the ns gaps between sparse writes (seconds on a quiet partition) do not fit, but slots do:
2^31 slots are 2^47 ns, about 39 hours.

A sealed range [start, end) of slots is written contiguously, as the object format wants:
each Kafka batch (already patched with its Kafka offset) is one StreamRecordBatch at its
slot, covering the slots up to the next batch (at most 2^31 - 1 of them); gaps that are
longer, and the gap between `start` and the first batch, are covered by *fillers*:
StreamRecordBatches with an empty payload, which readers skip.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataplane.formats.stream_records import StreamRecordBatch

SLOT_BITS = 16
SLOT_SIZE = 1 << SLOT_BITS  # Kafka offsets per slot (the write alignment)
MAX_SLOTS_PER_BATCH = 2**31 - 1
SEAL_EPOCH = 0  # a leaderless stream has no writer epochs


def slot_of(kafka_offset: int) -> int:
    """The slot holding a Kafka offset (any offset of a batch maps to its batch's slot)."""
    return kafka_offset >> SLOT_BITS


def offset_of(slot: int) -> int:
    """The first Kafka offset of a slot."""
    return slot << SLOT_BITS


def _cover(stream_id: int, start: int, end: int, payload: bytes) -> list[StreamRecordBatch]:
    """Batches covering slots [start, end): the first carries `payload`, the rest fill."""
    out: list[StreamRecordBatch] = []
    position = start
    while position < end:
        count = min(end - position, MAX_SLOTS_PER_BATCH)
        out.append(
            StreamRecordBatch(stream_id, SEAL_EPOCH, position, count, payload if not out else b"")
        )
        position += count
    return out


def seal_batches(
    stream_id: int, start: int, end: int, records: Sequence[tuple[int, bytes]]
) -> list[StreamRecordBatch]:
    """The stream batches of sealed slots [start, end) holding `records`: (Kafka offset,
    Kafka batch patched with that offset), ascending, each offset aligned and inside the
    range. Raises ValueError otherwise."""
    if end <= start:
        raise ValueError(f"empty seal range [{start}, {end})")
    slots: list[tuple[int, bytes]] = []
    for offset, batch in records:
        slot = slot_of(offset)
        if offset != offset_of(slot) or not start <= slot < end:
            raise ValueError(f"offset {offset} is not an aligned offset of slots [{start}, {end})")
        if slots and slot <= slots[-1][0]:
            raise ValueError(f"offsets not ascending at {offset}")
        if not batch:
            raise ValueError(f"offset {offset}: empty batch")
        slots.append((slot, batch))
    out = (
        _cover(stream_id, start, slots[0][0], b"") if slots else _cover(stream_id, start, end, b"")
    )
    for i, (slot, batch) in enumerate(slots):
        following = slots[i + 1][0] if i + 1 < len(slots) else end
        out += _cover(stream_id, slot, following, batch)
    return out


def sealed_records(batches: Sequence[StreamRecordBatch]) -> list[tuple[int, bytes]]:
    """(Kafka offset, Kafka batch) of the data batches among sealed stream batches (fillers
    skipped)."""
    return [(offset_of(b.base_offset), b.payload) for b in batches if b.payload]
