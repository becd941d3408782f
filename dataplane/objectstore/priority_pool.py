"""A bounded thread pool that runs object-store requests by `Priority`, with workers kept
for the write path.

`ObjectStorage` sends uploads, WAL PUTs, catch-up GETs and their readahead through one pool.
A plain `ThreadPoolExecutor` runs them first come, first served, so a catch-up that queued
a hundred GETs made the next upload wait behind all of them, and GETs throttled by the read
limiter held every worker while they waited for tokens (seed 002: producer traffic before
catch-up reads before compaction). Here:

* queued work runs in (priority, arrival) order: a waiting `PRODUCE` request starts before
  any waiting `CATCH_UP` one, which starts before any `COMPACTION` one;
* at most `max_workers - reserved_workers` workers run lower-priority work at once, so
  `reserved_workers` workers are always free for `PRODUCE` work (an upload never waits for a
  catch-up GET to finish or for its tokens);
* workers start lazily, up to `max_workers`, and live until `shutdown`.

Thread-safety: `submit` and `shutdown` may be called from any thread.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .limiter import Priority

# a quarter of the workers are kept for the write path (at least one when there are two)
RESERVED_SHARE = 4


def reserved_workers_for(max_workers: int) -> int:
    """How many of `max_workers` a pool keeps for `PRODUCE` work by default (pure)."""
    if max_workers < 2:
        return 0
    return max(1, max_workers // RESERVED_SHARE)


class PriorityThreadPool:
    """Runs callables on up to `max_workers` threads named `objectstore-N`, by priority;
    see the module docstring. Thread-safe."""

    def __init__(self, max_workers: int, reserved_workers: int | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        reserved = (
            reserved_workers_for(max_workers) if reserved_workers is None else reserved_workers
        )
        if not 0 <= reserved < max_workers:
            raise ValueError(f"reserved_workers must be in [0, {max_workers}), got {reserved}")
        self._max_workers = max_workers
        self._low_priority_cap = max_workers - reserved
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[tuple[int, int, Future, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._running_low = 0  # workers running work below PRODUCE
        self._shutdown = False

    @property
    def max_workers(self) -> int:
        """The most threads the pool runs."""
        return self._max_workers

    @property
    def low_priority_cap(self) -> int:
        """The most workers running work below `PRODUCE` at once."""
        return self._low_priority_cap

    def submit(self, priority: Priority, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue `fn(*args)` at `priority`; its Future. RuntimeError after `shutdown`."""
        future: Future = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            heapq.heappush(self._queue, (int(priority), next(self._seq), future, fn, args))
            if self._idle == 0 and len(self._threads) < self._max_workers:
                self._start_worker()
            self._cond.notify_all()
        return future

    def queued_count(self) -> int:
        """Requests waiting for a worker now."""
        with self._cond:
            return len(self._queue)

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new work; the queued work still runs. With `wait`, return once every
        worker is done (idempotent)."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _start_worker(self) -> None:
        thread = threading.Thread(
            target=self._work,
            name=f"objectstore-{len(self._threads)}",
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()

    def _runnable(self) -> bool:
        """The queue's head may start now (called with the lock held)."""
        if not self._queue:
            return False
        return self._queue[0][0] <= Priority.PRODUCE or self._running_low < self._low_priority_cap

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._runnable():
                    if self._shutdown and not self._queue:
                        self._idle -= 1
                        return
                    self._cond.wait()
                self._idle -= 1
                priority, _, future, fn, args = heapq.heappop(self._queue)
                low = priority > Priority.PRODUCE
                if low:
                    self._running_low += 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args)
                    except BaseException as exc:
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._cond:
                    if low:
                        self._running_low -= 1
                    self._cond.notify_all()
