"""The zone router on an mTLS-only cluster (`automqctl cluster up --tls --mtls`: one SSL
listener requiring client certificates, 3 brokers in 3 AZs): the brokers reach each other
with their own client certificate (CN broker, a super user), so a client of az2 produces
through its proxy to partitions led in the other AZs, and consumers of az2 and az1 read
every record back, each exactly once."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.support.ledger import automqctl, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOPIC = "mtls-zone-routed"
PARTITIONS = 6
RECORDS = 300
CONSUME_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("zone-mtls") / "cluster"
    up_args = ("--tls", "--mtls", "--controllers", "1", "--upload-interval-s", "2")
    with running_cluster(d, *up_args, "--wal-capacity-mib", "16") as status:
        assert list(status["listeners"]) == ["SSL"]
        tls = d / "tls"
        yield {
            "dir": d,
            "brokers": {b["node_id"]: b for b in status["brokers"]},
            "ssl": {
                "security.protocol": "SSL",
                "ssl.ca.location": str(tls / "ca.pem"),
                # the admin's certificate (CN admin, a super user): ACLs are on
                "ssl.certificate.location": str(tls / "admin.pem"),
                "ssl.key.location": str(tls / "admin.key"),
            },
        }


def _client(cluster: dict, az: str) -> dict:
    """A confluent-kafka config of a client in `az`, bootstrapping from its AZ's brokers."""
    bootstrap = ",".join(b["address"] for b in cluster["brokers"].values() if b["az"] == az)
    return {
        "bootstrap.servers": bootstrap,
        "client.id": f"automq_type=e2e&automq_az={az}",
        **cluster["ssl"],
    }


def _leader_azs(cluster: dict) -> dict[int, str]:
    """partition -> the AZ of its leader (Metadata asked of a client without an AZ)."""
    everyone = ",".join(b["address"] for b in cluster["brokers"].values())
    admin = AdminClient({"bootstrap.servers": everyone, **cluster["ssl"]})
    md = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
    return {p.id: cluster["brokers"][p.leader]["az"] for p in md.partitions.values()}


def _consume_all(config: dict, group: str, count: int) -> list[bytes]:
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_a_zone_routed_client_produces_and_consumes_over_mutual_tls(cluster):
    out = automqctl(
        "topic", "create", TOPIC, "--partitions", str(PARTITIONS), cluster_dir=cluster["dir"]
    )
    assert out.returncode == 0, out.stderr + out.stdout
    leader_azs = _leader_azs(cluster)
    assert set(leader_azs.values()) - {"az2"}, leader_azs  # some are led in other AZs

    producer = Producer({**_client(cluster, "az2"), "acks": "all", "message.timeout.ms": 30_000})
    errors: list = []
    values = [b"mtls-%d" % i for i in range(RECORDS)]
    for i, value in enumerate(values):
        producer.produce(
            TOPIC,
            value,
            partition=i % PARTITIONS,
            on_delivery=lambda err, msg: err is not None and errors.append(err),
        )
    assert producer.flush(60) == 0
    assert errors == []

    for az in ("az2", "az1"):
        got = _consume_all(_client(cluster, az), f"mtls-{az}", len(values))
        assert sorted(got) == sorted(values), (az, len(got), json.dumps(leader_azs))
