"""`cluster up --port-range`: one allocator hands out every port of a new cluster, the
embedded stores' admin gRPC ports included, inside the range (issue 33 item 7)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli.cluster_config import ClusterError
from cli.config_files import broker_config
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from cli.port_allocator import PortAllocator, default_port_range, parse_port_range
from dataplane.objectstore.seaweed import ADMIN_GRPC_OFFSET


def _create(tmp_path: Path, **kwargs):
    args = dict(
        brokers=3,
        controllers=3,
        azs=["a"],
        base_port=None,
        bucket_uris=None,
        session_timeout_ms=6000,
    )
    return LocalCluster(tmp_path / "c").create(**{**args, **kwargs})


def _free_range(width: int) -> tuple[int, int]:
    """A range of `width` ports below the ephemeral range whose low end is free."""
    low, high = default_port_range()
    for start in range(low, high - width, 97):
        if PortAllocator(start, start + 20).take(20):
            return start, start + width - 1
    raise AssertionError("no free range")


@pytest.mark.parametrize(
    "text", ["", "20000", "a-b", "20000-", "900-2000", "3000-2000", "20000-70000"]
)
def test_a_bad_range_is_a_clear_error(text: str) -> None:
    with pytest.raises(ClusterError, match="--port-range"):
        parse_port_range(text)


def test_every_port_comes_from_the_range_taken_ports_skipped(tmp_path: Path) -> None:
    low, high = _free_range(10_100)
    held = socket.socket()
    held.bind(("127.0.0.1", low))
    held.listen()
    try:
        config = _create(tmp_path, port_range=f"{low}-{high}")
    finally:
        held.close()
    ports = config.all_ports()
    assert len(set(ports.values())) == len(ports)
    assert all(low < p <= high for p in ports.values()), ports  # `low` was taken
    assert {f"broker-{n} shard-store" for n in (1, 2, 3)} <= set(ports)  # pinned too
    spec = config.brokers[0]
    bcfg = broker_config(config, spec, tmp_path / "b1", tmp_path / "tls", None)
    assert bcfg.erasure.shard_store_port == spec.shard_store_port
    for store in (config.embedded_s3, config.embedded_s3_failover):
        assert store["ports"]["admin_grpc"] == store["ports"]["admin"] + ADMIN_GRPC_OFFSET
    assert config.port_range == [low, high]
    assert flag_differences(config, port_range=f"{low}-{high}") == []
    assert flag_differences(config, port_range=f"{low}-{high + 1}") == [
        f"--port-range {low}-{high + 1} (the cluster has {low}-{high})"
    ]


def test_a_range_too_small_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    low, _ = _free_range(100)
    with pytest.raises(ClusterError, match="has 10 free ports of the 34 the cluster still needs"):
        _create(tmp_path, port_range=f"{low}-{low + 9}", bucket_uris=None)
    with pytest.raises(ClusterError, match=f"P and P \\+ {ADMIN_GRPC_OFFSET}"):
        _create(tmp_path, port_range=f"{low}-{low + 99}")
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_external_buckets_need_no_admin_pair(tmp_path: Path) -> None:
    low, _ = _free_range(100)
    config = _create(
        tmp_path,
        port_range=f"{low}-{low + 99}",
        bucket_uris="0@s3://b?region=us-east-1&endpoint=http://127.0.0.1:9",
    )
    assert all(low <= p <= low + 99 for p in config.all_ports().values())


def test_base_port_and_port_range_do_not_go_together(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="--base-port and --port-range"):
        _create(tmp_path, base_port=20000, port_range="20000-31000")


def test_the_default_keeps_every_port_below_the_ephemeral_range(tmp_path: Path) -> None:
    config = _create(tmp_path)
    low, high = default_port_range()
    assert high < 32768
    assert all(low <= p <= high for p in config.all_ports().values()), config.all_ports()
