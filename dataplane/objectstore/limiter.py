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
import heapq
import itertools
import threading
import time
from collections.abc import Callable

from .errors import BandwidthLimitTimeoutError

DEFAULT_MAX_WAITERS = 10_000
DEFAULT_TIMEOUT_S = 60.0
# a head waiting for tokens re-checks at least this often (seconds) and at most this rarely
_MIN_WAIT_S = 0.0005
_MAX_WAIT_S = 0.1
# refills add float fractions of a byte; tolerate the rounding when comparing
_EPSILON_BYTES = 1e-6


class Priority(enum.IntEnum):
    """Traffic classes; a lower value is served first."""

    PRODUCE = 0  # WAL uploads, tail reads: latency-critical
    CATCH_UP = 1  # cold reads of a backlog
    COMPACTION = 2  # background rewrites


class BandwidthLimiter:
    """Thread-safe priority token bucket; see the module docstring."""

    def __init__(
        self,
        rate_bytes_per_s: int,
        burst_bytes: int | None = None,
        *,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0, got {rate_bytes_per_s}")
        if burst_bytes is not None and burst_bytes <= 0:
            raise ValueError(f"burst_bytes must be > 0, got {burst_bytes}")
        if max_waiters <= 0:
            raise ValueError(f"max_waiters must be > 0, got {max_waiters}")
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._rate = int(rate_bytes_per_s)
        self._burst = int(burst_bytes) if burst_bytes is not None else max(self._rate, 1)
        self._tokens = float(self._burst)
        self._last_refill = clock()
        self._max_waiters = max_waiters
        self._waiters: list[tuple[int, int]] = []  # heap of (priority, sequence)
        self._seq = itertools.count()

    @property
    def rate_bytes_per_s(self) -> int:
        """Current rate; 0 means unlimited."""
        return self._rate

    @property
    def burst_bytes(self) -> int:
        return self._burst

    @property
    def waiting_count(self) -> int:
        """How many requests are queued for tokens right now."""
        with self._cond:
            return len(self._waiters)

    def available_bytes(self) -> float:
        """Tokens in the bucket now (negative while in debt)."""
        with self._cond:
            self._refill()
            return self._tokens

    def set_rate(self, rate_bytes_per_s: int, burst_bytes: int | None = None) -> None:
        """Change the rate (and burst) at run time; waiters re-evaluate immediately."""
        if rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0, got {rate_bytes_per_s}")
        with self._cond:
            self._refill()
            self._rate = int(rate_bytes_per_s)
            self._burst = int(burst_bytes) if burst_bytes is not None else max(self._rate, 1)
            self._tokens = min(self._tokens, float(self._burst))
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
        if self._rate == 0 or n_bytes == 0:
            return
        timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        prio = int(Priority(priority))
        with self._cond:
            deadline = self._clock() + timeout_s
            self._refill()
            if not self._waiters and self._tokens + _EPSILON_BYTES >= min(n_bytes, self._burst):
                self._tokens -= n_bytes
                return
            if len(self._waiters) >= self._max_waiters:
                raise BandwidthLimitTimeoutError(
                    f"bandwidth limiter queue is full ({self._max_waiters} waiters)"
                )
            ticket = (prio, next(self._seq))
            heapq.heappush(self._waiters, ticket)
            try:
                while True:
                    if self._rate == 0:  # switched to unlimited while waiting
                        return
                    self._refill()
                    needed = min(n_bytes, self._burst)
                    is_head = self._waiters[0] == ticket
                    if is_head and self._tokens + _EPSILON_BYTES >= needed:
                        self._tokens -= n_bytes
                        return
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        raise BandwidthLimitTimeoutError(
                            f"waited {timeout_s:.3f}s for {n_bytes} bytes at priority "
                            f"{Priority(prio).name} (rate {self._rate} B/s, "
                            f"{len(self._waiters) - 1} other waiters)"
                        )
                    if is_head:
                        wait = (needed - self._tokens) / self._rate
                        wait = min(max(wait, _MIN_WAIT_S), _MAX_WAIT_S, remaining)
                    else:
                        wait = min(remaining, _MAX_WAIT_S)
                    self._cond.wait(wait)
            finally:
                # leave the queue (granted, timed out or interrupted) and let the next head go
                if ticket in self._waiters:
                    self._waiters.remove(ticket)
                    heapq.heapify(self._waiters)
                self._cond.notify_all()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last_refill
        if elapsed > 0:
            self._tokens = min(float(self._burst), self._tokens + elapsed * self._rate)
            self._last_refill = now
