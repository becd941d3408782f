"""Bandwidth limiter: a token bucket in bytes per second with strict priorities.

AutoMQ gives producer traffic precedence over catch-up reads and both over compaction, so a
backlog being read (or compacted) never starves the write path (seed 002, "Network
Prioritization and Rate Limiting"). Here:

* tokens accrue at `rate_bytes_per_s` up to `burst_bytes` (default one second's worth);
  `rate_bytes_per_s == 0` means unlimited and `acquire` returns at once;
* waiting requests form one queue ordered by (priority, arrival); only its head may take
  tokens, so a waiting `Priority.PRODUCE` request is served before any waiting `CATCH_UP`,
  which is served before any waiting `COMPACTION`. Within a priority it is first come, first
  served. Strict priority means sustained produce traffic can starve compaction; that is the
  intended trade-off;
* the head is granted once `min(n_bytes, burst_bytes)` tokens are available; a request larger
  than the burst then leaves the bucket in debt, which later requests pay back, so large
  objects neither deadlock nor exceed the average rate;
* every wait is bounded: `acquire(..., timeout_s=...)` raises `BandwidthLimitTimeoutError`,
  and at most `max_waiters` requests may queue.

The clock is injectable (`clock=`) so tests can drive time by hand.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable

from .errors import BandwidthLimitTimeoutError
from .token_bucket import PriorityTokenBucket, WaitersFullError

DEFAULT_MAX_WAITERS = 10_000
DEFAULT_TIMEOUT_S = 60.0
# a head waiting for tokens re-checks at least this often (seconds) and at most this rarely
_MIN_WAIT_S = 0.0005
_MAX_WAIT_S = 0.1


class Priority(enum.IntEnum):
    """Traffic classes; a lower value is served first."""

    PRODUCE = 0  # WAL uploads, tail reads: latency-critical
    CATCH_UP = 1  # cold reads of a backlog
    COMPACTION = 2  # background rewrites


class BandwidthLimiter:
    """Thread-safe priority token bucket (`token_bucket.py` behind a condition); see the
    module docstring."""

    def __init__(
        self,
        rate_bytes_per_s: int,
        burst_bytes: int | None = None,
        *,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._bucket = PriorityTokenBucket(
            rate_bytes_per_s, burst_bytes, max_waiters=max_waiters, clock=clock
        )

    @property
    def rate_bytes_per_s(self) -> int:
        """Current rate; 0 means unlimited."""
        return self._bucket.rate_bytes_per_s

    @property
    def burst_bytes(self) -> int:
        return self._bucket.burst_bytes

    @property
    def waiting_count(self) -> int:
        """How many requests are queued for tokens right now."""
        with self._cond:
            return self._bucket.waiting_count

    def available_bytes(self) -> float:
        """Tokens in the bucket now (negative while in debt)."""
        with self._cond:
            return self._bucket.available_bytes()

    def set_rate(self, rate_bytes_per_s: int, burst_bytes: int | None = None) -> None:
        """Change the rate (and burst) at run time; waiters re-evaluate immediately."""
        with self._cond:
            self._bucket.set_rate(rate_bytes_per_s, burst_bytes)
            self._cond.notify_all()

    def acquire(
        self,
        n_bytes: int,
        priority: Priority = Priority.CATCH_UP,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Block until `n_bytes` may be transferred at `priority`.

        Raises BandwidthLimitTimeoutError after `timeout_s` (clock seconds; None waits up
        to DEFAULT_TIMEOUT_S) or when `max_waiters` requests already wait.
        """
        if n_bytes < 0:
            raise ValueError(f"n_bytes must be >= 0, got {n_bytes}")
        bucket = self._bucket
        if bucket.rate_bytes_per_s == 0 or n_bytes == 0:
            return
        timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        prio = int(Priority(priority))
        with self._cond:
            deadline = self._clock() + timeout_s
            if bucket.take_if_first(prio, n_bytes):
                return
            try:
                ticket = bucket.enqueue(prio)
            except WaitersFullError as exc:
                raise BandwidthLimitTimeoutError(
                    f"bandwidth limiter queue is full ({exc})"
                ) from None
            try:
                while not bucket.try_grant(ticket, n_bytes):
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        raise BandwidthLimitTimeoutError(
                            f"waited {timeout_s:.3f}s for {n_bytes} bytes at priority "
                            f"{Priority(prio).name} (rate {bucket.rate_bytes_per_s} B/s, "
                            f"{bucket.waiting_count - 1} other waiters)"
                        )
                    head_wait = bucket.seconds_until_grant(ticket, n_bytes)
                    if head_wait is None:
                        wait = min(remaining, _MAX_WAIT_S)
                    else:
                        wait = min(max(head_wait, _MIN_WAIT_S), _MAX_WAIT_S, remaining)
                    self._cond.wait(wait)
            finally:
                # leave the queue (granted, timed out or interrupted) and let the next head go
                bucket.leave(ticket)
                self._cond.notify_all()
