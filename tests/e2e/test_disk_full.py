"""A full disk under a running cluster (issue 33 item 2): the cluster directory is a 400 MB
tmpfs, filled up by a filler file while an idempotent producer writes. No process dies of
it (or a died one is back within 10 s by itself: `cluster up --supervise`), producers keep
their acks (the brokers' WALs are preallocated), the controller quorum has a leader within
5 s of space returning, and nothing acknowledged is lost (the ledger)."""

from __future__ import annotations

import shutil
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")
from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from controlplane.errors import ControllerError  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    automqctl,
    cluster_status,
    create_topic,
    running_cluster,
)
from tests.support.ledger import AckLedger  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TMPFS_MIB = 400
FULL_FOR_S = 20.0
PARTITIONS = 4
LEADER_WITHIN_S = 5.0
BACK_WITHIN_S = 10.0


def _quorum_leader(cluster_dir) -> int | None:
    """The controller that says it leads (asked directly, 1 s each; None: none does)."""
    config = LocalCluster(cluster_dir).load()
    client = ControllerClient(
        config.quorum_config().api_addresses(),
        request_timeout_s=1.0,
        api_secret=config.api_secret,
        ca_file=config.controller_ca_file,
    )
    for ctrl in config.controllers:
        try:
            if client.status(ctrl.api_address)["raft"]["state"] == "leader":
                return ctrl.node_id
        except (ControllerError, OSError):
            continue
    return None


def _pids(status: dict) -> dict[str, int | None]:
    out = {f"controller-{c['node_id']}": c["pid"] for c in status["controllers"]}
    out |= {f"broker-{b['node_id']}": b["pid"] for b in status["brokers"]}
    out |= {s["component"]: s["pid"] for s in status["object_stores"]}
    return out


def test_a_full_cluster_disk_kills_nothing_and_loses_no_ack(tmp_path, faults):
    d = faults.size_limited_dir(tmp_path / "cluster", TMPFS_MIB)
    try:
        _run(d, faults)
    finally:  # the logs outlive the tmpfs, for a failure's post-mortem
        shutil.copytree(d / "logs", tmp_path / "logs", dirs_exist_ok=True)


def _run(d, faults) -> None:
    up_args = (
        "--brokers", "2", "--wal-capacity-mib", "64", "--upload-interval-s", "2", "--supervise"
    )  # fmt: skip
    with running_cluster(d, *up_args) as up:
        bootstrap = up["bootstrap_servers"]
        topic = f"full-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, PARTITIONS)
        before = _pids(cluster_status(d))
        ledger = AckLedger(bootstrap, topic, PARTITIONS, rate_per_partition=50).start()
        try:
            time.sleep(3)
            faults.fill_disk(d)
            filled_at = time.monotonic()
            died: dict[str, float] = {}  # component -> when it was seen not running
            while time.monotonic() - filled_at < FULL_FOR_S:
                now_pids = _pids(cluster_status(d))
                for name, pid in now_pids.items():
                    if pid != before[name] and name not in died:
                        died[name] = time.monotonic()
                print(f"full +{time.monotonic() - filled_at:.0f} s: leader {_quorum_leader(d)}")
                time.sleep(1)
            # a metadata write needs the controllers' journal: refused, not hung, no death
            refused = automqctl("topic", "create", "during-full", cluster_dir=d, timeout_s=90)
            print(f"topic create while full: exit {refused.returncode}: {refused.stderr[-300:]}")
            assert refused.returncode != 0
            during = [a for a in ledger.snapshot() if a.sent_s > filled_at + 2]
            print(f"acks while the disk was full: {len(during)}; seen down: {sorted(died)}")
            assert len(during) > PARTITIONS * 50 * (FULL_FOR_S - 5) * 0.5, len(during)
            faults.free_disk()
            freed_at = time.monotonic()
            leader_s = None
            while time.monotonic() - freed_at < 30 and leader_s is None:
                if _quorum_leader(d) is not None:
                    leader_s = time.monotonic() - freed_at
                time.sleep(0.1)
            while time.monotonic() - freed_at < 30:
                status = cluster_status(d)
                if all(_pids(status).values()):
                    break
                time.sleep(0.2)
            back_s = time.monotonic() - freed_at
            print(f"leader {leader_s:.1f} s after space returned; all running after {back_s:.1f}")
            assert leader_s is not None and leader_s <= LEADER_WITHIN_S, leader_s
            assert all(_pids(status).values()), _pids(status)
            assert not died or back_s <= BACK_WITHIN_S, (died, back_s)
            ledger.wait_writable(set(range(PARTITIONS)), time.monotonic(), timeout_s=60)
            # metadata writes resume (the journal persists again: the controller says so)
            deadline = time.monotonic() + 30
            while automqctl("topic", "create", "after-full", cluster_dir=d).returncode != 0:
                assert time.monotonic() < deadline, "metadata writes did not resume"
                time.sleep(1)
            again = [
                line
                for log in (d / "logs").glob("controller-*.log")
                for line in log.read_text(errors="replace").splitlines()
                if "persisting again" in line
            ]
            print(*again, sep="\n")
            assert again, "no controller journal met the full disk"
        finally:
            faults.free_disk()
            ledger.stop(flush_timeout_s=60)
        report = ledger.verify(timeout_s=120)
        print(f"acked {report.acked}, consumed {report.consumed}")
        assert report.failed_sends == 0, ledger.errors
        assert not report.missing, report.missing[:5]
        assert not report.duplicated, report.duplicated[:5]
