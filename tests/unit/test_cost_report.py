"""`automqctl cost`'s arithmetic over the brokers' zone-router counters (pure)."""

from __future__ import annotations

import pytest

from cli.cost import cost_report


def test_sums_brokers_and_prices_against_kafka():
    traffic = {
        1: {
            "produced_bytes": 3 * 10**9,
            "produced_same_az_bytes": 3 * 10**9,
            "consumed_bytes": 3 * 10**9,
            "consumed_same_az_bytes": 2 * 10**9,
            "consumed_cross_az_bytes": 10**9,
            "wal_data_bytes": 4 * 10**9,
            "object_store_put_bytes": 5 * 10**9,
        },
        2: {"produced_bytes": 0},
        3: None,  # not reported (yet)
    }
    report = cost_report(traffic, 0.02)
    assert report["brokers_reporting"] == 2
    assert report["produced_bytes"] == 3 * 10**9 and report["consumed_bytes"] == 3 * 10**9
    assert report["cross_az_bytes"] == 10**9
    assert report["cross_az_ratio"] == pytest.approx(1 / 6)
    assert report["wal_data_bytes_per_produced_byte"] == pytest.approx(4 / 3)
    assert report["cross_az_cost_usd"] == pytest.approx(0.02)
    # Kafka: produce 3 GB * (2/3 + 2) + consume 3 GB * 2/3 = 10 GB crossing AZs
    assert report["kafka_cross_az_bytes"] == 10 * 10**9
    assert report["kafka_cross_az_cost_usd"] == pytest.approx(0.2)


def test_clients_without_an_az_are_priced_like_kafkas_clients():
    report = cost_report(
        {1: {"produced_bytes": 3 * 10**9, "produced_unknown_az_bytes": 3 * 10**9}}, 1.0
    )
    assert report["cross_az_bytes"] == 0 and report["unknown_az_client_bytes"] == 3 * 10**9
    assert report["cross_az_cost_usd"] == pytest.approx(2.0)


def test_no_traffic():
    report = cost_report({}, 0.02)
    assert report["produced_bytes"] == 0 and report["cross_az_ratio"] == 0.0
    assert report["cross_az_cost_usd"] == 0 and report["kafka_cross_az_cost_usd"] == 0


def test_the_brokers_own_cross_az_requests_are_counted_and_priced():
    """Zone routes, snapshot polls and forwarded coordinator requests to brokers of other
    AZs carry no record data but do cross AZs: reported apart and priced."""
    from dataplane.zonerouter.traffic import ZoneTraffic

    traffic = ZoneTraffic("az1")
    traffic.client("produced", "az1", 10**9)
    traffic.broker("az2", 2 * 10**6)
    traffic.broker("az1", 5 * 10**6)  # same AZ: free
    counters = traffic.snapshot()
    assert (counters["broker_cross_az_bytes"], counters["broker_same_az_bytes"]) == (
        2 * 10**6,
        5 * 10**6,
    )
    report = cost_report({1: counters}, 0.02)
    assert report["cross_az_bytes"] == 0  # no client data crossed
    assert report["broker_cross_az_bytes"] == 2 * 10**6
    assert report["broker_cross_az_ratio"] == pytest.approx(0.002)
    assert report["cross_az_cost_usd"] == pytest.approx(2 * 10**6 / 10**9 * 0.02)
