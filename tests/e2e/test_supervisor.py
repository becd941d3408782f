"""`cluster up --supervise` (issue 33 item 2): a crashed broker or controller is back within
10 s by itself, the restart is in `cluster status` and logs/supervisor.log; a broker
stopped on purpose stays down until it is started; `cluster down` stops everything."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")
from cli.local_cluster import LocalCluster  # noqa: E402
from tests.support.cluster import automqctl, cluster_status, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BACK_WITHIN_S = 10.0


def _pid(status: dict, name: str) -> int | None:
    kind, node = name.rsplit("-", 1)
    entries = status["controllers"] if kind == "controller" else status["brokers"]
    return next(e["pid"] for e in entries if e["node_id"] == int(node))


def _back(cluster_dir, name: str, old_pid: int) -> tuple[dict, float]:
    """The status once `name` runs with another pid than `old_pid`, and the seconds until
    its new process ran (its PID file: quicker to read than a status)."""
    started = time.monotonic()
    cluster = LocalCluster(cluster_dir)
    while time.monotonic() - started < 30:
        pid = cluster.running(name)
        if pid is not None and pid != old_pid:
            return cluster_status(cluster_dir), time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{name} not restarted within 30 s")


def test_crashed_processes_come_back_and_stopped_ones_stay_down(tmp_path, faults):
    d = tmp_path / "cluster"
    with running_cluster(d, "--brokers", "2", "--supervise") as up:
        assert up["supervisor"]["pid"], up["supervisor"]
        for name in ("broker-1", "controller-1"):
            old = _pid(up, name)
            faults.kill(old)
            status, took_s = _back(d, name, old)
            print(f"{name} killed: running again after {took_s:.1f} s")
            assert took_s <= BACK_WITHIN_S
            assert status["supervisor"]["restarts"][name]["restarts"] == 1
        log = (d / "logs" / "supervisor.log").read_text()
        assert "restarted broker-1 (restart 1" in log and "restarted controller-1" in log
        assert automqctl("cluster", "status", "--exit-when-healthy", cluster_dir=d).returncode == 0
        # stopped on purpose: left down
        assert automqctl("broker", "stop", "2", cluster_dir=d).returncode == 0
        time.sleep(4)  # several supervision rounds
        assert _pid(cluster_status(d), "broker-2") is None
        assert automqctl("broker", "start", "2", cluster_dir=d).returncode == 0
        assert _pid(cluster_status(d), "broker-2") is not None
