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
