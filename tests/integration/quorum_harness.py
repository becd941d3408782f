"""A real controller quorum in subprocesses for tests and benchmarks; always torn down."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

from cli.cluster_config import ClusterConfig
from cli.local_cluster import LocalCluster
from controlplane.client import ControllerClient
from controlplane.config import BucketConfig, ControllerAddress
from controlplane.errors import ControllerError
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import find_free_ports


class QuorumHarness:
    """N controller processes on free loopback ports, sharing one cluster directory."""

    def __init__(
        self,
        directory: Path,
        voters: int = 3,
        session_timeout_ms: int = 2_000,
        buckets: list[BucketConfig] | None = None,
        destroy_retention_ms: int = 60_000,
        api_secret: str | None = None,
    ):
        self.cluster = LocalCluster(directory)
        ports = find_free_ports(voters * 2)
        self.config = ClusterConfig(
            controllers=[
                ControllerAddress(node_id=i, raft_port=ports[2 * i], api_port=ports[2 * i + 1])
                for i in range(voters)
            ],
            brokers=[],
            password=secrets.token_urlsafe(24),
            api_secret=api_secret,
            buckets=buckets or [],
            settings=ControllerSettings(
                broker_session_timeout_ms=session_timeout_ms,
                bucket_ids=[0, 1],
                object_destroy_retention_ms=destroy_retention_ms,
                # these tests check that the log stays still; route epoch bumps (the zone
                # router's timer) would move it
                route_epoch_interval_ms=0,
            ),
        )
        self.cluster.save(self.config)
        self.client = ControllerClient(
            self.config.quorum_config().api_addresses(), timeout_s=20, api_secret=api_secret
        )

    def __enter__(self) -> QuorumHarness:
        for c in self.config.controllers:
            self.start(c.node_id)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop_all(self.config)

    def start(self, node_id: int) -> int:
        return self.cluster.start_controller(self.config, node_id)

    def kill(self, node_id: int) -> None:
        """kill -9, as a crash."""
        pid = self.cluster.running(f"controller-{node_id}")
        assert pid is not None, f"controller {node_id} is not running"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.cluster.running(f"controller-{node_id}") and time.monotonic() < deadline:
            time.sleep(0.02)

    def address(self, node_id: int) -> str:
        return next(c.api_address for c in self.config.controllers if c.node_id == node_id)

    def status(self, node_id: int) -> dict | None:
        try:
            return self.client.status(self.address(node_id))
        except (ControllerError, OSError):
            return None

    def leader(self, timeout_s: float = 20.0, exclude: int | None = None) -> int:
        """Node id of the leader, waiting up to `timeout_s` for one."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for c in self.config.controllers:
                if c.node_id == exclude:
                    continue
                s = self.status(c.node_id)
                if s and s["raft"]["state"] == "leader" and s["raft"]["has_quorum"]:
                    return c.node_id
            time.sleep(0.05)
        raise TimeoutError(f"no leader within {timeout_s}s")
