"""BucketFollowingWAL: an object WAL that writes to the active bucket (AKIP-1, seed 000).

The RouterChannel and `--wal s3` are object WALs; pinned to one bucket, an outage of that
bucket stops every append even after the cluster failed over to another bucket. This WAL is
a sequence of `ObjectWAL` segments (`bucket_segments`): appends go to the newest segment;
a `wal-bucket-switch` thread starts a new one

* in the active bucket when the metadata names another bucket (`active_bucket()`);
* when the newest segment failed for good (a PUT failed after its retries) or stalls (a
  PUT unanswered for `stall_switch_s`, 2 s): in the active bucket, or else in another
  configured bucket that answers, so appends go on before the controller even detects the
  outage (offsets name their bucket: every reader finds the record where it was written);
  the bucket left is not returned to for `return_after_s` (30 s) while the metadata still
  names it; a stall counts only while this process runs (`RunningStretch`: a broker
  stopped with a PUT in flight finds it waiting when it resumes, the bucket being fine);
* when the newest segment's offsets near their limit.

Older segments stay readable (and recovered on a restart) until a trim passes their end;
then they are closed and their objects deleted. Offsets grow across segments, so users
trim below a point as with one ObjectWAL.

Limits: a restart or a takeover lists and claims every segment, so it needs every bucket
still holding an untrimmed segment to answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from dataplane.config import ObjectWALConfig
from dataplane.light_future import LightFuture
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal.base import (
    AppendResult,
    RecordPieces,
    RecoveredRecord,
    RoomSignal,
    WALClosedError,
    WALError,
    WALFencedError,
    WriteAheadLog,
)
from dataplane.s3stream.wal.bucket_segments import (
    MAX_SEGMENT_BUCKET_ID,
    SEGMENT_CAPACITY_BYTES,
    SegmentId,
    delete_segment,
    global_offset,
    list_segments,
    split_offset,
)
from dataplane.s3stream.wal.object_chain import ObjectWALLocation
from dataplane.s3stream.wal.object_wal import ObjectWAL
from dataplane.s3stream.wal.running_stretch import RunningStretch

__all__ = ["BucketFollowingWAL"]

log = logging.getLogger(__name__)

SWITCH_CHECK_S = 0.1  # how often the switch thread looks at the active bucket
RETRY_AFTER_FAILED_OPEN_S = 2.0  # a bucket that refused a new segment is tried again after
MAX_SEGMENTS = 64  # open segments (older ones are deleted once trimmed)


@dataclass(slots=True)
class _Segment:
    segment: SegmentId
    wal: ObjectWAL


class BucketFollowingWAL(WriteAheadLog):
    """An object WAL whose appends go to the active bucket (see the module docstring).

    Create with :meth:`open`. Thread-safe: `append` never blocks (the newest segment's);
    the switch thread opens segments; `trim` drops the segments it passes.
    """

    def __init__(
        self,
        objects: ObjectStorage,
        base_prefix: str,
        node_id: int,
        node_epoch: int,
        segments: list[_Segment],
        capacity_bytes: int,
        config: ObjectWALConfig,
        active_bucket: Callable[[], int | None],
        ordered_acks: bool = True,
        fail_stalled_appends: bool = False,
    ) -> None:
        self._objects = objects
        self._ordered_acks = ordered_acks
        self._fail_stalled_appends = fail_stalled_appends
        # the last append's future, and (ordered acks) the one appends to the newest
        # segment wait for: the last append to the segments before it
        self._last_append: Future | None = None
        self._barrier: Future | None = None
        self._base_prefix = base_prefix
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._capacity_bytes = capacity_bytes
        self._config = config
        self._active_bucket = active_bucket
        self._lock = threading.Lock()
        self._trim_lock = threading.Lock()
        self._segments = segments  # in order; the last one takes the appends
        self._closed = False
        self._stop = threading.Event()
        self._retry_at: dict[int, float] = {}  # bucket id -> monotonic time of the next try
        # bucket id -> monotonic time before which it is not returned to (left for
        # stalling or failing; forgotten when the metadata names another bucket), and
        # the active bucket the switch thread saw last (only that thread uses both)
        self._avoid_until: dict[int, float] = {}
        self._last_target: int | None = None
        # the switch thread's own running stretch (only that thread uses it)
        self._running = RunningStretch(
            time.monotonic(), max(SWITCH_CHECK_S * 5, config.stall_switch_s / 2)
        )
        self._switches = 0
        self._switcher = threading.Thread(
            target=self._switch_loop, name="wal-bucket-switch", daemon=True
        )
        self._switcher.start()

    @classmethod
    def open(
        cls,
        objects: ObjectStorage,
        home: ObjectWALLocation,
        node_id: int,
        node_epoch: int,
        *,
        capacity_bytes: int,
        config: ObjectWALConfig | None = None,
        active_bucket: Callable[[], int | None] | None = None,
        ordered_acks: bool = True,
        fail_stalled_appends: bool = False,
    ) -> BucketFollowingWAL:
        """Open (or create) the WAL whose first segment is `home`, as writer (node_id,
        node_epoch): every existing segment is claimed (its records recovered by
        `recover`); appends go to the newest one if it is in the active bucket, else to a
        new one there (`config.stall_switch_s` and `return_after_s` tune the moves away
        from a bucket that stalls or fails).

        `ordered_acks`: appends resolve in offset order across segments too (as one
        ObjectWAL: the storage engine relies on it); else an append in a new segment may
        resolve before one still waiting in an older one. `fail_stalled_appends`: appends
        waiting in a segment left for stalling fail at once (the caller retries them;
        they are never acknowledged), else they wait for their PUT (`put_timeout_s`).
        Raises as `ObjectWAL.open` (every bucket holding a segment must answer).
        """
        config = config or ObjectWALConfig()
        active = active_bucket or (lambda: None)
        objects.bucket(home.bucket_id)  # an unknown bucket id fails here, before any write
        if home.bucket_id > MAX_SEGMENT_BUCKET_ID:
            raise ValueError(
                f"bucket {home.bucket_id} cannot hold a WAL (ids 0..{MAX_SEGMENT_BUCKET_ID})"
            )
        opened: list[_Segment] = []
        try:
            for segment in list_segments(objects, home.prefix):
                where = segment.location(home.prefix)
                wal = ObjectWAL.open(
                    objects,
                    where,
                    node_id,
                    node_epoch,
                    capacity_bytes=capacity_bytes,
                    config=config,
                )
                opened.append(_Segment(segment, wal))
            target = _valid_bucket(objects, active())
            if not opened:
                segment = SegmentId(0, home.bucket_id if target is None else target)
            elif (target is None or target == opened[-1].segment.bucket_id) and not _near_end(
                opened[-1].wal, capacity_bytes
            ):
                segment = None  # go on in the newest segment
            else:
                bucket = opened[-1].segment.bucket_id if target is None else target
                segment = SegmentId(opened[-1].segment.counter + 1, bucket)
            if segment is not None:
                where = segment.location(home.prefix)
                wal = ObjectWAL.open(
                    objects,
                    where,
                    node_id,
                    node_epoch,
                    capacity_bytes=capacity_bytes,
                    config=config,
                )
                opened.append(_Segment(segment, wal))
        except BaseException:
            for seg in opened:
                _close_quietly(seg.wal)
            raise
        return cls(
            objects,
            home.prefix,
            node_id,
            node_epoch,
            opened,
            capacity_bytes,
            config,
            active,
            ordered_acks,
            fail_stalled_appends,
        )

    # ------------------------------------------------------------------ properties
    @property
    def base_prefix(self) -> str:
        """The prefix of segment 0 (segment n at `<base_prefix>-g<n>`)."""
        return self._base_prefix

    @property
    def segments(self) -> list[SegmentId]:
        """The open segments, oldest first (the last takes the appends)."""
        with self._lock:
            return [s.segment for s in self._segments]

    @property
    def current_bucket_id(self) -> int:
        """The bucket new appends go to."""
        with self._lock:
            return self._segments[-1].segment.bucket_id

    @property
    def switches(self) -> int:
        """New segments started since open (bucket switches, failed segments replaced)."""
        with self._lock:
            return self._switches

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self._newest().wal.used_bytes

    @property
    def start_offset(self) -> int:
        with self._lock:
            first = self._segments[0]
        return global_offset(first.segment, first.wal.start_offset)

    @property
    def end_offset(self) -> int:
        newest = self._newest()
        return global_offset(newest.segment, newest.wal.end_offset)

    @property
    def fenced(self) -> bool:
        """Whether another owner took the WAL over."""
        return self._newest().wal.fenced

    @property
    def room(self) -> RoomSignal:
        return self._newest().wal.room

    def has_room(self, size_bytes: int) -> bool:
        return self._newest().wal.has_room(size_bytes)

    def _newest(self) -> _Segment:
        with self._lock:
            return self._segments[-1]

    # ------------------------------------------------------------------ API
    def append(
        self, record: bytes | RecordPieces, body_crc32c: int | None = None
    ) -> Future[AppendResult]:
        """Queue `record` in the newest segment; never blocks (see `ObjectWAL.append`). A
        failed segment raises WALError until the switch thread replaced it."""
        outer: Future[AppendResult] = LightFuture()
        outer.set_running_or_notify_cancel()
        with self._lock:
            if self._closed:
                raise WALClosedError(f"WAL {self._base_prefix} is closed")
            newest = self._segments[-1]
            # never blocks; under the lock: no switch now
            inner = newest.wal.append(record, body_crc32c)
            barrier = self._barrier if self._ordered_acks else None
            self._last_append = outer
        segment = newest.segment

        def settle(fut: Future[AppendResult]) -> None:
            exc = fut.exception()
            if exc is not None:
                outer.set_exception(exc)
                return
            result = fut.result()
            outer.set_result(AppendResult(global_offset(segment, result.offset), result.size_bytes))

        if barrier is None:
            inner.add_done_callback(settle)
        else:  # after the older segments' last append, whatever its outcome
            inner.add_done_callback(lambda fut: barrier.add_done_callback(lambda _: settle(fut)))
        return outer

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield the records of every segment as of this call, in order."""
        with self._lock:
            segments = list(self._segments)
        for seg in segments:
            for record in seg.wal.recover():
                yield RecoveredRecord(
                    global_offset(seg.segment, record.offset), record.size_bytes, record.data
                )

    def trim(self, up_to_offset: int) -> None:
        """Release the records below `up_to_offset`: segments wholly below it are closed
        and their objects deleted (retried at the next trim if the store fails), the one
        holding it is trimmed.

        Raises:
            ValueError: beyond the WAL's end, or not a record boundary.
            WALError: the segment holding the point could not be trimmed.
        """
        up_to_segment, local = split_offset(up_to_offset)
        with self._trim_lock:
            with self._lock:
                segments = list(self._segments)
            if up_to_segment > segments[-1].segment:
                raise ValueError(f"trim point {up_to_offset} is beyond the WAL's end")
            for seg in segments[:-1]:
                if seg.segment < up_to_segment:
                    self._drop(seg)
            for seg in segments:
                if seg.segment == up_to_segment:
                    seg.wal.trim(local)

    def _drop(self, seg: _Segment) -> None:
        """Close a segment wholly trimmed and delete its objects (logged on failure: the
        next trim tries again)."""
        _close_quietly(seg.wal)
        try:
            delete_segment(self._objects, self._base_prefix, seg.segment)
        except Exception as exc:  # noqa: BLE001 - the bucket is down: later
            log.warning(
                "WAL %s: deleting segment %s failed: %s", self._base_prefix, seg.segment, exc
            )
            return
        with self._lock:
            self._segments = [s for s in self._segments if s is not seg]

    def close(self) -> None:
        """Stop the switch thread, close every segment. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            segments = list(self._segments)
        self._stop.set()
        self._switcher.join(self._config.close_timeout_s)
        errors = []
        for seg in reversed(segments):
            try:
                seg.wal.close()
            except WALError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ the switch thread
    def _switch_loop(self) -> None:
        while not self._stop.wait(SWITCH_CHECK_S):
            try:
                self._maybe_switch()
            except Exception:  # a bug: log it, keep following the active bucket
                log.exception("WAL %s: bucket switch failed", self._base_prefix)

    def _maybe_switch(self) -> None:
        """Start a new segment when the newest failed or stalls (elsewhere), is not in
        the active bucket, or nears the end of its offsets."""
        now = time.monotonic()
        not_running_s = self._running.observe(now)
        if not_running_s:
            log.warning(
                "WAL %s: the bucket switch did not run for %.1f s (this process was stopped "
                "or starved): what waited meanwhile is not counted as a stall",
                self._base_prefix,
                not_running_s,
            )
        newest = self._newest()
        if newest.wal.fenced:
            return  # taken over: nothing more is acknowledged here
        target = _valid_bucket(self._objects, self._active_bucket())
        current = newest.segment.bucket_id
        if target != self._last_target:  # the metadata named another bucket since
            self._avoid_until.clear()
            self._last_target = target
        # a stall counts only while this process runs: a stopped broker's PUTs wait on it
        stalled_s = min(newest.wal.stalled_s, self._running.running_s(now))
        stalled = stalled_s >= self._config.stall_switch_s
        if newest.wal.failed or stalled:
            # a bucket that answers: the active one if it is another, then the rest; a
            # failed one again last (the failure may have passed), a stalled one not
            preferred = ([target] if target is not None else []) + self._segment_buckets()
            candidates = [b for b in preferred if b != current]
            if not stalled:
                candidates.append(current)
            reason = "its segment stalls" if stalled else "its segment failed"
        elif target is not None and target != current:
            if self._avoid_until.get(target, 0.0) > now:
                return  # left for stalling a moment ago, still named active: not back yet
            candidates, reason = [target], f"bucket {target} is active"
        elif _near_end(newest.wal, self._capacity_bytes):
            candidates, reason = [current], "its segment is full"
        else:
            return
        with self._lock:
            if len(self._segments) >= MAX_SEGMENTS:
                log.warning("WAL %s: %d segments not trimmed yet", self._base_prefix, MAX_SEGMENTS)
                return
        for bucket in dict.fromkeys(candidates):
            if self._open_segment(newest, bucket, reason):
                if bucket != current and (stalled or newest.wal.failed):
                    self._avoid_until[current] = now + self._config.return_after_s
                if stalled and self._fail_stalled_appends:
                    newest.wal.abandon(f"bucket {current} stalls; appends go to bucket {bucket}")
                return

    def _segment_buckets(self) -> list[int]:
        return [b for b in self._objects.bucket_ids if b <= MAX_SEGMENT_BUCKET_ID]

    def _open_segment(self, newest: _Segment, bucket_id: int, reason: str) -> bool:
        """Open the next segment in `bucket_id` and send appends there; False when the
        bucket did not answer (tried again after RETRY_AFTER_FAILED_OPEN_S)."""
        now = time.monotonic()
        if self._retry_at.get(bucket_id, 0.0) > now:
            return False
        segment = SegmentId(newest.segment.counter + 1, bucket_id)
        where = segment.location(self._base_prefix)
        try:
            wal = ObjectWAL.open(
                self._objects,
                where,
                self._node_id,
                self._node_epoch,
                capacity_bytes=self._capacity_bytes,
                config=self._config,
            )
        except WALFencedError:
            raise
        except Exception as exc:  # noqa: BLE001 - that bucket does not answer either
            self._retry_at[bucket_id] = time.monotonic() + RETRY_AFTER_FAILED_OPEN_S
            log.warning(
                "WAL %s: cannot start segment %s (%s): %s", self._base_prefix, segment, reason, exc
            )
            return False
        with self._lock:
            if self._closed:
                closing = True
            else:
                closing = False
                self._segments.append(_Segment(segment, wal))
                self._switches += 1
                last = self._last_append
                self._barrier = last if last is not None and not last.done() else None
        if closing:
            _close_quietly(wal)
            return True
        log.warning(
            "WAL %s: appends now go to segment %s in bucket %d (%s)",
            self._base_prefix,
            segment,
            bucket_id,
            reason,
        )
        return True


def _valid_bucket(objects: ObjectStorage, bucket_id: int | None) -> int | None:
    """`bucket_id` if a segment can live there (configured, id small enough), else None."""
    if bucket_id is None or bucket_id > MAX_SEGMENT_BUCKET_ID:
        return None
    return bucket_id if bucket_id in objects.bucket_ids else None


def _near_end(wal: ObjectWAL, capacity_bytes: int) -> bool:
    """Whether the segment's offsets come near their limit (a new segment is due)."""
    return wal.end_offset + 2 * capacity_bytes >= SEGMENT_CAPACITY_BYTES


def _close_quietly(wal: ObjectWAL) -> None:
    try:
        wal.close()
    except Exception as exc:  # noqa: BLE001 - a failed segment: nothing more to keep
        log.warning("closing WAL segment %s: %s", wal.location.prefix, exc)
