"""What in a WAL is uncommitted: the one rule for the engine's restart and for WAL failover.

A WAL holds the acknowledged batches of a node's streams in WAL order; some of them were
already uploaded and committed. Recovery re-uploads only the rest. The rule, stream by
stream (the stream's committed metadata comes from the controller):

* a stream the controller no longer knows was deleted: nothing of it is kept;
* a stream not open, or open on another node than the WAL's writer, was closed (its
  acknowledged records were uploaded before it was closed) or moved on: nothing is kept;
* a batch of another epoch than the stream's open one is not the writer's to commit;
* a batch ending at or below the committed end was committed already;
* the first batch kept must start exactly at the committed end, and each next one where
  the previous ended; a batch that does not cannot be committed, so the stream's later
  records cannot be recovered (logged, with the reason).

`UncommittedBatches` applies it batch by batch in WAL order; the engine
(`S3Storage.start`) uses it for its own WAL, `wal_failover.recover_failed_wal` for a failed
node's WAL. Both resolve the Link Records they keep with `LinkResolution`, several at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from controlplane.errors import ControllerError, ErrorCode
from dataplane.formats.link_record import resolved_size_bytes
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream.wal.loss import WALLoss, report_gone_offsets

__all__ = [
    "LINK_RESOLVE_WORKERS",
    "LinkResolution",
    "StreamTarget",
    "UncommittedBatches",
    "resolve_all",
    "stream_target",
]

log = logging.getLogger(__name__)

StreamMetadata = Callable[[int], dict]
"""The controller's metadata of a stream id (`ControllerCalls.stream`); raises
ControllerError UNKNOWN_STREAM for a deleted one."""


@dataclass(slots=True)
class StreamTarget:
    """Where a stream's recovered batches must continue: its open epoch and the end of
    what is committed (or accepted for upload so far)."""

    epoch: int
    end_offset: int


def stream_target(meta: dict, writer_node_id: int) -> StreamTarget | None:
    """The target of a stream whose committed metadata is `meta`, None when nothing of the
    WAL's writer `writer_node_id` may be committed to it (closed, or open on another node)."""
    if meta.get("state") != "opened" or meta.get("node_id") != writer_node_id:
        return None
    return StreamTarget(int(meta["epoch"]), int(meta["end_offset"]))


class UncommittedBatches:
    """Picks, in WAL order, the recovered batches that must be re-uploaded (module docstring).

    `skipped` maps the streams whose later records cannot be recovered (or that were
    deleted) to the reason. Not thread-safe: one recovery uses it on one thread.
    """

    def __init__(self, writer_node_id: int, stream_metadata: StreamMetadata) -> None:
        self._writer_node_id = writer_node_id
        self._stream_metadata = stream_metadata
        self._targets: dict[int, StreamTarget | None] = {}
        self.skipped: dict[int, str] = {}

    def accept(self, batch: StreamRecordBatch) -> bool:
        """Whether `batch` (the next one in WAL order) must be re-uploaded. Accepting it
        moves its stream's target to the batch's end."""
        sid = batch.stream_id
        if sid not in self._targets:
            self._targets[sid] = self._read_target(sid)
        target = self._targets[sid]
        if target is None or batch.epoch != target.epoch or batch.last_offset <= target.end_offset:
            return False  # committed already, another epoch, or not the writer's stream
        if batch.base_offset != target.end_offset:
            self.skip(
                sid, f"WAL resumes at {batch.base_offset}, committed end is {target.end_offset}"
            )
            log.error(
                "stream %d: %s; its later records cannot be recovered", sid, self.skipped[sid]
            )
            return False
        target.end_offset = batch.last_offset
        return True

    def name_lost(self, loss: WALLoss | None, context: str) -> dict[int, tuple[int, int]]:
        """Once every recovered batch was offered: per stream, the acknowledged offsets that
        `loss` (records a WAL scan cut off) took and nothing committed covers, ``(first,
        end)``; reported as an ERROR and for `cluster status` (`wal.loss`)."""
        if loss is None:
            return {}
        gone: dict[int, tuple[int, int]] = {}
        for sid, (first, end) in sorted(loss.streams.items()):
            if sid not in self._targets:
                self._targets[sid] = self._read_target(sid)
            target = self._targets[sid]
            if target is not None and end > target.end_offset:
                gone[sid] = (max(first, target.end_offset), end)
        if gone:
            report_gone_offsets(context, gone)
        return gone

    def reread(self, stream_id: int) -> None:
        """Ask the controller for `stream_id`'s committed end again (after an upload was
        refused for continuity: the stream may have moved past what was sent)."""
        self._targets[stream_id] = self._read_target(stream_id)

    def skip(self, stream_id: int, reason: str) -> None:
        """Keep nothing more of `stream_id` (its later batches could not be committed)."""
        self.skipped[stream_id] = reason
        self._targets[stream_id] = None

    def _read_target(self, stream_id: int) -> StreamTarget | None:
        try:
            meta = self._stream_metadata(stream_id)
        except ControllerError as exc:
            if exc.code == ErrorCode.UNKNOWN_STREAM:
                self.skipped[stream_id] = "deleted"
                return None
            raise
        return stream_target(meta, self._writer_node_id)


LINK_RESOLVE_WORKERS = 4
"""Link Records resolved at once by one recovery: each is a GET of a RouterChannel object
(tens of ms on a busy store), so a failover of a zone-routed broker resolved one by one
took seconds before its partitions could move."""


class LinkResolution:
    """The kept batches of a recovery in WAL order, their Link Records resolved (the data
    read from the RouterChannel they point at, `resolve_link`) on up to `workers` threads
    while the caller reads the WAL on. `take()` returns what was added, resolved, in
    order. A context manager: leaving it cancels what was not started and waits for the
    rest. Not thread-safe: one recovering thread adds and takes; the workers only run
    `resolve_link`, which must be thread-safe."""

    def __init__(
        self,
        resolve_link: Callable[[StreamRecordBatch], StreamRecordBatch],
        workers: int = LINK_RESOLVE_WORKERS,
    ) -> None:
        self._resolve_link = resolve_link
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="resolve-links")
        self._pending: list[StreamRecordBatch | Future[StreamRecordBatch]] = []
        self.pending_bytes = 0
        """The resolved size of what was added and not taken yet (a link's target size)."""

    def add(self, batch: StreamRecordBatch) -> None:
        """Keep `batch`; a Link Record starts resolving now."""
        if batch.is_link:
            self._pending.append(self._pool.submit(self._resolve_link, batch))
            self.pending_bytes += resolved_size_bytes(batch)
        else:
            self._pending.append(batch)
            self.pending_bytes += batch.size_bytes

    def take(self) -> list[StreamRecordBatch]:
        """Everything added since the last take, resolved, in the order added. Raises what
        resolving a link raised (WALTrimmedError, ValueError, a store error)."""
        pending, self._pending, self.pending_bytes = self._pending, [], 0
        return [item.result() if isinstance(item, Future) else item for item in pending]

    def __enter__(self) -> LinkResolution:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def resolve_all(
    resolve_link: Callable[[StreamRecordBatch], StreamRecordBatch],
    batches: list[StreamRecordBatch],
) -> list[StreamRecordBatch]:
    """`batches` with their Link Records resolved, several at once (`LinkResolution`)."""
    with LinkResolution(resolve_link) as resolution:
        for batch in batches:
            resolution.add(batch)
        return resolution.take()
