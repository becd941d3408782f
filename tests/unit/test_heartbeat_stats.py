"""What a broker's heartbeat carries about its data plane (dataplane/broker/heartbeat.py):
the zone router's traffic and the bytes this process PUT to object storage."""

from __future__ import annotations

from types import SimpleNamespace

from dataplane.broker.heartbeat import HeartbeatStats
from dataplane.objectstore import default_metrics
from dataplane.zonerouter.traffic import ZoneTraffic


def _stats(traffic: ZoneTraffic) -> HeartbeatStats:
    storage = SimpleNamespace(
        upload_stats=lambda: SimpleNamespace(
            wal_used_bytes=0, wal_capacity_bytes=1, upload_lag_s=0.0, last_upload_error=None
        )
    )
    return HeartbeatStats(storage, None, None, traffic, None)  # type: ignore[arg-type]


def test_the_heartbeat_counts_the_bytes_put_to_object_storage_and_nothing_else():
    traffic = ZoneTraffic("az1")
    traffic.add("produced_cross_az_bytes", 7)
    before = _stats(traffic).upload_stats().zone_traffic
    default_metrics().observe("put", 0, "ok", 0.01, 1234)
    default_metrics().observe("put", 1, "ok", 0.01, 1000)
    default_metrics().observe("get", 0, "ok", 0.01, 999)
    after = _stats(traffic).upload_stats().zone_traffic
    assert after["object_store_put_bytes"] - before["object_store_put_bytes"] == 2234
    assert after["produced_cross_az_bytes"] == 7
