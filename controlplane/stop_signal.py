"""SIGTERM / SIGINT as an Event a process's main loop can wait on, without deadlocks.

Python runs a signal handler in the main thread, between two of its bytecodes, and possibly
while that thread holds a lock. A handler that calls `threading.Event.set()` therefore
deadlocks the process if the main thread was inside that Event's own `wait()` (it re-takes
the Event's lock when it wakes) or inside an earlier handler's `set()` (a second SIGTERM
arriving while the first is handled: a supervisor's terminate, then a test's). The process
then ignores every later SIGTERM and is only ever killed.

So the handler here only assigns an attribute (no lock), and a small daemon thread turns it
into `event.set()` within `POLL_S`.

Thread-safety: `event` may be waited on by any thread; `install` is called once, from the
main thread (Python's rule for `signal.signal`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable

POLL_S = 0.05  # how late the event may be set after the signal


class StopSignal:
    """Sets `event` once one of `signals` arrives; `received` names the first one."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received: int | None = None

    @classmethod
    def install(
        cls, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> StopSignal:
        stop = cls()
        for sig in signals:
            signal.signal(sig, stop._handle)
        threading.Thread(target=stop._watch, name="stop-signal", daemon=True).start()
        return stop

    def _handle(self, signum: int, _frame: object) -> None:
        # an attribute assignment only: no lock may be taken here (module docstring)
        if self.received is None:
            self.received = signum

    def _watch(self) -> None:
        while self.received is None:
            time.sleep(POLL_S)
        self.event.set()
