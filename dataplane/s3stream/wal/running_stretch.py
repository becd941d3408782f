"""RunningStretch: how long a thread that checks at a steady pace has been running unstopped.

A thread that checks every few hundred milliseconds and then finds seconds gone since its
last check did not run meanwhile: its process was stopped (SIGSTOP, a paused VM) or starved
of CPU. Whatever waited in that time (a PUT in flight, an ownership check) waited on this
process too, so it says nothing about the store. The bucket switch of `BucketFollowingWAL`
counts a stall only within the current running stretch: a broker stopped for 6 s with a PUT
in flight once left a healthy bucket on resuming, and a PUT it then began in the failover
bucket was cut off by its restart (the empty owner object of docs/formats.md).

Pure: fed with monotonic times by one thread.
"""

from __future__ import annotations

__all__ = ["RunningStretch"]


class RunningStretch:
    """The running stretch of one checking thread (module docstring).

    `max_gap_s`: a gap between two checks longer than this means the thread did not run.
    Thread-safety: one thread calls `observe` and `running_s`.
    """

    def __init__(self, now_s: float, max_gap_s: float) -> None:
        if max_gap_s <= 0:
            raise ValueError(f"max_gap_s must be positive, not {max_gap_s}")
        self._max_gap_s = max_gap_s
        self._last_s = now_s
        self.since_s = now_s  # when the current running stretch began

    def observe(self, now_s: float) -> float:
        """Note a check at `now_s`; returns the gap since the previous one when it was
        longer than `max_gap_s` (the running stretch starts over at `now_s`), else 0."""
        gap_s = now_s - self._last_s
        self._last_s = now_s
        if gap_s > self._max_gap_s:
            self.since_s = now_s
            return gap_s
        return 0.0

    def running_s(self, now_s: float) -> float:
        """How long the thread has been running unstopped at `now_s`."""
        return now_s - self.since_s
