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


def _shares(mapping: ProxyMapping, proxies: list[int]) -> list[int]:
    return [len(mapping.mains_of(p)) for p in proxies]


@pytest.mark.parametrize("per_az", [1, 2, 3, 4, 5, 7])
def test_the_proxies_of_an_az_share_the_mains_equally(per_az):
    """Issue #32: with 6 brokers in 3 AZs one broker proxied all four remote mains of its
    AZ and the other none; each now proxies an equal share (+-1)."""
    brokers = _cluster(per_az)
    mapping = ProxyMapping(brokers)
    for az in ("az1", "az2", "az3"):
        shares = _shares(mapping, [b.node_id for b in brokers if b.az == az])
        assert max(shares) - min(shares) <= 1 and sum(shares) == 2 * per_az
    if per_az == 2:  # the cluster: 4 remote mains, 2 proxies, 2 each
        assert _shares(mapping, list(range(6))) == [2] * 6


def test_shares_stay_equal_with_uneven_azs_and_fenced_brokers():
    import random

    rng = random.Random(7)
    for _ in range(200):
        brokers = []
        for node in range(rng.randint(2, 14)):
            brokers.append(BrokerPlace(node, f"az{rng.randint(1, 3)}", rng.random() > 0.2))
        mapping = ProxyMapping(brokers)
        for az in mapping.azs:
            proxies = [b.node_id for b in brokers if b.az == az and b.eligible]
            leading = [b.node_id for b in brokers if b.az != az and b.eligible]
            served = [m for p in proxies for m in mapping.mains_of(p) if m in leading]
            assert sorted(served) == sorted(leading)
            shares = [len([m for m in mapping.mains_of(p) if m in leading]) for p in proxies]
            assert max(shares) - min(shares) <= 1
        for b in brokers:  # fenced mains keep a proxy too (their clients are not stranded)
            for az in mapping.azs:
                assert mapping.az_of(mapping.route(b.node_id, az)) in (az, b.az)


def test_mostly_stable_under_broker_add_and_remove():
    """Equal shares cost a little stability: a broker joining an AZ takes its share and at
    most as many other mains move between the old proxies; one leaving hands its mains
    over and at most a share's worth of others move."""
    base = _cluster(5)
    before = ProxyMapping(base)
    az2 = [b.node_id for b in base if b.az == "az2"]
    mains = [b.node_id for b in base if b.az != "az2"]
    after_add = ProxyMapping(base + [BrokerPlace(99, "az2", True)])
    taken = after_add.mains_of(99)
    assert len(taken) >= 1
    moved = [m for m in mains if before.proxy_of(m, "az2") != after_add.proxy_of(m, "az2")]
    assert set(taken) <= set(moved) and len(moved) <= 2 * len(taken)
    assert max(_shares(after_add, az2 + [99])) - min(_shares(after_add, az2 + [99])) <= 1
    # removing broker 6 (az2): its mains move, and at most a share's worth of others
    removed = ProxyMapping([b for b in base if b.node_id != 6])
    held = before.mains_of(6)
    others_moved = [
        m
        for m in mains
        if m not in held and removed.proxy_of(m, "az2") != before.proxy_of(m, "az2")
    ]
    assert all(removed.proxy_of(m, "az2") not in (6, None) for m in held)
    assert len(others_moved) <= -(-len(mains) // (len(az2) - 1))


def test_broker_config_refuses_a_bad_client_az_map():
    import pydantic

    from dataplane.config import BrokerConfig

    base = dict(node_id=1, az="az1", kafka_port=1, data_dir="/tmp/x", controllers=[])
    with pytest.raises(pydantic.ValidationError, match="invalid CIDR '10.0.0.0/33'"):
        BrokerConfig(**base, zone_router={"client_az_cidrs": {"10.0.0.0/33": "az1"}})
    cidrs = {"10.0.0.0/8": "az1"}
    assert BrokerConfig(**base, zone_router={"client_az_cidrs": cidrs}).zone_router.client_az_cidrs
