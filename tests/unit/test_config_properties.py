"""server.properties (issue #30 item 9): Java .properties syntax, the value forms (sizes,
`N@` parts, `--override`), and every mapping of AutoMQ's and Kafka's keys onto the broker's
settings, the warnings of the keys not used and the errors naming a bad key."""

from __future__ import annotations

import os

import pytest

from dataplane.config_mapping import (
    BROKER_KEYS,
    MAPPING_TABLE,
    map_properties,
)
from dataplane.config_properties import (
    MAX_PROPERTIES_BYTES,
    PropertiesError,
    file_is_private,
    parse_id_parts,
    parse_overrides,
    parse_properties,
    parse_size,
    read_properties_file,
)

GiB = 1 << 30
MAIN = "0@s3://main?region=us-east-1&endpoint=http://127.0.0.1:8333"
BOTH = MAIN + ",1@s3://failover?region=eu-west-1&endpoint=http://127.0.0.1:9333"


# ------------------------------------------------------------------ syntax


def test_java_properties_syntax():
    text = (
        "# a comment\n"
        "   ! another comment\n"
        "\n"
        "a=1\n"
        "b = two words \n"
        "c:3\n"
        "d 4\n"
        "e\\ f=5\n"  # an escaped blank belongs to the key
        "g=x\\\n"  # a continuation; the next line's leading blanks go
        "     y\\\\\n"  # an even number of backslashes: no continuation
        "h=\\u0041\\t\\=\n"
        "i=\n"
        "j\n"
        "k=a=b:c\n"
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "two words ",
        "c": "3",
        "d": "4",
        "e f": "5",
        "g": "xy\\",
        "h": "A\t=",
        "i": "",
        "j": "",
        "k": "a=b:c",
    }


def test_a_key_given_twice_must_agree_and_overrides_replace():
    assert parse_properties("a=1\na=1\n") == {"a": "1"}
    with pytest.raises(PropertiesError, match=r"^a: given twice .*line 2"):
        parse_properties("a=1\na=2\n")
    assert parse_overrides(["node.id=0", "x=a=b", "node.id=3"]) == {"node.id": "3", "x": "a=b"}
    for bad in ("novalue", "=1"):
        with pytest.raises(PropertiesError, match="want key=value"):
            parse_overrides([bad])


def test_malformed_escape_and_bounds():
    with pytest.raises(PropertiesError, match="line 2: malformed"):
        parse_properties("a=1\nb=\\u12\n")
    with pytest.raises(PropertiesError, match="larger than"):
        parse_properties("a=" + "x" * MAX_PROPERTIES_BYTES)
    with pytest.raises(PropertiesError, match="k: longer than"):
        parse_properties("k=" + "x" * 70_000)


def test_read_properties_file_bounded_and_private(tmp_path):
    path = tmp_path / "server.properties"
    path.write_bytes(b"a=caf\xe9\n")  # Latin-1, Java's own encoding of the format
    assert read_properties_file(path) == {"a": "café"}
    path.write_bytes(b"x" * (MAX_PROPERTIES_BYTES + 1))
    with pytest.raises(PropertiesError, match="larger than"):
        read_properties_file(path)
    with pytest.raises(PropertiesError, match="cannot read"):
        read_properties_file(tmp_path / "missing")
    os.chmod(path, 0o644)
    assert not file_is_private(path)
    os.chmod(path, 0o600)
    assert file_is_private(path)


@pytest.mark.parametrize(
    "text, size",
    [
        ("6442450944", 6 * GiB),
        ("14G", 14 * GiB),
        ("2GB", 2 * GiB),
        ("512MiB", 512 << 20),
        ("64k", 64 << 10),
        ("1.5g", 3 * GiB // 2),
        (" 10 MB ", 10 << 20),
    ],
)
def test_sizes(text, size):
    assert parse_size("s3.block.cache.size", text) == size


@pytest.mark.parametrize("text", ["", "-1", "2XB", "G", "1e9", "2 PB"])
def test_bad_sizes_name_the_key(text):
    with pytest.raises(PropertiesError, match=r"^s3\.block\.cache\.size: "):
        parse_size("s3.block.cache.size", text)


def test_id_parts():
    assert parse_id_parts("k", "main-ak,1@xxx") == {0: "main-ak", 1: "xxx"}
    assert parse_id_parts("k", "1@b, 0@a") == {0: "a", 1: "b"}
    for bad, why in (
        ("a,,1@b", "empty part"),
        ("a,0@b", "bucket 0 is given twice"),
        ("1@", "empty"),
    ):
        with pytest.raises(PropertiesError, match=f"^k: .*{why}"):
            parse_id_parts("k", bad)


# ------------------------------------------------------------------ mapping


@pytest.mark.parametrize("key", sorted(BROKER_KEYS))
def test_every_broker_key_lands_in_its_setting(key):
    path, kind = BROKER_KEYS[key]
    value = {"int": "60000", "size": "64MiB", "bool": "false"}[kind]
    if key == "s3.object.block.size":
        value = "1MiB"
    if key in ("group.max.size", "num.partitions"):
        value = "50"
    if key == "group.share.delivery.count.limit":  # Kafka's range: 2-10
        value = "5"
    got = map_properties({key: value}, "cluster").settings
    for part in path:
        got = got[part]
    assert (
        got
        == {"60000": 60000, "64MiB": 64 << 20, "1MiB": 1 << 20, "50": 50, "5": 5, "false": False}[
            value
        ]
    )


def test_the_seed_002_start_command():
    """AutoMQ's catch-up benchmark command (seed 002), as --override arguments."""
    props = parse_overrides(
        [
            "node.id=0",
            "cluster.id=M_automq-catchup_____w",
            "controller.quorum.voters=0@10.0.0.1:9093",
            "advertised.listener=10.0.0.1:9092",
            "s3.data.buckets=0@s3://xxx_bucket?region=oss-cn-hangzhou"
            "&endpoint=https://oss-cn-hangzhou-internal.aliyuncs.com",
            "s3.wal.path=0@file:///dev/nvme1n1?capacity=21474836480&iodepth=32&iops=4000",
            "s3.telemetry.metrics.exporter.uri=otlp://?endpoint=http://xxxx&protocol=grpc",
            "s3.stream.allocator.policy=POOLED_DIRECT",
            "s3.wal.cache.size=6442450944",
            "s3.wal.upload.threshold=1572864000",
            "s3.block.cache.size=12884901888",
            "s3.network.baseline.bandwidth=2147483648",
            "s3.stream.object.split.size=1048576",
        ]
    )
    env = {"KAFKA_S3_ACCESS_KEY": "xxxx", "KAFKA_S3_SECRET_KEY": "yyyy"}
    m = map_properties(props, "node", env=env)
    assert m.settings["node_id"] == 0
    assert m.settings["wal"] == {"capacity_bytes": 20 * GiB, "uri": "file:///dev/nvme1n1"}
    assert m.settings["storage"] == {
        "log_cache_uploaded_bytes": 6 * GiB,
        "upload_threshold_bytes": 1572864000,
        "block_cache_bytes": 12 * GiB,
        "stream_split_bytes": 1 << 20,
    }
    assert m.settings["object_store"] == {
        "read_bandwidth_bytes_per_s": 2 * GiB,
        "write_bandwidth_bytes_per_s": 2 * GiB,
    }
    assert m.bucket_uris.startswith("0@s3://xxx_bucket?region=oss-cn-hangzhou&endpoint=https")
    assert m.bucket_credentials == {0: ("xxxx", "yyyy")}
    assert "accessKey=xxxx&secretKey=yyyy" in m.bucket_uris_with_credentials()
    assert "xxxx" not in m.bucket_uris
    ignored = [w.split(":", 1)[0] for w in m.warnings]
    assert sorted(ignored) == sorted(
        [
            "cluster.id",
            "controller.quorum.voters",
            "advertised.listener",
            "s3.telemetry.metrics.exporter.uri",
            "s3.stream.allocator.policy",
            "s3.wal.path",
        ]
    ), m.warnings
    assert "s3.wal.path: ignored in part (iodepth; iops)" in m.warnings
    assert all("\n" not in w for w in m.warnings)


def test_the_seed_003_failover_keys():
    props = {
        "s3.endpoint": "http://main-endpoint:9000,1@http://xxx-endpoint:9000",
        "s3.region": "main-region,1@cn-xxx",
        "s3.bucket": "main-bucket,1@failover-xxx-bucket",
        "s3.path.style": "false",
        "KAFKA_S3_ACCESS_KEY": "main-ak,1@xxx",
        "KAFKA_S3_SECRET_KEY": "main-sk,1@yyy",
    }
    m = map_properties(props, "cluster")
    assert m.bucket_uris == (
        "0@s3://main-bucket?region=main-region&endpoint=http://main-endpoint:9000"
        "&pathStyle=false,1@s3://failover-xxx-bucket?region=cn-xxx"
        "&endpoint=http://xxx-endpoint:9000&pathStyle=false"
    )
    assert m.bucket_credentials == {0: ("main-ak", "main-sk"), 1: ("xxx", "yyy")}
    assert m.warnings == ()
    # a bare endpoint is https (AutoMQ's older keys); bucket 1 shares bucket 0's store and
    # region when it names none
    m = map_properties({"s3.endpoint": "s3.amazonaws.com", "s3.bucket": "a,1@b"}, "cluster")
    assert m.bucket_uris.count("endpoint=https://s3.amazonaws.com") == 2


def test_credentials_from_the_environment_and_the_uris():
    env = {"KAFKA_S3_ACCESS_KEY": "ak,1@ak1", "KAFKA_S3_SECRET_KEY": "sk,1@sk1"}
    m = map_properties({"s3.data.buckets": BOTH}, "cluster", env=env)
    assert m.bucket_credentials == {0: ("ak", "sk"), 1: ("ak1", "sk1")}
    inline = MAIN + "&accessKey=a&secretKey=s"
    m = map_properties({"s3.data.buckets": inline}, "cluster")
    assert m.bucket_credentials == {0: ("a", "s")} and "accessKey" not in m.bucket_uris
    # the environment's keys without buckets are someone else's: no error, no credentials
    assert map_properties({}, "cluster", env=env).bucket_credentials == {}


def test_wal_forms():
    m = map_properties({"s3.wal.path": "/tmp/kraft/s3wal"}, "node")  # AutoMQ's older bare path
    assert m.settings["wal"] == {"uri": "file:///tmp/kraft/s3wal"}
    m = map_properties({"s3.data.buckets": BOTH, "s3.wal.path": "0@s3://main?region=x"}, "cluster")
    assert m.wal_in_bucket and "wal" not in m.settings
    m = map_properties({"s3.wal.path": "0@file:///d/wal?capacity=1GB"}, "cluster")
    assert m.settings["wal"] == {"capacity_bytes": GiB}
    assert m.warnings == (
        "s3.wal.path: ignored in part (the path: cluster up keeps each broker's WAL in "
        "DIR/broker-N)",
    )
    m = map_properties(
        {"s3.wal.capacity": "1G", "s3.wal.path": "0@file:///w?capacity=1073741824"}, "node"
    )
    assert m.settings["wal"]["capacity_bytes"] == GiB


def test_node_identity_and_listeners():
    props = {
        "process.roles": "broker",
        "node.id": "3",
        "broker.rack": "use1-az1",
        "log.dirs": "/var/lib/automq/b3",
        "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093,EXTERNAL://10.0.0.3:9094",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "advertised.listeners": "PLAINTEXT://b3.internal:9092,EXTERNAL://b3.example.com:9094",
    }
    m = map_properties(props, "node", default_host="10.0.0.3")
    s = m.settings
    assert (s["node_id"], s["az"], s["data_dir"]) == (3, "use1-az1", "/var/lib/automq/b3")
    assert [(e["name"], e["host"], e["port"]) for e in s["listeners"]] == [
        ("PLAINTEXT", "10.0.0.3", 9092),
        ("EXTERNAL", "10.0.0.3", 9094),
    ]
    assert [e["host"] for e in s["advertised_listeners"]] == ["b3.internal", "b3.example.com"]
    assert (s["host"], s["kafka_port"]) == ("10.0.0.3", 9092)
    assert m.warnings == ()
    # cluster up places its nodes itself: every one of these keys is named, once
    m = map_properties(props, "cluster")
    assert m.settings == {} and len(m.warnings) == len(props)


def test_topic_defaults_for_a_cluster_are_warned_for_a_node():
    props = {
        "log.retention.hours": "24",
        "message.max.bytes": "2097152",
        "log.cleanup.policy": "delete",  # the default: no dynamic config needed
        "log.segment.bytes": "1073741824",
    }
    m = map_properties(props, "cluster")
    assert m.topic_defaults == {"log.retention.ms": "86400000", "message.max.bytes": "2097152"}
    assert m.warnings == ()
    m = map_properties(props, "node")
    assert m.topic_defaults == {} and len(m.warnings) == 4
    assert "kafka-configs.sh --entity-type brokers --entity-default" in m.warnings[0]
    # the finer key wins, as in Kafka; the coarser one is named
    m = map_properties({"log.retention.ms": "1000", "log.retention.hours": "1"}, "cluster")
    assert m.topic_defaults == {"log.retention.ms": "1000"}
    assert m.warnings == ("log.retention.hours: ignored (log.retention.ms is given too, and wins)",)
    m = map_properties({"log.retention.minutes": "2", "log.retention.hours": "1"}, "cluster")
    assert m.topic_defaults == {"log.retention.ms": "120000"}


def test_fixed_and_ignored_keys():
    assert map_properties({"delete.topic.enable": "true"}, "cluster").warnings == ()
    assert map_properties({"delete.topic.enable": "false"}, "cluster").warnings == (
        "delete.topic.enable: ignored (topics can always be deleted here)",
    )
    # Kafka's topic-creation keys are the broker's own settings
    m = map_properties({"num.partitions": "3", "auto.create.topics.enable": "FALSE"}, "cluster")
    assert m.warnings == ()
    assert m.settings == {"num_partitions": 3, "auto_create_topics_enable": False}
    m = map_properties(
        {
            "offsets.topic.replication.factor": "1",
            "num.io.threads": "8",
            "s3.ops.buckets": "1@s3://ops?region=x",
            "autobalancer.controller.enable": "true",
        },
        "cluster",
    )
    assert [w.split(" (")[0] for w in m.warnings] == [
        "offsets.topic.replication.factor: ignored",
        "num.io.threads: ignored",
        "s3.ops.buckets: ignored",
        "autobalancer.controller.enable: ignored",
    ]
    assert map_properties(
        {"offsets.topic.num.partitions": "20"}, "cluster"
    ).controller_settings == {"coordinator_slots": 20}


@pytest.mark.parametrize(
    "props, target, message",
    [
        ({"s3.block.cache.size": "lots"}, "cluster", "s3.block.cache.size: 'lots' is not a size"),
        ({"s3.block.cache.size": "10"}, "cluster", "s3.block.cache.size: Input should be greater"),
        ({"s3.data.buckets": "s3://x"}, "cluster", "s3.data.buckets: bucket URI entry 1"),
        ({"s3.data.buckets": MAIN, "s3.bucket": "b"}, "cluster", "s3.bucket: give the buckets"),
        ({"s3.endpoint": "http://e"}, "cluster", "s3.endpoint: needs s3.bucket"),
        ({"s3.bucket": "a", "s3.region": "r,1@x"}, "cluster", "s3.region: bucket 1 has no name"),
        ({"s3.bucket": "a b"}, "cluster", "s3.bucket: bucket 0: Value error, invalid bucket"),
        ({"s3.bucket": "a", "s3.path.style": "maybe"}, "cluster", "s3.path.style: 'maybe'"),
        (
            {"s3.data.buckets": BOTH, "KAFKA_S3_ACCESS_KEY": "a,1@b", "KAFKA_S3_SECRET_KEY": "s"},
            "cluster",
            "KAFKA_S3_SECRET_KEY: no value for bucket 1",
        ),
        (
            {
                "s3.data.buckets": MAIN,
                "KAFKA_S3_ACCESS_KEY": "a,2@b",
                "KAFKA_S3_SECRET_KEY": "s,2@t",
            },
            "cluster",
            "KAFKA_S3_ACCESS_KEY: bucket 2 is not one of the buckets",
        ),
        (
            {
                "s3.data.buckets": MAIN + "&accessKey=x&secretKey=y",
                "KAFKA_S3_ACCESS_KEY": "a",
                "KAFKA_S3_SECRET_KEY": "s",
            },
            "cluster",
            "KAFKA_S3_ACCESS_KEY: bucket 0's URI holds other credentials",
        ),
        ({"KAFKA_S3_ACCESS_KEY": "a"}, "cluster", "KAFKA_S3_ACCESS_KEY: no buckets given"),
        ({"s3.ops.buckets": "nonsense"}, "cluster", "s3.ops.buckets: bucket URI entry 1"),
        ({"s3.wal.path": "0@s3://other"}, "cluster", "s3.wal.path: an s3 WAL lives in the main"),
        ({"s3.wal.path": "0@nfs://x/y"}, "node", "s3.wal.path: want 0@file:///abs/path"),
        ({"s3.wal.path": "0@file:///w?capacity=1X"}, "node", "s3.wal.path capacity: '1X'"),
        (
            {"s3.wal.capacity": "2G", "s3.wal.path": "0@file:///w?capacity=1G"},
            "node",
            "s3.wal.capacity: differs from s3.wal.path's capacity",
        ),
        ({"s3.wal.capacity": "1M"}, "cluster", "s3.wal.capacity: Input should be greater"),
        ({"node.id": "x"}, "node", "node.id: 'x' is not an integer"),
        ({"node.id": "1", "broker.id": "2"}, "node", "broker.id: differs from node.id"),
        ({"log.dirs": "/a,/b"}, "node", "log.dirs: one directory here"),
        ({"listeners": "PLAINTEXT://:x"}, "node", "listeners: bad listener"),
        ({"listeners": "FOO://:9092"}, "node", "listeners: "),
        ({"advertised.listeners": "PLAINTEXT://h:1"}, "node", "advertised.listeners: needs"),
        (
            {"listeners": "PLAINTEXT://:9092", "inter.broker.listener.name": "INTERNAL"},
            "node",
            "inter.broker.listener.name: INTERNAL is not one of the listeners",
        ),
        ({"process.roles": "controller"}, "node", "process.roles: node run --properties runs"),
        ({"log.retention.ms": "-5"}, "cluster", "log.retention.ms: "),
        ({"log.retention.hours": "x"}, "cluster", "log.retention.hours: 'x' is not an integer"),
        ({"log.cleanup.policy": "shred"}, "cluster", "log.cleanup.policy: "),
        ({"message.max.bytes": "big"}, "node", "message.max.bytes: "),
        (
            {"num.partitions": "0"},
            "cluster",
            "num.partitions: Input should be greater than or equal to 1",
        ),
        ({"auto.create.topics.enable": "yes"}, "cluster", "auto.create.topics.enable: 'yes'"),
        ({"offsets.topic.num.partitions": "5000"}, "cluster", "offsets.topic.num.partitions: 5000"),
        ({"default.replication.factor": "three"}, "cluster", "default.replication.factor: 'three'"),
        (
            {"group.min.session.timeout.ms": "9000", "group.max.session.timeout.ms": "8000"},
            "cluster",
            "groups: Value error, need group_min_session_timeout_ms",
        ),
    ],
)
def test_malformed_and_contradictory_values_name_the_key(props, target, message):
    with pytest.raises(PropertiesError) as exc:
        map_properties(props, target)
    assert str(exc.value).startswith(message), str(exc.value)
    assert "\n" not in str(exc.value)


def test_the_environment_and_the_file_must_agree_on_credentials():
    env = {"KAFKA_S3_ACCESS_KEY": "other"}
    props = {"s3.data.buckets": MAIN, "KAFKA_S3_ACCESS_KEY": "a", "KAFKA_S3_SECRET_KEY": "s"}
    with pytest.raises(PropertiesError, match="^KAFKA_S3_ACCESS_KEY: the file and the environment"):
        map_properties(props, "cluster", env=env)
    assert map_properties(props, "cluster", env={"KAFKA_S3_ACCESS_KEY": "a"}).bucket_credentials


def test_the_mapping_table_names_every_key_the_code_maps():
    table = " ".join(row.key for row in MAPPING_TABLE)
    for key in BROKER_KEYS:
        assert key in table
    for key in (
        "s3.data.buckets",
        "s3.wal.path",
        "s3.network.baseline.bandwidth",
        "num.partitions",
    ):
        assert key in table


def test_an_s3_wal_names_the_main_bucket_as_written():
    props = {"s3.data.buckets": "0@s3://Main-Bucket?region=x", "s3.wal.path": "0@s3://Main-Bucket"}
    assert map_properties(props, "cluster").wal_in_bucket
