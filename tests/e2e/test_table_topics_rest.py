"""Table topics into an Iceberg REST catalog: the embedded object store's own (SeaweedFS
serves one over an S3 Tables bucket, SigV4-signed like AWS S3 Tables), on a real cluster
(`automqctl cluster up`), real Spark (`local[2]`) and PyIceberg's REST client.

`automqctl table catalog --embedded-rest` switches the cluster to it; `automqctl table sync`
appends a json-mode topic's records once each (one that is not JSON left out and counted:
`automq.table.topic.errors.tolerance=all`); a second run appends only the new ones; the
catalog refuses a commit made on a stale table (what the sync's exactly-once rests on: a run
that raced another must fail, not add its records on top of the winner's)."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.spark import skip_module_without_spark

skip_module_without_spark("pyiceberg")
from confluent_kafka import Producer  # noqa: E402
from pyiceberg.exceptions import CommitFailedException  # noqa: E402

from cli import table_jobs  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from dataplane.tables import catalog as cat  # noqa: E402
from dataplane.tables import spec as ts  # noqa: E402
from spark_jobs.topic_source.plan import committed_end  # noqa: E402
from tests.support.cluster import automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 2
TOPIC = "orders_rest"
JSON_TOPIC = {
    "automq.table.topic.enable": "true",
    "automq.table.topic.schema.type": "json",
    "automq.table.topic.errors.tolerance": "all",
}
BAD = 7  # this record's value is not JSON: left out of the table, counted


def _produce(bootstrap: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + count):
        value = b"not json {" if i == BAD else json.dumps({"id": i, "item": f"item-{i}"}).encode()
        producer.produce(TOPIC, key=str(i).encode(), value=value, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def _wait_committed(d, total: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        image = table_jobs.image(LocalCluster(d).load())
        state = image.topic_by_name(TOPIC)
        if sum(committed_end(image.streams[p.stream_id]) for p in state.partitions.values()) >= (
            total
        ):
            return
        time.sleep(0.5)
    raise AssertionError(f"{total} records not committed to objects in {timeout_s}s")


def _sync(d) -> dict:
    out = automqctl(
        "table", "sync", "--master", "local[2]", "--format", "json", cluster_dir=d, timeout_s=400
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return {t["topic"]: t for t in json.loads(out.stdout)["tables"]}


def _table(d):
    config = LocalCluster(d).load()
    catalog = cat.open_catalog(
        table_jobs.catalog_config(d, config), table_jobs.warehouse_credentials(config)
    )
    return catalog.load_table(("default", TOPIC))


@pytest.mark.timeout(900)
def test_a_table_topic_synced_into_the_embedded_iceberg_rest_catalog(tmp_path):
    d = tmp_path / "cluster"
    with running_cluster(
        d, "--brokers", "1", "--controllers", "1", "--upload-interval-s", "0.5"
    ) as up:
        shown = automqctl("table", "catalog", "--embedded-rest", "--format", "json", cluster_dir=d)
        assert shown.returncode == 0, shown.stderr
        catalog = json.loads(shown.stdout)
        assert catalog["kind"] == "rest" and catalog["uri"].startswith("http://127.0.0.1:")
        assert catalog["rest_signing_name"] == "s3tables"
        assert catalog["warehouse"] == "s3://automq-tables"
        mixed = automqctl("table", "catalog", "--embedded-rest", "--uri", "http://x", cluster_dir=d)
        assert mixed.returncode != 0 and "--embedded-rest" in mixed.stderr

        bootstrap = up["bootstrap_servers"]
        create_topic(bootstrap, TOPIC, PARTITIONS, configs=JSON_TOPIC)
        _produce(bootstrap, 0, 120)
        _wait_committed(d, 120)
        first = _sync(d)[TOPIC]
        assert first["appended"] == 119 and first["skipped_invalid"] == 1
        assert (
            f"record at offset {BAD // PARTITIONS} of {TOPIC}-{BAD % PARTITIONS}: value is not JSON"
            in (first["first_skipped_invalid"])
        )
        _produce(bootstrap, 120, 30)
        _wait_committed(d, 150)
        assert _sync(d)[TOPIC]["appended"] == 30

        table = _table(d)
        rows = table.scan().to_arrow().to_pylist()
        assert sorted(r["id"] for r in rows) == [i for i in range(150) if i != BAD]  # once each
        assert {r["item"] for r in rows} == {f"item-{i}" for i in range(150) if i != BAD}
        assert sum(cat.held_offsets(table)[0].values()) == 150
        assert table.metadata_location.startswith("s3://automq-tables/")

        # a commit on a stale view of the table is refused by the catalog (the sync's own
        # commit path, re-adding one of the table's files with the offsets it holds)
        topic = table_jobs.image(LocalCluster(d).load()).topic_by_name(TOPIC)
        spec = ts.spec_of(TOPIC, topic.topic_id, topic.configs, sorted(topic.partitions))
        held = cat.held_offsets(table)[0]
        one_file = [next(iter(table.scan().plan_files())).file.file_path]
        stale, fresh = _table(d), _table(d)
        won = cat.commit_files(fresh, spec, {}, one_file, held, "fresh")
        with pytest.raises(CommitFailedException):
            cat.commit_files(stale, spec, {}, one_file, held, "stale")
        assert _table(d).current_snapshot().snapshot_id == won

        listed = automqctl("table", "list", "--format", "json", cluster_dir=d)
        assert {t["topic"]: t["lag"] for t in json.loads(listed.stdout)} == {TOPIC: 0}
