"""The object uploader: stream data -> objects in the object store -> committed metadata.

One upload path for everything that writes objects: the engine's uploads of its WAL, WAL
failover (uploading a failed node's WAL on its behalf) and, through the same class, jobs that
run without a broker. Each round is prepare (object ids from the controller) -> put (the
objects, in the active bucket) -> commit (one metadata command, atomic); transient failures
are retried with the same ids, and a commit refused for some streams only is rebuilt without
them (`permanent_stream_errors`), so one bad stream never holds back the others.

The rule "what is not committed yet" is the controller's: a stream's range is accepted only
where its committed end is, so nothing is committed twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from controlplane.calls import ControllerCalls
from controlplane.errors import (
    RETRIABLE_CODES,
    STREAM_PERMANENT_CODES,
    ControllerError,
    ErrorCode,
)
from controlplane.requests import CommitStreamSetObjectRequest
from dataplane.config import StorageConfig
from dataplane.formats.object_format import ObjectWriter
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import (
    ObjectBody,
    ObjectStorage,
    ObjectStoreError,
    Priority,
    SendPace,
    object_key,
)
from dataplane.s3stream.commit import Committer, ObjectCommitter, retry_transient

log = logging.getLogger(__name__)

MAX_COMMIT_ROUNDS = 4  # a refused commit names every bad stream: round 2 succeeds
# unless more streams go bad meanwhile


# a paced upload is sent at this many times the rate its data arrived at: it takes at most
# half the time the next upload's data takes to arrive, so uploads keep up
UPLOAD_SEND_RATE_FACTOR = 2.0
# the WAL this full (a fraction of its capacity): uploads go as fast as the store takes them
UNPACED_WAL_USED_FRACTION = 0.5


def upload_send_rate(
    pending_bytes: int, accumulated_s: float, min_bytes_per_s: int, wal_used_fraction: float
) -> float:
    """Bytes per second to send an upload of `pending_bytes`, gathered over `accumulated_s`,
    at (pure): UPLOAD_SEND_RATE_FACTOR times the rate the data arrived at, at least
    `min_bytes_per_s`; 0 (unpaced) when pacing is off (`min_bytes_per_s` 0) or the WAL is
    filling up."""
    if min_bytes_per_s <= 0 or wal_used_fraction >= UNPACED_WAL_USED_FRACTION:
        return 0.0
    arrival = pending_bytes / max(accumulated_s, 0.1)
    return max(float(min_bytes_per_s), UPLOAD_SEND_RATE_FACTOR * arrival)


def upload_pace(
    pending_bytes: int, accumulated_s: float, min_bytes_per_s: int, wal_used_fraction: float
) -> SendPace | None:
    """The pace of a regular upload (`upload_send_rate`), None: unpaced."""
    rate = upload_send_rate(pending_bytes, accumulated_s, min_bytes_per_s, wal_used_fraction)
    return SendPace(rate) if rate else None


MAX_BUCKET_SWITCHES = 4  # an upload redone whole on a new active bucket, at most this often
PUT_POLL_S = 0.2  # how often a waiting put checks whether the active bucket changed


class BucketSwitchedError(ObjectStoreError):
    """The active bucket changed while this round's objects were being written to the old
    one (object-storage failover): the round is abandoned and redone whole, with fresh
    object ids, in the new bucket. The abandoned prepared ids are never committed; the
    controller destroys them at their deadline."""


class StorageError(RuntimeError):
    """The engine cannot serve the request (fenced, closed, WAL full for too long...)."""


@dataclass
class UploadResult:
    """What one `upload_batches` call committed, and which streams' data it left out."""

    size_bytes: int = 0
    batches: int = 0  # batches committed
    # stream id -> the controller's per-stream refusal (STREAM_PERMANENT_CODES): its data
    # in this upload can never be committed, so it was left out and the rest committed
    dropped: dict[int, ErrorCode] = field(default_factory=dict)


def permanent_stream_errors(exc: BaseException) -> dict[int, ErrorCode]:
    """The streams a refused commit can never carry (pure).

    Non-empty only when the controller refused the commit for per-stream reasons alone:
    then exactly those streams' data is uncommittable (deleted stream, fenced by a newer
    epoch or another node, not open with that epoch, or not continuing the committed end)
    and the other streams of the upload may be committed without them. Anything else — a
    fenced node, a network error, an object store 5xx, no controller leader — is about the
    whole upload, and says nothing about single streams: {}.
    """
    if not isinstance(exc, ControllerError) or not exc.stream_errors:
        return {}
    if exc.code not in STREAM_PERMANENT_CODES or any(
        code not in STREAM_PERMANENT_CODES for code in exc.stream_errors.values()
    ):
        return {}
    return dict(exc.stream_errors)


def is_retriable_upload_error(exc: BaseException) -> bool:
    """Transient for the whole upload: retry the same upload later (pure)."""
    if isinstance(exc, ControllerError):
        return exc.code in RETRIABLE_CODES
    return isinstance(exc, ObjectStoreError)


def data_lost(code: ErrorCode, committed_end: int | None, dropped_end: int) -> bool:
    """Did leaving out a stream's data (acknowledged up to `dropped_end`) lose records a
    live stream still needs? (pure)

    Deleted streams need nothing; a stream fenced by a newer epoch, or closed, had its
    acknowledged records uploaded by whoever closed it (our own close or our WAL's
    failover) before anyone could reopen it. A continuity refusal (gap) is harmless only
    when the committed end already covers the data — a commit retried after a timeout
    that had in fact been applied; otherwise (or unknown) acknowledged records are missing.
    """
    if code in (ErrorCode.UNKNOWN_STREAM, ErrorCode.STREAM_FENCED, ErrorCode.STREAM_NOT_OPENED):
        return False
    return committed_end is None or committed_end < dropped_end


def log_dropped_stream(
    stream_id: int,
    epoch: int,
    code: ErrorCode,
    committed_end: int | None,
    dropped_end: int,
    lost: bool,
) -> None:
    """Log a stream's data left out of an upload: an ERROR when acknowledged records are
    lost (`data_lost`), else INFO for a deleted stream and WARNING for the rest."""
    if lost:
        log.error(
            "stream %d epoch %d: the controller refuses its data (%s, committed end %s, "
            "data up to %d): acknowledged records are lost; the stream takes no more "
            "appends here",
            stream_id,
            epoch,
            code.value,
            committed_end,
            dropped_end,
        )
        return
    # deleted, moved on (its records were uploaded by whoever closed it), or already
    # committed by an earlier attempt whose answer was lost
    log.log(
        logging.INFO if code == ErrorCode.UNKNOWN_STREAM else logging.WARNING,
        "stream %d epoch %d: its data up to %d is left out of the upload (%s, committed "
        "end %s); nothing acknowledged is lost",
        stream_id,
        epoch,
        dropped_end,
        code.value,
        committed_end,
    )


def _is_retriable_put_error(exc: BaseException) -> bool:
    """A failed put worth another try in the same bucket (not a switch of buckets)."""
    return is_retriable_upload_error(exc) and not isinstance(exc, BucketSwitchedError)


@dataclass
class _RoundObjects:
    """The objects one upload round writes, and the ranges its commit declares."""

    # object id -> its bytes, sent buffer by buffer: a 60 MB object is never joined
    puts: list[tuple[int, ObjectBody]] = field(default_factory=list)
    sso_id: int = -1  # the stream-set object's id, -1: none (only stream objects)
    stream_ranges: list[dict] = field(default_factory=list)
    stream_objects: list[dict] = field(default_factory=list)


class ObjectUploader:
    """prepare -> put -> commit of stream batches as objects (see the module docstring).

    Thread-safety: `upload` may run on several threads at once (the engine's uploader and
    WAL failovers); each call prepares its own object ids, and order ids come from a lock.
    """

    def __init__(
        self,
        controller: ControllerCalls,
        objects: ObjectStorage,
        committer: Callable[[], Committer],
        config: StorageConfig | None = None,
        active_bucket: Callable[[], int | None] | None = None,
    ):
        """`active_bucket()`: the bucket new objects go to as the metadata says now (None:
        not known yet; no callback: never switch mid-upload); a round writing to another
        bucket is abandoned."""
        self._active_bucket = active_bucket
        self.controller = controller
        self.objects = objects
        self._committer = committer
        self.config = config or StorageConfig()  # its object layout and retry limits
        self._commits = ObjectCommitter(controller, self.config.upload_attempts)
        self._order_lock = threading.Lock()
        self._order_id = int(time.time() * 1000)

    def upload(
        self,
        batches: list[StreamRecordBatch],
        failover_node_id: int | None = None,
        on_dropped: Callable[[dict[int, ErrorCode]], None] | None = None,
        compacted_object_ids: list[int] | None = None,
        pace: SendPace | None = None,
    ) -> UploadResult:
        """Write `batches` (WAL order, each stream contiguous from its committed end) as a
        stream-set object and stream objects, and commit them: prepare ids -> put -> commit.
        `failover_node_id`: the batches come from that failed node's WAL, which this node
        is recovering (the streams are still that node's).

        One bad stream never holds back the others: when the controller refuses the commit
        for per-stream reasons only (`permanent_stream_errors`: deleted, fenced by a newer
        epoch, not continuing the committed end), those streams' data is left out and the
        objects are rebuilt and committed without it — under fresh object ids, so an id is
        only ever written with one content. The refused round's objects stay PREPARED and
        the controller destroys them at their deadline; they are not deleted here, because
        a refusal can also follow an earlier attempt of the same commit that was applied
        (its answer lost) and such an object may be committed. Nothing is committed twice:
        a stream's range is accepted only where its committed end is.
        `on_dropped(streams)` is called as soon as a round refuses streams, so what was
        learnt is kept even if a later round fails (and the upload is retried).
        `compacted_object_ids`: a compaction: the new objects replace these committed ones
        (their data must lie within the streams' committed offsets), in the same commit.
        `pace`: the objects of a round are sent at this rate together (None: as fast as
        the store takes them; see `ObjectBody.paced`).
        Returns what was committed and which streams were left out (`dropped`).
        """
        result = UploadResult()
        per_stream: dict[int, list[StreamRecordBatch]] = defaultdict(list)
        for b in batches:
            per_stream[b.stream_id].append(b)
        switches = 0
        for _ in range(MAX_COMMIT_ROUNDS + MAX_BUCKET_SWITCHES):
            live = {sid: bs for sid, bs in per_stream.items() if sid not in result.dropped}
            if not live:
                return result
            try:
                result.size_bytes = self._put_and_commit(
                    live, failover_node_id, compacted_object_ids or [], pace
                )
            except BucketSwitchedError as exc:
                switches += 1
                if switches > MAX_BUCKET_SWITCHES:
                    raise
                log.warning("%s: redoing the upload whole in the new active bucket", exc)
                continue
            except ControllerError as exc:
                bad = permanent_stream_errors(exc)
                if not bad or not bad.keys() <= live.keys():
                    raise
                log.info(
                    "commit refused for %d of %d streams (%s)%s",
                    len(bad),
                    len(live),
                    exc,
                    ": committing the others without them" if len(bad) < len(live) else "",
                )
                result.dropped.update(bad)
                if on_dropped is not None:
                    on_dropped(bad)
                continue
            result.batches = sum(len(bs) for bs in live.values())
            return result
        raise StorageError(
            f"commit refused {MAX_COMMIT_ROUNDS} times, each time for other "
            f"streams (left out so far: {sorted(result.dropped)})"
        )

    def _put_and_commit(
        self,
        per_stream: dict[int, list[StreamRecordBatch]],
        failover_node_id: int | None,
        compacted_object_ids: list[int],
        pace: SendPace | None = None,
    ) -> int:
        """One round of `upload_batches`: prepare, put and commit objects holding exactly
        `per_stream`, sent at `pace` together. Returns the bytes written."""
        committer = self._committer()
        split = {
            sid
            for sid, bs in per_stream.items()
            if sum(b.size_bytes for b in bs) >= self.config.stream_split_bytes
        }
        shared = [sid for sid in per_stream if sid not in split]
        prepared = self._commits.prepare(
            committer, (1 if shared else 0) + len(split), self.config.prepared_ttl_ms
        )
        objects = self._write_objects(per_stream, shared, sorted(split), prepared.first_object_id)
        if pace is not None:  # one pace for the objects sent in parallel
            objects.puts = [(oid, body.paced(pace)) for oid, body in objects.puts]
        bucket_id = prepared.bucket_id
        retry_transient(
            lambda: self._put_all_or_switch(objects.puts, bucket_id),
            self.config.upload_attempts,
            _is_retriable_put_error,
            what="upload step",
        )
        with self._order_lock:  # the engine's uploader and WAL failovers share it
            self._order_id += 1
            order_id = self._order_id
        self._commits.commit(
            CommitStreamSetObjectRequest(
                **committer.fields(),
                object_id=objects.sso_id,
                order_id=order_id,
                size_bytes=len(objects.puts[0][1]) if objects.sso_id >= 0 else 0,
                bucket_id=bucket_id,
                stream_ranges=objects.stream_ranges,
                stream_objects=objects.stream_objects,
                compacted_object_ids=compacted_object_ids,
                failover_node_id=failover_node_id,
            )
        )
        return sum(len(d) for _, d in objects.puts)

    def _write_objects(
        self,
        per_stream: dict[int, list[StreamRecordBatch]],
        shared: list[int],
        split: list[int],
        first_object_id: int,
    ) -> _RoundObjects:
        """The round's objects under consecutive ids from `first_object_id`: one stream-set
        object holding the `shared` streams (if any), then one stream object per `split`
        stream; with the ranges their commit declares."""
        objects = _RoundObjects()
        next_id = first_object_id
        if shared:
            writer = self._object_writer()
            for sid in shared:
                writer.add_all(per_stream[sid])
            obj = writer.finish()
            objects.sso_id = next_id
            next_id += 1
            objects.puts.append((objects.sso_id, ObjectBody(obj.parts)))
            epochs = {sid: per_stream[sid][0].epoch for sid in shared}
            objects.stream_ranges = [
                {
                    "stream_id": r.stream_id,
                    "stream_epoch": epochs[r.stream_id],
                    "start_offset": r.start_offset,
                    "end_offset": r.end_offset,
                }
                for r in obj.ranges
            ]
        for sid in split:
            writer = self._object_writer()
            writer.add_all(per_stream[sid])
            obj = writer.finish()
            objects.puts.append((next_id, ObjectBody(obj.parts)))
            objects.stream_objects.append(
                {
                    "object_id": next_id,
                    "stream_id": sid,
                    "stream_epoch": per_stream[sid][0].epoch,
                    "start_offset": obj.ranges[0].start_offset,
                    "end_offset": obj.ranges[0].end_offset,
                    "size_bytes": obj.size_bytes,
                }
            )
            next_id += 1
        return objects

    def _object_writer(self) -> ObjectWriter:
        return ObjectWriter(self.config.block_size_bytes, self.config.max_object_bytes + 2**20)

    def _check_switch(self, bucket_id: int) -> None:
        """Raise BucketSwitchedError if new objects go to another bucket than `bucket_id` now."""
        active = self._active_bucket() if self._active_bucket is not None else None
        if active is not None and active != bucket_id:
            raise BucketSwitchedError(
                f"active bucket is now {active}, not {bucket_id}", bucket_id=bucket_id
            )

    def _put_all(self, puts: list[tuple[int, ObjectBody]], bucket_id: int) -> None:
        """Put every object of the round into `bucket_id`, in parallel."""
        futures = [
            self.objects.put_object_async(
                bucket_id, object_key(oid), data, priority=Priority.PRODUCE
            )
            for oid, data in puts
        ]
        for f in futures:
            # a put hanging on a dead bucket is left behind once writes switched (it
            # ends on its own timeout; its prepared id is never committed). Checked
            # only once a put is slow: a healthy round never waits on the metadata
            while True:
                try:
                    f.result(timeout=PUT_POLL_S)
                    break
                except FutureTimeout:
                    self._check_switch(bucket_id)

    def _put_all_or_switch(self, puts: list[tuple[int, ObjectBody]], bucket_id: int) -> None:
        """`_put_all`; a failed put on a bucket writes have left raises BucketSwitchedError."""
        try:
            self._put_all(puts, bucket_id)
        except ObjectStoreError as exc:
            if isinstance(exc, BucketSwitchedError):
                raise
            self._check_switch(
                bucket_id
            )  # failed on a bucket writes have left: redo in the new one
            raise
