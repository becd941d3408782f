"""Issue #11: a fault proxy in front of the main bucket of a real cluster.

A SeaweedFS outside the cluster serves both buckets; bucket 0's endpoint is a TCP fault proxy
(`cluster up --bucket-uris 0@..endpoint=PROXY,1@..endpoint=STORE`), the keys come from a
0600 `--bucket-secrets-file`, and the leader switches after `--failover-detect-s 1`.
confluent-kafka produces with acks=all and records every ack throughout. Added latency
first: slow, not failing, so writes stay in bucket 0. Then each fault in turn (connection
reset, HTTP 503, blackhole): the brokers' write health reports it, the controller leader
switches new objects to bucket 1 by itself and records why, produce keeps being acked; after
healing, the operator switches back and new objects land in bucket 0 again. A topic deleted
while bucket 0 is down leaves its objects there (deletion paused, not forgotten): they are
deleted from the bucket once it heals. At the end every
acked record is read back exactly once by a broker that never cached it, from the objects of
both buckets.
"""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402
from tests.e2e.test_bucket_failover import bucket, leader_failover_status, wait_for  # noqa: E402
from tests.integration.fault_proxy import FaultProxy  # noqa: E402
from tests.support.ledger import AckLedger, automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 2
DETECT_S = 1.0
# detect time + a probe's timeout + a heartbeat + the leader's round, with slack
MAX_DETECTION_S = 15.0
MAX_ACK_GAP_S = 5.0
LATENCY_HOLD_S = 3.0  # > DETECT_S several times over: latency alone must not switch


def data_keys(store: EmbeddedSeaweed, bucket_name: str) -> set[str]:
    """The object keys in a bucket, read straight from the store (not through the proxy)."""
    import boto3
    from botocore.config import Config

    c = store.config
    client = boto3.client(
        "s3",
        endpoint_url=c.endpoint,
        aws_access_key_id=c.access_key,
        aws_secret_access_key=c.secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket_name, Prefix="data/", PaginationConfig={"MaxItems": 100_000}
    )
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def wait_keys(store, predicate, what: str, timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    keys: set[str] = set()
    while time.monotonic() < deadline:
        keys = data_keys(store, "automq-main")
        if predicate(keys):
            return keys
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s}s: {sorted(keys)[:10]}")


def test_faults_in_front_of_the_main_bucket_fail_over_and_lose_nothing(tmp_path):
    with (
        EmbeddedSeaweed(tmp_path / "s3") as store,
        FaultProxy("127.0.0.1", store.config.ports["s3"]) as proxy,
    ):
        c = store.config
        secrets = tmp_path / "bucket.secrets"
        fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            for i in (0, 1):
                f.write(f"AUTOMQ_S3_ACCESS_KEY_{i}={c.access_key}\n")
                f.write(f"AUTOMQ_S3_SECRET_KEY_{i}={c.secret_key}\n")
        uris = (
            f"0@s3://automq-main?region=us-east-1&endpoint={proxy.endpoint},"
            f"1@s3://automq-failover?region=us-east-1&endpoint={c.endpoint}"
        )
        d = tmp_path / "cluster"
        up_args = ["--brokers", "2", "--controllers", "1", "--azs", "a"]
        up_args += ["--wal-capacity-mib", "32", "--upload-interval-s", "0.5"]
        up_args += ["--bucket-uris", uris, "--bucket-secrets-file", str(secrets)]
        up_args += ["--failover-detect-s", str(DETECT_S), "--object-delete-delay-s", "0.5"]
        with running_cluster(d, *up_args) as up:
            assert c.secret_key not in json.dumps(up)
            bootstrap = up["bootstrap_servers"]
            # a topic whose objects hold nothing else (written before any other data)
            create_topic(bootstrap, "doomed", 1)
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
            for i in range(50):
                producer.produce("doomed", value=b"doomed-%d" % i)
            assert producer.flush(30) == 0
            doomed_keys = wait_keys(store, bool, "the doomed topic's objects in bucket 0", 15)
            create_topic(bootstrap, "orders", PARTITIONS)
            ledger = AckLedger(bootstrap, "orders", PARTITIONS, rate_per_partition=50).start()
            try:
                wait_for(d, lambda s: bucket(s, 0)["objects"] > 0, "objects in bucket 0", 15)
                # added latency: every request to bucket 0 slower, none failing
                proxy.latency_s, proxy.mode = 0.2, "latency"
                in_main = bucket(leader_failover_status(d), 0)["objects"]
                time.sleep(LATENCY_HOLD_S)
                status = leader_failover_status(d)
                assert status["mode"] == "normal", status
                assert bucket(status, 0)["objects"] > in_main, status
                proxy.mode = "pass"
                for fault in ("reset", "503", "blackhole"):
                    in_failover = bucket(leader_failover_status(d), 1)["objects"]
                    proxy.mode = fault
                    faulted_at = time.monotonic()
                    status = wait_for(
                        d, lambda s: s["mode"] == "failover", f"failover on {fault}", 30
                    )
                    detection_s = time.monotonic() - faulted_at
                    assert detection_s <= MAX_DETECTION_S, (fault, detection_s)
                    print(f"{fault}: failover {detection_s:.1f} s after the fault")
                    assert status["auto"] and status["active_bucket_id"] == 1, status
                    assert "bucket 0" in status["reason"], status["reason"]
                    if fault == "reset":  # the CLI shows it, and never a key
                        shown = automqctl("failover", "status", "--format", "json", cluster_dir=d)
                        assert json.loads(shown.stdout)["mode"] == "failover", shown.stderr
                        assert c.secret_key not in shown.stdout + shown.stderr
                    wait_for(
                        d,
                        lambda s, n=in_failover: bucket(s, 1)["objects"] > n,
                        f"new objects in bucket 1 ({fault})",
                        15,
                    )
                    if fault == "reset":
                        # destroyed while bucket 0 is down: kept there, not forgotten
                        admin = AdminClient({"bootstrap.servers": bootstrap})
                        admin.delete_topics(["doomed"], operation_timeout=30)["doomed"].result(30)
                        time.sleep(1.5)  # > the delete delay + a lifecycle round
                        assert doomed_keys <= data_keys(store, "automq-main")
                    gaps = ledger.unavailability_s(set(range(PARTITIONS)), faulted_at)
                    assert max(gaps.values()) < MAX_ACK_GAP_S, (fault, gaps)
                    proxy.mode = "pass"
                    healed_at = time.monotonic()
                    back = automqctl("failover", "--bucket", "0", "--format", "json", cluster_dir=d)
                    assert back.returncode == 0, (fault, back.stderr)
                    assert json.loads(back.stdout)["mode"] == "normal"
                    in_main = bucket(leader_failover_status(d), 0)["objects"]
                    wait_for(
                        d,
                        lambda s, n=in_main: (
                            bucket(s, 0)["objects"] > n and bucket(s, 0)["healthy"]
                        ),
                        f"new objects in bucket 0 after {fault}",
                        15,
                    )
                    ledger.wait_writable(set(range(PARTITIONS)), healed_at)
                    if fault == "reset":  # healed: the paused deletions run now
                        wait_keys(
                            store,
                            lambda keys: not doomed_keys & keys,
                            "the doomed objects deleted from bucket 0 after healing",
                            15,
                        )
            finally:
                proxy.mode = "pass"
                ledger.stop()
            # broker 1 hands its partitions to broker 2, whose cache never held them:
            # reading everything back goes to the objects of both buckets
            stop = automqctl("broker", "stop", "1", cluster_dir=d)
            assert stop.returncode == 0, stop.stderr
            report = ledger.verify()
            assert report.acked > 0 and report.failed_sends == 0, report
            assert report.ok, (len(report.missing), len(report.duplicated), report)
