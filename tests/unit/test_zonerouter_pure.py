"""Client AZ parsing and the main → proxy mapping of the zone router (pure)."""

from __future__ import annotations

import pytest

from dataplane.formats.client_az import CidrAzMap, az_from_client_id, client_az
from dataplane.zonerouter.proxy_mapping import BrokerPlace, ProxyMapping


@pytest.mark.parametrize(
    ("client_id", "az"),
    [
        ("automq_az=az2", "az2"),
        ("automq_type=producer&automq_az=az1", "az1"),
        ("app-1&warpstream_az=us-east-1a", "us-east-1a"),
        ("x=1,automq_az=eu-west-1b", "eu-west-1b"),
        ("AUTOMQ_AZ= az3 ", "az3"),
        ("rdkafka", None),
        (None, None),
        ("", None),
        ("automq_az=", None),
        ("automq_az=bad/name", None),
        ("automq_az=" + "a" * 65, None),
        ("other_az=az1", None),
    ],
)
def test_az_from_client_id(client_id, az):
    assert az_from_client_id(client_id) == az


def test_cidr_map_longest_prefix_and_client_id_first():
    cidrs = CidrAzMap.parse({"10.0.0.0/8": "az1", "10.1.0.0/16": "az2", "::1/128": "az3"})
    assert cidrs.az_of("10.1.2.3") == "az2"
    assert cidrs.az_of("10.9.2.3") == "az1"
    assert cidrs.az_of("::1") == "az3"
    assert cidrs.az_of("192.168.1.1") is None
    assert cidrs.az_of("not-an-ip") is None
    assert client_az("automq_az=az9", "10.1.2.3", cidrs) == "az9"
    assert client_az("rdkafka", "10.1.2.3", cidrs) == "az2"
    assert client_az("rdkafka", None, cidrs) is None


@pytest.mark.parametrize("spec", [{"10.0.0.300/8": "az1"}, {"10.0.0.0/8": "bad az"}])
def test_cidr_map_rejects_bad_entries(spec):
    with pytest.raises(ValueError, match="client AZ map"):
        CidrAzMap.parse(spec)


def _cluster(per_az: int, azs=("az1", "az2", "az3"), skip=()) -> list[BrokerPlace]:
    out = []
    node = 0
    for az in azs:
        for _ in range(per_az):
            out.append(BrokerPlace(node, az, node not in skip))
            node += 1
    return out


def test_every_main_has_exactly_one_proxy_per_other_az():
    brokers = _cluster(4)
    mapping = ProxyMapping(brokers)
    for b in brokers:
        for az in ("az1", "az2", "az3"):
            proxy = mapping.proxy_of(b.node_id, az)
            if az == b.az:
                assert proxy == b.node_id
            else:
                assert proxy is not None and mapping.az_of(proxy) == az
    # mains_of is the inverse: each main appears under exactly one proxy per other AZ
    for az in ("az1", "az2", "az3"):
        proxies = [b.node_id for b in brokers if b.az == az]
        served = [m for p in proxies for m in mapping.mains_of(p)]
        assert sorted(served) == sorted(b.node_id for b in brokers if b.az != az)
    # with 4 brokers per AZ and 8 mains from other AZs, the load is spread (not all on one)
    assert max(len(mapping.mains_of(p)) for p in range(12)) < 8


def test_same_mapping_regardless_of_broker_order():
    brokers = _cluster(3)
    a = ProxyMapping(brokers)
    b = ProxyMapping(list(reversed(brokers)))
    assert all(a.proxy_of(m, az) == b.proxy_of(m, az) for m in range(9) for az in a.azs)


def test_fenced_and_shutting_down_brokers_are_never_proxies():
    mapping = ProxyMapping(_cluster(3, skip={3, 4}))  # az2 = nodes 3,4,5
    for main in (0, 1, 2, 6, 7, 8):
        assert mapping.proxy_of(main, "az2") == 5
    assert mapping.mains_of(3) == []
    # an AZ with no eligible broker: the client is sent to the real leader
    none_left = ProxyMapping(_cluster(3, skip={3, 4, 5}))
    assert none_left.proxy_of(0, "az2") is None
    assert none_left.route(0, "az2") == 0
    assert none_left.route(0, "az-unknown") == 0


def test_route_for_clients():
    mapping = ProxyMapping(_cluster(2))
    assert mapping.route(0, None) == 0  # no AZ: the real leader
    assert mapping.route(0, "az1") == 0  # the main's own AZ skips the proxy
    assert mapping.az_of(mapping.route(0, "az3")) == "az3"


def test_stable_under_broker_add_and_remove():
    base = _cluster(5)
    before = ProxyMapping(base)
    # a new broker in az2 (node 99) only takes mains over; nobody moves between old proxies
    after_add = ProxyMapping(base + [BrokerPlace(99, "az2", True)])
    moved = 0
    for main in range(15):
        old, new = before.proxy_of(main, "az2"), after_add.proxy_of(main, "az2")
        if old != new:
            assert new == 99
            moved += 1
    assert moved < 10
    # removing broker 6 (az2) moves only the mains it served
    removed = ProxyMapping([b for b in base if b.node_id != 6])
    for main in range(15):
        if before.proxy_of(main, "az2") != 6:
            assert removed.proxy_of(main, "az2") == before.proxy_of(main, "az2")
        else:
            assert removed.proxy_of(main, "az2") not in (6, None)


def test_broker_config_refuses_a_bad_client_az_map():
    import pydantic

    from dataplane.config import BrokerConfig

    base = dict(node_id=1, az="az1", kafka_port=1, data_dir="/tmp/x", controllers=[])
    with pytest.raises(pydantic.ValidationError, match="invalid CIDR '10.0.0.0/33'"):
        BrokerConfig(**base, zone_router={"client_az_cidrs": {"10.0.0.0/33": "az1"}})
    cidrs = {"10.0.0.0/8": "az1"}
    assert BrokerConfig(**base, zone_router={"client_az_cidrs": cidrs}).zone_router.client_az_cidrs
