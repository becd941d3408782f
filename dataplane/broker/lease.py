"""A broker's own view of its controller session: it fences itself when no controller
answered it for a session timeout.

The controller leader fences a broker whose heartbeats stopped for `broker_session_timeout_ms`
and moves its partitions to other brokers. A broker cut off from every controller (its host
partitioned, its controllers lost) cannot hear that; left alone it would keep its listener
open and clients would keep waiting on it until the network returned. So each heartbeat the
controller answered (not fenced) renews a lease that ends one session after that heartbeat
was *sent* (the controller's own timer starts later, when it received it: the broker's lease
always ends first). Once the lease ended the broker is self-fenced: `holds()` is False, so
no partition is served (produce and fetch answer NOT_LEADER_OR_FOLLOWER, retriable), and
`on_lost` closes the client connections and new ones are refused, so clients go to the new
leaders at once. A later heartbeat the controller answers unfenced renews the lease and
`on_regained` is told (a broker the controller fenced meanwhile restarts instead:
heartbeat.py).

Before the first renewal (registering, starting) there is no lease and nothing is held back.

Thread-safety: `tick` runs on the `controller-lease` thread; `renewed` and `holds` are called
from any thread (plain float reads and writes); the callbacks run on the lease thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TICK_S = 0.1


class ControllerLease:
    """Self-fencing after a session without an answer from any controller."""

    def __init__(
        self,
        on_lost: Callable[[], None],
        on_regained: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = TICK_S,
    ):
        self._on_lost = on_lost
        self._on_regained = on_regained
        self._clock = clock
        self._tick_s = tick_s
        self._ends_at_s: float | None = None  # None: no lease yet (nothing held back)
        self._session_s = 0.0
        self._lost = False  # what the last tick saw (callbacks fire on its changes)
        self._tick_lock = threading.Lock()  # the lease thread and `renewed` both tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-lease", daemon=True)

    def start(self) -> None:
        """Start watching the lease (the `controller-lease` thread)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def renewed(self, sent_at_s: float, session_timeout_ms: int) -> None:
        """A heartbeat sent at `sent_at_s` (this clock) was answered, not fenced: the lease
        runs until one session after it was sent (0 ms: the session is unknown, no lease)."""
        if session_timeout_ms <= 0:
            return
        self._session_s = session_timeout_ms / 1000
        ends_at_s = sent_at_s + self._session_s
        if self._ends_at_s is None or ends_at_s > self._ends_at_s:
            self._ends_at_s = ends_at_s
        if self._lost and self.holds():
            self.tick()  # say so at once: clients may connect again

    def holds(self) -> bool:
        """Whether this broker may serve: no lease yet, or the lease has not ended."""
        ends_at_s = self._ends_at_s
        return ends_at_s is None or self._clock() < ends_at_s

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the watch must outlive a failing callback
                log.exception("controller lease check failed")

    def tick(self) -> None:
        """Tell the callbacks when the lease is lost or regained."""
        with self._tick_lock:
            self._tick()

    def _tick(self) -> None:
        holds = self.holds()
        if not holds and not self._lost:
            self._lost = True
            log.warning(
                "no controller answered a heartbeat for %.1f s (the session): this broker "
                "fences itself (produce and fetch answer NOT_LEADER_OR_FOLLOWER, client "
                "connections are closed and refused) until a controller answers",
                self._session_s,
            )
            self._on_lost()
        elif holds and self._lost:
            self._lost = False
            log.info("a controller answered: this broker serves again")
            self._on_regained()
