"""`automqctl cluster up|status|down` as an operator runs it, against real processes."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from cli.local_cluster import LocalCluster

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


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except OSError:
                continue
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_status(cluster_dir: Path, done, timeout_s: float = 60) -> dict:
    """`cluster status --format json` once `done(status)` holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir)
        status = json.loads(out.stdout)
        if done(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.3)


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
    pids += [s["pid"] for s in status.get("object_stores", []) if s["pid"] not in pids]
    return [p for p in pids if p]


def test_up_status_down_restart(cluster_dir, tmp_path, faults):
    # the object stores' data on its own directory (another device in production)
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    up = automqctl("cluster", "up", "--store-dir", str(store_dir), cluster_dir=cluster_dir)
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
    # two embedded object stores, separate processes: main (bucket 0), failover (bucket 1)
    stores = {s["name"]: s for s in status["object_stores"]}
    assert stores["main"]["bucket_ids"] == [0] and stores["failover"]["bucket_ids"] == [1]
    assert stores["main"]["endpoint"] != stores["failover"]["endpoint"]
    assert len(pids) == 8 and all(pid_alive(p) for p in pids)
    assert stores["main"]["data_dir"] == str(store_dir / "s3")
    assert stores["failover"]["data_dir"] == str(store_dir / "s3-failover")
    assert any((store_dir / "s3" / "data").iterdir()) and not (cluster_dir / "s3").exists()

    # a second `up` on a running, healthy directory starts nothing and prints the status
    # (exit 0: scripts and systemd units run `up` again); another --store-dir than the
    # cluster's is refused by name
    elsewhere = automqctl("cluster", "up", "--store-dir", str(tmp_path), cluster_dir=cluster_dir)
    assert elsewhere.returncode == 1 and f"--store-dir {tmp_path} (" in elsewhere.stderr
    again = automqctl("cluster", "up", cluster_dir=cluster_dir)
    assert again.returncode == 0, again.stderr
    assert ": healthy" in again.stdout and "was already running: nothing started" in again.stdout
    assert "Traceback" not in again.stderr
    assert (
        all_pids(
            json.loads(
                automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir).stdout
            )
        )
        == pids
    )

    logs = automqctl("cluster", "logs", "broker-1", "-n", "5", cluster_dir=cluster_dir)
    assert logs.returncode == 0 and "node 1" in logs.stdout

    # supervised by default: a killed store is restarted by the supervisor, and status
    # counts the restart
    dead = stores["failover"]["pid"]
    faults.kill(dead)
    supervised = _wait_status(
        cluster_dir,
        lambda st: (
            {s["name"]: s["pid"] for s in st["object_stores"]}["failover"] not in (None, dead)
            and st["supervisor"]["restarts"].get("s3-failover", {}).get("restarts", 0) >= 1
        ),
    )
    assert supervised["supervisor"]["pid"] is not None
    assert "restarted s3-failover" in (cluster_dir / "logs" / "supervisor.log").read_text()

    # the supervisor died: status says so; the failover store died after it: nothing
    # restarts it until `up` starts just those two again (the supervisor stays single)
    faults.kill(supervised["supervisor"]["pid"])
    gone = _wait_status(cluster_dir, lambda st: st["supervisor"]["pid"] is None)
    assert any(p.startswith("the supervisor is not running") for p in gone["problems"])
    dead = {s["name"]: s["pid"] for s in gone["object_stores"]}["failover"]
    faults.kill(dead)
    deadline = time.monotonic() + 5
    while pid_alive(dead) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = automqctl("cluster", "up", cluster_dir=cluster_dir)
    assert again.returncode == 0, again.stderr
    assert "restarted s3-failover, supervisor " in again.stdout, again.stdout
    restarted = json.loads(
        automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir).stdout
    )
    new = {s["name"]: s["pid"] for s in restarted["object_stores"]}
    assert new["main"] == stores["main"]["pid"] and new["failover"] not in (None, dead)
    assert restarted["supervisor"]["pid"] is not None and restarted["healthy"]
    again = automqctl("cluster", "up", cluster_dir=cluster_dir)
    assert "was already running: nothing started" in again.stdout, again.stdout
    pids = all_pids(restarted) + [restarted["supervisor"]["pid"]]

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
    assert [s["data_dir"] for s in status2["object_stores"]] == [
        str(store_dir / "s3"),
        str(store_dir / "s3-failover"),
    ]

    purge = automqctl("cluster", "down", "--purge", cluster_dir=cluster_dir)
    assert purge.returncode == 0
    assert not cluster_dir.exists()
    assert store_dir.is_dir() and not any(store_dir.iterdir())
    assert not [p for p in all_pids(status2) if pid_alive(p)]


def test_port_in_use_is_a_clear_error(cluster_dir):
    # a port that is a valid --base-port (ephemeral ports can be above the highest)
    blocker = socket.socket()
    for port in random.sample(range(20000, 50000), 200):
        try:
            blocker.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        res = automqctl("cluster", "up", "--base-port", str(port), cluster_dir=cluster_dir)
    finally:
        blocker.close()
    assert res.returncode == 1
    assert "ports already in use" in res.stderr and str(port) in res.stderr
    assert "Traceback" not in res.stderr


def test_unreachable_external_s3_is_a_clear_error(cluster_dir, refused_port):
    port = refused_port  # nothing listens there
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
    res = automqctl("cluster", "up", "--store-dir", "/nonexistent/x", cluster_dir=cluster_dir)
    [line] = res.stderr.strip().splitlines()
    assert res.returncode == 1 and "--store-dir /nonexistent/x: not an existing" in line
    assert not cluster_dir.exists()
    res = automqctl("cluster", "status", cluster_dir=cluster_dir)
    assert res.returncode == 1 and "no cluster" in res.stderr


def test_operator_experience_issue_18(cluster_dir):
    """A failed first `up` and a retry with other flags, refused flags, one-line errors,
    perf's cleanup, `logs -f`, the states of `status`, `--exit-when-healthy` and the object
    store's quiet log, against one small real cluster."""
    from cli.os_processes import scan_processes

    # 1. processes start, then the wait times out: stopped again, logs kept, and the retry
    #    with other flags starts over and honours all of them
    failed = automqctl("cluster", "up", "--timeout-s", "0.5", cluster_dir=cluster_dir)
    assert failed.returncode == 1
    [line] = failed.stderr.strip().splitlines()
    assert "timed out" in line and "starts over" in line
    assert (cluster_dir / "logs").is_dir() and not scan_processes(cluster_dir)
    up = automqctl(
        "cluster",
        "up",
        "--controllers",
        "1",
        "--brokers",
        "1",
        "--azs",
        "solo",
        "--wal-capacity-mib",
        "16",
        # step 5 kills a broker and starts it by hand: unsupervised (a supervisor would
        # restart it first; test_up_status_down_restart covers that)
        "--no-supervise",
        "--format",
        "json",
        cluster_dir=cluster_dir,
    )
    assert up.returncode == 0, up.stderr + up.stdout
    assert "starting over" in up.stderr
    assert up.returncode == 0 and json.loads(up.stdout)["supervisor"] is None
    status = json.loads(up.stdout)
    assert status["state"] == "healthy" and len(status["controllers"]) == 1
    assert [b["az"] for b in status["brokers"]] == ["solo"]
    assert status["wal_allocated_bytes"] == 16 * 1024 * 1024
    bootstrap = status["bootstrap_servers"]

    # 1. flags that differ from the existing cluster are refused, by name
    refused = automqctl("cluster", "up", "--brokers", "3", cluster_dir=cluster_dir)
    assert refused.returncode == 1 and "--brokers 3 (the cluster has 1)" in refused.stderr

    # 2. one line, nothing eaten, no request reprs
    bad = automqctl("topic", "create", "bad name!", cluster_dir=cluster_dir)
    assert bad.returncode == 1
    [line] = bad.stderr.strip().splitlines()
    assert "[a-zA-Z0-9._-]" in line
    assert automqctl("topic", "create", "t1", cluster_dir=cluster_dir).returncode == 0
    dup = automqctl("topic", "create", "t1", cluster_dir=cluster_dir)
    [line] = dup.stderr.strip().splitlines()
    assert "TOPIC_ALREADY_EXISTS" in line and "Request" not in line

    # 7. perf deletes its topics; its clients run in child processes (two producing, one
    #    per group), which are gone when it ends, and every acknowledged record is consumed
    summary_file = cluster_dir / "perf-summary.json"
    perf = automqctl(
        "perf",
        "--duration",
        "2",
        "--send-rate",
        "200",
        "--topic-prefix",
        "pc",
        "--producer-processes",
        "2",
        "--summary-file",
        str(summary_file),
        "--summary-intervals",
        cluster_dir=cluster_dir,
    )
    assert perf.returncode == 0, perf.stderr + perf.stdout
    assert "deleted topics" in perf.stdout and "rdkafka" not in perf.stderr
    summary = json.loads(summary_file.read_text())
    # nothing left behind: no topic and no consumer group of the run; its table output is
    # a table (no JSON document after it)
    assert "deleted consumer groups" in perf.stdout
    assert '"produced_records"' not in perf.stdout and "produced_records" in perf.stdout
    bootstrap = LocalCluster(cluster_dir).load().bootstrap_servers()
    leftover_admin = AdminClient({"bootstrap.servers": bootstrap})
    groups = leftover_admin.list_consumer_groups(request_timeout=30).result(timeout=60)
    assert [g.group_id for g in groups.valid if g.group_id.startswith("perf-")] == []
    topics = leftover_admin.list_topics(timeout=30).topics
    assert [t for t in topics if t.startswith("pc-")] == []
    assert summary["producer_processes"] == 2 and summary["consumer_processes"] == 1
    pids = [p["pid"] for p in summary["processes"]]
    assert [p["role"] for p in summary["processes"]] == ["producer", "producer", "consumer"]
    assert len(set(pids)) == 3 and summary["pid"] not in pids
    assert not any(pid_alive(pid) for pid in pids)
    assert summary["produced_records"] >= 200 and summary["errors"] == 0
    assert summary["consumed_records"] == [summary["produced_records"]]
    assert summary["produce_p99_ms"] > 0 and summary["e2e_p99_ms"] > 0
    # librdkafka's own round-trip times to the broker (measured in C) are reported too
    assert 0 < summary["broker_rtt_p99_ms"] <= summary["max_interval_broker_rtt_p99_ms"]
    # with upper bounds of the whole run's p99 and p999 from librdkafka's windows
    assert 0 < summary["broker_rtt_p99_at_most_ms"] <= summary["broker_rtt_p999_at_most_ms"]
    # and the brokers' own share of it, from their /metrics (loop lag, GC pauses, WAL
    # appends over the run), beside how late a process that only sleeps woke
    assert summary["broker_loop_lag_p99_ms"] > 0 and summary["broker_wal_append_p99_ms"] > 0
    assert "broker_gc_pause_p99_ms" in summary and summary["machine_lag_p99_ms"] >= 0
    # --summary-intervals: each interval's produce latencies, for any window of the run
    intervals = summary["intervals"]
    assert len(intervals) >= 2 and intervals[0]["end_unix_s"] < intervals[-1]["end_unix_s"]
    in_intervals = sum(n for i in intervals for n in i["produce_counts"].values())
    assert 0 < in_intervals <= summary["produced_records"]
    # Ctrl-C (SIGINT to the terminal's process group): perf and its children end within
    # seconds and its topics are deleted
    interrupted = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "perf", "--duration", "60", "--topic-prefix", "pi"],
        env={**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # a shell's background job ignores SIGINT, a foreground one does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        lines = []
        while not lines or not lines[-1].strip().startswith("1."):  # the first interval
            line = interrupted.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        children = _children(interrupted.pid)
        assert len(children) >= 2  # a producer, a group (and multiprocessing's tracker)
        started = time.monotonic()
        os.killpg(interrupted.pid, signal.SIGINT)
        rest = interrupted.communicate(timeout=30)[0]
        assert interrupted.returncode != 0 and time.monotonic() - started < 10
        assert "deleted topics pi-" in rest, rest
        deadline = time.monotonic() + 5
        while any(pid_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(pid) for pid in children)
    finally:
        if interrupted.poll() is None:
            os.killpg(interrupted.pid, signal.SIGKILL)
            interrupted.wait(10)
    listed = automqctl("topic", "list", "--format", "json", cluster_dir=cluster_dir)
    assert [t["name"] for t in json.loads(listed.stdout)] == ["t1"]

    # 8. logs -f prints what is appended
    follow = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "cluster", "logs", "broker-1", "-f", "-n", "1"],
        env={**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        follow.stdout.readline()
        with open(cluster_dir / "logs" / "broker-1.log", "a") as f:
            f.write("appended by the test\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if follow.stdout.readline() == "appended by the test\n":
                break
        else:
            raise AssertionError("logs -f did not print the new line")
    finally:
        follow.terminate()
        follow.wait(10)

    # 5. a killed broker: degraded at once; `--exit-when-healthy` waits for its restart
    assert automqctl("broker", "kill", "1", cluster_dir=cluster_dir).returncode == 0
    res = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir)
    degraded = json.loads(res.stdout)
    assert res.returncode == 1 and degraded["state"] == "degraded"
    # at once "not running"; once its session expired (6 s) the leader has fenced it
    assert any(p.startswith("broker 1 ") for p in degraded["problems"]), degraded["problems"]
    assert automqctl("broker", "start", "1", cluster_dir=cluster_dir).returncode == 0
    res = automqctl(
        "cluster", "status", "--exit-when-healthy", "--timeout-s", "60", cluster_dir=cluster_dir
    )
    assert res.returncode == 0 and res.stdout.splitlines()[0].endswith(": healthy")

    # 6. the object store's plugin worker reaches its admin server: no warning every 5 s
    s3_log = (cluster_dir / "logs" / "s3.log").read_text(errors="replace")
    assert "connection refused" not in s3_log, s3_log[-3000:]

    # 5. stopped: said first, JSON with the state, nothing claimed active
    assert automqctl("cluster", "down", cluster_dir=cluster_dir).returncode == 0
    res = automqctl("cluster", "status", cluster_dir=cluster_dir)
    assert res.returncode == 1 and res.stdout.splitlines()[0].endswith(": stopped")
    stopped = json.loads(
        automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir).stdout
    )
    assert stopped["state"] == "stopped" and stopped["topics"] is None
    assert not any(b["active"] for b in stopped["buckets"])
    assert bootstrap == stopped["bootstrap_servers"]
