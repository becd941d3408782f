"""The priority token bucket's rules (pure, a fake clock): strict priority between waiting
requests, the rate kept over time, partial grants, refunds and debt, a bounded queue."""

from __future__ import annotations

import pytest

from dataplane.objectstore.token_bucket import PriorityTokenBucket, WaitersFullError

PRODUCE, TAIL, CATCH_UP = 0, 1, 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drained(rate: int = 1000, burst: int | None = None, waiters: int = 100):
    clock = FakeClock()
    bucket = PriorityTokenBucket(rate, burst, max_waiters=waiters, clock=clock)
    assert bucket.take_if_first(PRODUCE, bucket.burst_bytes)  # empty now
    return bucket, clock


def test_a_catch_up_waiter_never_goes_before_a_produce_waiter():
    bucket, clock = drained()
    catch_up = bucket.enqueue(CATCH_UP)  # first to arrive
    tail = bucket.enqueue(TAIL)
    produce = bucket.enqueue(PRODUCE)
    granted: list[str] = []
    for _ in range(40):
        clock.now += 0.05
        for name, ticket in (("catch-up", catch_up), ("tail", tail), ("produce", produce)):
            if name not in granted and bucket.try_grant(ticket, 500):
                granted.append(name)
    assert granted == ["produce", "tail", "catch-up"]
    # only the head is ever told how long it waits
    bucket2, _ = drained()
    low, high = bucket2.enqueue(CATCH_UP), bucket2.enqueue(PRODUCE)
    assert bucket2.seconds_until_grant(low, 500) is None
    assert bucket2.seconds_until_grant(high, 500) == pytest.approx(0.5)


def test_a_later_produce_overtakes_waiting_reads_but_not_an_earlier_produce():
    bucket, clock = drained()
    bucket.enqueue(CATCH_UP)
    clock.now += 1.0  # a full bucket, a catch-up read waiting
    assert bucket.take_if_first(PRODUCE, 400)  # producer traffic first
    first = bucket.enqueue(PRODUCE)
    assert not bucket.take_if_first(PRODUCE, 100)  # first come, first served
    assert bucket.try_grant(first, 100)


def test_the_rate_is_kept_over_time():
    """Requests of assorted sizes granted as soon as they may go, for 60 simulated
    seconds: the bytes granted are the rate's, plus one burst, within 2%."""
    rate = 10_000
    bucket, clock = drained(rate)
    start, granted = clock.now, 0
    sizes = [300, 5_000, 1_200, 20_000, 64]  # one larger than the burst (debt)
    i = 0
    while clock.now - start < 60:
        ticket = bucket.enqueue((PRODUCE, TAIL, CATCH_UP)[i % 3])
        n = sizes[i % len(sizes)]
        while not bucket.try_grant(ticket, n):
            clock.now += bucket.seconds_until_grant(ticket, n) or 0.001
        granted += n
        i += 1
    elapsed = clock.now - start
    assert granted == pytest.approx(rate * elapsed, rel=0.02, abs=20_000)


def test_partial_grants_refunds_and_debt():
    bucket, clock = drained(1000)
    clock.now += 0.4  # 400 tokens
    ticket = bucket.enqueue(CATCH_UP)
    assert bucket.grant_partial(ticket, 1_000) == 400
    assert bucket.waiting_count == 0
    bucket.refund(150)  # not sent after all
    assert bucket.available_bytes() == pytest.approx(150)
    bucket.charge(1_150)  # sent more than granted: debt
    assert bucket.available_bytes() == pytest.approx(-1_000)
    in_debt = bucket.enqueue(TAIL)
    assert bucket.grant_partial(in_debt, 10) == 0
    clock.now += 10
    bucket.refund(10**9)
    assert bucket.available_bytes() == bucket.burst_bytes  # never above the burst
    # a request of a higher priority waiting ahead: nothing for a lower one
    ahead = bucket.enqueue(PRODUCE)
    behind = bucket.enqueue(CATCH_UP)
    assert bucket.grant_partial(behind, 10) == 0
    assert bucket.try_grant(ahead, 10)


def test_unlimited_queue_bound_and_arguments():
    clock = FakeClock()
    unlimited = PriorityTokenBucket(0, max_waiters=1, clock=clock)
    assert unlimited.take_if_first(CATCH_UP, 10**12)
    bucket, _ = drained(waiters=2)
    a = bucket.enqueue(CATCH_UP)
    bucket.enqueue(CATCH_UP)
    with pytest.raises(WaitersFullError):
        bucket.enqueue(PRODUCE)
    bucket.leave(a)
    bucket.leave(a)  # idempotent
    bucket.enqueue(PRODUCE)
    bucket.set_rate(0)  # unlimited: every waiter may go
    assert bucket.try_grant(bucket.head(), 10**9)
    with pytest.raises(ValueError):
        PriorityTokenBucket(-1, max_waiters=1, clock=clock)
    with pytest.raises(ValueError):
        PriorityTokenBucket(1, 0, max_waiters=1, clock=clock)
    with pytest.raises(ValueError):
        PriorityTokenBucket(1, max_waiters=0, clock=clock)
