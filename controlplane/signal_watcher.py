"""SIGTERM / SIGINT as an Event set by a thread of its own, never by a signal handler.

Traps of Python signal handlers:
- Python runs a handler in the main thread, between two of its bytecodes, possibly while
  that thread holds a lock. A handler calling `threading.Event.set()` deadlocks if the main
  thread was inside that Event's `wait()` or inside an earlier handler's `set()` (a second
  SIGTERM): the shard store then ignored SIGTERM and was killed after 10 s.
- The kernel may deliver a signal to any thread, and Python runs the handler only once the
  main thread runs bytecode again.

Here the Python-level handler does nothing; the C-level handler, in whatever thread the
signal lands, writes the signal's number to the wakeup pipe (`signal.set_wakeup_fd`), and
a daemon thread reading it sets the stop Event, outside any signal context.

Thread-safety: `stop_event` may be waited on by any thread. `install` must be called from
the main thread (Python's rule) and once per process (the wakeup fd is process-wide; an
asyncio loop in the main thread would replace it).
"""

from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalWatcher:
    """Sets `stop_event` on SIGTERM / SIGINT."""

    def __init__(self) -> None:
        self.stop_event = threading.Event()

    @classmethod
    def install(cls) -> SignalWatcher:
        watcher = cls()
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # a full pipe drops the byte; signals coalesce anyway
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, _ignore_in_main_thread)
        threading.Thread(
            target=watcher._watch, args=(read_fd,), name="signal-watcher", daemon=True
        ).start()
        return watcher

    def _watch(self, read_fd: int) -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            if any(signum in STOP_SIGNALS for signum in data):
                self.stop_event.set()


def _ignore_in_main_thread(_signum: int, _frame: object) -> None:
    """The Python-level handler: the watcher thread acts (module docstring)."""
