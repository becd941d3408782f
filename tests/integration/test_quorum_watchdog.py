"""The stuck-follower watchdog: a follower that stops applying is rebuilt from the leader."""

from __future__ import annotations

import secrets
import time

import pytest

from controlplane.errors import ControllerError
from controlplane.quorum import MetadataQuorum
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import find_free_ports

pytestmark = pytest.mark.integration


def current_leader(nodes: list[MetadataQuorum], timeout_s: float = 20) -> MetadataQuorum:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for n in nodes:
            if n.is_leader():
                return n
        time.sleep(0.05)
    raise AssertionError(f"no leader within {timeout_s}s")


def put_kv(nodes: list[MetadataQuorum], key: str) -> None:
    """Commit put_kv on whichever node leads: an election on a loaded machine (three raft
    nodes share this process's GIL; timeouts are 0.4-1 s) moves the leader, and put_kv is
    idempotent, so a refused or timed-out submit is tried again (bounded)."""
    for _ in range(10):
        try:
            assert "result" in current_leader(nodes).submit("put_kv", {"key": key, "value": "v"})
            return
        except ControllerError:
            time.sleep(0.1)
    raise AssertionError(f"put_kv {key} was never committed")


def test_follower_with_failing_ticks_is_rebuilt_and_converges(tmp_path):
    ports = find_free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    password = secrets.token_urlsafe(16)
    nodes = [
        MetadataQuorum(
            a,
            [b for b in addrs if b != a],
            tmp_path / f"n{i}",
            password,
            ControllerSettings(),
            stuck_after_s=3.0,
        )
        for i, a in enumerate(addrs)
    ]
    try:
        for i in range(50):
            put_kv(nodes, f"k{i}")
        follower = next(n for n in nodes if n is not current_leader(nodes))
        broken = follower._syncobj

        def failing_tick(*_a, **_kw):  # what pysyncobj's IndexError-every-tick looks like
            raise IndexError("list index out of range")

        broken._onTick = failing_tick
        for i in range(50, 100):
            put_kv([n for n in nodes if n is not follower], f"k{i}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # the most advanced healthy node (the leader may have moved; the rebuilt
            # follower may even lead now, so it is not compared with itself)
            leader = max(
                (n for n in nodes if n is not follower), key=lambda n: n.machine.next_offset
            )
            # converged = same log end and the same state (read after the rebuild finished)
            if (
                follower.recoveries
                and follower._syncobj is not broken
                and follower.machine.next_offset == leader.machine.next_offset
                and follower.machine.image.fingerprint() == leader.machine.image.fingerprint()
            ):
                break
            time.sleep(0.1)
        assert follower.recoveries == 1
        assert follower._syncobj is not broken
        assert follower.machine.next_offset == leader.machine.next_offset
        assert follower.machine.image.kv == leader.machine.image.kv
        assert follower.machine.image.fingerprint() == leader.machine.image.fingerprint()
        assert list(tmp_path.glob(f"n{nodes.index(follower)}/raft.journal*.stuck-*"))
    finally:
        for n in nodes:
            n.close()
