"""Crash failover on the object-storage WAL (`cluster up --wal s3`): a broker is killed with
acknowledged records that are only in its WAL objects; another broker (no shared disk)
recovers them from the object store, and a real client reads every acknowledged record."""

from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("confluent_kafka")
from tests.e2e.test_elastic import (  # noqa: E402
    BROKERS,
    assert_ledger_exact,
    producing,
    victim_with_partitions,
    wait_all_active,
)
from tests.support.ledger import automqctl, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("objwal") / "cluster"
    with running_cluster(
        d,
        # a killed broker must stay down (failover, `broker start`): no supervisor
        "--no-supervise",
        "--wal",
        "s3",
        "--session-timeout-ms",
        "6000",
        # nothing is uploaded before the kill: the acked records exist only in the WAL
        "--upload-interval-s",
        "120",
    ) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def failover_line(cluster, node: int, timeout_s: float = 60) -> str:
    pattern = re.compile(
        rf"WAL failover of node {node} done in [\d.]+s: (\d+) records read, (\d+) batches"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in (cluster["dir"] / "logs").glob("broker-*.log"):
            m = pattern.search(log.read_text())
            if m:
                return m
        time.sleep(0.3)
    raise AssertionError(f"no broker logged the failover of node {node} within {timeout_s}s")


def test_kill_9_recovers_the_object_wal_on_another_broker(cluster):
    for node in BROKERS:  # the brokers' WALs are objects, not local files
        config = json.loads((cluster["dir"] / f"broker-{node}" / "broker.json").read_text())
        assert config["wal"]["uri"] == f"s3://automq-main/wal/node-{node}"
        assert not (cluster["dir"] / f"broker-{node}" / "storage" / "wal").exists()
    wait_all_active(cluster)
    status = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster["dir"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["wal"] == "s3"
    assert json.loads(status.stdout)["wal_allocated_bytes"] == 0  # no local WAL file
    with producing(cluster) as (topic, ledger):
        time.sleep(3)
        node, moved = victim_with_partitions(cluster, topic)
        assert moved
        killed = automqctl("broker", "kill", str(node), cluster_dir=cluster["dir"])
        assert killed.returncode == 0, killed.stderr
        event = time.monotonic()
        again = ledger.wait_writable(moved, event)
        m = failover_line(cluster, node)
        records_read, batches_uploaded = int(m[1]), int(m[2])
        # the killed broker's acknowledged records were recovered from its WAL objects
        assert records_read > 0 and batches_uploaded > 0, m[0]
        print(f"kill -9 of broker {node} on the s3 WAL: writable again after {again}; {m[0]}")
        assert automqctl("broker", "start", str(node), cluster_dir=cluster["dir"]).returncode == 0
        time.sleep(1)
    assert_ledger_exact(ledger)
