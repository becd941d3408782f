"""`automqctl COMMAND` imports what COMMAND needs and not the rest of the toolkit: each
command is a process of its own (scripts run dozens), and importing every command group
cost ~1 s of CPU per call before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# modules of other commands that a command must not import on its way to run
OTHER_COMMANDS = ("cli.perf", "cli.group", "cli.compaction", "cli.table", "cli.reassign")


def modules_after(*argv: str) -> set[str]:
    """The modules a fresh interpreter has imported after running `automqctl ARGV`."""
    script = (
        "import json, sys\n"
        "from cli.main import app\n"
        "try:\n"
        f"    app({list(argv)!r}, prog_name='automqctl')\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('MODULES ' + json.dumps(sorted(sys.modules)))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    line = next(x for x in res.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize(
    ("argv", "own"),
    [(("topic", "--help"), "cli.topic"), (("failover", "--help"), "cli.bucket_failover")],
)
def test_a_command_imports_its_own_module_and_no_other_commands(argv, own):
    loaded = modules_after(*argv)
    assert own in loaded
    assert loaded.isdisjoint(OTHER_COMMANDS), sorted(loaded & set(OTHER_COMMANDS))
    assert "cli.cluster" not in loaded


def test_cluster_up_does_not_import_the_controller_client_or_the_live_view():
    loaded = modules_after("cluster", "up", "--help")
    assert "cli.cluster" in loaded
    assert loaded.isdisjoint({"cli.cluster_top", "cli.deploy", "controlplane.requests"})


def test_the_root_help_lists_every_command_with_its_help_line():
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    for name, help_line in [
        ("cluster", "Start, inspect and stop a local cluster."),
        ("perf", "Load generator: throughput and latency percentiles"),
        ("node", "Run one node of a multi-host cluster."),
        ("acl", "ACLs, enforced with SASL or mutual TLS on"),
    ]:
        assert any(name in line and help_line in line for line in res.stdout.splitlines()), (
            name,
            res.stdout,
        )


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [(("topc", "list"), "Did you mean 'topic'?"), (("cluster", "tp"), "Did you mean 'top'?")],
)
def test_a_mistyped_command_is_answered_with_the_commands_not_loaded_yet(argv, suggestion):
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, list(argv), prog_name="automqctl")
    assert res.exit_code == 2
    assert suggestion in res.stderr, res.stderr
