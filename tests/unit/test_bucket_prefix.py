"""A bucket key prefix (`prefix=` in a bucket URI, `cluster init/up --bucket-prefix`):
every object of the cluster is stored under it, so a new cluster can use a bucket an
earlier cluster used (issue 33 item 9)."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from cli.cluster_config import ClusterError
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from dataplane.objectstore import ObjectStorage, parse_bucket_uris
from dataplane.objectstore.bucket_uri import BucketURI, with_key_prefix
from dataplane.s3stream.wal import WALFencedError
from dataplane.s3stream.wal.factory import open_wal

URI = "0@s3://shared?region=us-east-1"


def test_the_prefix_parses_normalised_and_round_trips() -> None:
    uri = BucketURI.parse(URI + "&prefix=cluster-b")
    assert uri.key_prefix == "cluster-b/" and uri.extra == {}
    assert BucketURI.parse(uri.to_string(redact=False)) == uri
    assert "s3://shared/cluster-b/ at" in uri.describe()
    assert BucketURI.parse(URI).key_prefix == ""
    assert BucketURI.parse(URI + "&prefix=a/b/").key_prefix == "a/b/"


@pytest.mark.parametrize("bad", ["/abs", "a//b", "../x", "a/../b", "sp ace", "x" * 200])
def test_a_bad_prefix_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        BucketURI.parse(URI + "&prefix=" + bad)
    with pytest.raises(ValueError, match="prefix"):
        with_key_prefix(URI, bad)


def test_with_key_prefix_keeps_the_entry_and_refuses_another_prefix() -> None:
    entry = URI + "&accessKey=k&secretKey=s"
    out = with_key_prefix(entry, "c1")
    assert out.startswith(entry) and BucketURI.parse(out).key_prefix == "c1/"
    assert with_key_prefix(out, "c1/") == out
    with pytest.raises(ValueError, match="already has the key prefix 'c1/'"):
        with_key_prefix(out, "c2")


@pytest.fixture
def s3(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="shared")
        yield client


def test_every_operation_works_under_the_prefix_and_lists_without_it(s3) -> None:
    with ObjectStorage(URI + "&prefix=c2", merge_window_ms=0) as store:
        store.put_object(0, "data/a", b"hello")
        store.put_object_async(0, "data/b", b"world").result(10)
        assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket="shared")["Contents"]) == [
            "c2/data/a",
            "c2/data/b",
        ]
        assert store.list_keys(0, "data/") == ["data/a", "data/b"]
        assert store.get_object(0, "data/a") == b"hello"
        assert store.get_range(0, "data/b", 1, 3) == b"or"
        assert bytes(store.get_range_async(0, "data/b", 0, 5).result(10)) == b"world"
        assert store.head_object(0, "data/a") == 5
        assert store.delete_objects(0, ["data/a"]) == 1
        assert store.list_keys(0, "") == ["data/b"]
    with ObjectStorage(URI, merge_window_ms=0) as plain:  # the unprefixed view: its keys
        assert plain.list_keys(0, "") == ["c2/data/b"]


def test_a_new_cluster_with_its_own_prefix_opens_the_wal_an_earlier_one_owns(s3) -> None:
    with ObjectStorage(URI, merge_window_ms=0) as old_store:
        old = open_wal("s3://shared/wal/node-1", 1, 5, capacity_bytes=1 << 26, objects=old_store)
        old.close()
        with pytest.raises(WALFencedError, match="--bucket-prefix"):
            open_wal("s3://shared/wal/node-1", 1, 1, capacity_bytes=1 << 26, objects=old_store)
    with ObjectStorage(URI + "&prefix=new", merge_window_ms=0) as new_store:
        wal = open_wal("s3://shared/wal/node-1", 1, 1, capacity_bytes=1 << 26, objects=new_store)
        try:
            assert wal.append(b"x").result(10).offset == 0
        finally:
            wal.close()


def _create(tmp_path: Path, prefix: str | None):
    return LocalCluster(tmp_path / "c").create(
        brokers=1,
        controllers=1,
        azs=["az1"],
        base_port=None,
        bucket_uris=None,
        session_timeout_ms=6000,
        bucket_prefix=prefix,
    )


def test_cluster_up_stores_the_prefix_in_every_bucket_of_the_config(tmp_path: Path) -> None:
    config = _create(tmp_path, "team-a")
    assert [u.key_prefix for u in parse_bucket_uris(",".join(b.uri for b in config.buckets))] == [
        "team-a/",
        "team-a/",
    ]
    assert flag_differences(config, bucket_prefix="team-a") == []
    assert flag_differences(config, bucket_prefix="team-b") == [
        "--bucket-prefix team-b (the cluster has team-a/)"
    ]


def test_a_bad_bucket_prefix_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="--bucket-prefix: invalid key prefix"):
        _create(tmp_path, "../up")
    assert not (tmp_path / "c" / "cluster.json").exists()
