"""Range-read merging: nearby concurrent range reads of one object share one GET.

Readers (BlockCache misses, prefetch) ask for data blocks of ~512 KiB, often several of the
same object at once. Every GET costs a round trip and an API charge, so - like AutoMQ's
ObjectStorage, which merges reads "<= 4 MiB within 5 ms" - requests are held for a short
window and coalesced:

* a new range joins an open batch of the same (bucket id, key) when the gap between it and
  the batch's span is at most `gap_bytes` (or the smaller gap the request or any member of
  the batch allows: the bytes in a gap are read and thrown away) and the merged span stays
  within `max_bytes`;
  otherwise it opens a new batch (several batches of one key may be open at once);
* a batch is flushed `window_s` after it was opened, or at once when its span reaches
  `max_bytes`, or on `close()`;
* the flushed batch is handed to `execute(batch)` (the owner runs one GET for the span of the
  live members and calls `batch.deliver` / `batch.fail`); each member's future gets exactly
  its bytes, sliced out of the shared body (a read-only memoryview of it, not a copy: the
  body is immutable `bytes`; the slice keeps the whole body alive while it lives);
* a member future cancelled before the flush is dropped; if all are, no GET is made.

This module does no I/O itself; `ObjectStorage` owns the executor and the retries.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .errors import InvalidRangeError, ObjectStoreError
from .limiter import Priority

DEFAULT_WINDOW_MS = 5.0
DEFAULT_GAP_BYTES = 512 * 1024
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_OPEN_BATCHES = 4096
_IDLE_WAIT_S = 1.0


@dataclass
class RangeRequest:
    """One caller's range [start, end_exclusive) and the future that receives its bytes."""

    start: int
    end_exclusive: int
    future: Future = field(default_factory=Future)


@dataclass
class ReadBatch:
    """Range requests of one object that will be served by one GET."""

    bucket_id: int
    key: str
    start: int
    end_exclusive: int
    priority: Priority
    deadline_s: float
    members: list[RangeRequest] = field(default_factory=list)
    flushed: bool = False
    gap_bytes: int | None = None  # the smallest gap a member allows (None: the merger's)

    def span_bytes(self) -> int:
        return self.end_exclusive - self.start

    def claim(self) -> list[RangeRequest]:
        """Mark members running; return those not cancelled (call exactly once)."""
        return [m for m in self.members if m.future.set_running_or_notify_cancel()]

    @staticmethod
    def span_of(members: list[RangeRequest]) -> tuple[int, int]:
        return min(m.start for m in members), max(m.end_exclusive for m in members)

    def deliver(self, members: list[RangeRequest], span_start: int, data: bytes) -> None:
        """Give each member its slice of `data` (the body of the GET starting at span_start).

        A member whose range runs past the end of `data` (the object is shorter) gets an
        InvalidRangeError, exactly as a lone read of that range would.
        """
        view = memoryview(data)
        for m in members:
            lo, hi = m.start - span_start, m.end_exclusive - span_start
            if lo == 0 and hi == len(data):
                m.future.set_result(data)  # the whole body: no copy
            elif hi <= len(data):
                # a view, not a copy: `data` (bytes) never changes
                m.future.set_result(view[lo:hi])
            else:
                m.future.set_exception(
                    InvalidRangeError(
                        f"range [{m.start}, {m.end_exclusive}) of {self.key!r} in bucket "
                        f"{self.bucket_id} runs past the end of the object "
                        f"({span_start + len(data)} bytes)",
                        op="get",
                        bucket_id=self.bucket_id,
                        key=self.key,
                    )
                )

    @staticmethod
    def fail(members: list[RangeRequest], exc: BaseException) -> None:
        for m in members:
            m.future.set_exception(exc)


class RangeMerger:
    """Collects range reads into `ReadBatch`es and flushes them; see the module docstring."""

    def __init__(
        self,
        execute: Callable[[ReadBatch], None],
        *,
        window_s: float = DEFAULT_WINDOW_MS / 1000,
        gap_bytes: int = DEFAULT_GAP_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_open_batches: int = DEFAULT_MAX_OPEN_BATCHES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s < 0 or gap_bytes < 0 or max_bytes < 0 or max_open_batches <= 0:
            raise ValueError("window_s, gap_bytes and max_bytes must be >= 0, max_open_batches > 0")
        self._execute = execute
        self._window_s = float(window_s)
        self._gap = int(gap_bytes)
        self._max = int(max_bytes)
        self._max_open = int(max_open_batches)
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._open: dict[tuple[int, str], list[ReadBatch]] = {}
        self._open_count = 0
        self._deadlines: list[tuple[float, int, ReadBatch]] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._window_s > 0 and self._max > 0

    def mergeable(self, start: int, end_exclusive: int) -> bool:
        """Whether a range of this size may be merged at all."""
        return self.enabled and 0 < end_exclusive - start <= self._max

    def submit(
        self,
        bucket_id: int,
        key: str,
        start: int,
        end_exclusive: int,
        priority: Priority,
        max_gap_bytes: int | None = None,
    ) -> Future:
        """Queue a range read; returns the future of its bytes.

        `max_gap_bytes` (if smaller than the merger's gap) bounds the gap this range may be
        merged across. The caller checks `mergeable` first. Raises ObjectStoreError after
        `close()`.
        """
        if max_gap_bytes is not None and max_gap_bytes < 0:
            raise ValueError("max_gap_bytes must be >= 0")
        request = RangeRequest(start, end_exclusive)
        flush_now: ReadBatch | None = None
        with self._cond:
            if self._closed:
                raise ObjectStoreError(
                    "object storage is closed", op="get", bucket_id=bucket_id, key=key
                )
            batches = self._open.setdefault((bucket_id, key), [])
            target = next(
                (b for b in batches if self._fits(b, start, end_exclusive, max_gap_bytes)), None
            )
            if target is None and self._open_count >= self._max_open:
                # too many open batches: this one goes out on its own, right away
                target = self._new_batch(bucket_id, key, start, end_exclusive, priority)
                target.members.append(request)
                target.flushed = True
                if not batches:
                    del self._open[(bucket_id, key)]
                flush_now = target
            else:
                if target is None:
                    target = self._new_batch(bucket_id, key, start, end_exclusive, priority)
                    target.gap_bytes = max_gap_bytes
                    batches.append(target)
                    self._open_count += 1
                    heapq.heappush(self._deadlines, (target.deadline_s, next(self._seq), target))
                    self._ensure_thread()
                    self._cond.notify_all()
                else:
                    target.start = min(target.start, start)
                    target.end_exclusive = max(target.end_exclusive, end_exclusive)
                    target.priority = min(target.priority, priority)
                    if max_gap_bytes is not None:
                        target.gap_bytes = (
                            max_gap_bytes
                            if target.gap_bytes is None
                            else min(target.gap_bytes, max_gap_bytes)
                        )
                target.members.append(request)
                if target.span_bytes() >= self._max:
                    self._remove(target)
                    flush_now = target
        if flush_now is not None:
            self._safe_execute(flush_now)
        return request.future

    def close(self) -> None:
        """Flush every open batch now and stop the flusher thread (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10.0)
        # the thread flushes what is left; without a thread (or if it hung) flush here
        for batch in self._take_all():
            self._safe_execute(batch)

    # ---------------------------------------------------------------------------------------
    def _fits(
        self, batch: ReadBatch, start: int, end_exclusive: int, max_gap_bytes: int | None = None
    ) -> bool:
        gap = min(g for g in (self._gap, batch.gap_bytes, max_gap_bytes) if g is not None)
        if start > batch.end_exclusive + gap or end_exclusive < batch.start - gap:
            return False
        span = max(batch.end_exclusive, end_exclusive) - min(batch.start, start)
        return span <= self._max

    def _new_batch(
        self, bucket_id: int, key: str, start: int, end_exclusive: int, priority: Priority
    ) -> ReadBatch:
        return ReadBatch(
            bucket_id, key, start, end_exclusive, Priority(priority), self._clock() + self._window_s
        )

    def _remove(self, batch: ReadBatch) -> None:
        """Take an open batch out of the index (lock held)."""
        batch.flushed = True
        batches = self._open.get((batch.bucket_id, batch.key))
        if batches is not None and batch in batches:
            batches.remove(batch)
            self._open_count -= 1
            if not batches:
                del self._open[(batch.bucket_id, batch.key)]

    def _take_all(self) -> list[ReadBatch]:
        with self._cond:
            out = [b for _, _, b in self._deadlines if not b.flushed]
            for b in out:
                self._remove(b)
            self._deadlines.clear()
            return out

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="objectstore-merger", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            due: list[ReadBatch] = []
            with self._cond:
                while not self._closed:
                    now = self._clock()
                    while self._deadlines and (
                        self._deadlines[0][2].flushed or self._deadlines[0][0] <= now
                    ):
                        _, _, batch = heapq.heappop(self._deadlines)
                        if not batch.flushed:
                            self._remove(batch)
                            due.append(batch)
                    if due:
                        break
                    wait = self._deadlines[0][0] - now if self._deadlines else _IDLE_WAIT_S
                    self._cond.wait(min(wait, _IDLE_WAIT_S))
                closed = self._closed
            for batch in due:
                self._safe_execute(batch)
            if closed:
                for batch in self._take_all():
                    self._safe_execute(batch)
                return

    def _safe_execute(self, batch: ReadBatch) -> None:
        try:
            self._execute(batch)
        except BaseException as exc:  # never leave a caller's future pending
            for m in batch.members:
                if m.future.done():
                    continue
                try:
                    if m.future.running() or m.future.set_running_or_notify_cancel():
                        m.future.set_exception(exc)
                except Exception:  # raced with completion; nothing left to do
                    pass
