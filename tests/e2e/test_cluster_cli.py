"""`automqctl cluster up|status|down` as an operator runs it, against real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def automqctl(*args: str, cluster_dir: Path, timeout_s: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
    )


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def cluster_dir(tmp_path):
    d = tmp_path / "cluster"
    yield d
    # whatever happened in the test, leave no process behind
    if (d / "cluster.json").exists():
        automqctl("cluster", "down", cluster_dir=d)


def all_pids(status: dict) -> list[int]:
    pids = [c["pid"] for c in status["controllers"]] + [b["pid"] for b in status["brokers"]]
    pids.append(status["object_store"]["pid"])
    return [p for p in pids if p]


def test_up_status_down_restart(cluster_dir):
    up = automqctl("cluster", "up", cluster_dir=cluster_dir)
    assert up.returncode == 0, up.stderr + up.stdout
    assert "bootstrap servers" in up.stdout

    res = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["healthy"]
    assert sum(c["is_leader"] for c in status["controllers"]) == 1
    assert len(status["controllers"]) == 3 and all("address" in c for c in status["controllers"])
    assert [(b["az"], b["fenced"]) for b in status["brokers"]] == [
        ("az1", False),
        ("az2", False),
        ("az3", False),
    ]
    assert all(b["node_epoch"] == 0 for b in status["brokers"])
    assert len(status["bootstrap_servers"].split(",")) == 3
    assert [b["bucket_id"] for b in status["buckets"]] == [0, 1]
    assert status["buckets"][0]["active"] and not status["buckets"][1]["active"]
    assert all("secret" not in b["uri"].lower() for b in status["buckets"])
    pids = all_pids(status)
    assert len(pids) == 7 and all(pid_alive(p) for p in pids)

    # a second `up` on a running directory is refused with a clear message
    again = automqctl("cluster", "up", cluster_dir=cluster_dir)
    assert again.returncode != 0 and "already running" in again.stderr
    assert "Traceback" not in again.stderr

    logs = automqctl("cluster", "logs", "broker-1", "-n", "5", cluster_dir=cluster_dir)
    assert logs.returncode == 0 and "node 1" in logs.stdout

    down = automqctl("cluster", "down", cluster_dir=cluster_dir)
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if pid_alive(p)]

    # status of a stopped cluster is unhealthy: scripts see a non-zero exit code
    stopped = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir)
    assert stopped.returncode == 1
    assert not json.loads(stopped.stdout)["healthy"]

    # restart from the persisted state: brokers come back with a new node epoch
    up2 = automqctl("cluster", "up", "--format", "json", cluster_dir=cluster_dir)
    assert up2.returncode == 0, up2.stderr
    status2 = json.loads(up2.stdout)
    assert status2["healthy"]
    assert all(b["node_epoch"] == 1 for b in status2["brokers"])
    assert status2["metadata_offset"] > status["metadata_offset"]

    purge = automqctl("cluster", "down", "--purge", cluster_dir=cluster_dir)
    assert purge.returncode == 0
    assert not cluster_dir.exists()
    assert not [p for p in all_pids(status2) if pid_alive(p)]


def test_port_in_use_is_a_clear_error(cluster_dir):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        res = automqctl("cluster", "up", "--base-port", str(port), cluster_dir=cluster_dir)
    finally:
        blocker.close()
    assert res.returncode == 1
    assert "ports already in use" in res.stderr and str(port) in res.stderr
    assert "Traceback" not in res.stderr


def test_unreachable_external_s3_is_a_clear_error(cluster_dir):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    res = automqctl(
        "cluster",
        "up",
        "--bucket-uris",
        f"0@s3://nowhere?region=us-east-1&endpoint=http://127.0.0.1:{port}",
        cluster_dir=cluster_dir,
        timeout_s=60,
    )
    assert res.returncode == 1
    assert "not reachable" in res.stderr and "Traceback" not in res.stderr


def test_wrong_arguments_are_refused(cluster_dir):
    res = automqctl("cluster", "up", "--controllers", "2", cluster_dir=cluster_dir)
    assert res.returncode != 0 and "odd" in res.stderr
    res = automqctl("cluster", "status", cluster_dir=cluster_dir)
    assert res.returncode == 1 and "no cluster" in res.stderr
