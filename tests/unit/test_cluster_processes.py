"""PID files and the /proc scan of cli/local_cluster.py and cli/os_processes.py: which
processes belong to a cluster, when a PID file is trusted, and that stop finds and ends every process of a component (with
stand-in processes whose command line looks like a controller's or a broker's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.cluster_config import BrokerSpec, ClusterConfig, ClusterError
from cli.local_cluster import LocalCluster
from cli.os_processes import component_of, proc_start_time, scan_processes, terminate
from controlplane.config import ControllerAddress
from dataplane.objectstore.seaweed import find_free_ports

WAIT_S = 10.0


@pytest.fixture
def procs():
    """Stand-in processes started by a test; all killed and reaped whatever happens."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=WAIT_S)


def spawn(
    procs: list[subprocess.Popen],
    args: list[str],
    ignore_term: bool = False,
    cwd: Path | None = None,
    new_session: bool = True,
) -> subprocess.Popen:
    """A sleeping Python whose command line ends with `args`; returns once it runs (and, with
    `ignore_term`, ignores SIGTERM)."""
    code = (
        "import signal, sys, time\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
        + "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        cwd=str(cwd) if cwd else None,
        start_new_session=new_session,
    )
    procs.append(p)
    assert p.stdout.readline().strip() == b"ready"
    return p


def controller_args(d: Path, node: int) -> list[str]:
    return [
        "-m",
        "controlplane.server",
        "--config",
        str(d / "quorum.json"),
        "--node-id",
        str(node),
        "--data-dir",
        str(d / f"controller-{node}"),
    ]


def broker_args(d: Path, node: int) -> list[str]:
    return ["-m", "dataplane.broker", "--config", str(d / f"broker-{node}" / "broker.json")]


def make_cluster(d: Path) -> tuple[LocalCluster, ClusterConfig]:
    cluster = LocalCluster(d)
    config = ClusterConfig(
        controllers=[ControllerAddress(node_id=i, raft_port=1, api_port=2) for i in range(3)],
        brokers=[BrokerSpec(node_id=1, az="az1", kafka_port=3)],
        password="x",
    )
    cluster.save(config)
    return cluster, config


def wait_gone(p: subprocess.Popen) -> int:
    return p.wait(timeout=WAIT_S)


# ------------------------------------------------------------------ matching command lines


def test_component_of_controller_forms(tmp_path):
    d = tmp_path / "c"
    py = sys.executable
    assert component_of([py, *controller_args(d, 2)], "/", d) == "controller-2"
    assert (
        component_of(
            [py, "-m", "controlplane.server", f"--config={d}/quorum.json", "--node-id=0"], "/", d
        )
        == "controller-0"
    )
    # a relative --config resolves against the process's working directory
    assert (
        component_of(
            [py, "-m", "controlplane.server", "--config", "quorum.json", "--node-id", "1"],
            str(d),
            d,
        )
        == "controller-1"
    )
    assert (
        component_of(
            [py, "/src/controlplane/server.py", "--config", f"{d}/quorum.json", "--node-id", "1"],
            "/",
            d,
        )
        == "controller-1"
    )
    # another cluster, no node id, another program with the same words
    assert component_of([py, *controller_args(tmp_path / "other", 1)], "/", d) is None
    assert (
        component_of([py, "-m", "controlplane.server", "--config", f"{d}/quorum.json"], "/", d)
        is None
    )
    assert (
        component_of(
            [
                py,
                "-m",
                "pytest",
                "controlplane.server",
                "--config",
                f"{d}/quorum.json",
                "--node-id",
                "1",
            ],
            "/",
            d,
        )
        is None
    )


def test_component_of_broker_and_object_store(tmp_path):
    d = tmp_path / "c"
    py = sys.executable
    assert component_of([py, *broker_args(d, 12)], "/", d) == "broker-12"
    assert (
        component_of([py, "-m", "dataplane.broker", "--config", "broker-3/broker.json"], str(d), d)
        == "broker-3"
    )
    assert component_of([py, *broker_args(tmp_path / "other", 1)], "/", d) is None
    assert (
        component_of(
            [py, "-m", "dataplane.broker", "--config", f"{d}/broker-x/broker.json"], "/", d
        )
        is None
    )
    assert (
        component_of(["/usr/bin/weed", "mini", f"-dir={d}/s3/data", "-s3.port=1"], "/", d) == "s3"
    )
    assert component_of(["/usr/bin/weed", "mini", f"-dir={tmp_path}/x/s3/data"], "/", d) is None
    assert (
        component_of(
            ["/usr/bin/weed", "mini", f"-dir={tmp_path}/x/data"], "/", d, s3_data_dir=tmp_path / "x"
        )
        == "s3"
    )
    assert component_of(["/usr/bin/weed", "server", f"-dir={d}/s3/data"], "/", d) is None


def test_component_of_follows_symlinks(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert component_of([sys.executable, *controller_args(link, 0)], "/", real) == "controller-0"
    assert component_of([sys.executable, *broker_args(real, 1)], "/", link) == "broker-1"


# ------------------------------------------------------------------ PID files


def test_pid_file_trusted_only_for_the_same_live_process(tmp_path, procs):
    cluster, _ = make_cluster(tmp_path / "c")
    p = spawn(procs, ["unrelated"])
    start = proc_start_time(p.pid)
    path = cluster.pid_path("broker-1")
    path.parent.mkdir(parents=True)

    path.write_text(f"{p.pid} {start}\n")
    assert cluster.running("broker-1") == p.pid
    # the PID now belongs to another process (reused): not trusted, never signalled
    path.write_text(f"{p.pid} {int(start) - 1}\n")
    assert cluster.running("broker-1") is None
    assert cluster.stop("broker-1") is False
    assert p.poll() is None
    # garbage, a dead PID, a missing file
    for text in ("", "abc def", "123", "-1 5"):
        path.write_text(text)
        assert cluster.running("broker-1") is None
    p.kill()
    p.wait(timeout=WAIT_S)
    path.write_text(f"{p.pid} {start}\n")
    assert cluster.running("broker-1") is None
    path.unlink()
    assert cluster.running("broker-1") is None


def test_zombie_is_not_running(tmp_path, procs):
    cluster, _ = make_cluster(tmp_path / "c")
    p = spawn(procs, controller_args(cluster.dir, 0))
    cluster._record_pid("controller-0", p.pid)
    os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while proc_start_time(p.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert Path(f"/proc/{p.pid}").exists()  # not reaped yet: a zombie
    assert cluster.running("controller-0") is None
    assert scan_processes(cluster.dir) == {}


# ------------------------------------------------------------------ the scan and stop


def test_process_started_by_hand_is_found_and_stopped(tmp_path, procs):
    cluster, config = make_cluster(tmp_path / "c")
    other, _ = make_cluster(tmp_path / "other")
    # started by hand: no PID file; relative --config from its cwd, same process group as us
    hand = spawn(
        procs,
        ["-m", "controlplane.server", "--config", "quorum.json", "--node-id", "1"],
        cwd=cluster.dir,
        new_session=False,
    )
    stranger = spawn(procs, controller_args(other.dir, 1))

    assert scan_processes(cluster.dir) == {"controller-1": [hand.pid]}
    assert cluster.running("controller-1") == hand.pid
    assert cluster.running_pids(config) == {"controller-1": hand.pid}

    assert cluster.stop("controller-1", timeout_s=5.0) is True
    assert wait_gone(hand) == -signal.SIGTERM
    assert cluster.running("controller-1") is None
    assert cluster.stop("controller-1") is False
    assert stranger.poll() is None  # another cluster's process is never touched


def test_stale_pid_file_and_duplicate_are_all_stopped(tmp_path, procs):
    cluster, config = make_cluster(tmp_path / "c")
    recorded = spawn(procs, broker_args(cluster.dir, 1))
    cluster._record_pid("broker-1", recorded.pid)
    duplicate = spawn(procs, broker_args(cluster.dir, 1))
    assert cluster.pids("broker-1") == [recorded.pid, duplicate.pid]

    # a controller restarted by hand after a crash: its PID file names the dead process
    dead = spawn(procs, controller_args(cluster.dir, 0))
    cluster._record_pid("controller-0", dead.pid)
    dead.kill()
    dead.wait(timeout=WAIT_S)
    restarted = spawn(procs, controller_args(cluster.dir, 0))
    assert cluster.running("controller-0") == restarted.pid

    assert set(cluster.stop_all(config, timeout_s=5.0)) == {"broker-1", "controller-0"}
    for p in (recorded, duplicate, restarted):
        assert wait_gone(p) == -signal.SIGTERM
    assert cluster.running_pids(config) == {}
    assert not cluster.pid_path("broker-1").exists()
    assert not cluster.pid_path("controller-0").exists()


def test_stop_escalates_to_sigkill_and_kill_waits(tmp_path, procs):
    cluster, _ = make_cluster(tmp_path / "c")
    stubborn = spawn(procs, controller_args(cluster.dir, 2), ignore_term=True)
    cluster._record_pid("controller-2", stubborn.pid)
    t0 = time.monotonic()
    assert cluster.stop("controller-2", timeout_s=0.3) is True
    assert time.monotonic() - t0 >= 0.3
    assert wait_gone(stubborn) == -signal.SIGKILL

    victim = spawn(procs, controller_args(cluster.dir, 1))
    cluster._record_pid("controller-1", victim.pid)
    assert cluster.kill("controller-1") == [victim.pid]
    assert wait_gone(victim) == -signal.SIGKILL
    assert cluster.kill("controller-1") == []
    # a stop is on purpose (the supervisor leaves it down), a kill is a crash (restarted)
    assert cluster.held("controller-2") and not cluster.held("controller-1")


def test_a_start_of_a_running_component_starts_nothing(tmp_path, procs):
    """The supervisor and `cluster up` / `broker start` may race to start one component:
    the start lock and the running check make the second start a no-op."""
    cluster, _ = make_cluster(tmp_path / "c")
    running = spawn(procs, controller_args(cluster.dir, 1))
    cluster._record_pid("controller-1", running.pid)
    (cluster.dir / "pids" / "controller-1.held").touch()
    assert cluster._spawn("controller-1", [sys.executable, "-c", "raise SystemExit(3)"]) == (
        running.pid
    )
    assert not cluster.held("controller-1")
    assert cluster.running("controller-1") == running.pid


def test_terminate_only_signals_the_recorded_process(procs):
    p = spawn(procs, ["unrelated"])
    start = proc_start_time(p.pid)
    # a start time that is not the live process's: the PID was reused, leave it alone
    assert terminate([(p.pid, str(int(start) + 1))], timeout_s=0.2, kill_wait_s=0.2) == []
    assert p.poll() is None
    assert terminate([(p.pid, start)], timeout_s=5.0) == []
    assert wait_gone(p) == -signal.SIGTERM


def test_check_ports_only_for_the_given_components(tmp_path):
    cluster, config = make_cluster(tmp_path / "c")
    free = iter(find_free_ports(6))
    for c in config.controllers:
        c.raft_port, c.api_port = next(free), next(free)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        config.controllers[0].api_port = port
        with pytest.raises(ClusterError, match=f"controller-0 api \\({port}\\)"):
            cluster.check_ports(config, ["controller-0"])
        cluster.check_ports(config, ["controller-1"])  # not its port: no error


# ------------------------------------------------------------------ cluster up --store-dir


def test_store_dir_holds_the_object_stores_and_is_kept(tmp_path):
    from cli.cluster_config import STORE_COMPONENTS
    from cli.flag_differences import flag_differences

    store = tmp_path / "store"
    store.mkdir()
    cluster = LocalCluster(tmp_path / "c")
    cluster.create(1, 1, ["az1"], None, None, 6000, store_dir=store)
    config = cluster.load()  # persisted: every later up / status / down reads it
    assert config.store_dir == str(store)
    dirs = {name: s["data_dir"] for name, s in config.embedded_stores().items()}
    assert dirs == {name: str(store / name) for name in STORE_COMPONENTS}
    # the stores' processes are found by their command line under the store dir
    s3_dir = cluster._s3_data_dir()
    weed = ["/usr/bin/weed", "mini", f"-dir={store / 's3' / 'data'}"]
    assert component_of(weed, None, cluster.dir, s3_dir) == "s3"
    weed = ["/usr/bin/weed", "mini", f"-dir={store / 's3-failover' / 'data'}"]
    assert component_of(weed, None, cluster.dir, s3_dir) == "s3-failover"
    assert component_of(weed, None, cluster.dir) is None  # not the cluster dir's store
    # a restart with the same --store-dir is fine, another one is refused by name
    assert flag_differences(config, store_dir=store) == []
    [differ] = flag_differences(config, store_dir=tmp_path)
    assert differ.startswith(f"--store-dir {tmp_path} (the cluster's object store is in")
    # the stores' data goes with the cluster (a failed first up, down --purge); the
    # operator's directory stays
    for name in STORE_COMPONENTS:
        (store / name / "data").mkdir(parents=True)
    cluster.purge()
    assert not cluster.dir.exists() and store.is_dir() and not list(store.iterdir())


def test_store_dir_must_be_a_writable_directory_and_nothing_is_written(tmp_path):
    cluster = LocalCluster(tmp_path / "c")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    used = tmp_path / "used"
    (used / "s3").mkdir(parents=True)
    cases = [
        (tmp_path / "missing", "not an existing directory"),
        (a_file, "not an existing directory"),
        (used, "already holds s3/"),
    ]
    if os.geteuid() != 0:  # root may write anywhere
        read_only = tmp_path / "ro"
        read_only.mkdir(mode=0o500)
        cases.append((read_only, "not writable"))
    for path, message in cases:
        with pytest.raises(ClusterError, match=message):
            cluster.create(1, 1, ["az1"], None, None, 6000, store_dir=path)
        assert not cluster.dir.exists()
    with pytest.raises(ClusterError, match="does not go with --bucket-uris"):
        cluster.create(
            1, 1, ["az1"], None, "0@s3://b?region=r&endpoint=http://x", 6000, store_dir=used
        )
    assert not cluster.dir.exists() and (used / "s3").is_dir()
