"""BandwidthLimiter: token bucket, strict priorities, bounded waits (driven by a fake clock)."""

from __future__ import annotations

import threading
import time

import pytest

from dataplane.objectstore.errors import BandwidthLimitTimeoutError
from dataplane.objectstore.limiter import BandwidthLimiter, Priority

WAIT_S = 5.0  # upper bound for any test-side wait; tests normally finish far sooner


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def wait_until(predicate, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


def start_waiter(
    limiter: BandwidthLimiter,
    n: int,
    prio: Priority,
    name: str,
    granted: list[str],
    errors: list[BaseException],
    timeout_s: float = 60.0,
) -> threading.Thread:
    def run() -> None:
        try:
            limiter.acquire(n, prio, timeout_s=timeout_s)
            granted.append(name)
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_unlimited_never_waits():
    limiter = BandwidthLimiter(0)
    t0 = time.monotonic()
    for _ in range(1000):
        limiter.acquire(10**9, Priority.COMPACTION, timeout_s=0.001)
    assert time.monotonic() - t0 < 1.0


def test_large_request_waits_for_a_full_burst_then_leaves_debt():
    clock = FakeClock()
    limiter = BandwidthLimiter(1000, burst_bytes=1000, clock=clock)
    limiter.acquire(1000, timeout_s=0)
    assert limiter.available_bytes() == pytest.approx(0)
    with pytest.raises(BandwidthLimitTimeoutError):
        limiter.acquire(3000, timeout_s=0)  # needs a full burst first
    clock.advance(1.0)
    limiter.acquire(3000, timeout_s=0)  # granted with a full bucket, 2000 in debt
    assert limiter.available_bytes() == pytest.approx(-2000)
    clock.advance(2.0)
    assert limiter.available_bytes() == pytest.approx(0)
    clock.advance(10.0)
    assert limiter.available_bytes() == pytest.approx(1000)  # capped at the burst


def test_higher_priority_waiter_is_served_first():
    clock = FakeClock()
    limiter = BandwidthLimiter(1000, burst_bytes=100, clock=clock)
    limiter.acquire(100, timeout_s=0)  # drain the bucket
    granted: list[str] = []
    errors: list[BaseException] = []
    threads = []
    # arrival order: lowest priority first, so FIFO would give the opposite order
    for name, prio in [
        ("compaction", Priority.COMPACTION),
        ("catch_up", Priority.CATCH_UP),
        ("produce", Priority.PRODUCE),
    ]:
        threads.append(start_waiter(limiter, 100, prio, name, granted, errors))
        wait_until(lambda n=len(threads): limiter.waiting_count == n)
    assert granted == []
    for expected in range(1, 4):
        clock.advance(0.1)  # exactly 100 tokens: one request at a time
        wait_until(lambda e=expected: len(granted) == e)
        time.sleep(0.02)  # nobody else may slip through on the same tokens
        assert len(granted) == expected
    assert granted == ["produce", "catch_up", "compaction"]
    assert errors == []
    for t in threads:
        t.join(WAIT_S)


def test_fifo_within_one_priority_and_late_high_priority_overtakes():
    clock = FakeClock()
    limiter = BandwidthLimiter(1000, burst_bytes=100, clock=clock)
    limiter.acquire(100, timeout_s=0)
    granted: list[str] = []
    errors: list[BaseException] = []
    threads = []
    for name in ("c1", "c2", "c3"):
        threads.append(start_waiter(limiter, 100, Priority.CATCH_UP, name, granted, errors))
        wait_until(lambda n=len(threads): limiter.waiting_count == n)
    clock.advance(0.1)
    wait_until(lambda: granted == ["c1"])
    threads.append(start_waiter(limiter, 100, Priority.PRODUCE, "p1", granted, errors))
    wait_until(lambda: limiter.waiting_count == 3)
    for expected in (2, 3, 4):
        clock.advance(0.1)
        wait_until(lambda e=expected: len(granted) == e)
    assert granted == ["c1", "p1", "c2", "c3"]
    assert errors == []
    for t in threads:
        t.join(WAIT_S)


def test_wait_is_bounded_and_timed_out_waiter_leaves_the_queue():
    limiter = BandwidthLimiter(1, burst_bytes=1)  # real clock, 1 byte per second
    limiter.acquire(1, timeout_s=0)
    t0 = time.monotonic()
    with pytest.raises(BandwidthLimitTimeoutError, match="COMPACTION"):
        limiter.acquire(1, Priority.COMPACTION, timeout_s=0.05)
    assert time.monotonic() - t0 < 5.0  # the 0.05 s asked, not the 60 s default (or 1 s/B)
    assert limiter.waiting_count == 0


def test_timed_out_head_lets_the_next_waiter_proceed():
    clock = FakeClock()
    limiter = BandwidthLimiter(1000, burst_bytes=100, clock=clock)
    limiter.acquire(100, timeout_s=0)
    granted: list[str] = []
    errors: list[BaseException] = []
    head = start_waiter(limiter, 100, Priority.PRODUCE, "head", granted, errors, timeout_s=0.05)
    wait_until(lambda: limiter.waiting_count == 1)
    other = start_waiter(
        limiter, 100, Priority.COMPACTION, "other", granted, errors, timeout_s=60.0
    )
    wait_until(lambda: limiter.waiting_count == 2)
    clock.advance(0.06)  # 60 tokens: not enough for the head, but its deadline passes
    wait_until(lambda: len(errors) == 1)
    assert isinstance(errors[0], BandwidthLimitTimeoutError)
    clock.advance(0.04)
    wait_until(lambda: granted == ["other"])
    head.join(WAIT_S)
    other.join(WAIT_S)


def test_queue_length_is_bounded():
    clock = FakeClock()
    limiter = BandwidthLimiter(1000, burst_bytes=100, max_waiters=1, clock=clock)
    limiter.acquire(100, timeout_s=0)
    granted: list[str] = []
    errors: list[BaseException] = []
    t = start_waiter(limiter, 100, Priority.CATCH_UP, "w", granted, errors)
    wait_until(lambda: limiter.waiting_count == 1)
    with pytest.raises(BandwidthLimitTimeoutError, match="queue is full"):
        limiter.acquire(100, Priority.PRODUCE, timeout_s=10)
    clock.advance(0.1)
    t.join(WAIT_S)
    assert granted == ["w"]


def test_set_rate_to_unlimited_releases_waiters():
    clock = FakeClock()
    limiter = BandwidthLimiter(1000, burst_bytes=100, clock=clock)
    limiter.acquire(100, timeout_s=0)
    granted: list[str] = []
    errors: list[BaseException] = []
    t = start_waiter(limiter, 10_000, Priority.COMPACTION, "big", granted, errors)
    wait_until(lambda: limiter.waiting_count == 1)
    limiter.set_rate(0)
    t.join(WAIT_S)
    assert granted == ["big"]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        BandwidthLimiter(-1)
    with pytest.raises(ValueError):
        BandwidthLimiter(10, burst_bytes=0)
    with pytest.raises(ValueError):
        BandwidthLimiter(10).acquire(-5)
