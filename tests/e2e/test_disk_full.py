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
from tests.support.cluster import cluster_status, create_topic, running_cluster  # noqa: E402
from tests.support.ledger import AckLedger  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TMPFS_MIB = 400
FULL_FOR_S = 20.0
PARTITIONS = 4
LEADER_WITHIN_S = 5.0
BACK_WITHIN_S = 10.0


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
                seen = cluster_status(d)
                print(f"full +{time.monotonic() - filled_at:.0f} s: leader {seen['leader']}")
                time.sleep(1)
            during = [a for a in ledger.snapshot() if a.sent_s > filled_at + 2]
            print(f"acks while the disk was full: {len(during)}; seen down: {sorted(died)}")
            assert len(during) > PARTITIONS * 50 * (FULL_FOR_S - 5) * 0.5, len(during)
            faults.free_disk()
            freed_at = time.monotonic()
            leader_s = None
            while time.monotonic() - freed_at < 30:
                status = cluster_status(d)
                print(
                    f"freed +{time.monotonic() - freed_at:.1f} s: leader {status['leader']}",
                    [(c["state"], c["term"]) for c in status["controllers"]],
                )
                if status["leader"] is not None and leader_s is None:
                    leader_s = time.monotonic() - freed_at
                if leader_s is not None and all(_pids(status).values()):
                    break
                time.sleep(0.2)
            back_s = time.monotonic() - freed_at
            print(f"leader {leader_s:.1f} s after space returned; all running after {back_s:.1f}")
            assert leader_s is not None and leader_s <= LEADER_WITHIN_S, leader_s
            assert all(_pids(status).values()), _pids(status)
            assert not died or back_s <= BACK_WITHIN_S, (died, back_s)
            ledger.wait_writable(set(range(PARTITIONS)), time.monotonic(), timeout_s=60)
        finally:
            faults.free_disk()
            ledger.stop(flush_timeout_s=60)
        report = ledger.verify(timeout_s=120)
        print(f"acked {report.acked}, consumed {report.consumed}")
        assert report.failed_sends == 0, ledger.errors
        assert not report.missing, report.missing[:5]
        assert not report.duplicated, report.duplicated[:5]
