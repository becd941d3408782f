"""`automqctl controller list|stop|kill|start`, `cluster up` on a partly dead cluster and
`cluster down` of processes restarted by hand, against real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.ledger import automqctl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WAIT_S = 30.0


def proc_start_time(pid: int) -> str | None:
    """Start time of a live (not zombie) process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def cluster_processes(cluster_dir: Path) -> dict[int, str]:
    """Every live process whose command line mentions the cluster directory (from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(cluster_dir) in cmd and proc_start_time(int(entry)) is not None:
            found[int(entry)] = cmd
    return found


def wait_gone(pid: int, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while proc_start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc_start_time(pid) is None, f"pid {pid} still alive"


@pytest.fixture
def cluster_dir(tmp_path):
    d = tmp_path / "cluster"
    yield d
    # whatever happened in the test, leave no process behind
    if (d / "cluster.json").exists():
        automqctl("cluster", "down", cluster_dir=d)
    for pid in cluster_processes(d):  # even if `cluster down` missed one
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def up(cluster_dir: Path, *args: str) -> dict:
    # unsupervised: these tests kill components and check that they stay down until a
    # `controller start` / `cluster up` (or a restart by hand); a supervisor would restart
    # them first (tests/e2e/test_supervisor.py covers that)
    res = automqctl(
        "cluster",
        "up",
        "--no-supervise",
        "--session-timeout-ms",
        "2000",
        "--format",
        "json",
        *args,
        cluster_dir=cluster_dir,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    return json.loads(res.stdout)


def controllers(cluster_dir: Path) -> dict[int, dict]:
    res = automqctl("controller", "list", "--format", "json", cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr
    return {c["node_id"]: c for c in json.loads(res.stdout)}


def status(cluster_dir: Path) -> dict:
    res = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir)
    return json.loads(res.stdout)


def wait_until_only_the_killed_controller_is_missing(
    cluster_dir: Path, killed: int, timeout_s: float = 60
) -> None:
    """Until `cluster status` names no problem but the killed controller being unreachable
    (a leader elected, every broker heartbeating to it again), at most `timeout_s`."""
    expected = [f"controller {killed} unreachable"]
    deadline = time.monotonic() + timeout_s
    while (problems := status(cluster_dir)["problems"]) != expected:
        assert time.monotonic() < deadline, problems
        time.sleep(0.3)


def refused(res: subprocess.CompletedProcess, text: str) -> None:
    """A clear error: non-zero exit, the message on one line of stderr, no traceback."""
    assert res.returncode != 0, res.stdout
    assert text in res.stderr, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_controller_kill_list_start_stop(cluster_dir):
    up(cluster_dir)
    ctrl = controllers(cluster_dir)
    assert sorted(ctrl) == [0, 1, 2]
    assert all(c["running"] and c["pid"] and c["reachable"] for c in ctrl.values())
    assert sum(c["is_leader"] for c in ctrl.values()) == 1
    assert all(c["address"] and c["raft_address"] and c["term"] >= 1 for c in ctrl.values())
    leader = next(n for n, c in ctrl.items() if c["is_leader"])
    pids = {n: c["pid"] for n, c in ctrl.items()}

    # kill -9 the leader: it is gone when the command returns, the others elect a new one
    res = automqctl("controller", "kill", str(leader), cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr
    assert proc_start_time(pids[leader]) is None
    ctrl = controllers(cluster_dir)
    assert not ctrl[leader]["running"] and ctrl[leader]["pid"] is None
    assert ctrl[leader]["state"] == "unreachable" and not ctrl[leader]["reachable"]
    table = automqctl("controller", "list", cluster_dir=cluster_dir)
    assert table.returncode == 0 and "stopped" in table.stdout

    # metadata changes while it is down: it has to catch up when it comes back. First the
    # two others elect a leader: until one answers, brokers (2 s sessions here) fence
    # themselves and close client connections, as designed (broker/lease.py)
    wait_until_only_the_killed_controller_is_missing(cluster_dir, leader)
    res = automqctl("topic", "create", "while-down", "-p", "3", cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr

    # bad input: one clear line, non-zero exit, nothing changed
    others = [n for n in pids if n != leader]
    refused(automqctl("controller", "start", "7", cluster_dir=cluster_dir), "no controller 7")
    refused(automqctl("controller", "stop", "7", cluster_dir=cluster_dir), "no controller 7")
    refused(
        automqctl("controller", "kill", "--", "-1", cluster_dir=cluster_dir), "no controller -1"
    )
    refused(automqctl("controller", "kill", str(leader), cluster_dir=cluster_dir), "not running")
    refused(automqctl("controller", "stop", str(leader), cluster_dir=cluster_dir), "not running")
    refused(
        automqctl("controller", "start", str(others[0]), cluster_dir=cluster_dir), "already running"
    )
    bad = automqctl("controller", "start", "one", cluster_dir=cluster_dir)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    bad = automqctl("controller", "start", cluster_dir=cluster_dir)
    assert bad.returncode != 0 and "Missing argument" in bad.stderr
    refused(automqctl("controller", "list", cluster_dir=cluster_dir / "nowhere"), "no cluster")
    assert {n: c["pid"] for n, c in controllers(cluster_dir).items() if n != leader} == {
        n: pids[n] for n in others
    }

    # start brings it back: a follower with everything the leader committed
    res = automqctl("controller", "start", str(leader), cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr
    assert "follower" in res.stdout
    deadline = time.monotonic() + WAIT_S
    while True:
        ctrl = controllers(cluster_dir)
        new_leader = next((c for c in ctrl.values() if c["is_leader"]), None)
        me = ctrl[leader]
        if (
            new_leader
            and me["running"]
            and me["state"] == "follower"
            and me["commit_index"] == new_leader["commit_index"]
            and me["term"] == new_leader["term"]
        ):
            break
        assert time.monotonic() < deadline, ctrl
        time.sleep(0.3)
    assert me["pid"] not in pids.values()
    assert status(cluster_dir)["healthy"]

    # stop: SIGTERM, the process is gone when the command returns
    follower = others[0] if not ctrl[others[0]]["is_leader"] else others[1]
    res = automqctl("controller", "stop", str(follower), cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr
    assert proc_start_time(pids[follower]) is None
    assert not controllers(cluster_dir)[follower]["running"]


def test_up_restarts_only_the_dead_processes(cluster_dir, faults):
    before = up(cluster_dir)
    pids = {f"controller-{c['node_id']}": c["pid"] for c in before["controllers"]}
    pids |= {f"broker-{b['node_id']}": b["pid"] for b in before["brokers"]}
    pids["s3"] = before["object_store"]["pid"]

    # a crashed controller (kill -9 behind the CLI's back) and a crashed broker
    faults.kill(pids["controller-0"])
    wait_gone(pids["controller-0"])
    res = automqctl("broker", "kill", "2", cluster_dir=cluster_dir)
    assert res.returncode == 0, res.stderr

    after = up(cluster_dir)
    assert after["healthy"], after["problems"]
    now = {f"controller-{c['node_id']}": c["pid"] for c in after["controllers"]}
    now |= {f"broker-{b['node_id']}": b["pid"] for b in after["brokers"]}
    now["s3"] = after["object_store"]["pid"]
    restarted = {n for n in pids if now[n] != pids[n]}
    assert restarted == {"controller-0", "broker-2"}
    assert all(proc_start_time(p) for p in now.values())
    assert next(b for b in after["brokers"] if b["node_id"] == 2)["node_epoch"] == 1

    # everything runs again: a second `up` starts nothing, prints the status and exits 0
    again = automqctl("cluster", "up", "--format", "json", cluster_dir=cluster_dir)
    assert again.returncode == 0, again.stderr
    same = json.loads(again.stdout)
    assert same["healthy"] and {b["pid"] for b in same["brokers"]} == {
        b["pid"] for b in after["brokers"]
    }


def test_down_stops_processes_restarted_by_hand(cluster_dir, tmp_path, faults):
    before = up(cluster_dir)
    ctrl_pid = next(c["pid"] for c in before["controllers"] if c["node_id"] == 1)
    broker_pid = next(b["pid"] for b in before["brokers"] if b["node_id"] == 3)

    def command_line(pid: int) -> list[str]:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().rstrip(b"\0").split(b"\0")]

    ctrl_cmd, broker_cmd = command_line(ctrl_pid), command_line(broker_pid)
    assert "controlplane.server" in ctrl_cmd and "dataplane.broker" in broker_cmd
    old_start = proc_start_time(ctrl_pid)
    for pid in (ctrl_pid, broker_pid):
        faults.kill(pid)
        wait_gone(pid)

    # an unrelated process that got the dead controller's PID file entry (a reused PID)
    bystander = subprocess.Popen(["sleep", "120"])
    by_hand: list[subprocess.Popen] = []
    try:
        (cluster_dir / "pids" / "controller-1.pid").write_text(f"{bystander.pid} {old_start}\n")
        (cluster_dir / "pids" / "broker-3.pid").unlink()
        # restarted by hand with the same command lines: the controller in our own process
        # group (as from a shell), the broker in its own session
        with open(tmp_path / "by-hand.log", "ab") as log:
            by_hand.append(
                subprocess.Popen(
                    ctrl_cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=str(cluster_dir),
                )
            )
            by_hand.append(
                subprocess.Popen(
                    broker_cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd="/",
                    start_new_session=True,
                )
            )
        time.sleep(1.0)
        assert all(p.poll() is None for p in by_hand), (tmp_path / "by-hand.log").read_text()
        seen = status(cluster_dir)

        down = automqctl("cluster", "down", cluster_dir=cluster_dir)
        assert down.returncode == 0, down.stderr
        for p in by_hand:
            p.wait(timeout=WAIT_S)  # reaped: they were ours
        assert cluster_processes(cluster_dir) == {}
        assert bystander.poll() is None  # the stale PID file's process is left alone
        # before they were stopped, both were shown with their real PIDs
        assert next(c["pid"] for c in seen["controllers"] if c["node_id"] == 1) == by_hand[0].pid
        assert next(b["pid"] for b in seen["brokers"] if b["node_id"] == 3) == by_hand[1].pid
    finally:
        for p in [*by_hand, bystander]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=WAIT_S)
