"""`cluster up --config server.properties` and `node run --properties` without starting
anything: what the cluster's and the brokers' configs get, the flags a file contradicts,
and the one-line errors that leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli import cluster_properties
from cli.cluster_up import WALKind
from cli.config_files import broker_config
from cli.deploy import Topology, init_topology, process_argv
from cli.local_cluster import LocalCluster
from dataplane.config_mapping import map_properties
from dataplane.config_properties import PropertiesError
from tests.unit.test_deploy import TOPO

URIS = (
    "0@s3://main?region=us-east-1&endpoint=http://127.0.0.1:18333,"
    "1@s3://failover?region=us-east-1&endpoint=http://127.0.0.1:18334"
)
PROPS = {
    "s3.endpoint": "http://127.0.0.1:18333,1@http://127.0.0.1:18334",
    "s3.region": "us-east-1",
    "s3.bucket": "main,1@failover",
    "KAFKA_S3_ACCESS_KEY": "ak0,1@ak1",
    "KAFKA_S3_SECRET_KEY": "sk0,1@sk1",
    "s3.wal.path": "0@file:///dev/nvme1n1?capacity=64MiB",
    "s3.block.cache.size": "64MiB",
    "s3.network.baseline.bandwidth": "1GB",
    "log.retention.ms": "3600000",
    "offsets.topic.num.partitions": "10",
}


def _up(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "up", "--dir", str(tmp_path / "c"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},
    )


def _write(path: Path, props: dict[str, str], mode: int = 0o600) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    os.chmod(path, mode)
    return path


def test_the_cluster_and_its_brokers_get_what_the_file_says(tmp_path):
    mapping = map_properties(PROPS, "cluster")
    values = {"bucket_uris": None, "wal": WALKind.file}
    given: dict = {}
    cluster_properties.apply_to_flags(mapping, values, given)
    assert values["bucket_uris"] == given["bucket_uris"]
    cluster = LocalCluster(tmp_path / "c")
    config = cluster.create(1, 1, ["a"], None, values["bucket_uris"], 6000)
    config = cluster_properties.configure_new(config, mapping)
    assert [(b.bucket_id, b.access_key, b.secret_key) for b in config.buckets] == [
        (0, "ak0", "sk0"),
        (1, "ak1", "sk1"),
    ]
    assert config.broker_wal_capacity_bytes == 64 << 20
    assert config.settings.coordinator_slots == 10
    assert config.topic_defaults == {"log.retention.ms": "3600000"}
    broker = broker_config(config, config.brokers[0], tmp_path / "b", tmp_path / "tls", None)
    assert broker.storage.block_cache_bytes == 64 << 20
    assert broker.storage.upload_interval_s == 5.0  # the rest stays the default
    assert broker.object_store.write_bandwidth_bytes_per_s == 1 << 30
    assert broker.wal.capacity_bytes == 64 << 20
    assert "accessKey=ak1" in broker.bucket_uris
    # the same file on a restart agrees; another one is refused by what differs
    assert cluster_properties.differences(config, mapping) == []
    other = map_properties(
        {**PROPS, "s3.block.cache.size": "1G", "log.retention.ms": "1"}, "cluster"
    )
    assert cluster_properties.differences(config, other) == [
        "--config: broker setting storage.block_cache_bytes 1073741824 (the cluster has 67108864)",
        "--config: topic default log.retention.ms 1 (the cluster has 3600000)",
    ]
    fewer = map_properties({k: v for k, v in PROPS.items() if k != "log.retention.ms"}, "cluster")
    assert cluster_properties.differences(config, fewer) == [
        "--config: topic default log.retention.ms (default) (the cluster has 3600000)"
    ]


@pytest.mark.parametrize(
    "given, message",
    [
        ({"bucket_uris": URIS.replace("failover", "other")}, "s3.data.buckets: --bucket-uris"),
        ({"wal": "file"}, "s3.wal.path: names a bucket"),
        ({"wal_capacity_mib": 32}, "s3.wal.path: its capacity differs"),
        ({"bucket_secrets_file": Path("/x")}, "KAFKA_S3_ACCESS_KEY: --bucket-secrets-file"),
    ],
)
def test_flags_that_contradict_the_file_are_refused_by_key(given, message):
    props = {**PROPS, "s3.wal.path": "0@s3://main", "s3.wal.capacity": "64MiB"}
    mapping = map_properties(props, "cluster")
    with pytest.raises(PropertiesError, match=f"^{message}"):
        cluster_properties.apply_to_flags(
            mapping, {"bucket_uris": None, "wal": WALKind.file}, given
        )


def test_the_same_buckets_as_the_flag_are_fine():
    mapping = map_properties(PROPS, "cluster")
    given = {"bucket_uris": URIS}
    cluster_properties.apply_to_flags(mapping, {"bucket_uris": URIS, "wal": WALKind.file}, given)


@pytest.mark.parametrize(
    "props, mode, args, message",
    [
        ({"s3.block.cache.size": "lots"}, 0o600, [], "s3.block.cache.size: 'lots' is not a size"),
        (PROPS, 0o644, [], "KAFKA_S3_ACCESS_KEY: "),
        ({}, 0o600, ["--override", "s3.wal.cache.size=-1"], "s3.wal.cache.size: "),
        ({}, 0o600, ["--override", "nonsense"], "--override 'nonsense': want key=value"),
        (PROPS, 0o600, ["--bucket-uris", "0@s3://x"], "s3.data.buckets: --bucket-uris"),
    ],
)
def test_cluster_up_refuses_a_bad_file_in_one_line_and_writes_nothing(
    tmp_path, props, mode, args, message
):
    f = _write(tmp_path / "server.properties", props, mode)
    res = _up(tmp_path, "--config", str(f), *args)
    assert res.returncode == 1, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line
    assert "sk0" not in res.stderr + res.stdout
    assert not (tmp_path / "c").exists()


def test_node_run_lays_the_properties_over_the_node_file(tmp_path):
    init_topology(Topology.model_validate(TOPO), tmp_path)
    node, secrets = tmp_path / "10.0.0.2" / "broker-2.json", tmp_path / "10.0.0.2" / "secrets.json"
    data = json.loads(node.read_text())
    data["broker"]["data_dir"] = str(tmp_path / "data")
    node.write_text(json.dumps(data))
    props = {
        "process.roles": "broker,controller",
        "node.id": "2",
        "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "controller.listener.names": "CONTROLLER",
        "advertised.listeners": "PLAINTEXT://b2.example.com:9092",
        "log.dirs": str(tmp_path / "automq-logs"),
        "s3.data.buckets": "0@s3://main?region=us-east-1&endpoint=http://10.0.0.9:9000",
        "KAFKA_S3_ACCESS_KEY": "ak",
        "KAFKA_S3_SECRET_KEY": "sk",
        "s3.wal.path": "0@s3://main",
        "s3.wal.cache.size": "128MiB",
        "log.retention.ms": "1000",
    }
    notes: list[str] = []
    # a listener on 10.0.0.2 without SASL: the operator's --allow-insecure
    _, runtime, name = process_argv(
        node, secrets, allow_insecure=True, properties=props, warnings=notes
    )
    assert name == "broker-2" and runtime == tmp_path / "automq-logs" / "broker.json"
    broker = json.loads(runtime.read_text())
    assert broker["storage"]["log_cache_uploaded_bytes"] == 128 << 20
    assert broker["wal"]["uri"] == "s3://main/wal/node-2"
    assert broker["bucket_uris"].endswith("accessKey=ak&secretKey=sk")
    assert [(e["host"], e["port"]) for e in broker["listeners"]] == [("10.0.0.2", 9092)]
    assert broker["advertised_listeners"][0]["host"] == "b2.example.com"
    assert broker["controllers"] == ["10.0.0.1:9094"]  # the node file's
    assert [n.split(":")[0] for n in notes] == ["process.roles", "log.retention.ms"]
    with pytest.raises(PropertiesError, match="^node.id: 3 is not this node file's id"):
        process_argv(node, secrets, properties={"node.id": "3"})
    with pytest.raises(PropertiesError, match=r"^s3.data.buckets: buckets \[0, 1\]"):
        process_argv(node, secrets, properties={"s3.data.buckets": URIS})
    controller = tmp_path / "10.0.0.1" / "controller-0.json"
    with pytest.raises(ValueError, match="--properties applies to a broker"):
        process_argv(controller, tmp_path / "10.0.0.1" / "secrets.json", properties={})


def test_node_run_names_each_ignored_key_on_stderr_and_a_bad_one_in_one_line(tmp_path):
    init_topology(Topology.model_validate(TOPO), tmp_path)
    node = tmp_path / "10.0.0.2" / "broker-2.json"
    data = json.loads(node.read_text())
    data["broker"]["data_dir"] = str(tmp_path / "data")
    node.write_text(json.dumps(data))
    f = _write(
        tmp_path / "server.properties", {"s3.block.cache.size": "64M", "num.io.threads": "8"}
    )
    run = [sys.executable, "-m", "cli.main", "node", "run", "--config", str(node), "--dry-run"]
    run.append("--allow-insecure")  # a listener on 10.0.0.2 without SASL
    res = subprocess.run(
        [*run, "--properties", str(f), "--override", "cluster.id=x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines() == [
        "note: num.io.threads: ignored (the broker sizes its threads and buffers itself)",
        "note: cluster.id: ignored (the node file names the controllers)",
    ]
    assert json.loads((tmp_path / "data" / "broker.json").read_text())["storage"][
        "block_cache_bytes"
    ] == (64 << 20)
    res = subprocess.run(
        [*run, "--properties", str(f), "--override", "s3.block.cache.size=1X"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("error: s3.block.cache.size: '1X' is not a size")


def test_kafka_s3_keys_apply_to_the_buckets_named_elsewhere(tmp_path, monkeypatch):
    """AutoMQ's credentials in the environment, the buckets in the node file (or in
    --bucket-uris): each bucket gets its own keys."""
    init_topology(Topology.model_validate({**TOPO, "buckets": URIS.split(",")}), tmp_path)
    node, secrets = tmp_path / "10.0.0.2" / "broker-2.json", tmp_path / "10.0.0.2" / "secrets.json"
    data = json.loads(node.read_text())
    data["broker"]["data_dir"] = str(tmp_path / "data")
    node.write_text(json.dumps(data))
    monkeypatch.setenv("KAFKA_S3_ACCESS_KEY", "ak0,1@ak1")
    monkeypatch.setenv("KAFKA_S3_SECRET_KEY", "sk0,1@sk1")
    _, runtime, _ = process_argv(
        node, secrets, allow_insecure=True, properties={"s3.block.cache.size": "64M"}
    )
    uris = json.loads(runtime.read_text())["bucket_uris"].split(",")
    assert uris[0].endswith("accessKey=ak0&secretKey=sk0")
    assert uris[1].endswith("accessKey=ak1&secretKey=sk1")
    f = _write(tmp_path / "server.properties", {"s3.block.cache.size": "64M"})
    mapping = cluster_properties.load_mapping(f, [], bucket_uris=URIS)
    assert mapping.bucket_credentials == {0: ("ak0", "sk0"), 1: ("ak1", "sk1")}
    # without credentials the file names no buckets: the flag's stay the flag's
    monkeypatch.delenv("KAFKA_S3_ACCESS_KEY")
    monkeypatch.delenv("KAFKA_S3_SECRET_KEY")
    assert cluster_properties.load_mapping(f, [], bucket_uris=URIS).bucket_uris is None
