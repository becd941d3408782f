"""Issue #11: object-storage failover on a real cluster with real clients.

Two embedded stores run as separate processes (main: bucket 0, failover: bucket 1).
First a manual switch to bucket 1 and back under load. Then confluent-kafka produces with acks=all and records every ack while the main store's process
is frozen (SIGSTOP: every request to it hangs, like a region that stopped answering).
Produce keeps being acknowledged from the WAL; the controller leader switches new objects to
bucket 1 on its own once the brokers report failed writes for the detection time; a switch
back to the dead bucket is refused; after SIGCONT the operator switches back by hand and
new objects land in bucket 0 again. At the end every acked record is read back exactly once
from a broker that never cached it (from both buckets' objects).
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("confluent_kafka")

from cli.local_cluster import LocalCluster  # noqa: E402
from tests.support.cluster import automqctl, create_topic, running_cluster  # noqa: E402
from tests.support.ledger import AckLedger  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 4
DETECT_S = 10.0  # bucket_failover_detect_ms default
# detection = the detect time + the first probe's timeout (2 s) + heartbeat (1 s) +
# the leader's round (0.5 s): the switch must come well before this
MAX_DETECTION_S = DETECT_S + 10
MAX_ACK_GAP_S = 5.0  # produce is acked from the WAL: the failure must not stall it


def failover_status(d) -> dict:
    """What `automqctl failover status --format json` prints."""
    out = automqctl("failover", "status", "--format", "json", cluster_dir=d)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def leader_failover_status(d) -> dict:
    """The same document straight from the leader (polling without a CLI process each time)."""
    from controlplane.client import ControllerClient

    config = LocalCluster(d).load()
    addresses = config.quorum_config().api_addresses()
    client = ControllerClient(
        addresses, timeout_s=5, request_timeout_s=5, api_secret=config.api_secret
    )
    for address in addresses:
        try:
            status = client.status(address)
        except Exception:
            continue
        if status.get("raft", {}).get("state") == "leader":
            return status["bucket_failover"]
    return {"mode": "no leader", "buckets": []}


def bucket(status: dict, bucket_id: int) -> dict:
    return next(b for b in status["buckets"] if b["bucket_id"] == bucket_id)


def wait_for(d, predicate, what: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while time.monotonic() < deadline:
        status = leader_failover_status(d)
        try:
            if predicate(status):
                return status
        except StopIteration:  # a bucket not listed (no leader)
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached in {timeout_s}s: {status}")


def test_main_store_frozen_writes_fail_over_and_nothing_acked_is_lost(tmp_path, faults):
    d = tmp_path / "cluster"
    with running_cluster(d, "--brokers", "2", "--upload-interval-s", "1") as up:
        stores = {s["name"]: s for s in up["object_stores"]}
        assert stores["main"]["bucket_ids"] == [0] and stores["failover"]["bucket_ids"] == [1]
        assert stores["main"]["pid"] != stores["failover"]["pid"]
        main_pid = stores["main"]["pid"]
        bootstrap = up["bootstrap_servers"]
        create_topic(bootstrap, "orders", PARTITIONS)
        ledger = AckLedger(bootstrap, "orders", PARTITIONS, rate_per_partition=50).start()
        try:
            wait_for(d, lambda s: bucket(s, 0)["objects"] > 0, "objects in bucket 0", 20)
            # a manual switch under load with both buckets healthy, and back
            to_1 = automqctl("failover", "--bucket", "1", "--format", "json", cluster_dir=d)
            assert to_1.returncode == 0, to_1.stderr
            switched = json.loads(to_1.stdout)
            assert (switched["mode"], switched["active_bucket_id"]) == ("failover", 1)
            wait_for(d, lambda s: bucket(s, 1)["objects"] > 0, "objects in bucket 1", 10)
            assert automqctl("failover", "--bucket", "0", cluster_dir=d).returncode == 0
            time.sleep(1.5)  # an upload prepared in bucket 1 before the switch commits now
            in_failover = bucket(leader_failover_status(d), 1)["objects"]
            frozen_at = time.monotonic()
            with faults.suspended(main_pid):
                wait_for(
                    d, lambda s: s["mode"] == "failover", "failover mode", MAX_DETECTION_S + 10
                )
                detection_s = time.monotonic() - frozen_at
                assert detection_s <= MAX_DETECTION_S, detection_s
                status = failover_status(d)  # the CLI shows it
                assert status["auto"] and status["active_bucket_id"] == 1
                assert "bucket 0" in status["reason"], status["reason"]
                assert bucket(status, 0)["healthy"] is False
                wait_for(d, lambda s: bucket(s, 1)["objects"] > in_failover, "new objects in 1", 10)
                # going back to a bucket that does not answer: refused, nothing changed
                back = automqctl("failover", "--bucket", "0", cluster_dir=d)
                assert back.returncode == 1 and "not reachable" in back.stderr, back
                assert failover_status(d)["mode"] == "failover"
            healed_at = time.monotonic()
            gaps = ledger.unavailability_s(set(range(PARTITIONS)), frozen_at)
            assert max(gaps.values()) < MAX_ACK_GAP_S, gaps
            # manual switch back under load
            back = automqctl("failover", "--bucket", "0", "--format", "json", cluster_dir=d)
            assert back.returncode == 0, back.stderr
            assert json.loads(back.stdout)["mode"] == "normal"
            in_main = bucket(failover_status(d), 0)["objects"]
            wait_for(
                d,
                lambda s: bucket(s, 0)["objects"] > in_main and bucket(s, 0)["healthy"],
                "new objects in bucket 0",
                15,
            )
            ledger.wait_writable(set(range(PARTITIONS)), healed_at)
        finally:
            ledger.stop()
        # broker 1 hands its partitions to broker 2, whose cache never held them: reading
        # everything back goes to the objects, old ones in bucket 0 and the failover
        # period's in bucket 1
        stop = automqctl("broker", "stop", "1", cluster_dir=d)
        assert stop.returncode == 0, stop.stderr
        report = ledger.verify()
        assert report.acked > 0 and report.failed_sends == 0, report
        assert report.ok, (len(report.missing), len(report.duplicated), report)
