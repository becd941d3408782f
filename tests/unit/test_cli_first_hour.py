"""The operator's first hour (issue 30): usage errors, output in a pipe, honest statuses and
an idempotent `cluster up`, through the CLI as an operator runs it (CliRunner: stdout is
not a terminal; one real subprocess with stdout a pipe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.local_cluster import LocalCluster
from cli.main import app
from tests.support.cli_commands import leaf_commands
from tests.unit.test_balancer import create, machine, register, settle
from tests.unit.test_metadata_state_machine import ok

ROOT = Path(__file__).resolve().parents[2]
LONG_URI = (
    "0@s3://automq-main-bucket-with-a-rather-long-name?region=us-east-1"
    "&endpoint=http://object-store.internal.example.com:9000"
)


@pytest.fixture(autouse=True)
def no_process_starts(monkeypatch):
    """These tests never start a cluster process, whatever the code under test does."""

    def refuse(*args, **kwargs):
        raise AssertionError("a unit test tried to start a cluster process")

    for method in ("start_object_store", "start_controller", "start_broker", "_spawn"):
        monkeypatch.setattr(LocalCluster, method, refuse)


def run(*args: str, env: dict | None = None):
    """The CLI as in a pipe: no COLUMNS (unless `env` sets it), stdout not a terminal."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": None, **(env or {})})


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def made_cluster(directory: Path, bucket_uris: str | None = None) -> LocalCluster:
    """A cluster directory as a successful `up` leaves it (no process runs)."""
    cluster = LocalCluster(directory)
    cluster.create(3, 3, ["az1", "az2", "az3"], None, bucket_uris, 6000)
    cluster.mark_complete()
    return cluster


# ---------------------------------------------------------------- 2: usage errors, PLAN_FILE


@pytest.mark.parametrize("command", sorted(path for path, _ in leaf_commands(app)), ids=" ".join)
def test_2_a_usage_error_is_one_line_on_stderr_with_exit_2_for_every_command(command):
    res = CliRunner().invoke(app, [*command, "--no-such-option"], prog_name="automqctl")
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    line = one_error_line(res.stderr)
    assert "--no-such-option" in line
    assert line.endswith(f"Try 'automqctl {' '.join(command)} --help'.")


@pytest.mark.parametrize(
    "args, says",
    [
        (["topic", "describe"], "Missing argument"),  # a missing argument
        (["cluster", "up", "--brokers", "0"], "--brokers"),  # a value out of range
        (["cluster", "status", "--format", "xml"], "xml"),  # not a choice
        (["no-such-command"], "No such command"),  # an unknown command
        (["--no-such-option"], "--no-such-option"),  # the root's own options
    ],
)
def test_2_usage_errors_of_every_kind_are_one_line_with_exit_2(args, says):
    res = CliRunner().invoke(app, args, prog_name="automqctl")
    assert res.exit_code == 2 and res.stdout == ""
    assert says in one_error_line(res.stderr)


def test_2_a_runtime_error_still_exits_1(tmp_path):
    res = run("reassign", "execute", str(tmp_path / "nope.json"))
    assert res.exit_code == 1
    assert one_error_line(res.stderr) == f"error: plan file {tmp_path / 'nope.json'} does not exist"


def test_2_a_group_without_a_command_still_prints_its_help():
    res = run("cluster")
    assert "cluster up" in res.stdout or " up " in res.stdout
    assert "error" not in res.stderr


def _reassign_fixture(monkeypatch, tmp_path) -> Path:
    """A controller whose image has topic orders (6 partitions over brokers 1-3); the plan
    moves orders-0 to broker 3."""
    import cli.reassign

    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "orders", 6)
    monkeypatch.setattr(cli.reassign, "controller_client", lambda dir, controllers: object())
    monkeypatch.setattr(cli.reassign, "metadata_image", lambda client: sm.image)
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "orders", "partition": 0, "node_id": 3}]}
        )
    )
    return plan


def test_2_reassign_execute_takes_the_plan_as_an_argument_or_as_plan(monkeypatch, tmp_path):
    plan = _reassign_fixture(monkeypatch, tmp_path)
    as_argument = run("reassign", "execute", str(plan), "--dry-run", "--format", "json")
    assert as_argument.exit_code == 0, as_argument.output
    as_option = run("reassign", "execute", "--plan", str(plan), "--dry-run", "--format", "json")
    assert as_option.exit_code == 0, as_option.output
    assert json.loads(as_argument.stdout) == json.loads(as_option.stdout)
    assert json.loads(as_argument.stdout)["moves"] == [
        {"topic": "orders", "partition": 0, "from": 1, "to": 3}
    ]
    # the same file both ways is fine
    both = run("reassign", "execute", str(plan), "--plan", str(plan), "--dry-run")
    assert both.exit_code == 0, both.output


def test_2_reassign_plan_file_missing_or_given_twice_differently_is_a_usage_error(
    monkeypatch, tmp_path
):
    plan = _reassign_fixture(monkeypatch, tmp_path)
    other = tmp_path / "other.json"
    for command in ("execute", "verify"):
        neither = run("reassign", command)
        assert neither.exit_code == 2
        assert "Missing argument 'PLAN_FILE' (or --plan)" in one_error_line(neither.stderr)
        differ = run("reassign", command, str(plan), "--plan", str(other))
        assert differ.exit_code == 2
        line = one_error_line(differ.stderr)
        assert f"PLAN_FILE {plan} and --plan {other} differ" in line


def test_2_reassign_verify_takes_the_plan_as_an_argument(monkeypatch, tmp_path):
    plan = _reassign_fixture(monkeypatch, tmp_path)
    res = run("reassign", "verify", str(plan), "--timeout-s", "0", "--format", "json")
    assert res.exit_code == 1  # orders-0 is not on broker 3: verify ran with the plan
    assert [r["partition"] for r in json.loads(res.stdout)["unfinished"]] == [0]


# ---------------------------------------------------------------- 3: full width in a pipe


def test_3_tables_in_a_pipe_are_never_cut(tmp_path):
    cluster = made_cluster(tmp_path / ("d" * 90), bucket_uris=LONG_URI)
    for env in ({}, {"COLUMNS": "80"}):  # COLUMNS exported by a shell: still whole
        res = run("cluster", "status", "--dir", str(cluster.dir), env=env)
        assert res.exit_code == 1  # stopped
        assert LONG_URI in res.stdout and str(cluster.dir) in res.stdout
        assert "…" not in res.stdout


def test_3_json_and_yaml_are_unchanged_in_a_pipe(tmp_path):
    cluster = made_cluster(tmp_path / "c", bucket_uris=LONG_URI)
    res = run("cluster", "status", "--dir", str(cluster.dir), "--format", "json")
    assert json.loads(res.stdout)["buckets"][0]["uri"] == LONG_URI
    assert res.stdout.startswith("{\n  ")  # indented as before


def test_3_help_in_a_pipe_shows_every_option_whole():
    cut = []
    for command in sorted(path for path, _ in leaf_commands(app)):
        for env in ({}, {"COLUMNS": "80"}):
            res = run(*command, "--help", env=env)
            assert res.exit_code == 0, (command, res.output)
            if "…" in res.stdout:
                cut.append(" ".join(command))
    assert cut == []
    assert "--bucket-secrets-file" in run("cluster", "up", "--help").stdout


def test_3_a_real_pipe_gets_the_whole_table_and_the_whole_help(tmp_path):
    cluster = made_cluster(tmp_path / ("d" * 90), bucket_uris=LONG_URI)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(ROOT)
    for args, whole in (
        (["cluster", "status", "--dir", str(cluster.dir)], LONG_URI),
        (["cluster", "up", "--help"], "--bucket-secrets-file"),
        (["cluster", "up", "--help"], "--retention-check-interval-s"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,  # stdout a pipe: `automqctl ... | cat`
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
        )
        assert whole in proc.stdout, proc.stdout + proc.stderr
        assert "…" not in proc.stdout


# ---------------------------------------------------------------- 4: balancer status, pinned


def test_4_balancer_status_names_the_pinned_partitions_and_until_when(monkeypatch):
    import cli.balancer
    from controlplane.balancer import BalancerSettings, status_document

    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "orders", 12)
    leaders = {
        p.partition: p.leader_node_id for p in sm.image.topics["id-orders"].partitions.values()
    }
    on_1 = sorted(p for p, node in leaders.items() if node == 1)
    leaders.update({p: 2 + i % 2 for i, p in enumerate(on_1)})
    now_ms = 2_000_000_000_000  # the controller's clock (ms)
    moves = [{"topic": "orders", "partition": p, "node_id": n} for p, n in leaders.items()]
    ok(sm.execute("reassign_partitions", {"moves": moves}, now_ms))
    settle(sm, now_ms)
    doc = status_document(sm.image, {}, now_ms + 2_000, BalancerSettings())

    class Client:
        def balancer_status(self):
            return doc

    monkeypatch.setattr(cli.balancer, "controller_client", lambda dir, controllers: Client())
    res = run("balancer", "status")
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert ": balanced by count" not in first and ": not balanced by count" in first
    assert "lead 0/6/6" in first and "12 partition(s) pinned" in first
    import time

    clock = time.strftime("%H:%M:%S", time.localtime((now_ms + 600_000) / 1000))
    pinned = next(line for line in res.stdout.splitlines() if line.startswith("pinned"))
    assert f"until {clock}" in pinned
    assert "orders 0,1,2,3,4,5,6,7,8,9,10,11" in pinned
    as_json = json.loads(run("balancer", "status", "--format", "json").stdout)
    assert as_json["pinned_until_ms"] == now_ms + 600_000
    assert len(as_json["pinned_partitions"]) == 12


# ---------------------------------------------------------------- 5: cost, unknown AZs


def _cost(monkeypatch, tmp_path, counters: dict, *args: str):
    import cli.status

    cluster = made_cluster(tmp_path / "c")
    status = {
        "leader": 0,
        "brokers": [{"node_id": 1, "zone_traffic": counters}],
    }
    monkeypatch.setattr(cli.status, "collect_status", lambda cluster, config: status)
    return run("cost", "--dir", str(cluster.dir), *args)


def test_5_cost_splits_client_bytes_by_known_and_unknown_az(monkeypatch, tmp_path):
    counters = {
        "produced_bytes": 3 * 10**9,
        "produced_unknown_az_bytes": 3 * 10**9,
        "consumed_bytes": 10**9,
        "consumed_same_az_bytes": 10**9,
    }
    res = _cost(monkeypatch, tmp_path, counters, "--format", "json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["cross_az_bytes"] == 0
    assert report["known_az_client_bytes"] == 10**9
    assert report["unknown_az_client_bytes"] == 3 * 10**9
    assert report["unknown_az_estimated_cross_az_bytes"] == 2 * 10**9
    assert report["unknown_az_cost_usd"] == pytest.approx(0.04)
    assert report["cross_az_cost_usd"] == pytest.approx(0.04)  # all of it from them
    assert report["unknown_az_cost_if_routed_usd"] == 0  # routed: within their AZ
    assert report["known_az_cost_usd"] == 0

    table = _cost(monkeypatch, tmp_path, counters)
    note = next(line for line in table.stdout.splitlines() if line.startswith("note:"))
    assert "declare no AZ" in note and "automq_az=" in note
    assert "$0.04 of cross_az_cost_usd" in note and "would cost $0 " in note


def test_5_unknown_clients_routed_would_cross_as_much_as_the_known_ones(monkeypatch, tmp_path):
    # the known clients' bytes cross AZs 1 time in 10 (an AZ without a broker, say)
    counters = {
        "produced_bytes": 2 * 10**9,
        "produced_cross_az_bytes": 10**8,
        "produced_unknown_az_bytes": 10**9,
    }
    report = json.loads(_cost(monkeypatch, tmp_path, counters, "--format", "json").stdout)
    assert report["known_az_client_bytes"] == 10**9
    assert report["unknown_az_cost_if_routed_usd"] == pytest.approx(10**8 / 10**9 * 0.02)
    assert report["known_az_cost_usd"] == pytest.approx(10**8 / 10**9 * 0.02)


def test_5_no_note_without_unknown_clients(monkeypatch, tmp_path):
    res = _cost(monkeypatch, tmp_path, {"produced_bytes": 10**9})
    assert res.exit_code == 0 and "note:" not in res.stdout


# ---------------------------------------------------------------- 7: `cluster up` idempotent


def _running_healthy(monkeypatch, cluster: LocalCluster) -> dict:
    """Every process of `cluster` runs (fake pids) and the status says healthy."""
    import cli.status

    config = cluster.load()
    names = cluster.component_names(config)
    pids = {name: 1000 + i for i, name in enumerate(names)}
    stopped = json.loads(
        run("cluster", "status", "--dir", str(cluster.dir), "--format", "json").stdout
    )
    healthy = {**stopped, "state": "healthy", "healthy": True, "problems": [], "leader": 0}
    monkeypatch.setattr(LocalCluster, "running_pids", lambda self, config: dict(pids))
    monkeypatch.setattr(LocalCluster, "running", lambda self, name: pids.get(name))
    monkeypatch.setattr(cli.status, "collect_status", lambda cluster, config: healthy)
    return healthy


def test_7_up_on_a_running_healthy_cluster_exits_0_and_prints_the_status(monkeypatch, tmp_path):
    cluster = made_cluster(tmp_path / "c")
    healthy = _running_healthy(monkeypatch, cluster)
    res = run("cluster", "up", "--dir", str(cluster.dir))
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].endswith(": healthy")
    assert "was already running: nothing started" in res.stdout
    assert "bootstrap servers" in res.stdout
    as_json = run("cluster", "up", "--dir", str(cluster.dir), "--format", "json")
    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == healthy


def test_7_up_on_a_running_cluster_still_refuses_other_flags_by_name(monkeypatch, tmp_path):
    cluster = made_cluster(tmp_path / "c")
    _running_healthy(monkeypatch, cluster)
    res = run("cluster", "up", "--dir", str(cluster.dir), "--brokers", "5")
    assert res.exit_code == 1
    assert "--brokers 5" in one_error_line(res.stderr)
