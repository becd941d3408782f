"""Waiting for an append's durability with a timeout (`runtime.outcome_within`, used by
Produce, the zone router's routed appends and the transaction markers): the timeout never
cancels the append's future, which other waiters still rely on, and a failure that comes
after the wait gave up leaves no "Future exception was never retrieved" ERROR (a fenced WAL:
issue 33)."""

from __future__ import annotations

import asyncio
import gc
from concurrent.futures import Future

import pytest

from dataplane.light_future import LightFuture
from dataplane.runtime import outcome_within
from dataplane.s3stream.wal import WALFencedError


def _unretrieved_after_timeout(wait) -> list[dict]:
    reported: list[dict] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        durable: Future = Future()
        with pytest.raises(TimeoutError):
            await wait(durable, 0.01)
        durable.set_exception(WALFencedError("owned by node 2 epoch 4"))
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(scenario())
    return [c for c in reported if "never retrieved" in c.get("message", "")]


def _shielded_wrap(durable: Future, timeout_s: float):
    return asyncio.wait_for(asyncio.shield(asyncio.wrap_future(durable)), timeout_s)


def test_a_late_failure_of_an_abandoned_wait_is_retrieved() -> None:
    assert _unretrieved_after_timeout(outcome_within) == []


def test_without_it_asyncio_reports_the_exception() -> None:
    """The scenario reproduces the ERROR the fix removes."""
    assert _unretrieved_after_timeout(_shielded_wrap)


@pytest.mark.parametrize("kind", [Future, LightFuture], ids=lambda k: k.__name__)
def test_a_timed_out_or_cancelled_wait_leaves_the_append_future_pending(kind) -> None:
    async def scenario() -> None:
        timed_out = kind()  # pending, as the stored batch's future (a running one resists)
        with pytest.raises(TimeoutError):
            await outcome_within(timed_out, 0.01)
        assert not timed_out.done()  # `wait_for(wrap_future(f))` cancelled a pending f here

        abandoned = kind()
        waiting = asyncio.ensure_future(outcome_within(abandoned, 10))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not abandoned.done() and not abandoned.cancelled()

        for future in (timed_out, abandoned):  # the outcome still reaches a later waiter
            future.set_result("durable")
            assert await outcome_within(future, 1) == "durable"

    asyncio.run(scenario())


def test_the_outcome_or_the_failure_of_a_concurrent_future_reaches_the_waiter() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ok, failed = LightFuture(), LightFuture()
        loop.call_later(0.01, lambda: loop.run_in_executor(None, ok.set_result, 7))
        loop.call_later(0.01, lambda: failed.set_exception(WALFencedError("taken over")))
        assert await outcome_within(ok, 10) == 7
        with pytest.raises(WALFencedError):
            await outcome_within(failed, 10)

    asyncio.run(scenario())
