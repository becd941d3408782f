"""Slows down repeated failed logins from one client address: each failure within
`window_s` of the previous one doubles the delay of the next failure's answer, up to
`max_delay_s`. Bounded memory (the oldest addresses are forgotten). Pure apart from the
injectable clock. Thread-safety: call from one event loop."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class LoginThrottle:
    def __init__(
        self,
        base_delay_s: float = 0.1,
        max_delay_s: float = 2.0,
        window_s: float = 60.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # addr -> (n, last)

    def failure(self, address: str) -> float:
        """Record a failed login from `address`; the delay (s) before answering it."""
        now = self._clock()
        count, last = self._failures.pop(address, (0, now))
        count = count + 1 if now - last <= self.window_s else 1
        self._failures[address] = (count, now)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
        return min(self.base_delay_s * 2 ** (count - 1), self.max_delay_s)

    def success(self, address: str) -> None:
        self._failures.pop(address, None)

    def failures(self, address: str) -> int:
        return self._failures.get(address, (0, 0.0))[0]
