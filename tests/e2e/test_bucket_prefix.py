"""`cluster up --bucket-prefix`: every object the cluster writes (data, the brokers' probes)
lands under the prefix in the embedded store, and what was produced reads back."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402

from cli.local_cluster import LocalCluster  # noqa: E402
from dataplane.objectstore import ObjectStorage  # noqa: E402
from tests.support.cluster import create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _all_keys(cluster_dir) -> list[str]:
    """Every key of bucket 0, read without the prefix (the bucket as another cluster sees it)."""
    config = LocalCluster(cluster_dir).load()
    main = config.buckets[0]
    plain = main.uri_with_credentials().replace("&prefix=team-a/", "")
    with ObjectStorage(plain) as store:
        return store.list_keys(0, "")


def test_every_object_of_a_prefixed_cluster_is_under_its_prefix(tmp_path):
    d = tmp_path / "cluster"
    up_args = ("--brokers", "1", "--controllers", "1", "--upload-interval-s", "1")
    with running_cluster(d, *up_args, "--bucket-prefix", "team-a") as up:
        bootstrap = up["bootstrap_servers"]
        create_topic(bootstrap, "t", 1)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(100):
            producer.produce("t", f"v{i}".encode())
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        keys: list[str] = []
        while time.monotonic() < deadline and not any("/data/" in k for k in keys):
            keys = _all_keys(d)
            time.sleep(0.5)
        assert any(k.startswith("team-a/data/") for k in keys), keys[:20]
        assert all(k.startswith("team-a/") for k in keys), [
            k for k in keys if not k.startswith("team-a/")
        ]
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe(["t"])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        try:
            while len(got) < 100 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
        finally:
            consumer.close()
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(100))
