"""The stuck-follower watchdog: a follower that stops applying is rebuilt from the leader."""

from __future__ import annotations

import secrets
import time

import pytest

from controlplane.quorum import MetadataQuorum
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import find_free_ports

pytestmark = pytest.mark.integration


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
        deadline = time.monotonic() + 20
        while not any(n.is_leader() for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.05)
        leader = next(n for n in nodes if n.is_leader())
        for i in range(50):
            assert "result" in leader.submit("put_kv", {"key": f"k{i}", "value": "v"})
        follower = next(n for n in nodes if n is not leader)
        broken = follower._syncobj

        def failing_tick(*_a, **_kw):  # what pysyncobj's IndexError-every-tick looks like
            raise IndexError("list index out of range")

        broken._onTick = failing_tick
        for i in range(50, 100):
            assert "result" in leader.submit("put_kv", {"key": f"k{i}", "value": "v"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
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
