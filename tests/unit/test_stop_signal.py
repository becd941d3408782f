"""A process's main loop stops on SIGTERM even when SIGTERMs come in bursts (a supervisor's
terminate, then a test's): the handler takes no lock, so it cannot deadlock the main thread
inside `Event.wait` or inside an earlier handler (the shard store hung this way until
killed)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from controlplane.stop_signal import StopSignal

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import sys, threading
from controlplane.stop_signal import StopSignal
stop = StopSignal.install().event
print("READY", flush=True)
while not stop.wait(0.001):  # the main thread takes the Event's lock about 1,000 times a second
    pass
print("STOPPED", flush=True)
"""


def _child() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""


def test_bursts_of_sigterm_always_stop_the_process() -> None:
    children = [_child() for _ in range(6)]
    try:
        for child in children:
            assert _readline(child, 30) == "READY"
        for child in children:
            for _ in range(20):  # a burst: handlers arrive while earlier ones run
                child.send_signal(signal.SIGTERM)
        for child in children:
            assert _readline(child, 10) == "STOPPED"
            assert child.wait(timeout=10) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def test_the_event_is_set_soon_after_the_signal() -> None:
    child = _child()
    try:
        assert _readline(child, 30) == "READY"
        began = time.monotonic()
        child.send_signal(signal.SIGINT)
        assert _readline(child, 10) == "STOPPED"
        assert time.monotonic() - began < 5  # POLL_S, with a loaded machine's margin
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_the_handler_returns_while_the_events_lock_is_held() -> None:
    """Where the old handlers (`lambda *_: stop.set()`) deadlocked: Python ran one while the
    main thread held the Event's lock (inside `Event.wait`, or inside the `set()` of an
    earlier SIGTERM's handler)."""
    stop = StopSignal()
    returned = threading.Event()

    def main_thread_holding_the_lock() -> None:
        with stop.event._cond:  # type: ignore[attr-defined]
            stop._handle(signal.SIGTERM, None)
            returned.set()

    thread = threading.Thread(target=main_thread_holding_the_lock, daemon=True)
    thread.start()
    assert returned.wait(5), "the handler blocked on the Event's lock"
    assert stop.received == signal.SIGTERM
