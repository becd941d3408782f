"""Table topics on a real cluster (`automqctl cluster up`: SeaweedFS, a controller, a
broker), real Spark (`local[2]`, the `automq` source reading the committed objects) and
PyIceberg's SQL catalog with the warehouse in the cluster's bucket.

A json-mode table topic: after `automqctl table sync` PyIceberg's scan returns every record
once with the inferred columns; a run killed after its Parquet files are written and before
its commit changes nothing, and the re-run adds every record once; a new JSON field becomes
a new column; a non-JSON value fails its topic's run naming the offset (its table
unchanged) while the other topic commits; a raw-mode topic is appended by the compaction
schedule (which also does the re-run above). Bad input (a missing topic, an invalid schema mode) gets a clear error.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.spark import skip_module_without_spark

skip_module_without_spark("pyiceberg")
from confluent_kafka import Producer  # noqa: E402

from cli import table_jobs  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from dataplane.tables import catalog as cat  # noqa: E402
from spark_jobs.table_sync import FAULT_ENV, FAULT_EXIT_CODE  # noqa: E402
from spark_jobs.topic_source.plan import committed_end  # noqa: E402
from tests.support.cluster import automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MASTER = "local[2]"
PARTITIONS = 3
JSON_TOPIC = {"automq.table.topic.enable": "true", "automq.table.topic.schema.type": "json"}
SYNC_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables") / "cluster"
    with running_cluster(
        d, "--brokers", "1", "--controllers", "1", "--upload-interval-s", "0.5"
    ) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def _config(cluster):
    return LocalCluster(cluster["dir"]).load()


def _produce(cluster, topic: str, values: list[bytes], first_key: int = 0) -> None:
    producer = Producer({"bootstrap.servers": cluster["bootstrap"], "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(
            topic,
            key=str(first_key + i).encode(),
            value=value,
            partition=(first_key + i) % PARTITIONS,
            headers=[("source", b"test")],
        )
    assert producer.flush(30) == 0


def _wait_committed(cluster, topic: str, total: int, timeout_s: float = 60) -> None:
    """Until the topic's partitions' committed (uploaded) ends add up to `total`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        image = table_jobs.image(_config(cluster))
        state = image.topic_by_name(topic)
        ends = [committed_end(image.streams[p.stream_id]) for p in state.partitions.values()]
        if sum(ends) >= total:
            return
        time.sleep(0.5)
    raise AssertionError(f"{topic}: {total} records not committed to objects in {timeout_s}s")


def _table(cluster, topic: str):
    config = _config(cluster)
    catalog = cat.open_catalog(
        table_jobs.catalog_config(cluster["dir"], config),
        table_jobs.warehouse_credentials(config),
    )
    return catalog.load_table(("default", topic))


def _rows(cluster, topic: str) -> list[dict]:
    return _table(cluster, topic).scan().to_arrow().to_pylist()


def _sync(cluster, *args: str):
    out = automqctl(
        "table",
        "sync",
        "--master",
        MASTER,
        "--format",
        "json",
        *args,
        cluster_dir=cluster["dir"],
        timeout_s=SYNC_TIMEOUT_S,
    )
    body = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
    return out, {t["topic"]: t for t in body.get("tables", [])}


def _json_values(first: int, count: int, **extra) -> list[bytes]:
    return [
        json.dumps({"id": i, "name": f"n{i}", "price": i * 1.5, **extra}).encode()
        for i in range(first, first + count)
    ]


def _assert_once(rows: list[dict], count: int) -> None:
    seen = {(r["_kafka_partition"], r["_kafka_offset"]) for r in rows}
    assert len(rows) == count and len(seen) == count, (len(rows), len(seen))
    assert sorted(r["id"] for r in rows) == list(range(count))


@pytest.mark.timeout(1200)
def test_table_topics_exactly_once_across_a_killed_run_a_new_column_and_a_schedule(
    cluster, monkeypatch
):
    create_topic(cluster["bootstrap"], "events", PARTITIONS, configs=JSON_TOPIC)
    create_topic(cluster["bootstrap"], "badjson", PARTITIONS, configs=JSON_TOPIC)
    raw = {"automq.table.topic.enable": "true", "automq.table.topic.partition.by": "[]"}
    create_topic(cluster["bootstrap"], "clicks", PARTITIONS, configs=raw)
    _produce(cluster, "events", _json_values(0, 300))
    _produce(cluster, "clicks", [f"click-{i}".encode() for i in range(90)])
    _wait_committed(cluster, "events", 300)

    out, tables = _sync(cluster, "--topic", "events")
    assert out.returncode == 0, out.stderr + out.stdout
    assert tables["events"]["appended"] == 300
    assert tables["events"]["new_columns"] == ["id", "name", "price"]
    rows = _rows(cluster, "events")
    _assert_once(rows, 300)
    first = min(rows, key=lambda r: r["id"])
    assert first["name"] == "n0" and first["price"] == 0.0 and first["_kafka_key"] == b"0"
    assert first["_kafka_headers"] == [{"key": "source", "value": b"test"}]
    (field,) = _table(cluster, "events").spec().fields
    assert (field.name, str(field.transform)) == ("_kafka_timestamp_day", "day")

    # the next records carry a new field; a run dies after writing its files, before its
    # commit: the table is as it was
    _produce(cluster, "events", _json_values(300, 150, color="red"), first_key=300)
    _produce(cluster, "badjson", [b'{"ok": 1}', b"not json {", b'{"ok": 2}'])
    _wait_committed(cluster, "events", 450)
    _wait_committed(cluster, "badjson", 3)
    _wait_committed(cluster, "clicks", 90)
    snapshot_before = _table(cluster, "events").current_snapshot().snapshot_id
    monkeypatch.setenv(FAULT_ENV, "before_commit")
    out, _ = _sync(cluster, "--topic", "events")
    monkeypatch.delenv(FAULT_ENV)
    assert out.returncode != 0 and f"exit {FAULT_EXIT_CODE}" in out.stderr, out.stderr
    table = _table(cluster, "events")
    assert table.current_snapshot().snapshot_id == snapshot_before
    assert len(table.scan().to_arrow()) == 300 and "color" not in table.schema().column_names

    # the re-run is a scheduled one (the compaction schedule syncs every table topic after
    # each compaction run): events gets each record once and the new column; badjson fails
    # naming the offset of its bad value, its table stays empty; clicks (raw) is appended
    out = automqctl(
        "compaction", "schedule", "--every", "10s", "--master", MASTER, cluster_dir=cluster["dir"]
    )
    assert out.returncode == 0, out.stderr
    try:
        run = _wait_scheduled_sync(cluster)
    finally:
        automqctl("compaction", "unschedule", cluster_dir=cluster["dir"])
    tables = {t["topic"]: t for t in run["tables"]}
    assert tables["events"]["appended"] == 150 and tables["events"]["new_columns"] == ["color"]
    rows = _rows(cluster, "events")
    _assert_once(rows, 450)
    assert {r["color"] for r in rows if r["id"] >= 300} == {"red"}
    assert {r["color"] for r in rows if r["id"] < 300} == {None}
    assert "record at offset 0 of badjson-1: value is not JSON" in tables["badjson"]["error"]
    assert _table(cluster, "badjson").current_snapshot() is None
    assert sum(cat.held_offsets(_table(cluster, "events"))[0].values()) == 450
    clicks = _rows(cluster, "clicks")
    assert sorted(r["value"] for r in clicks) == sorted(f"click-{i}".encode() for i in range(90))
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in clicks}) == 90

    listed = automqctl("table", "list", "--format", "json", cluster_dir=cluster["dir"])
    lags = {t["topic"]: t["lag"] for t in json.loads(listed.stdout)}
    assert lags == {"events": 0, "badjson": 3, "clicks": 0}
    status = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster["dir"])
    assert {t["topic"]: t["lag"] for t in json.loads(status.stdout)["tables"]} == lags


def _wait_scheduled_sync(cluster, timeout_s: float = 600) -> dict:
    """The first table sync the schedule ran (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [r for r in table_jobs.last_runs(cluster["dir"]) if r["trigger"] == "schedule"]
        if runs:
            assert "tables" in runs[0], runs[0]
            return runs[0]
        time.sleep(1)
    raise AssertionError(f"no scheduled table sync in {timeout_s}s")


def test_bad_input_gets_a_clear_error_and_changes_nothing(cluster):
    runs_before = table_jobs.last_runs(cluster["dir"], limit=1000)
    out, _ = _sync(cluster, "--topic", "no-such-topic")
    assert out.returncode == 1 and "topic 'no-such-topic' does not exist" in out.stderr
    create_topic(cluster["bootstrap"], "plain", 1)
    out, _ = _sync(cluster, "--topic", "plain")
    assert out.returncode == 1 and "'plain' is not a table topic" in out.stderr
    out = automqctl(
        "topic",
        "alter",
        "plain",
        "-c",
        "automq.table.topic.schema.type=avro",
        cluster_dir=cluster["dir"],
    )
    assert out.returncode == 1 and "automq.table.topic.schema.type" in out.stderr
    assert "raw, json" in out.stderr
    listed = automqctl("table", "list", "--format", "json", cluster_dir=cluster["dir"])
    assert "plain" not in {t["topic"] for t in json.loads(listed.stdout)}
    # disable: the topic is no longer synced nor listed
    create_topic(cluster["bootstrap"], "gone", 1, configs={"automq.table.topic.enable": "true"})
    out = automqctl("table", "disable", "gone", cluster_dir=cluster["dir"])
    assert out.returncode == 0, out.stderr
    listed = automqctl("table", "list", "--format", "json", cluster_dir=cluster["dir"])
    assert "gone" not in {t["topic"] for t in json.loads(listed.stdout)}
    out, _ = _sync(cluster, "--topic", "gone")
    assert out.returncode == 1 and "'gone' is not a table topic" in out.stderr
    # refused before any job ran: no run recorded
    assert table_jobs.last_runs(cluster["dir"], limit=1000) == runs_before
