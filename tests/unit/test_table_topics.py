"""Table topics without Spark: the topic configs, the table spec, JSON columns, rows and
Parquet files, and the PyIceberg catalog (a SQLite catalog with a file:// warehouse):
offsets in snapshot summaries, schema evolution, a raced commit refused whole."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")
from pyiceberg.exceptions import CommitFailedException  # noqa: E402

from controlplane import topic_configs as tc  # noqa: E402
from controlplane.errors import ControllerError  # noqa: E402
from controlplane.image import (  # noqa: E402
    MetadataImage,
    ObjectRange,
    PartitionState,
    RangeState,
    StreamMetaState,
    TopicState,
)
from controlplane.records import PartitionKind  # noqa: E402
from dataplane.tables import catalog as cat  # noqa: E402
from dataplane.tables import rows  # noqa: E402
from dataplane.tables import spec as ts  # noqa: E402
from spark_jobs import table_sync  # noqa: E402

JSON_CONFIGS = {tc.TABLE_TOPIC_ENABLE: "true", tc.TABLE_TOPIC_SCHEMA_TYPE: "json"}


def _batch(records: list[tuple[int, int, object]], day: int = 1) -> pa.RecordBatch:
    """Kafka-source rows as Spark hands them (`rows.SOURCE_SELECT`): (partition, offset,
    value) with value a dict (JSON), bytes or None."""
    stamp_us = int(dt.datetime(2026, 1, day, 12, tzinfo=dt.UTC).timestamp() * 1_000_000)
    out = []
    for partition, offset, value in records:
        if isinstance(value, dict):
            value = json.dumps(value).encode()
        out.append((f"k{offset}".encode(), value, partition, offset, stamp_us, 0, [("h", b"v")]))
    (batch,) = rows.source_batches(out)
    return batch


@pytest.fixture
def catalog(tmp_path):
    config = cat.CatalogConfig(uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/w")
    return config, cat.open_catalog(config, {})


def _write(config, table, spec, columns, batch) -> list[str]:
    filesystem, fs_dir = cat.filesystem(table.location() + "/data", config, {})
    table_rows = rows.table_rows(spec, columns, batch)
    return [
        f["path"]
        for value, part in rows.split_by_partition(spec, table_rows)
        for f in rows.write_parquet(
            filesystem, fs_dir, table.location() + "/data", str(value), part
        )
    ]


# ------------------------------------------------------------------ configs and spec


def test_table_topic_configs_validated_with_clear_errors():
    ok = tc.validate_new_topic_configs(
        {**JSON_CONFIGS, tc.TABLE_TOPIC_PARTITION_BY: "[hour(timestamp)]"}
    )
    assert ok[tc.TABLE_TOPIC_SCHEMA_TYPE] == "json"
    for key, bad, says in (
        (tc.TABLE_TOPIC_SCHEMA_TYPE, "avro", "raw, json"),
        (tc.TABLE_TOPIC_PARTITION_BY, "day(price)", "[hour|day|month|year(timestamp)]"),
        (tc.TABLE_TOPIC_NAMESPACE, "a.b", "letters, digits"),
        (tc.TABLE_TOPIC_ENABLE, "yes", "true or false"),
    ):
        with pytest.raises(ControllerError) as err:
            tc.validate_new_topic_configs({key: bad})
        assert key in str(err.value) and says in str(err.value)
    # an alter that enables a table on an existing topic is accepted
    assert tc.apply_ops({}, [(tc.TABLE_TOPIC_ENABLE, tc.OP_SET, "true")], False) == {
        tc.TABLE_TOPIC_ENABLE: "true"
    }


def test_spec_names_partitioning_and_columns():
    spec = ts.spec_of("orders.eu", "tid", {**JSON_CONFIGS}, [1, 0])
    assert spec.identifier == ("default", "orders_eu") and spec.partitions == (0, 1)
    assert spec.partition_transform == "day"
    assert [c for c, _ in spec.fixed_columns()][:2] == ["_kafka_key", "_kafka_partition"]
    raw = ts.spec_of("t", "tid", {tc.TABLE_TOPIC_PARTITION_BY: "[]"}, [0])
    assert raw.schema_type == "raw" and raw.partition_transform is None
    assert [c for c, _ in raw.fixed_columns()][:2] == ["key", "value"]
    assert ts.partition_transform("month(timestamp)") == "month"
    assert ts.decode_offsets(ts.encode_offsets({1: 5, 0: 3})) == {0: 3, 1: 5}
    with pytest.raises(ts.TableTopicError):
        ts.decode_offsets("not json")


def test_json_columns_infer_merge_and_refuse():
    spec = ts.spec_of("t", "tid", JSON_CONFIGS, [0])
    batch = _batch([(0, 0, {"a": 1, "n": {"x": 1}}), (0, 1, {"a": 2.5, "b": True}), (0, 2, None)])
    fields = rows.infer_json_fields(spec, [batch])
    assert fields == {"a": "double", "n": "string", "b": "boolean"}
    columns, new = ts.plan_columns(spec, {}, fields)
    table = rows.table_rows(spec, columns, batch)
    assert table.column("a").to_pylist() == [1.0, 2.5, None]  # the tombstone keeps its row
    assert table.column("n").to_pylist() == ['{"x":1}', None, None]
    # a column in the table keeps its type; a value it cannot take names its offset
    columns, new = ts.plan_columns(spec, {"a": "long"}, {"a": "string"})
    assert columns["a"] == "long" and new == {}
    with pytest.raises(ts.InvalidRecordError, match="offset 7 of t-0: field 'a' is string"):
        rows.table_rows(spec, columns, _batch([(0, 7, {"a": "x"})]))
    with pytest.raises(ts.InvalidRecordError, match="offset 3 of t-0: value is not JSON"):
        rows.infer_json_fields(spec, [_batch([(0, 3, b"\xffnot json")])])
    with pytest.raises(ts.InvalidRecordError, match="offset 4 of t-0: value is JSON list"):
        rows.infer_json_fields(spec, [_batch([(0, 4, b"[1]")])])
    with pytest.raises(ts.TableTopicError, match="clash"):
        ts.plan_columns(spec, {}, {"_kafka_offset": "long"})


def test_rows_split_by_day_and_hour():
    spec = ts.spec_of("t", "tid", {tc.TABLE_TOPIC_PARTITION_BY: "[day(timestamp)]"}, [0])
    batch = pa.concat_batches([_batch([(0, 0, b"a")], day=1), _batch([(0, 1, b"b")], day=2)])
    table = rows.table_rows(spec, dict(spec.fixed_columns()), batch)
    split = rows.split_by_partition(spec, table)
    assert [v for v, _ in split] == [20454, 20455]  # days since 1970
    hourly = ts.spec_of("t", "tid", {tc.TABLE_TOPIC_PARTITION_BY: "[hour(timestamp)]"}, [0])
    assert rows.partition_keys(hourly, table).to_pylist() == [20454 * 24 + 12, 20455 * 24 + 12]


# ------------------------------------------------------------------ catalog


def test_commit_records_offsets_and_evolves_schema(catalog):
    config, c = catalog
    spec = ts.spec_of("orders", "tid", JSON_CONFIGS, [0, 1])
    first = _batch([(0, 0, {"a": 1}), (1, 0, {"a": 2})])
    columns, new = ts.plan_columns(spec, {}, rows.infer_json_fields(spec, [first]))
    table = cat.create_table(c, spec, dict(spec.fixed_columns()))
    assert cat.held_offsets(table) == ({}, None)
    cat.commit_files(
        table, spec, new, _write(config, table, spec, columns, first), {0: 1, 1: 1}, "r1"
    )
    assert cat.held_offsets(table) == ({0: 1, 1: 1}, "tid")
    second = _batch([(0, 1, {"a": 3, "b": "new"})])
    columns, new = ts.plan_columns(
        spec, cat.column_types(table), rows.infer_json_fields(spec, [second])
    )
    assert new == {"b": "string"}
    cat.commit_files(
        table, spec, new, _write(config, table, spec, columns, second), {0: 2, 1: 1}, "r2"
    )
    got = c.load_table(spec.identifier).scan().to_arrow().sort_by("_kafka_offset").to_pylist()
    assert sorted((r["_kafka_partition"], r["_kafka_offset"], r["a"], r["b"]) for r in got) == [
        (0, 0, 1, None),
        (0, 1, 3, "new"),
        (1, 0, 2, None),
    ]
    # offsets that moved past records the table does not keep still commit (no files)
    cat.commit_files(table, spec, {}, [], {0: 5, 1: 1}, "r3")
    assert cat.held_offsets(c.load_table(spec.identifier))[0] == {0: 5, 1: 1}
    assert len(c.load_table(spec.identifier).scan().to_arrow()) == 3


def test_a_raced_commit_changes_nothing(catalog):
    config, c = catalog
    spec = ts.spec_of("orders", "tid", {tc.TABLE_TOPIC_ENABLE: "true"}, [0])
    cat.create_table(c, spec, dict(spec.fixed_columns()))
    mine, theirs = c.load_table(spec.identifier), c.load_table(spec.identifier)
    batch = _batch([(0, 0, b"x")])
    columns = dict(spec.fixed_columns())
    cat.commit_files(theirs, spec, {}, _write(config, theirs, spec, columns, batch), {0: 1}, "a")
    with pytest.raises(CommitFailedException):
        cat.commit_files(mine, spec, {}, _write(config, mine, spec, columns, batch), {0: 1}, "b")
    table = c.load_table(spec.identifier)
    assert len(table.scan().to_arrow()) == 1 and cat.held_offsets(table)[0] == {0: 1}


# ------------------------------------------------------------------ the job's driver (pure)


def _image(configs: dict[str, str], start: int = 0, end: int = 10) -> MetadataImage:
    image = MetadataImage()
    image.topics["tid"] = TopicState(
        topic_id="tid",
        name="orders",
        configs=configs,
        partitions={
            0: PartitionState(
                partition=0,
                kind=PartitionKind.LEADER,
                leader_node_id=1,
                leader_epoch=0,
                stream_id=7,
            )
        },
    )
    image.topic_ids_by_name["orders"] = "tid"
    image.streams[7] = StreamMetaState(
        stream_id=7,
        start_offset=start,
        ranges=[RangeState(range_index=0, epoch=0, start_offset=0, end_offset=end, node_id=1)],
        object_ranges=[ObjectRange(object_id=1, start_offset=0, end_offset=end, kind="so")],
    )
    return image


def test_offset_ranges_from_held_offsets_retention_and_limit():
    image = _image({tc.TABLE_TOPIC_ENABLE: "true"}, start=4, end=10)
    spec = table_sync.select_specs(image, ["orders"])[0]
    assert table_sync.offset_ranges(image, spec, {}, 100) == ({0: 4}, {0: 10}, 4)
    assert table_sync.offset_ranges(image, spec, {0: 6}, 100) == ({0: 6}, {0: 10}, 0)
    assert table_sync.offset_ranges(image, spec, {0: 6}, 3) == ({0: 6}, {0: 9}, 0)
    with pytest.raises(ts.TableTopicError, match="past the partition's committed end 10"):
        table_sync.offset_ranges(image, spec, {0: 11}, 100)


def test_select_specs_names_a_missing_or_plain_topic():
    image = _image({})
    with pytest.raises(ts.TableTopicError, match="topic 'nope' does not exist"):
        table_sync.select_specs(image, ["nope"])
    with pytest.raises(ts.TableTopicError, match="'orders' is not a table topic"):
        table_sync.select_specs(image, ["orders"])
    assert table_sync.select_specs(image, []) == []


# ------------------------------------------------------------------ the CLI's catalog config


def test_table_catalog_defaults_to_sqlite_in_the_cluster_dir_and_takes_a_rest_uri(tmp_path):
    from typer.testing import CliRunner

    from cli.local_cluster import LocalCluster
    from cli.main import app

    cluster = LocalCluster(tmp_path / "c")
    cluster.create(1, 1, ["a"], None, None, 6000)

    def catalog(*args: str):
        out = CliRunner().invoke(
            app, ["table", "catalog", "--dir", str(cluster.dir), "--format", "json", *args]
        )
        return out.exit_code, (json.loads(out.stdout) if out.exit_code == 0 else out.output)

    code, shown = catalog()
    assert code == 0 and shown["kind"] == "sql"
    assert shown["uri"] == f"sqlite:///{(cluster.dir / 'tables' / 'catalog.db').resolve()}"
    assert shown["warehouse"].startswith("s3://") and shown["warehouse"].endswith("/iceberg")
    assert "secret" not in json.dumps(shown).lower()
    code, shown = catalog("--uri", "https://rest.example/catalog", "--warehouse", "s3://lake/w")
    assert code == 0 and shown["kind"] == "rest" and shown["warehouse"] == "s3://lake/w"
    assert catalog()[1]["uri"] == "https://rest.example/catalog"  # kept
    code, said = catalog("--uri", "ftp://nope")
    assert code == 1 and "invalid --uri" in said
    assert catalog()[1]["uri"] == "https://rest.example/catalog"  # a bad one changes nothing
    assert catalog("--reset")[1]["kind"] == "sql"
    # the embedded store's own REST catalog (SeaweedFS S3 Tables), SigV4-signed
    code, shown = catalog("--embedded-rest")
    store = cluster.load().embedded_s3
    assert code == 0 and shown["kind"] == "rest" and shown["rest_signing_name"] == "s3tables"
    assert shown["uri"] == f"http://127.0.0.1:{store['ports']['iceberg']}"
    assert shown["warehouse"] == f"s3://{store['table_bucket']}"
    code, said = catalog("--embedded-rest", "--reset")
    assert code == 1 and "--embedded-rest" in said
    code, said = catalog("--rest-signing-name", "Bad Name!")
    assert code == 1 and "invalid catalog" in said


def test_a_signed_rest_catalog_gets_sigv4_properties_with_the_warehouse_keys():
    creds = {"aws_access_key_id": "AK", "aws_secret_access_key": "SK"}
    rest = cat.CatalogConfig(
        uri="http://127.0.0.1:8181", warehouse="s3://t", rest_signing_name="s3tables"
    )
    props = cat.catalog_properties(rest, creds)
    assert props["rest.sigv4-enabled"] == "true" and props["rest.signing-name"] == "s3tables"
    assert (props["client.access-key-id"], props["client.secret-access-key"]) == ("AK", "SK")
    unsigned = cat.catalog_properties(rest.model_copy(update={"rest_signing_name": None}), creds)
    assert "rest.sigv4-enabled" not in unsigned and "client.access-key-id" not in unsigned
    sql = cat.CatalogConfig(uri="sqlite:///x.db", warehouse="s3://t", rest_signing_name="glue")
    assert "rest.sigv4-enabled" not in cat.catalog_properties(sql, creds)


def test_ends_stop_at_the_last_stable_offset(monkeypatch):
    """An open transaction: the run's recorded ends are what the source reads (it stops a
    read_committed read at the LSO), never past it."""
    image = _image({tc.TABLE_TOPIC_ENABLE: "true"}, start=0, end=10)
    spec = table_sync.select_specs(image, ["orders"])[0]
    monkeypatch.setattr(table_sync.stable, "bootstrap_from_image", lambda img: "127.0.0.1:1")
    for lso, want in ((6, 6), (12, 10), (-1, 10), (2, 4)):
        monkeypatch.setattr(
            table_sync.stable, "last_stable_offsets", lambda cfg, tps, lso=lso: {tps[0]: lso}
        )
        assert table_sync.cap_at_stable(image, spec, {0: 4}, {0: 10}) == {0: want}


def test_errors_tolerance_all_leaves_records_that_do_not_fit_out_and_counts_them():
    configs = {tc.TABLE_TOPIC_ENABLE: "true", tc.TABLE_TOPIC_SCHEMA_TYPE: "json"}
    strict = ts.spec_of("orders", "tid", configs, [0])
    tolerant = ts.spec_of("orders", "tid", {**configs, tc.TABLE_TOPIC_ERRORS_TOLERANCE: "all"}, [0])
    assert (strict.errors_tolerance, tolerant.errors_tolerance) == ("none", "all")
    with pytest.raises(ControllerError):
        tc.validate_value(tc.TABLE_TOPIC_ERRORS_TOLERANCE, "some")
    values = [b'{"id": 1}', b"not json {", b'{"id": "text"}', b'{"id": 4}', b"[1]"]
    batch = _batch([(0, i, v) for i, v in enumerate(values)])
    with pytest.raises(ts.InvalidRecordError, match="offset 1 of orders-0"):
        rows.infer_json_fields(strict, [batch])
    assert rows.infer_json_fields(tolerant, [batch]) == {"id": "string"}  # long + string
    columns, _ = ts.plan_columns(tolerant, {}, {"id": "long"})  # a table whose id is long
    with pytest.raises(ts.InvalidRecordError, match="offset 1 of orders-0"):
        rows.convert_batch(strict, columns, batch)
    out = rows.convert_batch(tolerant, columns, batch)
    assert out.rows.column("id").to_pylist() == [1, 4]
    assert out.rows.column("_kafka_offset").to_pylist() == [0, 3]
    assert out.skipped == 3 and "offset 1 of orders-0: value is not JSON" in out.first_skipped


def test_the_sync_reaches_a_secured_cluster_by_the_settings_in_its_environment(monkeypatch):
    """A cluster without a PLAINTEXT listener (SASL/TLS): the CLI hands the job the admin's
    librdkafka settings in its environment (never in job.json); without them the job uses
    the brokers' PLAINTEXT listeners from the metadata, as before."""
    image = _image({tc.TABLE_TOPIC_ENABLE: "true"})
    monkeypatch.delenv(table_sync.KAFKA_CLIENT_ENV, raising=False)
    with pytest.raises(Exception, match="PLAINTEXT"):  # no broker registered here
        table_sync.kafka_client_config(image)
    secured = {"bootstrap.servers": "127.0.0.1:9094", "security.protocol": "SASL_PLAINTEXT"}
    monkeypatch.setenv(table_sync.KAFKA_CLIENT_ENV, json.dumps(secured))
    assert table_sync.kafka_client_config(image) == secured
    monkeypatch.setenv(table_sync.KAFKA_CLIENT_ENV, "{not json")
    with pytest.raises(ts.TableTopicError, match="not JSON"):
        table_sync.kafka_client_config(image)
