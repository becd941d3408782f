"""`until_done`: a connection's writer awaits each response slot, and each request its turn,
without ever cancelling them when the connection's task is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from dataplane.runtime import until_done


def test_returns_once_the_future_is_done_whatever_its_outcome() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        for settle in (
            lambda f: f.set_result(1),
            lambda f: f.set_exception(ValueError("x")),
            lambda f: f.cancel(),
        ):
            fut = loop.create_future()
            loop.call_later(0.01, settle, fut)
            await until_done(fut)  # never raises the future's outcome
            assert fut.done()

    asyncio.run(main())


def test_cancelling_the_waiter_leaves_the_future_pending() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        waiting = asyncio.create_task(until_done(fut))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not fut.done()
        fut.set_result(None)  # the cancelled wait's callback is gone: nothing is woken
        await asyncio.sleep(0)

    asyncio.run(main())


def test_a_timeout_returns_false_and_leaves_the_future_to_finish() -> None:
    """A produce stops waiting for durability at its deadline; the append's future goes
    on (a retry of the batch may wait for it) and is not cancelled."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        started = loop.time()
        assert await until_done(fut, 0.05) is False
        assert 0.04 <= loop.time() - started < 1
        assert not fut.done()
        loop.call_later(0.01, fut.set_result, 7)
        assert await until_done(fut, 5) is True
        assert fut.result() == 7

    asyncio.run(main())


def test_held_writer_wakeups_all_run_once_at_the_block_end_even_if_one_fails() -> None:
    """`writer_wakeups_held`: each queue's writer is woken once when the outermost block
    ends; one failing wakeup does not leave another writer asleep (it would wait for an
    append that may never come)."""
    from dataplane.runtime import writer_wakeup_deferred, writer_wakeups_held

    woken: list[str] = []

    def failing() -> None:
        woken.append("a")
        raise RuntimeError("boom")

    assert writer_wakeup_deferred("a", failing) is False  # no block: wake now
    with writer_wakeups_held():
        assert writer_wakeup_deferred("a", failing) is True
        assert writer_wakeup_deferred("a", failing) is True  # the same queue: once
        with writer_wakeups_held():
            assert writer_wakeup_deferred("b", lambda: woken.append("b")) is True
        assert woken == []  # the inner block does not wake
    assert woken == ["a", "b"]
