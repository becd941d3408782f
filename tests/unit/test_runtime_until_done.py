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
