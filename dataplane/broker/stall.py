"""Noticing that this broker process was stopped: SIGSTOP, a paused VM, heavy swapping.

A broker stopped for longer than its controller session may have been fenced meanwhile: its
partitions moved, its WAL taken over, and producers went on with another broker. When it
runs again, it still holds its old metadata image and idempotence tables until a heartbeat
tells it otherwise, and answers from them would be stale. The WAL's reservation already
keeps it from acknowledging a write, but an answer such as OUT_OF_ORDER_SEQUENCE_NUMBER
from a stale table makes librdkafka bump its producer epoch and renumber the messages it
resends, some possibly stored already, which no broker can then deduplicate.

`StallWatch` ticks on its own thread. A gap between two ticks longer than the session
means the process was stopped; from then until a heartbeat *sent after* the gap succeeds,
`serving()` is False and the broker answers NOT_LEADER_OR_FOLLOWER (clients refresh their
metadata and retry). A gap seen by `serving()` before the ticker has run again counts the
same, so nothing is served in between. Without a known session (0) nothing is held back.

Thread-safety: `tick` runs on the watch's thread; `serving` and `heartbeat_succeeded` from
any thread (plain float reads and writes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TICK_S = 0.1


class StallWatch:
    """Holds serving back after this process was stopped longer than its session."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, tick_s: float = TICK_S):
        self._clock = clock
        self._tick_s = tick_s
        self.session_s = 0.0  # the controller's broker session; 0: unknown, never held back
        self._last_tick_s = clock()
        self._stalled_at_s: float | None = None  # when the latest stall was noticed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self.tick()

    def tick(self) -> None:
        now = self._clock()
        gap_s = now - self._last_tick_s
        if self.session_s > 0 and gap_s > self.session_s:
            self._stalled_at_s = now
            log.warning(
                "this process was stopped for %.1f s (longer than its %.1f s session): not "
                "serving partitions until a heartbeat succeeds",
                gap_s,
                self.session_s,
            )
        self._last_tick_s = now

    def serving(self) -> bool:
        """Whether partitions may be served (False from a stall until a later heartbeat)."""
        if self._stalled_at_s is not None:
            return False
        return not (self.session_s > 0 and self._clock() - self._last_tick_s > self.session_s)

    def heartbeat_succeeded(self, sent_at_s: float, session_timeout_ms: int) -> None:
        """A heartbeat sent at `sent_at_s` (this clock) was answered, not fenced: a stall
        noticed before it was sent is over."""
        if session_timeout_ms > 0:
            self.session_s = session_timeout_ms / 1000
        stalled_at = self._stalled_at_s
        if stalled_at is not None and sent_at_s > stalled_at:
            self._stalled_at_s = None
            log.info("serving partitions again: a heartbeat after the stall succeeded")
