"""`cluster init --topology` and `node run` without starting anything: what the files hold,
and the clear errors of bad topologies and node files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from cli.deploy import Topology, init_topology, load_topology, process_argv

TOPO = {
    "buckets": ["0@s3://main?region=us-east-1&endpoint=http://10.0.0.9:9000"],
    "controllers": [{"id": 0, "host": "10.0.0.1", "raft_port": 9093, "api_port": 9094}],
    "brokers": [
        {"id": 1, "host": "10.0.0.1", "az": "a", "kafka_port": 9092, "data_dir": "/d/b{id}"},
        {"id": 2, "host": "10.0.0.2", "az": "b", "kafka_port": 9092, "wal": "s3"},
    ],
}


def test_init_writes_a_directory_per_host_with_secret_references(tmp_path):
    written = init_topology(Topology.model_validate(TOPO), tmp_path)
    assert written == {
        "10.0.0.1": ["secrets.json", "broker-1.json", "controller-0.json"],
        "10.0.0.2": ["secrets.json", "broker-2.json"],
    }
    values = json.loads((tmp_path / "10.0.0.1" / "secrets.json").read_text())
    assert values == json.loads((tmp_path / "10.0.0.2" / "secrets.json").read_text())
    for f in tmp_path.rglob("*.json"):
        assert f.stat().st_mode & 0o077 == 0
        if f.name != "secrets.json":
            assert values["api_secret"] not in f.read_text()
            assert values["raft_password"] not in f.read_text()
    broker2 = json.loads((tmp_path / "10.0.0.2" / "broker-2.json").read_text())["broker"]
    assert broker2["wal"]["uri"] == "s3://main/wal/node-2"
    assert broker2["controllers"] == ["10.0.0.1:9094"]
    assert broker2["controller_api_secret"] == "${secret:api_secret}"

    # node run resolves the references into a private runtime config
    argv, runtime, name = process_argv(
        tmp_path / "10.0.0.1" / "controller-0.json", tmp_path / "10.0.0.1" / "secrets.json"
    )
    assert name == "controller-0" and argv[1:3] == ["-m", "controlplane.server"]
    quorum = json.loads(runtime.read_text())
    assert quorum["api_secret"] == values["api_secret"]
    assert runtime.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "change, why",
    [
        ({"brokers": [{**TOPO["brokers"][0], "id": 0}, {**TOPO["brokers"][0], "id": 0}]}, "id"),
        ({"brokers": [{**TOPO["brokers"][0], "kafka_port": 9093}]}, "both use 10.0.0.1:9093"),
        ({"buckets": ["0@s3://b?accessKey=k&secretKey=s"]}, "credentials"),
        ({"buckets": ["nonsense"]}, "bucket URI entry 1"),
        ({"controllers": []}, "controllers"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_topologies_are_refused_with_the_reason(tmp_path, change, why):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**TOPO, **change}))
    with pytest.raises(ValueError) as exc:
        load_topology(path)
    assert why in str(exc.value)


def test_node_run_refuses_missing_secrets_and_bad_files(tmp_path):
    init_topology(Topology.model_validate(TOPO), tmp_path)
    node = tmp_path / "10.0.0.2" / "broker-2.json"
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ValueError, match="no secret 'api_secret'"):
        process_argv(node, tmp_path / "empty.json")
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", "node", "run", "--config", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "cannot read" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_broker_on_a_real_address_needs_allow_insecure_to_start(tmp_path):
    """The broker refuses a non-loopback listener without SASL (dataplane/broker/listeners.py);
    `node run` says so before anything starts, naming the flag, and writes nothing;
    `node run --allow-insecure` is the operator saying so, written into the runtime config."""
    init_topology(Topology.model_validate(TOPO), tmp_path)
    node, secrets = tmp_path / "10.0.0.2" / "broker-2.json", tmp_path / "10.0.0.2" / "secrets.json"
    data = json.loads(node.read_text())
    data["broker"]["data_dir"] = str(tmp_path / "data")
    node.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="10.0.0.2 without authentication.*--allow-insecure"):
        process_argv(node, secrets, allow_insecure=False)
    assert not (tmp_path / "data").exists()
    _, runtime, _ = process_argv(node, secrets, allow_insecure=True)
    assert json.loads(runtime.read_text())["allow_insecure"] is True


def test_a_broker_refuses_an_insecure_listener_before_it_registers(tmp_path):
    """Run directly (not through `node run`), a broker with an unauthenticated listener on
    a real address stops before it registers or claims a WAL, and the error names the flag."""
    from dataplane.broker.assembly import Broker
    from dataplane.config import BrokerConfig

    config = BrokerConfig(
        node_id=1,
        az="a",
        host="10.0.0.2",
        kafka_port=9092,
        data_dir=tmp_path / "b",
        controllers=["127.0.0.1:1"],  # never asked: nothing listens there
    )
    with pytest.raises(RuntimeError, match="--allow-insecure"):
        Broker(config).start()
    assert not (tmp_path / "b").exists()


def test_the_shard_store_port_is_pinned_by_the_topology(tmp_path):
    topo = {**TOPO, "brokers": [{**TOPO["brokers"][0], "shard_store_port": 9095}]}
    init_topology(Topology.model_validate(topo), tmp_path)
    broker = json.loads((tmp_path / "10.0.0.1" / "broker-1.json").read_text())["broker"]
    assert broker["erasure"]["shard_store_port"] == 9095
    clash = {**TOPO, "brokers": [{**TOPO["brokers"][0], "shard_store_port": 9092}]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(clash))
    with pytest.raises(ValueError, match="both use 10.0.0.1:9092"):
        load_topology(path)
