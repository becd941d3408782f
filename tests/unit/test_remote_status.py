"""`automqctl cluster status --controllers host:port,...` when no controller answers: a
document that says so (state `unreachable`, each controller named), exit code 1; a bad
address list is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_controller_answering_is_unreachable_not_an_error(refused_port):
    address = f"127.0.0.1:{refused_port}"
    res = status("--controllers", address, "--format", "json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["state"] == "unreachable" and not doc["healthy"] and doc["leader"] is None
    assert doc["controllers"] == [
        {
            "node_id": None,
            "address": address,
            "reachable": False,
            "is_leader": False,
            "state": "unreachable",
            "term": None,
            "leader_raft_address": None,
            "has_quorum": None,
            "commit_index": None,
            "last_applied": None,
        }
    ]
    assert f"controller {address} unreachable" in doc["problems"]


def test_bad_controller_addresses_are_refused_in_one_line():
    res = status("--controllers", "nohost")
    assert res.returncode == 1 and "--controllers must be host:port" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
