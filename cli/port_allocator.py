"""One allocator for every port of a new local cluster (`cluster up`): the controllers'
Raft and API ports, the brokers' listener and metrics ports, and the embedded object
stores' ports, their admin gRPC ports included, all from one range.

The range is `--port-range A-B`, or by default 10000 up to the kernel's ephemeral range
(32768 on Linux): a port in the ephemeral range is also what the kernel hands to outgoing
connections, which can take it between the allocation and the bind. With a range given,
ports are taken in order from its low end (the same ports on every run of a free
machine); by default at random (clusters and test runs side by side rarely collide).

SeaweedFS dials its admin server's gRPC port at admin port + ADMIN_GRPC_OFFSET (10000),
whatever it is told: an embedded store needs such a pair inside the range, so a range for
a cluster with embedded stores spans more than 10000 ports.

Not thread-safe: one allocator per `cluster up`.
"""

from __future__ import annotations

import random

from cli.cluster_config import ClusterError
from dataplane.objectstore.seaweed import SERVER_PORT_RANGE, ephemeral_low, port_in_use

MIN_PORT = 1024
MAX_PORT = 65535


def default_port_range() -> tuple[int, int]:
    """The default range: 10000 up to just below the kernel's ephemeral ports."""
    return SERVER_PORT_RANGE[0], min(SERVER_PORT_RANGE[1], ephemeral_low() - 1)


def parse_port_range(text: str) -> tuple[int, int]:
    """`A-B` (inclusive) as (A, B), or ClusterError naming what is wrong."""
    low_text, sep, high_text = text.strip().partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low = high = -1
    if not sep or low < 0:
        raise ClusterError(f"--port-range {text!r}: expected LOW-HIGH, e.g. 20000-31999")
    if not MIN_PORT <= low < high <= MAX_PORT:
        raise ClusterError(f"--port-range {text}: needs {MIN_PORT} <= LOW < HIGH <= {MAX_PORT}")
    return low, high


class PortAllocator:
    """Distinct ports of [low, high] free on `host` when handed out (none twice)."""

    def __init__(self, low: int, high: int, host: str = "127.0.0.1", in_order: bool = True):
        self.low, self.high, self.host = low, high, host
        self._in_order = in_order
        self._given: set[int] = set()

    @property
    def label(self) -> str:
        return f"port range {self.low}-{self.high}"

    def _candidates(self, high: int) -> list[int]:
        ports = list(range(self.low, high + 1))
        if not self._in_order:
            random.shuffle(ports)
        return ports

    def _usable(self, port: int) -> bool:
        return port not in self._given and not port_in_use(port, self.host)

    def take(self, count: int) -> list[int]:
        """`count` free ports of the range; ClusterError when it has too few."""
        out: list[int] = []
        for port in self._candidates(self.high):
            if len(out) == count:
                break
            if self._usable(port):
                out.append(port)
        if len(out) < count:
            size = self.high - self.low + 1
            raise ClusterError(
                f"{self.label} has {len(out)} free ports of the {count} the cluster still "
                f"needs ({size - len(out) - len(self._given)} of its {size} are taken by "
                "other programs): give a wider or another --port-range"
            )
        self._given.update(out)
        return out

    def take_pair(self, offset: int) -> tuple[int, int]:
        """Free ports (P, P + offset), both in the range (an embedded store's admin and
        admin gRPC ports); ClusterError when the range cannot hold such a pair."""
        if self.high - self.low < offset:
            raise ClusterError(
                f"{self.label} spans {self.high - self.low + 1} ports; an embedded object "
                f"store needs an admin port P and P + {offset} in it (SeaweedFS dials its "
                f"admin gRPC port there): give a range of more than {offset} ports, or "
                "use external buckets (--bucket-uris)"
            )
        for port in self._candidates(self.high - offset):
            if self._usable(port) and self._usable(port + offset):
                self._given.update((port, port + offset))
                return port, port + offset
        raise ClusterError(
            f"{self.label} has no free pair of ports (P, P + {offset}) left for an embedded "
            "object store's admin ports: give a wider or another --port-range"
        )
