"""The executor side of a compaction run: one task writes one new object.

Runs inside Spark worker processes (`write_object` is the partition function's body): reads
the planned data blocks with ranged GETs (touching blocks in one GET), checks each block's
framing and CRC32C and copies its encoded batches without decoding them (only a block
holding the stream's start is decoded, to drop the batches below it), writes the object
in the project's format (`ObjectWriter`) and PUTs it under the id the driver prepared. Returns a descriptor
the driver commits (one naming the `source_gone` instead when a planned source object was
deleted since the plan); nothing here talks to the controller.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from dataplane.formats.object_format import (
    IndexEntry,
    ObjectWriter,
    check_block,
    decode_block,
)
from spark_jobs import objects_io
from spark_jobs.plan import ObjectTask

BLOCK_SIZE_BYTES = 512 * 1024
MAX_OBJECT_BYTES = 512 * 1024 * 1024


def write_object(
    task: ObjectTask, buckets: dict[int, str], source_buckets: dict[int, int], target_bucket_id: int
) -> dict:
    """Write `task`'s object; its descriptor (id, kind, size, ranges, bytes read, the
    seconds the task took)."""
    started = time.monotonic()
    by_source: dict[int, list[IndexEntry]] = defaultdict(list)
    for piece in task.pieces:
        for oid, entry in piece.blocks:
            by_source[oid].append(entry)
    gets = [
        (oid, start, end)
        for oid, entries in by_source.items()
        for start, end in objects_io.spans(entries)
    ]
    try:
        with ThreadPoolExecutor(objects_io.IO_THREADS) as pool:
            fetched = list(
                pool.map(
                    lambda g: objects_io.get_range(buckets[source_buckets[g[0]]], *g),
                    gets,
                )
            )
    except objects_io.SourceGoneError as exc:
        # the plan is stale: nothing is written, the driver refuses the run whole
        return {
            "object_id": task.object_id,
            "source_gone": exc.object_id,
            "size_bytes": 0,
            "bytes_read": 0,
            "task_s": time.monotonic() - started,
        }
    data: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for (oid, start, _), chunk in zip(gets, fetched, strict=True):
        data[oid].append((start, chunk))
    bytes_read = sum(len(c) for c in fetched)

    def block(oid: int, entry: IndexEntry) -> memoryview:
        for start, chunk in data[oid]:
            if start <= entry.position and entry.end_position <= start + len(chunk):
                return memoryview(chunk)[entry.position - start : entry.end_position - start]
        raise RuntimeError(f"block {entry} of object {oid} was not read")

    writer = ObjectWriter(BLOCK_SIZE_BYTES, MAX_OBJECT_BYTES)
    for piece in task.pieces:
        for oid, entry in piece.blocks:
            raw = block(oid, entry)
            if entry.start_offset >= piece.trim_offset:
                # wholly live: copied without decoding (framing and CRC32C checked)
                writer.add_encoded(entry, check_block(raw, entry))
                continue
            for batch in decode_block(raw, entry):  # straddles the stream's start: filter
                if batch.last_offset > piece.trim_offset:
                    writer.add(batch)
    obj = writer.finish()
    objects_io.put(buckets[target_bucket_id], task.object_id, obj.data)
    return {
        "object_id": task.object_id,
        "kind": task.kind,
        "size_bytes": obj.size_bytes,
        "ranges": [(r.stream_id, r.start_offset, r.end_offset) for r in obj.ranges],
        "bytes_read": bytes_read,
        "task_s": time.monotonic() - started,
    }
