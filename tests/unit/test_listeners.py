"""Per-listener security protocol: parsing Kafka-style listener specs, the start rules,
endpoint registration in the metadata quorum (old records without endpoints still apply),
and Metadata / FindCoordinator answering with the client's listener."""

from __future__ import annotations

import asyncio

import pytest
from kafka.protocol.metadata import MetadataRequest

from controlplane.listeners import (
    ListenerSpecError,
    listeners_error,
    parse_listener_kinds,
    parse_listeners,
)
from controlplane.records import BrokerEndpoint, decode_record
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.config import BrokerConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.api_context import BrokerIdentity
from dataplane.kafka.apis import KafkaApis
from dataplane.kafka.registry import RequestContext

NOW = 1_000_000


def ep(name: str, port: int, protocol: str, host: str = "127.0.0.1") -> BrokerEndpoint:
    return BrokerEndpoint(name=name, host=host, port=port, security_protocol=protocol)


# ------------------------------------------------------------------ parsing


def test_listeners_named_after_protocols():
    assert parse_listeners("PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093") == [
        ep("PLAINTEXT", 9092, "PLAINTEXT"),
        ep("SASL_SSL", 9093, "SASL_SSL"),
    ]


def test_named_listeners_take_their_protocol_from_the_map():
    got = parse_listeners(
        "INTERNAL://:9092, external://[::1]:9093",
        "INTERNAL:PLAINTEXT,EXTERNAL:sasl_ssl",
        default_host="10.0.0.5",
    )
    assert got == [
        ep("INTERNAL", 9092, "PLAINTEXT", host="10.0.0.5"),
        ep("EXTERNAL", 9093, "SASL_SSL", host="::1"),
    ]


@pytest.mark.parametrize(
    ("listeners", "protocol_map", "message"),
    [
        ("TLS://127.0.0.1:9092", None, "has no security protocol"),
        ("X://127.0.0.1:9092", "X:KERBEROS", "unknown security protocol 'KERBEROS'"),
        ("PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093", None, "duplicate listener"),
        ("A://127.0.0.1:9092,B://127.0.0.1:9092", "A:SSL,B:PLAINTEXT", "both use port 9092"),
        ("PLAINTEXT://127.0.0.1", None, "want NAME://HOST:PORT"),
        ("PLAINTEXT://127.0.0.1:99999", None, "out of range"),
        ("", None, "no listeners"),
        ("A://h:1", "A:SSL,A:PLAINTEXT", "mapped twice"),
    ],
)
def test_invalid_listener_specs_are_refused_in_one_line(listeners, protocol_map, message):
    with pytest.raises(ListenerSpecError, match=message) as info:
        parse_listeners(listeners, protocol_map)
    assert "\n" not in str(info.value)


def test_cluster_up_listener_kinds():
    assert parse_listener_kinds("PLAINTEXT,SASL_SSL") == [
        ("PLAINTEXT", "PLAINTEXT"),
        ("SASL_SSL", "SASL_SSL"),
    ]
    assert parse_listener_kinds("internal:PLAINTEXT, EXTERNAL:SSL") == [
        ("INTERNAL", "PLAINTEXT"),
        ("EXTERNAL", "SSL"),
    ]
    for bad, message in [
        ("PLAINTEXT,FOO", "has no security protocol"),
        ("A:PLAINTEXT,A:SSL", "duplicate listener name A"),
        ("A:BOGUS", "unknown security protocol"),
        ("PLAINTEXT://h:1", "want PROTOCOL or NAME:PROTOCOL"),
    ]:
        with pytest.raises(ListenerSpecError, match=message):
            parse_listener_kinds(bad)


def test_start_rules_apply_per_listener():
    plain, sasl_ssl = ep("PLAINTEXT", 1, "PLAINTEXT"), ep("SASL_SSL", 2, "SASL_SSL")
    both = [plain, sasl_ssl]
    assert listeners_error(both, sasl_enabled=True, tls_configured=True) is None
    assert "SASL is not set up" in listeners_error(both, sasl_enabled=False, tls_configured=True)
    assert "no TLS certificate" in listeners_error(both, sasl_enabled=True, tls_configured=False)
    # a SASL listener on a public address is fine; a PLAINTEXT one there is not
    public_sasl = [plain, ep("SASL_SSL", 2, "SASL_SSL", host="10.1.2.3")]
    assert listeners_error(public_sasl, sasl_enabled=True, tls_configured=True) is None
    public_plain = [ep("PLAINTEXT", 1, "PLAINTEXT", host="10.1.2.3"), sasl_ssl]
    refused = listeners_error(public_plain, sasl_enabled=True, tls_configured=True)
    assert "refusing to serve Kafka listener PLAINTEXT on 10.1.2.3" in refused
    assert (
        listeners_error(public_plain, sasl_enabled=True, tls_configured=True, allow_insecure=True)
        is None
    )
    # SSL on a public address counts as authenticated only with client certificates required
    public_ssl = [ep("SSL", 3, "SSL", host="10.1.2.3")]
    assert "refusing" in listeners_error(public_ssl, sasl_enabled=False, tls_configured=True)
    assert (
        listeners_error(public_ssl, sasl_enabled=False, tls_configured=True, ssl_client_auth=True)
        is None
    )
    dup = [plain, ep("OTHER", 1, "PLAINTEXT")]
    assert "both use port 1" in listeners_error(dup, sasl_enabled=False, tls_configured=False)


def test_legacy_broker_config_has_one_listener_named_after_its_protocol():
    base = {"node_id": 1, "az": "a", "kafka_port": 9092, "data_dir": "/tmp/x", "controllers": []}
    assert BrokerConfig(**base).effective_listeners() == [ep("PLAINTEXT", 9092, "PLAINTEXT")]
    tls = BrokerConfig(**base, sasl_enabled=True, tls_cert_file="c", tls_key_file="k")
    assert tls.effective_listeners() == [ep("SASL_SSL", 9092, "SASL_SSL")]
    two = [ep("INTERNAL", 9092, "PLAINTEXT"), ep("EXTERNAL", 9093, "SASL_PLAINTEXT")]
    assert BrokerConfig(**base, listeners=two).effective_listeners() == two


# ------------------------------------------------------------------ registration


def ok(result: dict) -> dict:
    assert "error" not in result, result
    return result["result"]


def register(sm: MetadataStateMachine, node: int, endpoints: list[BrokerEndpoint] | None) -> dict:
    body: dict = {
        "node_id": node,
        "az": f"az{node}",
        "host": "127.0.0.1",
        "kafka_port": 9000 + 10 * node,
        "incarnation_id": f"inc-{node}",
    }
    if endpoints is not None:
        body["endpoints"] = [e.model_dump() for e in endpoints]
    return sm.execute("register_broker", body, NOW)


@pytest.fixture
def sm() -> MetadataStateMachine:
    """Broker 1 has PLAINTEXT and SASL_SSL listeners, broker 2 only PLAINTEXT, both unfenced,
    one topic of two partitions (one led by each)."""
    machine = MetadataStateMachine(ControllerSettings(bucket_ids=[0]))
    ok(register(machine, 1, [ep("PLAINTEXT", 9010, "PLAINTEXT"), ep("SASL_SSL", 9011, "SASL_SSL")]))
    ok(register(machine, 2, [ep("PLAINTEXT", 9020, "PLAINTEXT")]))
    for node in (1, 2):
        ok(machine.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0}, NOW))
    ok(
        machine.execute(
            "create_topic", {"name": "t", "partitions": 2, "topic_id": "0" * 31 + "1"}, NOW
        )
    )
    return machine


def test_brokers_register_every_endpoint(sm):
    b1 = sm.image.brokers[1]
    assert [(e.name, e.port, e.security_protocol) for e in b1.endpoints] == [
        ("PLAINTEXT", 9010, "PLAINTEXT"),
        ("SASL_SSL", 9011, "SASL_SSL"),
    ]
    assert b1.endpoint("sasl_ssl") == ("127.0.0.1", 9011)
    assert sm.image.brokers[2].endpoint("SASL_SSL") is None
    assert b1.endpoint(None) == ("127.0.0.1", 9010)  # a caller that knows no listener


def test_a_registration_record_written_before_endpoints_still_applies():
    machine = MetadataStateMachine(ControllerSettings(bucket_ids=[0]))
    old = decode_record(
        '{"type": "register_broker", "node_id": 3, "node_epoch": 0, "az": "a", '
        '"host": "127.0.0.1", "kafka_port": 9092, "incarnation_id": "i", "registered_ms": 1}'
    )
    machine.image.apply(old, 1)
    broker = machine.image.brokers[3]
    assert broker.endpoints == ()
    # its one listener is host:kafka_port, whatever listener the client came in on
    assert broker.endpoint("SASL_SSL") == ("127.0.0.1", 9092)
    # and a request without endpoints (an older broker) still registers
    ok(register(machine, 4, None))
    assert machine.image.brokers[4].endpoints == ()


@pytest.mark.parametrize(
    "endpoints",
    [
        [{"name": "A", "host": "h", "port": 1, "security_protocol": "PLAINTEXT"}] * 2,
        [{"name": "A", "host": "h", "port": 1, "security_protocol": "KERBEROS"}],
        [{"name": "A B", "host": "h", "port": 1, "security_protocol": "PLAINTEXT"}],
        [],
    ],
)
def test_invalid_endpoints_are_refused_without_change(sm, endpoints):
    before = (sm.image.fingerprint(), sm.next_offset)
    result = sm.execute(
        "register_broker",
        {
            "node_id": 5,
            "az": "a",
            "host": "h",
            "kafka_port": 1,
            "incarnation_id": "x",
            "endpoints": endpoints,
        },
        NOW,
    )
    assert "error" in result
    assert (sm.image.fingerprint(), sm.next_offset) == before


# ------------------------------------------------------------------ metadata rewriting


def apis_for(sm: MetadataStateMachine) -> KafkaApis:
    return KafkaApis(
        BrokerIdentity(1, "127.0.0.1", 9010, "az1"),
        lambda: sm.image,
        lambda offset, timeout_s: True,
        None,  # no controller calls: nothing is auto-created here
        None,
        lambda: 0,
    )


def call(handler, req, api_key: int, version: int, listener: str | None):
    ctx = RequestContext(
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="unit",
        peer=("127.0.0.1", 1),
        extras={} if listener is None else {"listener": listener},
    )
    return asyncio.run(handler(req, ctx))


def metadata(sm, listener):
    req = MetadataRequest[9](
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name="t")],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    resp = call(apis_for(sm).cluster.metadata, req, 3, 9, listener)
    brokers = sorted((b.node_id, b.host, b.port) for b in resp.brokers)
    leaders = {
        p.partition_index: (p.error_code, p.leader_id) for t in resp.topics for p in t.partitions
    }
    return brokers, leaders


def test_metadata_lists_the_endpoints_of_the_clients_listener(sm):
    leader = {
        p.partition: p.leader_node_id for p in sm.image.topic_by_name("t").partitions.values()
    }
    assert sorted(leader.values()) == [1, 2]
    brokers, leaders = metadata(sm, "PLAINTEXT")
    assert brokers == [(1, "127.0.0.1", 9010), (2, "127.0.0.1", 9020)]
    assert leaders == {p: (KafkaError.NONE, n) for p, n in leader.items()}
    # broker 2 has no SASL_SSL listener: left out, and its partition has no usable leader
    brokers, leaders = metadata(sm, "SASL_SSL")
    assert brokers == [(1, "127.0.0.1", 9011)]
    for p, n in leader.items():
        want = (KafkaError.NONE, 1) if n == 1 else (KafkaError.LISTENER_NOT_FOUND, -1)
        assert leaders[p] == want


def test_find_coordinator_answers_on_the_clients_listener(sm):
    from kafka.protocol.metadata import FindCoordinatorRequest

    from controlplane.coordinators import group_coordinator

    groups = {group_coordinator(sm.image, f"g{i}"): f"g{i}" for i in range(64)}
    assert set(groups) == {1, 2}
    req = FindCoordinatorRequest[4](key_type=0, coordinator_keys=[groups[1], groups[2]])
    apis = apis_for(sm)
    resp = call(apis.cluster.find_coordinator, req, 10, 4, "SASL_SSL")
    got = {c.key: (c.error_code, c.node_id, c.port) for c in resp.coordinators}
    assert got[groups[1]] == (KafkaError.NONE, 1, 9011)
    assert got[groups[2]][0] == KafkaError.COORDINATOR_NOT_AVAILABLE
    resp = call(apis.cluster.find_coordinator, req, 10, 4, "PLAINTEXT")
    got = {c.key: (c.error_code, c.node_id, c.port) for c in resp.coordinators}
    assert got == {groups[1]: (0, 1, 9010), groups[2]: (0, 2, 9020)}


# ------------------------------------------------------------------ CLI: topology, cluster up

TOPO = {
    "buckets": ["0@s3://main?region=us-east-1&endpoint=http://10.0.0.9:9000"],
    "controllers": [{"id": 0, "host": "10.0.0.1", "raft_port": 9093, "api_port": 9094}],
    "brokers": [
        {
            "id": 1,
            "host": "10.0.0.1",
            "az": "a",
            "listeners": "INTERNAL://:9092,EXTERNAL://10.0.0.1:9095",
            "listener_security_protocol_map": "INTERNAL:PLAINTEXT,EXTERNAL:SSL",
            "tls_cert_file": "/etc/automq/server.pem",
            "tls_key_file": "/etc/automq/server.key",
        },
    ],
}


def test_topology_listeners_reach_the_broker_config(tmp_path):
    import json

    from cli.deploy import Topology, init_topology

    init_topology(Topology.model_validate(TOPO), tmp_path)
    broker = json.loads((tmp_path / "10.0.0.1" / "broker-1.json").read_text())["broker"]
    cfg = BrokerConfig.model_validate(broker)
    assert cfg.kafka_port == 9092
    assert cfg.effective_listeners() == [
        ep("INTERNAL", 9092, "PLAINTEXT", host="10.0.0.1"),
        ep("EXTERNAL", 9095, "SSL", host="10.0.0.1"),
    ]
    assert str(cfg.tls_cert_file) == "/etc/automq/server.pem"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"listener_security_protocol_map": "INTERNAL:PLAINTEXT,EXTERNAL:NOPE"}, "unknown"),
        ({"listeners": "INTERNAL://:9092,EXTERNAL://:9092"}, "both use port 9092"),
        ({"listener_security_protocol_map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL"}, "SASL"),
        ({"tls_cert_file": None}, "no TLS certificate"),
        ({"kafka_port": 9000}, "not both"),
        ({"listeners": None, "listener_security_protocol_map": None}, "give kafka_port"),
        ({"metrics_port": 9095}, "both use 10.0.0.1:9095"),
    ],
)
def test_bad_topology_listeners_are_refused_in_one_line(tmp_path, change, why):
    import yaml

    from cli.deploy import load_topology

    topo = {**TOPO, "brokers": [{**TOPO["brokers"][0], **change}]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo))
    with pytest.raises(ValueError, match=why) as info:
        load_topology(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("listeners", "sasl", "tls", "why"),
    [
        ("PLAINTEXT,SASL_SSL", True, False, "listener SASL_SSL needs --tls"),
        ("PLAINTEXT,EXT:SASL_PLAINTEXT", False, False, r"listener EXT \(SASL_PLAINTEXT\) needs"),
        ("PLAINTEXT,KERBEROS", False, False, "has no security protocol"),
        ("A:PLAINTEXT,A:SSL", False, True, "duplicate listener name A"),
        ("PLAINTEXT,SSL", True, True, "--sasl needs a SASL listener"),
    ],
)
def test_cluster_up_refuses_bad_listeners_and_stores_nothing(tmp_path, listeners, sasl, tls, why):
    from cli.cluster_config import ClusterError
    from cli.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "c")
    with pytest.raises(ClusterError, match=why):
        cluster.create(1, 1, ["a"], None, None, 6000, sasl=sasl, tls=tls, listeners=listeners)
    assert not (tmp_path / "c").exists()


def test_cluster_up_gives_every_listener_its_own_port(tmp_path):
    from cli.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "c")
    config = cluster.create(
        2, 1, ["a"], 20000, None, 6000, sasl=True, tls=False, listeners="PLAINTEXT,SASL_PLAINTEXT"
    )
    ports = sorted(config.all_ports().values())
    assert len(ports) == len(set(ports))
    b1, b2 = config.brokers
    assert b1.listener_ports == [20002, 20003] and b1.metrics_port == 20004
    assert b2.listener_ports == [20005, 20006]
    # the CLI (and the brokers among themselves) use the SASL listener: the logins need it
    assert config.security_protocol == "SASL_PLAINTEXT"
    assert config.bootstrap_servers() == "127.0.0.1:20003,127.0.0.1:20006"
    assert config.bootstrap_servers("PLAINTEXT") == "127.0.0.1:20002,127.0.0.1:20005"
    assert [e.name for e in config.broker_endpoints(b1)] == ["PLAINTEXT", "SASL_PLAINTEXT"]


def test_describe_configs_of_a_broker_shows_its_registered_listeners(sm):
    apis = apis_for(sm)
    error, _, rows = apis.topic_admin.describe_broker(sm.image, "1")
    assert error == KafkaError.NONE
    got = {row.name: row.value for row in rows}
    assert got["listeners"] == "PLAINTEXT://127.0.0.1:9010,SASL_SSL://127.0.0.1:9011"
    assert got["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"
    _, _, rows = apis.topic_admin.describe_broker(sm.image, "2")
    assert {row.name: row.value for row in rows}["listeners"] == "PLAINTEXT://127.0.0.1:9020"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_cluster_answers_on_the_clients_listener(sm, version):
    from kafka.protocol.admin import DescribeClusterRequest

    fields = {"include_cluster_authorized_operations": False}
    if version >= 1:
        fields["endpoint_type"] = 1
    if version >= 2:
        fields["include_fenced_brokers"] = False
    req = DescribeClusterRequest[version](**fields)
    apis = apis_for(sm)
    resp = call(apis.cluster.describe_cluster, req, 60, version, "SASL_SSL")
    assert resp.error_code == 0
    assert [(b.broker_id, b.port) for b in resp.brokers] == [(1, 9011)]
    resp = call(apis.cluster.describe_cluster, req, 60, version, "PLAINTEXT")
    assert [(b.broker_id, b.port) for b in resp.brokers] == [(1, 9010), (2, 9020)]
    if version >= 1:  # controllers are not described by brokers
        req = DescribeClusterRequest[version](**{**fields, "endpoint_type": 2})
        resp = call(apis.cluster.describe_cluster, req, 60, version, "PLAINTEXT")
        assert resp.error_code == KafkaError.UNSUPPORTED_ENDPOINT_TYPE and not resp.brokers


def test_cluster_up_cli_refuses_bad_listener_flags_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    d = tmp_path / "c"
    for args, why in [
        (["--listeners", "PLAINTEXT,SASL_SSL", "--tls"], "listener SASL_SSL needs --sasl"),
        (["--listeners", "PLAINTEXT,KERB"], "listener KERB has no security protocol"),
        (["--mtls"], "--mtls needs --tls and an SSL listener"),
    ]:
        res = subprocess.run(
            [sys.executable, "-m", "cli.main", "cluster", "up", "--dir", str(d), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "300"},
        )
        assert res.returncode == 1, res.stdout + res.stderr
        assert why in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not d.exists()  # nothing stored, nothing started


def test_restart_flags_that_differ_name_listeners_and_mtls(tmp_path):
    from cli.flag_differences import flag_differences
    from cli.local_cluster import LocalCluster

    config = LocalCluster(tmp_path / "c").create(
        1, 1, ["a"], None, None, 6000, tls=True, listeners="PLAINTEXT,SSL", mtls=True
    )
    assert flag_differences(config, listeners="plaintext, ssl", mtls=True) == []
    differ = flag_differences(config, listeners="PLAINTEXT", mtls=False)
    assert any(
        "--listeners PLAINTEXT (the cluster has PLAINTEXT:PLAINTEXT,SSL:SSL)" in d for d in differ
    )
    assert any("--no-mtls" in d for d in differ)
    # --mtls without --sasl: the CLI and the brokers use the SSL listener with certificates
    assert config.security_protocol == "SSL"
    security = LocalCluster(tmp_path / "c").client_security()
    assert security["ssl_cert_file"].endswith("admin.pem")


def test_advertised_listeners():
    from controlplane.listeners import parse_advertised_listeners

    bound = parse_listeners(
        "INTERNAL://0.0.0.0:9092,EXTERNAL://127.0.0.1:9093", "INTERNAL:PLAINTEXT,EXTERNAL:SSL"
    )
    told = parse_advertised_listeners("internal://broker1.example.com:19092", bound)
    assert told == [
        ep("INTERNAL", 19092, "PLAINTEXT", host="broker1.example.com"),
        ep("EXTERNAL", 9093, "SSL"),
    ]
    for spec, why in [
        ("", "binds 0.0.0.0"),  # a wildcard address is never told to clients
        ("OTHER://h:1", "not one of the listeners"),
        ("INTERNAL://h:1,INTERNAL://h:2", "given twice"),
        ("INTERNAL://:1", "needs a host"),
    ]:
        with pytest.raises(ListenerSpecError, match=why):
            parse_advertised_listeners(spec, bound)
    # the broker registers what it advertises, binds what it listens on
    base = {"node_id": 1, "az": "a", "kafka_port": 9092, "data_dir": "/tmp/x", "controllers": []}
    cfg = BrokerConfig(
        **base, listeners=bound, advertised_listeners=told, tls_cert_file="c", tls_key_file="k"
    )
    assert cfg.registered_endpoints() == told and cfg.effective_listeners() == bound
    with pytest.raises(ValueError, match="must name the listeners"):
        BrokerConfig(**base, listeners=bound, advertised_listeners=told[:1])


def test_topology_advertised_listeners(tmp_path):
    import json

    from cli.deploy import Topology, init_topology

    broker = {
        **TOPO["brokers"][0],
        "listeners": "INTERNAL://0.0.0.0:9092,EXTERNAL://10.0.0.1:9095",
        "advertised_listeners": "INTERNAL://b1.internal:9092",
    }
    init_topology(Topology.model_validate({**TOPO, "brokers": [broker]}), tmp_path)
    cfg = BrokerConfig.model_validate(
        json.loads((tmp_path / "10.0.0.1" / "broker-1.json").read_text())["broker"]
    )
    assert [(e.host, e.port) for e in cfg.effective_listeners()] == [
        ("0.0.0.0", 9092),
        ("10.0.0.1", 9095),
    ]
    assert [(e.host, e.port) for e in cfg.registered_endpoints()] == [
        ("b1.internal", 9092),
        ("10.0.0.1", 9095),
    ]
    with pytest.raises(ValueError, match="binds 0.0.0.0"):
        Topology.model_validate({**TOPO, "brokers": [{**broker, "advertised_listeners": None}]})


def test_user_cert_issues_a_client_certificate_and_refuses_in_one_line(tmp_path):
    import os
    import ssl
    import subprocess
    import sys

    from cli.local_cluster import LocalCluster

    def user_cert(d, *args):
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "user", "cert", *args, "--dir", str(d)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "300"},
        )

    plain = tmp_path / "plain"
    LocalCluster(plain).create(1, 1, ["a"], None, None, 6000)
    res = user_cert(plain, "alice")
    assert res.returncode == 1 and "has no CA of its own" in res.stderr
    d = tmp_path / "tls"
    LocalCluster(d).create(1, 1, ["a"], None, None, 6000, tls=True)
    res = user_cert(d, "bad name")
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    res = user_cert(d, "alice", "--format", "json")
    assert res.returncode == 0, res.stderr
    import json

    issued = json.loads(res.stdout)
    assert issued["principal"] == "User:alice"
    assert os.stat(issued["key"]).st_mode & 0o077 == 0
    ctx = ssl.create_default_context(cafile=issued["ca"])
    ctx.load_cert_chain(issued["certificate"], issued["key"])  # a valid pair of the CA
    res = user_cert(d, "alice")  # never overwrites
    assert res.returncode == 1 and "exists" in res.stderr
