"""Beyond one machine: `automqctl cluster init --topology` writes one config directory per
host, `automqctl node run` runs each node in the foreground; hosts are stood in for by the
loopback addresses 127.0.0.2-4 (one controller and one broker each), the object store is a
real SeaweedFS. Produce with an acked-write ledger, kill every process of one "host" (-9),
and every acknowledged record is still read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dataplane.objectstore.seaweed import find_free_ports
from tests.support.cluster import create_topic
from tests.support.ledger import AckLedger

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def automqctl(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def topology(seaweed, root: Path) -> dict:
    c = seaweed.config
    controllers, brokers = [], []
    for i, host in enumerate(HOSTS):
        raft, api, kafka = find_free_ports(3, host=host)
        controllers.append(
            {
                "id": i,
                "host": host,
                "raft_port": raft,
                "api_port": api,
                "data_dir": str(root / host / "controller-{id}"),
            }
        )
        brokers.append(
            {
                "id": i + 1,
                "host": host,
                "az": f"az{i + 1}",
                "kafka_port": kafka,
                "data_dir": str(root / host / "broker-{id}"),
                "wal_capacity_mib": 64,
            }
        )
    return {
        "buckets": [f"0@s3://automq-main?region=us-east-1&endpoint={c.endpoint}"],
        "controllers": controllers,
        "brokers": brokers,
        "broker_session_timeout_ms": 4000,
        "upload_interval_s": 2,
    }


def test_init_refuses_bad_topologies_clearly(tmp_path):
    bad = tmp_path / "bad.yaml"
    for text, why in (
        ("brokers: [", "not valid YAML"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("buckets: ['0@s3://b?accessKey=x']\ncontrollers: []\nbrokers: []\n", "controllers"),
    ):
        bad.write_text(text)
        res = automqctl("cluster", "init", "--topology", str(bad), "--out", str(tmp_path / "o"))
        assert res.returncode == 1 and why in res.stderr, (text, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "o").exists()


def test_nodes_on_three_hosts_survive_losing_one_host(seaweed, tmp_path):
    topo_file = tmp_path / "topo.yaml"
    topo = topology(seaweed, tmp_path / "data")
    topo_file.write_text(yaml.safe_dump(topo))
    out = tmp_path / "out"
    res = automqctl(
        "cluster", "init", "--topology", str(topo_file), "--out", str(out), "--format", "json"
    )
    assert res.returncode == 0, res.stderr
    init = json.loads(res.stdout)
    assert sorted(init["hosts"]) == HOSTS
    secrets_text = (out / HOSTS[0] / "secrets.json").read_text()
    assert (out / HOSTS[0] / "secrets.json").stat().st_mode & 0o077 == 0
    api_secret = json.loads(secrets_text)["api_secret"]
    for host in HOSTS:  # node files hold references, never the secrets themselves
        for f in (out / host).glob("*-*.json"):
            assert api_secret not in f.read_text() and "${secret:api_secret}" in f.read_text()
    again = automqctl("cluster", "init", "--topology", str(topo_file), "--out", str(out))
    assert again.returncode == 1 and "not empty" in again.stderr

    env = {
        **os.environ,
        "AUTOMQ_S3_ACCESS_KEY_0": seaweed.config.access_key,
        "AUTOMQ_S3_SECRET_KEY_0": seaweed.config.secret_key,
    }
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        for host in HOSTS:
            for node_file in sorted((out / host).glob("*-*.json")):
                log = open(tmp_path / f"{host}-{node_file.stem}.log", "w")  # noqa: SIM115
                logs.append(log)
                procs[f"{host}/{node_file.stem}"] = subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "node", "run", "--config", str(node_file)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        bootstrap = init["bootstrap_servers"]
        deadline = time.monotonic() + 90
        while True:  # every broker registered and unfenced: a 3-partition topic spreads
            try:
                # a retry after an attempt whose answer was lost finds the topic made
                create_topic(bootstrap, "hosts", 3, timeout_s=20, exist_ok=True)
                break
            except Exception as exc:
                print(f"create_topic attempt failed: {exc!r}")  # shown if the test fails
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        ledger = AckLedger(bootstrap, "hosts", 3, rate_per_partition=40).start()
        time.sleep(4)
        # the "host" 127.0.0.3 dies: its controller and its broker, kill -9
        for name, proc in procs.items():
            if name.startswith(HOSTS[1] + "/"):
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        killed_at = time.monotonic()
        ledger.wait_writable({0, 1, 2}, killed_at, timeout_s=60)
        time.sleep(2)
        ledger.stop()
        report = ledger.verify()
        assert report.acked > 300 and report.ok, report
        assert ledger.failed == 0, ledger.errors
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in logs:
            log.close()
