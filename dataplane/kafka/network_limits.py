"""The Kafka listeners' network limits (seed 002, "Network Prioritization and Rate
Limiting"): produced bytes in and fetched bytes out, each at most a configured rate, with
producer traffic first, tail reads next and catch-up reads last.

* ingress (`network.ingress_bytes_per_s`): a produce request takes its records' bytes
  before it is appended, at `TrafficClass.PRODUCE`; a produce that gets no tokens before
  its WAL-room share of the timeout is answered REQUEST_TIMED_OUT (retriable, nothing
  appended). Reads take no ingress tokens, so a catch-up never delays a produce here.
* egress (`network.egress_bytes_per_s`): a fetch that read records takes their bytes just
  before it answers, at `TAIL_READ` when everything came from memory (the log cache) and at
  `CATCH_UP_READ` when any of it came from object storage; a waiting tail read is served
  before any waiting catch-up read. A fetch waits at most until its `max_wait_ms` deadline;
  then it sends what the tokens there allow (whole partitions in request order, at least
  the first one while the bucket is not in debt, as Kafka lets the first partition exceed
  `max_bytes`) and leaves the rest for the consumer's next fetch. It never hangs.
* 0 means unlimited: nothing is queued or counted.

The bucket is `objectstore.token_bucket.PriorityTokenBucket` (pure); `AsyncPriorityLimiter`
is its waiting on the event loop. Event loop only: not thread-safe.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from dataplane.config import NetworkConfig
from dataplane.objectstore.token_bucket import PriorityTokenBucket, Ticket, WaitersFullError

# a head waiting for tokens re-checks at least this rarely (seconds): another waiter's
# departure wakes it earlier
MIN_RECHECK_S = 0.001

WAIT_SECONDS = Counter(
    "automq_network_limit_wait_seconds_total",
    "seconds produce and fetch requests waited for network-limit tokens",
    ["direction", "traffic"],
)
DEFERRED_BYTES = Counter(
    "automq_network_deferred_bytes_total",
    "fetched record bytes the egress limit left for the consumer's next fetch",
    ["traffic"],
)


class TrafficClass(enum.IntEnum):
    """What a transfer is; a lower value is served first."""

    PRODUCE = 0  # produced records
    TAIL_READ = 1  # fetched records served from memory (the log cache)
    CATCH_UP_READ = 2  # fetched records read from object storage


class AsyncPriorityLimiter:
    """One direction's bytes per second on the event loop; see the module docstring.
    `rate_bytes_per_s` 0: unlimited. Event loop only."""

    def __init__(
        self,
        rate_bytes_per_s: int,
        burst_bytes: int | None = None,
        *,
        max_waiters: int,
        direction: str = "egress",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._direction = direction  # the metrics' label
        self._clock = clock
        self._bucket = PriorityTokenBucket(
            rate_bytes_per_s, burst_bytes, max_waiters=max_waiters, clock=clock
        )
        self._wakers: dict[Ticket, asyncio.Future] = {}

    @property
    def limited(self) -> bool:
        """False when unlimited (rate 0)."""
        return self._bucket.rate_bytes_per_s != 0

    @property
    def waiting_count(self) -> int:
        """Transfers waiting for tokens now."""
        return self._bucket.waiting_count

    async def acquire(
        self, n_bytes: int, traffic: TrafficClass, timeout_s: float, partial: bool = False
    ) -> int:
        """Wait up to `timeout_s` until `n_bytes` may go at `traffic`'s priority; the bytes
        granted: `n_bytes`, or on time-out 0 (`partial` False) or the whole tokens there
        then, at most `n_bytes` (`partial`). A full queue answers at once the same way."""
        bucket = self._bucket
        if n_bytes <= 0 or bucket.take_if_first(traffic, n_bytes):
            return max(n_bytes, 0)
        started = self._clock()
        deadline = started + max(timeout_s, 0.0)
        try:
            ticket = bucket.enqueue(traffic)
        except WaitersFullError:
            return 0
        loop = asyncio.get_running_loop()
        try:
            while not bucket.try_grant(ticket, n_bytes):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return bucket.grant_partial(ticket, n_bytes) if partial else 0
                head_wait = bucket.seconds_until_grant(ticket, n_bytes)
                wait = remaining if head_wait is None else min(head_wait, remaining)
                waker = loop.create_future()
                self._wakers[ticket] = waker
                timer = loop.call_later(max(wait, MIN_RECHECK_S), _wake, waker)
                try:
                    await waker
                finally:
                    timer.cancel()
            return n_bytes
        finally:
            bucket.leave(ticket)
            self._wakers.pop(ticket, None)
            self._wake_head()
            WAIT_SECONDS.labels(self._direction, traffic.name).inc(self._clock() - started)

    def charge(self, n_bytes: int) -> None:
        """Count `n_bytes` sent beyond a grant (the bucket goes into debt)."""
        if self.limited:
            self._bucket.charge(n_bytes)

    def refund(self, n_bytes: int) -> None:
        """Give back `n_bytes` of a grant that were not sent."""
        if self.limited:
            self._bucket.refund(n_bytes)
            self._wake_head()

    def _wake_head(self) -> None:
        head = self._bucket.head()
        if head is not None:
            waker = self._wakers.get(head)
            if waker is not None:
                _wake(waker)


def _wake(waker: asyncio.Future) -> None:
    if not waker.done():
        waker.set_result(None)


def kept_partitions(sizes: Sequence[int], granted_bytes: int) -> int:
    """How many of a fetch's partition reads (their record bytes `sizes`, in request
    order) go into the answer with `granted_bytes` of tokens: the longest prefix that fits,
    but at least one when anything was granted, so a consumer always progresses (pure)."""
    kept = used = 0
    for size in sizes:
        if used + size > granted_bytes:
            break
        used += size
        kept += 1
    if kept == 0 and granted_bytes > 0 and sizes:
        return 1
    return kept


class NetworkLimits:
    """The broker's ingress and egress limits (a component: nothing to start or stop).
    Event loop only."""

    name = "network-limits"

    def __init__(self, ingress: AsyncPriorityLimiter, egress: AsyncPriorityLimiter) -> None:
        self.ingress = ingress
        self.egress = egress

    @classmethod
    def unlimited(cls) -> NetworkLimits:
        """No limits (the default of in-process brokers and tests)."""
        return cls(AsyncPriorityLimiter(0, max_waiters=1), AsyncPriorityLimiter(0, max_waiters=1))

    @classmethod
    def from_config(cls, config: NetworkConfig) -> NetworkLimits:
        """The limits of the broker config's `network` section (0: unlimited)."""

        def one(rate: int, direction: str) -> AsyncPriorityLimiter:
            burst = max(rate * config.burst_ms // 1000, 1) if rate else None
            return AsyncPriorityLimiter(
                rate, burst, max_waiters=config.max_waiters, direction=direction
            )

        return cls(
            one(config.ingress_bytes_per_s, "ingress"), one(config.egress_bytes_per_s, "egress")
        )

    async def admit_produce(self, n_bytes: int, timeout_s: float) -> bool:
        """Produced `n_bytes` may be appended (False: no tokens within `timeout_s`)."""
        if not self.ingress.limited:
            return True
        return await self.ingress.acquire(n_bytes, TrafficClass.PRODUCE, timeout_s) == n_bytes

    async def admit_fetch(self, sizes: Sequence[int], from_objects: bool, timeout_s: float) -> int:
        """How many of a fetch's partition reads (their record bytes, in request order) are
        sent now; the others are left for the next fetch. Waits at most `timeout_s`."""
        total = sum(sizes)
        if not self.egress.limited or total == 0:
            return len(sizes)
        traffic = TrafficClass.CATCH_UP_READ if from_objects else TrafficClass.TAIL_READ
        granted = await self.egress.acquire(total, traffic, timeout_s, partial=True)
        if granted >= total:
            return len(sizes)
        kept = kept_partitions(sizes, granted)
        sent = sum(sizes[:kept])
        DEFERRED_BYTES.labels(traffic.name).inc(total - sent)
        if sent > granted:
            self.egress.charge(sent - granted)
        else:
            self.egress.refund(granted - sent)
        return kept

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""

    def on_metadata(self, delta: object, image: object) -> None:
        """Network limits do not follow metadata."""
