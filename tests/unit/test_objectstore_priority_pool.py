"""The object store's priority pool: uploads start before queued catch-up GETs and always
find a worker, however many catch-up requests are queued or throttled."""

from __future__ import annotations

import threading

import pytest

from dataplane.objectstore import Priority
from dataplane.objectstore.priority_pool import PriorityThreadPool, reserved_workers_for

WAIT_S = 10.0


def test_queued_work_starts_by_priority_then_arrival():
    pool = PriorityThreadPool(1)
    gate = threading.Event()
    order: list[str] = []
    blocker = pool.submit(Priority.PRODUCE, gate.wait, WAIT_S)
    futures = [
        pool.submit(priority, order.append, name)
        for priority, name in [
            (Priority.COMPACTION, "compaction"),
            (Priority.CATCH_UP, "catch-up 1"),
            (Priority.PRODUCE, "upload"),
            (Priority.CATCH_UP, "catch-up 2"),
        ]
    ]
    gate.set()
    for f in [blocker, *futures]:
        f.result(timeout=WAIT_S)
    assert order == ["upload", "catch-up 1", "catch-up 2", "compaction"]
    pool.shutdown()


def test_catch_up_work_never_holds_the_workers_kept_for_uploads():
    pool = PriorityThreadPool(4, reserved_workers=1)
    gate = threading.Event()
    started = threading.Semaphore(0)

    def catch_up_get() -> None:
        started.release()
        gate.wait(WAIT_S)

    gets = [pool.submit(Priority.CATCH_UP, catch_up_get) for _ in range(10)]
    for _ in range(pool.low_priority_cap):
        assert started.acquire(timeout=WAIT_S)
    upload = pool.submit(Priority.PRODUCE, lambda: "uploaded")
    assert upload.result(timeout=WAIT_S) == "uploaded"
    assert not any(g.done() for g in gets)  # the upload did not wait for any of them
    assert pool.queued_count() == 10 - pool.low_priority_cap
    gate.set()
    for g in gets:
        g.result(timeout=WAIT_S)
    pool.shutdown()


def test_results_exceptions_and_shutdown():
    pool = PriorityThreadPool(2)
    assert pool.submit(Priority.CATCH_UP, pow, 2, 10).result(timeout=WAIT_S) == 1024
    failing = pool.submit(Priority.PRODUCE, int, "not a number")
    with pytest.raises(ValueError):
        failing.result(timeout=WAIT_S)
    gate = threading.Event()
    pool.submit(Priority.PRODUCE, gate.wait, WAIT_S)
    queued = pool.submit(Priority.COMPACTION, lambda: "ran")
    gate.set()
    pool.shutdown(wait=True)  # queued work still runs
    assert queued.result(timeout=0) == "ran"
    with pytest.raises(RuntimeError):
        pool.submit(Priority.PRODUCE, print)


def test_reserved_workers_default_and_bounds():
    assert reserved_workers_for(1) == 0
    assert reserved_workers_for(2) == 1
    assert reserved_workers_for(64) == 16
    with pytest.raises(ValueError):
        PriorityThreadPool(2, reserved_workers=2)
    with pytest.raises(ValueError):
        PriorityThreadPool(0)
