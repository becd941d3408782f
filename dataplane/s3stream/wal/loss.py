"""Naming what a file-WAL scan cut off: torn tail (harmless) or corruption (acked data lost).

A scan of the ring (`ring.RecordScanner`) stops at the first record that does not validate.
Two very different things look alike there:

* a **torn tail**: the last writes before a crash never became durable. Only batches that were
  still in flight can be torn, and at most ``PIPELINE_DEPTH`` batches (each at most the
  owner's ``max_batch_bytes`` plus its padding record) are written but not yet acknowledged
  at any time (one since the FileWAL commits on one thread; two before 2026-11-29), so
  whatever a torn tail left behind lies within that *in-flight window* after the last
  valid record. Nothing in it was acknowledged. Harmless.
* **corruption in the middle**: bytes of an acknowledged record were damaged later (a bad
  sector, a stray write). The records written after it are still intact on disk, but the
  chain is broken, so the scan drops them all.

The rule (`find_loss`): after the scan stopped at offset S, search forward for a record
header of the *current lap* (magic, header CRC and ``body_offset == its own offset + 24``;
a header of an earlier lap of the ring ends the search: the current lap was written no
further) and follow the valid chain from there, again and again up to the window end.
No valid record after S (zeros, garbage, an earlier lap): a torn tail, nothing is reported.
Valid records after S: a loss, reported. A kill -9 never tears a write (what was written is
in the page cache), so after a process crash the only way to valid records past a break is
damage to written bytes. After a power loss, pages of the unsynced writes may reach the disk
out of order; when every lost record lies within the in-flight window after S, the report
says so (they may not have been acknowledged).

Both the restart and a failover zero the lost range once it is reported, so a later scan
neither reports it again nor chains into those stale records from new ones.

`report_loss` logs the loss as an ERROR (byte range, records, streams and their stream
offsets), counts it in ``automq_wal_corrupt_records_total`` / ``..._bytes_total`` and keeps a
one-line description for the broker's heartbeat (`recent_losses`), which
`automqctl cluster status` shows as a problem. Thread-safe: the report list has a lock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream.wal import metrics
from dataplane.s3stream.wal.base import WALLoss
from dataplane.s3stream.wal.format import (
    MAX_ALIGN_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_MAGIC,
    decode_record_header,
)
from dataplane.s3stream.wal.ring import RecordScanner, Ring

__all__ = [
    "PIPELINE_DEPTH",
    "WALLoss",
    "find_loss",
    "in_flight_window_bytes",
    "recent_losses",
    "report_gone_offsets",
    "report_loss",
]

log = logging.getLogger(__name__)

PIPELINE_DEPTH = 2
"""At most ``PIPELINE_DEPTH x max_batch_bytes`` (padding included) are written but not yet
fsynced-and-checked at any time: the zeroing on open, the fencing bound and the torn-tail
rule rely on it. The FileWAL's committer keeps one batch unchecked; the bound stays two, the
pipelined writer's before 2026-11-29, so files it wrote recover the same."""

MAX_REPORTS_KEPT = 8
MAX_REPORT_CHARS = 400
MAX_STREAMS_NAMED = 20  # as WALLoss.describe names at most this many
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "big")
_MAGIC_FIRST_BYTE = _MAGIC_BYTES[:1]
# few large reads: a failover runs the search in a busy broker, where every read gives up
# the GIL and waits up to a switch interval to get it back (64 x 1 MiB took 0.4-0.8 s
# there, 0.07 s in a quiet process)
_SEARCH_CHUNK_BYTES = 8 * 1024 * 1024


def in_flight_window_bytes(max_batch_bytes: int) -> int:
    """How far past the last valid record a torn (unacknowledged) batch can reach."""
    return PIPELINE_DEPTH * (max_batch_bytes + MAX_ALIGN_BYTES + RECORD_HEADER_SIZE_BYTES)


def find_loss(
    ring: Ring,
    wal: str,
    stop_offset: int,
    limit: int,
    in_flight_bytes: int,
    stop_reason: str,
    chunk_bytes: int = _SEARCH_CHUNK_BYTES,
) -> WALLoss | None:
    """The records a scan that stopped at ``stop_offset`` cut off (module docstring), None
    for a torn tail. ``limit`` is the end of the scan window (trim offset + capacity)."""
    loss = WALLoss(wal, stop_offset, stop_offset, 0, stop_reason)
    # the ranges that may hold a record, taken before this search reads anything
    extents = ring.data_extents(stop_offset, limit) if stop_offset < limit else []
    pos = stop_offset
    while True:
        found = _next_current_header(ring, pos + 1, limit, chunk_bytes, extents)
        if found is None:
            break
        scanner = RecordScanner(ring, found, stop_at=limit, chunk_bytes=chunk_bytes)
        for _offset, body in scanner:
            loss.records += 1
            _note_stream(loss.streams, body)
        if scanner.end_offset > found:
            loss.end_offset = scanner.end_offset
        pos = max(found, scanner.end_offset)
    if loss.records == 0:
        return None  # a torn tail: no valid record after the stop
    loss.within_in_flight_window = loss.end_offset <= stop_offset + in_flight_bytes
    return loss


def _next_current_header(
    ring: Ring, start: int, limit: int, chunk_bytes: int, extents: list[tuple[int, int]]
) -> int | None:
    """Offset of the first record header of the current lap in ``[start, limit)``; None when
    there is none or a header of an earlier lap comes first (the current lap ends there).
    Only ``extents`` are read: the rest is zeros, which hold no magic."""
    for extent_start, extent_end in extents:
        if extent_end <= start:
            continue
        pos = max(start, extent_start)
        end = min(extent_end, limit)
        while pos + RECORD_HEADER_SIZE_BYTES <= end:
            size = min(chunk_bytes, end - pos)
            chunk = ring.read(pos, size)
            at = _find_magic(chunk, 0)
            while at >= 0:
                offset = pos + at
                if offset + RECORD_HEADER_SIZE_BYTES > limit:
                    return None
                raw = chunk[at : at + RECORD_HEADER_SIZE_BYTES]
                if len(raw) < RECORD_HEADER_SIZE_BYTES:
                    raw = ring.read(offset, RECORD_HEADER_SIZE_BYTES)
                header = decode_record_header(raw)
                if header is not None:
                    if header.record_offset == offset:
                        return offset
                    return None  # a valid header of another lap: the current lap ended before it
                at = _find_magic(chunk, at + 1)
            if pos + size >= end or size <= 3:
                break  # zeros follow the extent: no magic is split across its end
            pos += size - 3  # a magic split across chunks is found in the next one
    return None


def _find_magic(chunk: bytes, start: int) -> int:
    """`chunk.find` of the record magic from `start`. A chunk without the magic's first
    byte, such as the zeros that fill the rest of a ring, is passed over by one memchr
    (0.2 ms per 8 MiB; the 4-byte search takes 5 ms, holding the GIL)."""
    first = chunk.find(_MAGIC_FIRST_BYTE, start)
    return first if first < 0 else chunk.find(_MAGIC_BYTES, first)


def _note_stream(streams: dict[int, tuple[int, int]], body: bytes) -> None:
    try:
        batch, _ = StreamRecordBatch.decode(body)
    except Exception:  # a record of another format: counted, not named
        return
    first, end = batch.base_offset, batch.last_offset
    known = streams.get(batch.stream_id)
    streams[batch.stream_id] = (
        (first, end) if known is None else (min(known[0], first), max(known[1], end))
    )


_reports: deque[str] = deque(maxlen=MAX_REPORTS_KEPT)
_reports_lock = threading.Lock()


def report_loss(loss: WALLoss, context: str) -> None:
    """Log `loss` as an ERROR, count it in the metrics and keep it for `recent_losses`.
    ``context`` says who scanned (e.g. "restart of node 1", "failover of node 3")."""
    text = f"{context}: {loss.describe()}"
    with _reports_lock:
        if text[:MAX_REPORT_CHARS] in _reports:
            return  # the same scan again (a retried failover): named and counted already
        _reports.append(text[:MAX_REPORT_CHARS])
    log.error(
        "%s. The acknowledged records in this range that were not uploaded yet are gone; "
        "their partitions continue from the last record before it",
        text,
    )
    metrics.CORRUPT_RECORDS.inc(loss.records)
    metrics.CORRUPT_BYTES.inc(loss.size_bytes)


def report_gone_offsets(context: str, gone: dict[int, tuple[int, int]]) -> None:
    """Log the acknowledged stream offsets a loss took (those not committed to object storage:
    `recovery.UncommittedBatches.name_lost`) and keep the line for `recent_losses`."""
    named = sorted(gone.items())[:MAX_STREAMS_NAMED]
    text = f"{context}: acknowledged offsets gone: " + ", ".join(
        f"stream {sid} [{a}, {b})" for sid, (a, b) in named
    )
    if len(gone) > len(named):
        text += f" and {len(gone) - len(named)} more streams"
    log.error("%s; the streams continue at the first offset of each range", text)
    with _reports_lock:
        if text[:MAX_REPORT_CHARS] not in _reports:
            _reports.append(text[:MAX_REPORT_CHARS])


def recent_losses() -> list[str]:
    """The last losses this process found (at most MAX_REPORTS_KEPT, oldest first)."""
    with _reports_lock:
        return list(_reports)
