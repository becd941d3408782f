"""Where the zone router places a client (issue #32): its client.id marker first, then the
rack its Fetch requests carried (KIP-392 `client.rack`, remembered for its host),
then the CIDR map; and the CIDR map is set by `cluster up --client-az-cidrs` and by the
topology file, not only by editing broker.json."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from cli.config_files import broker_config
from cli.deploy import Topology, init_topology
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from dataplane.formats.client_az import BROKER_CLIENT_ID, CidrAzMap, client_az, parse_az_cidrs
from dataplane.kafka.api_context import BrokerApiContext, ClientRacks

CIDRS = CidrAzMap.parse({"10.0.0.0/16": "az1", "10.1.0.0/16": "az2"})


def test_client_id_marker_then_rack_then_address():
    assert client_az("automq_az=az3", "10.0.0.5", CIDRS, rack="az2") == "az3"
    assert client_az("my-consumer", "10.0.0.5", CIDRS, rack="az2") == "az2"
    assert client_az("my-consumer", "10.0.0.5", CIDRS) == "az1"
    assert client_az("my-consumer", "10.0.0.5", CIDRS, rack="") == "az1"
    assert client_az("my-consumer", "10.0.0.5", CIDRS, rack="not an az!") == "az1"
    assert client_az("my-consumer", "192.168.0.1", CIDRS) is None
    assert client_az(BROKER_CLIENT_ID, "10.0.0.5", CIDRS, rack="az2") is None


class _Routing:
    """The zone router's answer, as `ZoneRouting.client_az` gives it."""

    def client_az(self, client_id, peer_host, rack=None):
        return client_az(client_id, peer_host, CIDRS, rack)


def test_a_client_host_that_fetched_with_a_rack_is_placed_by_it_from_then_on():
    """Metadata and FindCoordinator carry no rack: the broker remembers the rack the
    Fetch requests from a client's host carried (librdkafka sends client.rack in Fetch
    v11+), for every connection from that host (a client opens several)."""
    broker = SimpleNamespace(routing=_Routing(), client_racks=ClientRacks(max_hosts=2))

    def ctx(host: str, client_id: str = "rdkafka") -> SimpleNamespace:
        return SimpleNamespace(client_id=client_id, peer=(host, 5000), extras={})

    fetch = ctx("192.168.0.7")
    assert BrokerApiContext.client_az(broker, fetch) is None  # before any Fetch
    BrokerApiContext.note_client_rack(broker, fetch, "")  # a Fetch without client.rack
    assert BrokerApiContext.client_az(broker, fetch) is None
    BrokerApiContext.note_client_rack(broker, fetch, "az2")
    assert BrokerApiContext.client_az(broker, ctx("192.168.0.7")) == "az2"  # a Metadata
    assert BrokerApiContext.client_az(broker, ctx("192.168.0.8")) is None  # another host
    # the client.id marker still comes first
    assert BrokerApiContext.client_az(broker, ctx("192.168.0.7", "automq_az=az3")) == "az3"
    # bounded: the least recently noted host is forgotten
    BrokerApiContext.note_client_rack(broker, ctx("192.168.0.8"), "az1")
    BrokerApiContext.note_client_rack(broker, ctx("192.168.0.9"), "az3")
    assert BrokerApiContext.client_az(broker, ctx("192.168.0.7")) is None
    assert BrokerApiContext.client_az(broker, ctx("192.168.0.9")) == "az3"


def test_az_cidrs_flag_form():
    assert parse_az_cidrs("az1=10.0.0.0/16, az2=10.1.0.0/16,az2=10.2.0.0/16") == {
        "10.0.0.0/16": "az1",
        "10.1.0.0/16": "az2",
        "10.2.0.0/16": "az2",
    }
    assert parse_az_cidrs("") == {}


@pytest.mark.parametrize(
    "spec, why",
    [
        ("az1", "not AZ=CIDR"),
        ("az1=10.0.0.0/33", "invalid CIDR"),
        ("az 1=10.0.0.0/16", "invalid AZ name"),
        ("az1=10.0.0.0/16,az2=10.0.0.0/16", "both az1 and az2"),
    ],
)
def test_bad_az_cidrs_are_refused_with_the_entry(spec, why):
    with pytest.raises(ValueError, match=why):
        parse_az_cidrs(spec)


def test_cluster_up_client_az_cidrs_reach_every_broker_config(tmp_path):
    cluster = LocalCluster(tmp_path / "c")
    cidrs = parse_az_cidrs("az1=10.0.0.0/16,az2=10.1.0.0/16")
    config = cluster.create(2, 1, ["az1", "az2"], None, None, 6000, client_az_cidrs=cidrs)
    for spec in config.brokers:
        broker = broker_config(config, spec, tmp_path / "b", tmp_path / "tls", None)
        assert broker.zone_router.client_az_cidrs == cidrs
    # a restart with other ranges is refused by what differs; the same ones are fine
    assert flag_differences(config, client_az_cidrs=cidrs) == []
    differ = flag_differences(config, client_az_cidrs={"10.9.0.0/16": "az1"})
    assert differ == [
        "--client-az-cidrs az1=10.9.0.0/16 (the cluster has az1=10.0.0.0/16,az2=10.1.0.0/16)"
    ]


def test_cluster_up_refuses_bad_client_az_cidrs_before_starting_anything(tmp_path):
    from cli.main import app

    out = CliRunner().invoke(
        app,
        ["cluster", "up", "--dir", str(tmp_path / "c"), "--client-az-cidrs", "az1=nonsense"],
    )
    assert out.exit_code == 1
    assert "--client-az-cidrs" in out.output and "nonsense" in out.output
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_topology_client_az_cidrs_reach_every_broker_file(tmp_path):
    topo = {
        "buckets": ["0@s3://main?region=us-east-1&endpoint=http://10.0.0.9:9000"],
        "controllers": [{"id": 0, "host": "10.0.0.1", "raft_port": 9093, "api_port": 9094}],
        "brokers": [
            {"id": 1, "host": "10.0.0.1", "az": "az1", "kafka_port": 9092},
            {"id": 2, "host": "10.1.0.1", "az": "az2", "kafka_port": 9092},
        ],
        "client_az_cidrs": {"az1": "10.0.0.0/16", "az2": ["10.1.0.0/16", "10.2.0.0/16"]},
    }
    init_topology(Topology.model_validate(topo), tmp_path)
    for host, node in (("10.0.0.1", 1), ("10.1.0.1", 2)):
        broker = json.loads((tmp_path / host / f"broker-{node}.json").read_text())["broker"]
        assert broker["zone_router"]["client_az_cidrs"] == {
            "10.0.0.0/16": "az1",
            "10.1.0.0/16": "az2",
            "10.2.0.0/16": "az2",
        }
    with pytest.raises(ValueError, match="invalid CIDR"):
        Topology.model_validate({**topo, "client_az_cidrs": {"az1": "10.0.0.0/99"}})


def test_cluster_up_and_the_topology_set_the_zone_router_channel_mode(tmp_path):
    """zone_router.channel_mode (issue #32) from `cluster up --zone-router-channel-mode` and
    a topology's zone_router_channel_mode; the default stays "all"."""
    from cli.cluster_up import ChannelMode, with_channel_mode
    from cli.main import app

    cluster = LocalCluster(tmp_path / "c")
    overrides = with_channel_mode({}, ChannelMode.az_clients)
    config = cluster.create(2, 1, ["az1", "az2"], None, None, 6000, broker_overrides=overrides)
    for spec in config.brokers:
        broker = broker_config(config, spec, tmp_path / "b", tmp_path / "tls", None)
        assert broker.zone_router.channel_mode == "az_clients"
    assert flag_differences(config, zone_router_channel_mode="az_clients") == []
    assert flag_differences(config, zone_router_channel_mode="all") == [
        "--zone-router-channel-mode all (the cluster has az_clients)"
    ]
    plain = LocalCluster(tmp_path / "d").create(2, 1, ["az1", "az2"], None, None, 6000)
    default = broker_config(plain, plain.brokers[0], tmp_path / "b", tmp_path / "tls", None)
    assert default.zone_router.channel_mode == "all"
    # given twice (the flag and --broker-config): refused before anything starts
    out = CliRunner().invoke(
        app,
        [
            "cluster", "up", "--dir", str(tmp_path / "e"),
            "--zone-router-channel-mode", "az_clients",
            "--broker-config", "zone_router.channel_mode=all",
        ],
    )  # fmt: skip
    assert out.exit_code == 1 and "channel mode once" in out.output, out.output
    assert not (tmp_path / "e" / "cluster.json").exists()
    topo = {
        "buckets": ["0@s3://main?region=us-east-1&endpoint=http://10.0.0.9:9000"],
        "controllers": [{"id": 0, "host": "10.0.0.1", "raft_port": 9093, "api_port": 9094}],
        "brokers": [{"id": 1, "host": "10.0.0.1", "az": "az1", "kafka_port": 9092}],
        "zone_router_channel_mode": "az_clients",
    }
    init_topology(Topology.model_validate(topo), tmp_path / "t")
    broker = json.loads((tmp_path / "t" / "10.0.0.1" / "broker-1.json").read_text())["broker"]
    assert broker["zone_router"]["channel_mode"] == "az_clients"
    with pytest.raises(ValueError):
        Topology.model_validate({**topo, "zone_router_channel_mode": "sometimes"})
