"""WAL failover: this node recovers a failed node's WAL (seed 001, DESIGN.md "Crash failover").

The controller names this node the failover target of a fenced node's WAL, with a failover
epoch. `recover_failed_wal`:

1. takes the WAL over with the reservation (this node, failover epoch), durable *before*
   any record is read: the failed node, if only paused, can no longer acknowledge appends;
2. reads the valid records (stopping at a torn tail) and keeps, per stream, the batches the
   controller has not committed yet — only for streams the failed node still owns with the
   batch's epoch (the rule is `recovery.UncommittedBatches`, shared with the engine);
3. uploads them in objects of at most `max_object_bytes`, committed on the failed node's
   behalf (`failover_node_id`), so its streams end where its acknowledged records end. A
   stream the controller refuses for good meanwhile (deleted, reopened by a newer epoch) is
   left out of the commit and skipped from then on; the other streams are committed;
4. closes every stream the failed node still has open (on its behalf), trims the WAL and
   tells the controller the failover is complete. The partitions' new leaders then open
   the streams with the next epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from controlplane.errors import ControllerError, ErrorCode
from controlplane.requests import CloseStreamRequest, CompleteWALFailoverRequest
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream.recovery import LinkResolution, UncommittedBatches
from dataplane.s3stream.storage import S3Storage
from dataplane.s3stream.wal.factory import (
    UnsupportedWALError,
    WALRecovery,
    take_over_wal,
    wal_exists,
)

log = logging.getLogger(__name__)

CLOSE_WORKERS = 8  # the failed node's streams closed on the controller at once


class FailoverError(RuntimeError):
    """The failed node's WAL cannot be recovered here (unsupported URI, unreadable file)."""


@dataclass
class FailoverResult:
    """What one WAL failover did (logged, and returned to tests)."""

    failed_node_id: int
    failover_epoch: int
    records_read: int = 0
    batches_uploaded: int = 0
    bytes_uploaded: int = 0
    streams_closed: list[int] = field(default_factory=list)
    skipped_streams: dict[int, str] = field(default_factory=dict)
    # acknowledged offsets a corrupt WAL took: stream id -> (first, end)
    lost_offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    duration_s: float = 0.0
    # seconds per step, logged with the result: where a slow failover spent its time
    step_s: dict[str, float] = field(default_factory=dict)

    def step_done(self, step: str, since: float) -> float:
        """Record `step` as taking from `since` (monotonic) until now; returns now."""
        now = time.monotonic()
        self.step_s[step] = round(now - since, 3)
        return now


def recover_failed_wal(
    storage: S3Storage,
    failed_node_id: int,
    wal_uri: str,
    failover_epoch: int,
    open_streams_of_failed_node: Callable[[], list[tuple[int, int]]],
) -> FailoverResult:
    """Recover `failed_node_id`'s WAL on this node (see the module docstring).

    `open_streams_of_failed_node()` returns (stream_id, epoch) of the streams the failed
    node still owns open (from this node's metadata image, which has seen the failover).
    Raises ControllerError when the controller refuses (e.g. NOT_FAILOVER_TARGET once the
    failover moved to another node); the caller retries transient failures.
    """
    started = time.monotonic()
    result = FailoverResult(failed_node_id, failover_epoch)
    try:
        exists = wal_exists(wal_uri, objects=storage.objects)
    except UnsupportedWALError as exc:
        raise FailoverError(f"cannot recover the WAL of node {failed_node_id}: {exc}") from None
    mark = result.step_done("exists", started)
    if exists:
        handle = take_over_wal(wal_uri, storage.node_id, failover_epoch, objects=storage.objects)
        mark = result.step_done("take_over", mark)
        try:
            end = _upload_uncommitted(storage, handle, failed_node_id, result)
            mark = result.step_done("upload", mark)
            if end is not None:
                handle.trim(end)
        finally:
            handle.close()
        mark = result.step_done("trim", mark)
    else:
        log.warning("WAL %s of node %d does not exist: nothing to upload", wal_uri, failed_node_id)
    result.streams_closed += _close_streams(storage, failed_node_id, open_streams_of_failed_node())
    mark = result.step_done("close_streams", mark)
    storage.controller.complete_wal_failover(
        CompleteWALFailoverRequest(
            node_id=storage.node_id,
            node_epoch=storage.node_epoch,
            failed_node_id=failed_node_id,
            failover_epoch=failover_epoch,
        )
    )
    result.step_done("complete", mark)
    result.duration_s = time.monotonic() - started
    log.warning(
        "WAL failover of node %d done in %.2fs: %d records read, %d batches "
        "(%d bytes) uploaded, %d streams closed, skipped %s, lost %s; steps (s) %s",
        failed_node_id,
        result.duration_s,
        result.records_read,
        result.batches_uploaded,
        result.bytes_uploaded,
        len(result.streams_closed),
        result.skipped_streams,
        result.lost_offsets or "nothing",
        result.step_s,
    )
    return result


def _close_streams(
    storage: S3Storage, failed_node_id: int, streams: list[tuple[int, int]]
) -> list[int]:
    """Close the failed node's streams (id, epoch) on the controller, CLOSE_WORKERS at a
    time: their closes land together, so the brokers that take the partitions over see
    them in one metadata delta and open them in one pass (one by one, each close was a
    delta and each pass waited for the slowest open of the last). The ids closed here;
    raises the first unexpected refusal."""

    def close(stream: tuple[int, int]) -> int | None:
        stream_id, epoch = stream
        try:
            storage.controller.close_stream(
                CloseStreamRequest(
                    node_id=storage.node_id,
                    node_epoch=storage.node_epoch,
                    stream_id=stream_id,
                    stream_epoch=epoch,
                    failover_node_id=failed_node_id,
                )
            )
        except ControllerError as exc:
            if exc.code not in (
                ErrorCode.STREAM_FENCED,
                ErrorCode.STREAM_NOT_OPENED,
                ErrorCode.UNKNOWN_STREAM,
            ):
                raise
            return None  # closed or reopened meanwhile
        return stream_id

    if not streams:
        return []
    pool = ThreadPoolExecutor(min(CLOSE_WORKERS, len(streams)), thread_name_prefix="failover-close")
    try:
        closes = [pool.submit(close, stream) for stream in streams]
        closed = [future.result() for future in closes]
    finally:
        # after a refusal (or no controller answering) the closes not started are dropped:
        # the failover's retry closes what is still open, one controller timeout later
        pool.shutdown(wait=True, cancel_futures=True)
    return [stream_id for stream_id in closed if stream_id is not None]


def _upload_uncommitted(
    storage: S3Storage, handle: WALRecovery, failed_node_id: int, result: FailoverResult
) -> int | None:
    """Upload the records not committed yet (the rule is `recovery.UncommittedBatches`), in
    chunks; returns the WAL offset to trim to."""
    uncommitted = UncommittedBatches(failed_node_id, storage.controller.stream)
    end: int | None = None
    max_bytes = storage.config.max_object_bytes
    try:
        # only what is uploaded here needs its data: the links of committed batches may
        # point at data already trimmed. The last chunk's links resolve while the loss
        # search (after the last record) reads the rest of the ring.
        with LinkResolution(storage.resolve_link) as kept:
            for rec in handle.recover():
                result.records_read += 1
                end = rec.next_offset
                batch, _ = StreamRecordBatch.decode(rec.data)
                if not uncommitted.accept(batch):
                    continue
                kept.add(batch)
                if kept.pending_bytes >= max_bytes:
                    _flush(storage, kept.take(), failed_node_id, result, uncommitted)
            if kept.pending_bytes:
                _flush(storage, kept.take(), failed_node_id, result, uncommitted)
        result.lost_offsets = uncommitted.name_lost(
            handle.scan_loss, f"failover of node {failed_node_id} by node {storage.node_id}"
        )
    finally:
        result.skipped_streams.update(uncommitted.skipped)
    return end


def _flush(
    storage: S3Storage,
    chunk: list[StreamRecordBatch],
    failed_node_id: int,
    result: FailoverResult,
    uncommitted: UncommittedBatches,
) -> None:
    """Upload one chunk. A stream the controller refused for good (deleted, closed or
    reopened by a newer epoch) is skipped from now on: its later batches could not be
    committed either. After a continuity refusal the stream's target is read again, so its
    later batches still go up if they continue the committed end (it had moved past this
    chunk: nothing lost), and are reported as unrecoverable if they do not."""
    started = time.monotonic()
    uploaded = storage.uploader.upload(chunk, failover_node_id=failed_node_id)
    # the part of the upload step spent writing and committing objects (the rest: reading)
    result.step_s["put_commit"] = round(
        result.step_s.get("put_commit", 0.0) + time.monotonic() - started, 3
    )
    result.bytes_uploaded += uploaded.size_bytes
    result.batches_uploaded += uploaded.batches
    for sid, code in uploaded.dropped.items():
        log.warning(
            "WAL failover of node %d: stream %d left out of the upload (%s)",
            failed_node_id,
            sid,
            code.value,
        )
        if code in (ErrorCode.STREAM_OFFSET_GAP, ErrorCode.INVALID_OFFSET):
            uncommitted.reread(sid)
            continue
        uncommitted.skip(sid, f"refused by the controller: {code.value}")


__all__ = ["FailoverError", "FailoverResult", "recover_failed_wal"]
