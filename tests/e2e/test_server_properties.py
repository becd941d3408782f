"""Issue #30 item 9: a cluster started from an AutoMQ-style `server.properties`.

The file is what an AutoMQ operator has: seed 003's failover keys (`s3.endpoint`,
`s3.region`, `s3.bucket` with `1@` parts; the credentials, as AutoMQ takes them, in the
environment's `KAFKA_S3_ACCESS_KEY` / `KAFKA_S3_SECRET_KEY` with `1@` parts) and seed 002's
start command as `--override` arguments (the WAL path and capacity, the cache and bandwidth
sizes, telemetry keys this broker has no use for), plus common Kafka broker keys.

Buckets a server.properties names are real object stores, so they are external ones here
(`--bucket-uris` semantics): two SeaweedFS run outside the cluster, one bucket each with its
own keys, as a main and a failover bucket at two providers would. (Without bucket keys,
`cluster up --config` runs its two embedded stores as always.) The cluster must come up with
both buckets written by every broker (each with its own keys), the brokers' configs must hold
the file's sizes, a new topic must get the file's retention as its default, one record must
go through confluent-kafka, every key not used must be named once on stderr, and `cluster
down` stops it all.
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, ConfigResource  # noqa: E402

from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402
from tests.e2e.test_bucket_failover import leader_failover_status  # noqa: E402
from tests.support.ledger import automqctl  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RETENTION_MS = 7_200_000


def _server_properties(main: EmbeddedSeaweed, failover: EmbeddedSeaweed) -> str:
    return f"""\
# AutoMQ-style server.properties (config/kraft/server.properties)
process.roles=broker,controller
node.id=0
controller.quorum.voters=0@127.0.0.1:9093
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
controller.listener.names=CONTROLLER
num.network.threads=3
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
log.retention.hours=168
log.retention.ms={RETENTION_MS}
message.max.bytes=2097152

# object storage failover (AKIP-1, seed 003): bucket 0 main, bucket 1 failover
s3.endpoint={main.config.endpoint},1@{failover.config.endpoint}
s3.region=us-east-1,\\
    1@us-east-1
s3.bucket=automq-main,1@automq-failover
s3.path.style=true
"""


def _wait_both_buckets_written(d, timeout_s: float) -> dict:
    """The leader's failover view once every broker reported a write to both buckets."""
    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while time.monotonic() < deadline:
        status = leader_failover_status(d)
        buckets = {b["bucket_id"]: b for b in status.get("buckets", [])}
        if all(
            i in buckets and buckets[i]["healthy"] and buckets[i]["reports"] >= 2 for i in (0, 1)
        ):
            return status
        time.sleep(0.5)
    raise AssertionError(f"both buckets not written by every broker: {status}")


def test_an_automq_server_properties_starts_a_two_bucket_cluster(tmp_path, monkeypatch):
    with (
        EmbeddedSeaweed(tmp_path / "s3-main", buckets=["automq-main"]) as main,
        EmbeddedSeaweed(tmp_path / "s3-failover", buckets=["automq-failover"]) as failover,
    ):
        props = tmp_path / "server.properties"
        props.write_text(_server_properties(main, failover))
        d = tmp_path / "cluster"
        env_keys = {
            "KAFKA_S3_ACCESS_KEY": f"{main.config.access_key},1@{failover.config.access_key}",
            "KAFKA_S3_SECRET_KEY": f"{main.config.secret_key},1@{failover.config.secret_key}",
        }
        overrides = [
            "s3.wal.path=0@file:///dev/nvme1n1?capacity=33554432&iodepth=32&iops=4000",
            "s3.telemetry.metrics.exporter.uri=otlp://?endpoint=http://xxxx&protocol=grpc",
            "s3.stream.allocator.policy=POOLED_DIRECT",
            "s3.wal.cache.size=128MB",
            "s3.wal.upload.threshold=4194304",
            "s3.block.cache.size=64MiB",
            "s3.network.baseline.bandwidth=2147483648",
            "s3.stream.object.split.size=1048576",
        ]
        args = ["cluster", "up", "--format", "json", "--brokers", "2", "--controllers", "1"]
        args += ["--azs", "a", "--config", str(props)]
        for o in overrides:
            args += ["--override", o]
        for name, value in env_keys.items():  # AutoMQ takes the keys from the environment
            monkeypatch.setenv(name, value)
        up = automqctl(*args, cluster_dir=d)
        try:
            assert up.returncode == 0, up.stderr + up.stdout
            status = json.loads(up.stdout)
            secrets = (main.config.secret_key, failover.config.secret_key)
            assert not any(s in up.stdout + up.stderr for s in secrets)
            # every key not used, named once, one line each
            notes = [line for line in up.stderr.splitlines() if line.startswith("note: ")]
            named = sorted(line.split(":")[1].strip() for line in notes)
            assert named == sorted(
                [
                    "process.roles",
                    "node.id",
                    "controller.quorum.voters",
                    "listeners",
                    "controller.listener.names",
                    "num.network.threads",
                    "offsets.topic.replication.factor",
                    "log.retention.hours",
                    "s3.wal.path",  # iodepth, iops, and the path (each broker has its own)
                    "s3.telemetry.metrics.exporter.uri",
                    "s3.stream.allocator.policy",
                ]
            ), up.stderr
            assert [b["uri"].split("?")[0] for b in status["buckets"]] == [
                "0@s3://automq-main",
                "1@s3://automq-failover",
            ]
            broker = json.loads((d / "broker-1" / "broker.json").read_text())
            assert broker["storage"]["block_cache_bytes"] == 64 << 20
            assert broker["storage"]["log_cache_uploaded_bytes"] == 128 << 20
            assert broker["storage"]["stream_split_bytes"] == 1 << 20
            assert broker["object_store"]["write_bandwidth_bytes_per_s"] == 2 << 30
            assert broker["wal"]["capacity_bytes"] == 32 << 20
            # both buckets, each with its own keys, written by both brokers (their probes)
            _wait_both_buckets_written(d, timeout_s=30)

            bootstrap = status["bootstrap_servers"]
            admin = AdminClient({"bootstrap.servers": bootstrap})
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
            producer.produce("orders", key=b"k", value=b"from server.properties")
            assert producer.flush(30) == 0
            resource = ConfigResource("topic", "orders")
            configs = admin.describe_configs([resource])[resource].result(30)
            assert configs["retention.ms"].value == str(RETENTION_MS)
            assert configs["max.message.bytes"].value == "2097152"
            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "properties-e2e",
                    "auto.offset.reset": "earliest",
                }
            )
            try:
                consumer.subscribe(["orders"])
                deadline = time.monotonic() + 30
                got = None
                while got is None and time.monotonic() < deadline:
                    msg = consumer.poll(1.0)
                    if msg is not None and msg.error() is None:
                        got = msg
                assert got is not None and got.value() == b"from server.properties"
            finally:
                consumer.close()
        finally:
            down = automqctl("cluster", "down", cluster_dir=d)
            for wal in d.glob("broker-*/storage/wal"):
                wal.unlink(missing_ok=True)
        assert down.returncode == 0, down.stderr
        status_after = automqctl("cluster", "status", "--format", "json", cluster_dir=d)
        assert json.loads(status_after.stdout)["state"] == "stopped"
