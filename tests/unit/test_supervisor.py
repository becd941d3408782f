"""The supervisor of `cluster up --supervise` (cli/supervisor.py): restarts a component
that died, with a backoff that doubles while it keeps dying; leaves one stopped on purpose
down; records every restart for `cluster status`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from cli.supervisor import MAX_BACKOFF_S, Supervisor, acquire_run_lock, read_state


class _FakeCluster:
    """What the supervisor uses of LocalCluster: components, who runs, held, start."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.running: set[str] = {"controller-0", "broker-1"}
        self.held_names: set[str] = set()
        self.started: list[str] = []
        self.fail_starts = 0

    def load(self):
        return SimpleNamespace()

    def running_pids(self, config) -> dict[str, int]:
        return {n: 100 + i for i, n in enumerate(sorted(self.running))}

    def supervised_names(self, config) -> list[str]:
        return ["controller-0", "broker-1"]

    def held(self, name: str) -> bool:
        return name in self.held_names

    def start_broker(self, config, node_id: int) -> int:
        if self.fail_starts:
            self.fail_starts -= 1
            raise OSError("no space left on device")
        self.started.append(f"broker-{node_id}")
        return 1

    def start_controller(self, config, node_id: int) -> int:
        self.started.append(f"controller-{node_id}")
        return 1


def test_a_dead_component_is_restarted_with_a_growing_backoff(tmp_path: Path) -> None:
    now = [0.0]
    cluster = _FakeCluster(tmp_path)
    sup = Supervisor(cluster, clock=lambda: now[0])  # type: ignore[arg-type]
    assert sup.check_once() == []
    cluster.running.discard("broker-1")  # crashed
    assert sup.check_once() == ["broker-1"]  # the first restart comes at once
    waits = []
    for _ in range(8):  # it keeps dying: each restart waits twice as long, up to the cap
        start = now[0]
        while sup.check_once() == []:
            now[0] += 0.5
        waits.append(now[0] - start)
    assert waits[:3] == [1.0, 2.0, 4.0] and max(waits) == MAX_BACKOFF_S
    state = read_state(tmp_path)
    assert state["broker-1"]["restarts"] == 9 and state["broker-1"]["last_error"] is None
    assert "controller-0" in state and state["controller-0"]["restarts"] == 0
    # up for a minute: the next crash is restarted at once again
    cluster.running.add("broker-1")
    sup.check_once()
    now[0] += 61
    sup.check_once()
    cluster.running.discard("broker-1")
    assert sup.check_once() == ["broker-1"]


def test_a_component_stopped_on_purpose_stays_down(tmp_path: Path) -> None:
    cluster = _FakeCluster(tmp_path)
    sup = Supervisor(cluster, clock=lambda: 0.0)  # type: ignore[arg-type]
    cluster.running.discard("broker-1")
    cluster.held_names.add("broker-1")
    assert sup.check_once() == [] and cluster.started == []


def test_a_failed_restart_is_recorded_and_retried(tmp_path: Path) -> None:
    now = [0.0]
    cluster = _FakeCluster(tmp_path)
    cluster.fail_starts = 1
    sup = Supervisor(cluster, clock=lambda: now[0])  # type: ignore[arg-type]
    cluster.running.discard("broker-1")
    assert sup.check_once() == []
    assert "no space left" in read_state(tmp_path)["broker-1"]["last_error"]
    now[0] += 1.0
    assert sup.check_once() == ["broker-1"]
    assert read_state(tmp_path)["broker-1"]["last_error"] is None


def test_one_supervisor_per_directory(tmp_path: Path) -> None:
    """A second supervisor of a directory (a second `cluster up`, a race) gets no run lock
    and exits; the lock is free again once the first one ends."""
    first = acquire_run_lock(tmp_path)
    assert first is not None
    assert acquire_run_lock(tmp_path) is None
    os.close(first)
    again = acquire_run_lock(tmp_path)
    assert again is not None
    os.close(again)


def test_supervise_flags_on_an_existing_cluster(tmp_path: Path) -> None:
    """An existing cluster keeps its stored setting unless --supervise / --no-supervise is
    given (a cluster written before supervision was the default has none: unsupervised)."""
    from cli.cluster_config import BrokerSpec, ClusterConfig
    from cli.cluster_up import _apply_supervise
    from cli.local_cluster import LocalCluster
    from controlplane.config import ControllerAddress

    cluster = LocalCluster(tmp_path / "c")
    old = ClusterConfig(
        controllers=[ControllerAddress(node_id=0, raft_port=1, api_port=2)],
        brokers=[BrokerSpec(node_id=1, az="az1", kafka_port=3)],
        password="x",
    )
    cluster.save(old)
    stored = json.loads(cluster.config_path.read_text())
    del stored["supervise"]  # as written before supervision was the default
    cluster.config_path.write_text(json.dumps(stored))
    assert cluster.load().supervise is False
    _apply_supervise(cluster, cluster.load(), None)
    assert cluster.load().supervise is False
    _apply_supervise(cluster, cluster.load(), True)
    assert cluster.load().supervise is True
    _apply_supervise(cluster, cluster.load(), None)
    assert cluster.load().supervise is True
    _apply_supervise(cluster, cluster.load(), False)  # stops a supervisor (none runs here)
    assert cluster.load().supervise is False
