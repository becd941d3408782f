"""A token bucket in bytes per second with strict priorities: the pure logic, no threads,
no waiting, the clock injected.

Shared by the object store's `BandwidthLimiter` (threads wait on a condition) and the Kafka
listener's network limits (`dataplane/kafka/network_limits.py`: coroutines wait on the event
loop); each wrapper does the waiting and serializes its calls. The rules:

* tokens accrue at `rate_bytes_per_s` up to `burst_bytes` (default one second's worth);
  `rate_bytes_per_s == 0` means unlimited;
* waiting requests form one queue ordered by (priority, arrival), a lower priority value
  first; only its head may take tokens. Within a priority it is first come, first served;
* the head is granted once `min(n_bytes, burst_bytes)` tokens are there; a request larger
  than the burst leaves the bucket in debt, which later requests pay back, so large
  transfers neither deadlock nor exceed the average rate;
* a request may take what is there now instead (`grant_partial`: a fetch at its deadline
  sends fewer bytes), give back what it did not use (`refund`) or pay for more (`charge`);
* at most `max_waiters` requests queue (`WaitersFullError` past that).

Not thread-safe: the caller serializes every call (a lock, or the one event loop).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

# refills add float fractions of a byte; tolerate the rounding when comparing
EPSILON_BYTES = 1e-6

Ticket = tuple[int, int]  # (priority, arrival sequence): a place in the queue


class WaitersFullError(RuntimeError):
    """`max_waiters` requests already wait."""


class PriorityTokenBucket:
    """The bucket and its queue of waiting requests; see the module docstring. Not
    thread-safe."""

    def __init__(
        self,
        rate_bytes_per_s: int,
        burst_bytes: int | None = None,
        *,
        max_waiters: int,
        clock: Callable[[], float],
    ) -> None:
        if max_waiters <= 0:
            raise ValueError(f"max_waiters must be > 0, got {max_waiters}")
        self._clock = clock
        self._max_waiters = max_waiters
        self._waiters: list[Ticket] = []  # a heap
        self._seq = itertools.count()
        self._rate = 0
        self._burst = 1
        self._tokens = 0.0
        self._last_refill = clock()
        self.set_rate(rate_bytes_per_s, burst_bytes)
        self._tokens = float(self._burst)

    @property
    def rate_bytes_per_s(self) -> int:
        """The rate; 0 means unlimited."""
        return self._rate

    @property
    def burst_bytes(self) -> int:
        """The most tokens the bucket holds."""
        return self._burst

    @property
    def waiting_count(self) -> int:
        """Requests queued now."""
        return len(self._waiters)

    def set_rate(self, rate_bytes_per_s: int, burst_bytes: int | None = None) -> None:
        """Change the rate (and burst); tokens above the new burst are dropped."""
        if rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0, got {rate_bytes_per_s}")
        if burst_bytes is not None and burst_bytes <= 0:
            raise ValueError(f"burst_bytes must be > 0, got {burst_bytes}")
        self._refill()
        self._rate = int(rate_bytes_per_s)
        self._burst = int(burst_bytes) if burst_bytes is not None else max(self._rate, 1)
        self._tokens = min(self._tokens, float(self._burst))

    def available_bytes(self) -> float:
        """Tokens now (negative while in debt)."""
        self._refill()
        return self._tokens

    def take_if_first(self, priority: int, n_bytes: int) -> bool:
        """Take `n_bytes` at once if no request of this or a higher priority waits and the
        tokens are there (or the bucket is unlimited); else take nothing."""
        if self._rate == 0:
            return True
        if self._waiters and self._waiters[0][0] <= priority:
            return False
        self._refill()
        if self._tokens + EPSILON_BYTES >= min(n_bytes, self._burst):
            self._tokens -= n_bytes
            return True
        return False

    def enqueue(self, priority: int) -> Ticket:
        """Queue a request at `priority`; WaitersFullError when `max_waiters` wait."""
        if len(self._waiters) >= self._max_waiters:
            raise WaitersFullError(f"{self._max_waiters} requests already wait for bandwidth")
        ticket = (int(priority), next(self._seq))
        heapq.heappush(self._waiters, ticket)
        return ticket

    def head(self) -> Ticket | None:
        """The request served next, None when none waits."""
        return self._waiters[0] if self._waiters else None

    def try_grant(self, ticket: Ticket, n_bytes: int) -> bool:
        """Grant `n_bytes` to the queued `ticket` if it is the head and the tokens are there
        (or the bucket became unlimited); a granted ticket leaves the queue."""
        if self._rate != 0:
            if not self._waiters or self._waiters[0] != ticket:
                return False
            self._refill()
            if self._tokens + EPSILON_BYTES < min(n_bytes, self._burst):
                return False
            self._tokens -= n_bytes
        self.leave(ticket)
        return True

    def seconds_until_grant(self, ticket: Ticket, n_bytes: int) -> float | None:
        """How long until the head `ticket` may take `n_bytes` if no one overtakes it (0:
        now); None when it is not the head (it waits for the queue to move)."""
        if self._rate == 0:
            return 0.0
        if not self._waiters or self._waiters[0] != ticket:
            return None
        self._refill()
        missing = min(n_bytes, self._burst) - self._tokens
        return max(missing, 0.0) / self._rate

    def grant_partial(self, ticket: Ticket, n_bytes: int) -> int:
        """Take up to `n_bytes` of the whole tokens there now (0 in debt, or when a request
        of a higher priority waits ahead); `ticket` leaves the queue."""
        if self._rate == 0:
            granted = n_bytes
        elif self._waiters and self._waiters[0][0] < ticket[0]:
            granted = 0
        else:
            self._refill()
            granted = max(min(n_bytes, math.floor(self._tokens + EPSILON_BYTES)), 0)
            self._tokens -= granted
        self.leave(ticket)
        return granted

    def charge(self, n_bytes: int) -> None:
        """Take `n_bytes` sent beyond a grant (the bucket may go into debt)."""
        self._refill()
        self._tokens -= max(n_bytes, 0)

    def refund(self, n_bytes: int) -> None:
        """Give back `n_bytes` taken and not used (never above the burst)."""
        self._refill()
        self._tokens = min(self._tokens + max(n_bytes, 0), float(self._burst))

    def leave(self, ticket: Ticket) -> None:
        """`ticket` leaves the queue (granted, timed out or cancelled); idempotent."""
        if not self._waiters:
            return
        if self._waiters[0] == ticket:
            heapq.heappop(self._waiters)
        elif ticket in self._waiters:
            self._waiters.remove(ticket)
            heapq.heapify(self._waiters)

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last_refill
        if elapsed > 0:
            self._tokens = min(float(self._burst), self._tokens + elapsed * self._rate)
            self._last_refill = now
