"""`LoopHandoff`: callbacks handed to the event loop from other threads, one wakeup of the loop
for many (a WAL's group commit resolving several produces' futures), none lost or reordered."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from dataplane.runtime import LoopHandoff, loop_wakeups_held


class _CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts `call_soon_threadsafe` (each one writes to the self-pipe:
    a wakeup)."""

    def __init__(self) -> None:
        super().__init__()
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, callback, *args, context=None):
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def loop():
    loop = _CountingLoop()
    try:
        yield loop
    finally:
        loop.close()


def _on_thread(work) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_held_wakeups_wake_the_loop_once_and_run_every_callback_in_order(loop) -> None:
    handoff = LoopHandoff.of(loop)
    assert LoopHandoff.of(loop) is handoff  # one per loop: every caller shares its wakeups
    ran: list[int] = []

    async def main() -> None:
        before = loop.threadsafe_calls

        def resolve_group_commit() -> None:
            with loop_wakeups_held(), loop_wakeups_held():  # nested: the outermost wakes
                for i in range(20):
                    handoff.call_soon(ran.append, i)
                assert loop.threadsafe_calls == before  # nothing sent inside the block

        _on_thread(resolve_group_commit)
        assert loop.threadsafe_calls == before + 1
        for _ in range(100):  # bounded: the queued run is the next ready callback
            if len(ran) == 20:
                break
            await asyncio.sleep(0)
        assert ran == list(range(20))
        # not held: the first call wakes the loop, the next ones join the same run
        _on_thread(lambda: [handoff.call_soon(ran.append, i) for i in range(20, 25)])
        assert loop.threadsafe_calls == before + 2
        for _ in range(100):
            if len(ran) == 25:
                break
            await asyncio.sleep(0)
        assert ran == list(range(25))

    loop.run_until_complete(main())


def test_wrap_future_hands_over_results_and_errors_and_survives_a_failing_callback(
    loop,
) -> None:
    handoff = LoopHandoff.of(loop)
    errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def main() -> None:
        ok: Future = Future()
        failed: Future = Future()
        ok_waiter = handoff.wrap_future(ok)
        failed_waiter = handoff.wrap_future(failed)
        abandoned: Future = Future()
        abandoned_waiter = handoff.wrap_future(abandoned)
        abandoned_waiter.cancel()  # the produce gave up: the append's future stays as is
        cancelled: Future = Future()
        cancelled_waiter = handoff.wrap_future(cancelled)

        def boom() -> None:
            raise RuntimeError("a failing callback")

        def complete() -> None:
            with loop_wakeups_held():
                handoff.call_soon(boom)
                ok.set_result(7)
                failed.set_exception(ValueError("fenced"))
                abandoned.set_result(1)
                cancelled.cancel()

        _on_thread(complete)
        assert await asyncio.wait_for(ok_waiter, 10) == 7
        with pytest.raises(ValueError, match="fenced"):
            await asyncio.wait_for(failed_waiter, 10)
        assert not abandoned.cancelled() and abandoned.result() == 1
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(cancelled_waiter, 10)
        assert cancelled_waiter.cancelled()
        assert [str(e["exception"]) for e in errors] == ["a failing callback"]

    loop.run_until_complete(main())


def test_a_closed_loop_drops_what_is_handed_to_it() -> None:
    loop = asyncio.new_event_loop()
    handoff = LoopHandoff.of(loop)
    loop.close()
    handoff.call_soon(lambda: None)  # no error: nobody is left to call back
    handoff.call_soon(lambda: None)  # and the next call tries again rather than waits forever
