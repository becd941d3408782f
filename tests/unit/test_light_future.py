"""LightFuture behaves as the standard concurrent.futures.Future wherever the produce path
and its callers use one: each behaviour is checked on both, so a difference fails here."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from dataplane.light_future import LightFuture

KINDS = [Future, LightFuture]


@pytest.fixture(params=KINDS, ids=lambda kind: kind.__name__)
def make(request):
    return request.param


def test_callbacks_run_once_on_resolve_and_at_once_when_already_done(make) -> None:
    future = make()
    seen: list[tuple[str, object]] = []
    future.add_done_callback(lambda done: seen.append(("first", done.result())))
    future.add_done_callback(lambda done: seen.append(("second", done.result())))
    assert seen == [] and not future.done()
    future.set_result(7)
    assert seen == [("first", 7), ("second", 7)]
    future.add_done_callback(lambda done: seen.append(("late", done.result())))
    assert seen[-1] == ("late", 7)
    assert future.done() and not future.cancelled() and not future.running()


def test_a_failing_callback_is_logged_and_the_others_still_run(make, caplog) -> None:
    future = make()
    seen: list[int] = []

    def boom(_done: Future) -> None:
        raise RuntimeError("callback failed")

    future.add_done_callback(boom)
    future.add_done_callback(lambda done: seen.append(done.result()))
    future.set_result(1)
    assert seen == [1]
    assert any("exception calling callback" in r.getMessage() for r in caplog.records)


def test_an_exception_is_raised_by_result_and_returned_by_exception(make) -> None:
    future = make()
    error = ValueError("no room")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(ValueError, match="no room"):
        future.result()


def test_resolving_twice_is_refused_and_keeps_the_first_outcome(make) -> None:
    future = make()
    future.set_result("kept")
    with pytest.raises(InvalidStateError):
        future.set_result("second")
    with pytest.raises(InvalidStateError):
        future.set_exception(ValueError("second"))
    assert future.result() == "kept"


def test_cancel_succeeds_only_while_pending(make) -> None:
    pending = make()
    seen: list[bool] = []
    pending.add_done_callback(lambda done: seen.append(done.cancelled()))
    assert pending.cancel() and pending.cancel()  # a second cancel: still cancelled
    assert seen == [True] and pending.done()
    with pytest.raises(CancelledError):
        pending.result()
    with pytest.raises(CancelledError):
        pending.exception()
    assert pending.set_running_or_notify_cancel() is False
    with pytest.raises(RuntimeError):  # told once: a second call is a caller's bug
        pending.set_running_or_notify_cancel()
    assert pending.cancelled() and pending.cancel()
    with pytest.raises(InvalidStateError):
        pending.set_result(1)

    running = make()
    assert running.set_running_or_notify_cancel() is True and running.running()
    assert running.cancel() is False
    with pytest.raises(RuntimeError):
        running.set_running_or_notify_cancel()
    running.set_result(2)
    assert running.cancel() is False and running.result() == 2


def test_result_times_out_and_a_blocked_thread_is_woken_by_another(make) -> None:
    future = make()
    with pytest.raises(FutureTimeoutError):
        future.result(timeout=0.01)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(future.result(timeout=10)))
    waiter.start()
    future.set_result("from another thread")
    waiter.join(timeout=10)
    assert not waiter.is_alive() and got == ["from another thread"]


def test_asyncio_wrap_future_takes_it_both_ways(make) -> None:
    async def scenario() -> None:
        resolved = make()
        resolver = threading.Timer(0.01, lambda: resolved.set_result("durable"))
        resolver.start()
        try:
            assert await asyncio.wait_for(asyncio.wrap_future(resolved), 10) == "durable"
        finally:
            resolver.join(timeout=10)

        failed = make()
        failed.set_exception(OSError("disk"))
        with pytest.raises(OSError, match="disk"):
            await asyncio.wrap_future(failed)

        abandoned = make()
        wrapped = asyncio.wrap_future(abandoned)
        wrapped.cancel()  # the awaiting side gave up: a pending source is cancelled too
        await asyncio.sleep(0)
        assert abandoned.cancelled()

    asyncio.run(scenario())


def test_a_callback_added_while_another_thread_resolves_runs_exactly_once(make) -> None:
    futures = [make() for _ in range(3000)]
    calls = [0] * len(futures)
    start = threading.Barrier(2)

    def resolve_all() -> None:
        start.wait(timeout=10)
        for future in futures:
            future.set_result(None)

    resolver = threading.Thread(target=resolve_all)
    resolver.start()
    try:
        start.wait(timeout=10)
        for i, future in enumerate(futures):
            future.add_done_callback(lambda _done, i=i: calls.__setitem__(i, calls[i] + 1))
    finally:
        resolver.join(timeout=10)
    assert calls == [1] * len(futures)


def test_a_raised_outcome_does_not_keep_the_future_alive(make) -> None:
    # a fenced WAL fails every queued append: their futures must go with their last
    # reference, not wait for the cyclic collector (exception -> traceback -> frame -> future)
    gc.disable()
    try:
        future = make()
        future.set_exception(ValueError("fenced"))
        with pytest.raises(ValueError):
            future.result()
        gone = weakref.ref(future)
        del future
        assert gone() is None
    finally:
        gc.enable()
