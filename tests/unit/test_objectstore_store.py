"""ObjectStorage against moto: CRUD, ranges, error mapping, limits, config, metrics."""

from __future__ import annotations

import importlib
import os
import threading

import pytest
from botocore.config import Config as BotoConfig
from moto import mock_aws
from prometheus_client import REGISTRY, CollectorRegistry
from pydantic import ValidationError

from dataplane.objectstore import (
    AccessDeniedError,
    BandwidthLimitTimeoutError,
    BucketURI,
    InvalidRangeError,
    ObjectNotFoundError,
    ObjectStorage,
    ObjectStoreError,
    ObjectStoreMetrics,
    PreconditionFailedError,
    Priority,
    object_id_from_key,
    object_key,
    parse_bucket_uris,
)
from dataplane.objectstore import metrics as metrics_module
from dataplane.objectstore.clients import default_client_factory

URIS = "0@s3://automq-main?region=us-east-1,1@s3://automq-failover?region=us-east-1"


@pytest.fixture
def aws(monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        # the store's own factory: a fresh boto3.client() would parse the S3 model again
        s3 = default_client_factory(BucketURI(bucket_id=0, bucket="automq-main"), BotoConfig())
        s3.create_bucket(Bucket="automq-main")
        s3.create_bucket(Bucket="automq-failover")
        yield s3


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def store(aws, registry):
    with ObjectStorage(
        URIS,
        metrics=ObjectStoreMetrics(registry),
        merge_window_ms=0,
        backoff_base_ms=1,
        backoff_max_ms=2,
    ) as st:
        yield st


def count_calls(store: ObjectStorage, bucket_id: int, operation: str) -> list[dict]:
    """Record every `operation` call the bucket's client makes."""
    calls: list[dict] = []
    store.boto3_client(bucket_id).meta.events.register(
        f"before-parameter-build.s3.{operation}", lambda params, **_: calls.append(params)
    )
    return calls


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_put_get_head_list_delete_round_trip(store, aws):
    data = os.urandom(100_000)
    store.put_object(0, "data/a/1", data)
    store.put_object(0, "data/a/2", b"two")
    store.put_object(0, "other/3", b"three")
    assert store.get_object(0, "data/a/1") == data
    assert store.head_object(0, "data/a/1") == 100_000
    assert store.list_keys(0, "data/") == ["data/a/1", "data/a/2"]
    assert store.list_keys(0) == ["data/a/1", "data/a/2", "other/3"]
    assert store.list_keys(0, "data/", limit=1) == ["data/a/1"]
    assert store.delete_objects(0, ["data/a/1", "never-existed"]) == 2
    assert store.list_keys(0) == ["data/a/2", "other/3"]
    with pytest.raises(ObjectNotFoundError):
        store.get_object(0, "data/a/1")


def test_buckets_are_separate(store, aws):
    store.put_object(1, "k", b"failover bytes")
    assert store.get_object(1, "k") == b"failover bytes"
    assert store.list_keys(0) == []
    with pytest.raises(ObjectNotFoundError):
        store.head_object(0, "k")
    assert aws.get_object(Bucket="automq-failover", Key="k")["Body"].read() == b"failover bytes"


def test_get_range_is_byte_exact(store):
    data = os.urandom(1 << 20)
    store.put_object(0, "obj", data)
    for start, end in [
        (0, 1),
        (0, 1 << 20),
        (1000, 2000),
        ((1 << 20) - 1, 1 << 20),
        (123_456, 654_321),
    ]:
        assert store.get_range(0, "obj", start, end) == data[start:end]
    assert store.get_range(0, "obj", 5, 5) == b""


def test_range_errors(store):
    store.put_object(0, "small", b"0123456789")
    with pytest.raises(InvalidRangeError, match="past the end"):
        store.get_range(0, "small", 5, 11)
    with pytest.raises(InvalidRangeError):
        store.get_range(0, "small", 10, 20)  # starts at the end: HTTP 416
    with pytest.raises(ValueError):
        store.get_range(0, "small", -1, 3)
    with pytest.raises(ValueError):
        store.get_range(0, "small", 5, 4)


def test_zero_length_range_makes_no_request(store):
    store.put_object(0, "k", b"abc")
    gets = count_calls(store, 0, "GetObject")
    assert store.get_range(0, "k", 1, 1) == b""
    assert store.get_range_async(0, "k", 2, 2).result(timeout=5) == b""
    assert gets == []


def test_not_found_maps_and_is_not_retried(store, registry):
    gets = count_calls(store, 0, "GetObject")
    for call in (
        lambda: store.get_range(0, "missing", 0, 10),
        lambda: store.get_object(0, "missing"),
        lambda: store.head_object(0, "missing"),
    ):
        with pytest.raises(ObjectNotFoundError) as info:
            call()
        assert "missing" in str(info.value) and "bucket 0" in str(info.value)
        assert info.value.bucket_id == 0 and info.value.key == "missing"
    assert len(gets) == 2  # one attempt each for get_range and get_object
    assert (
        sample(
            registry,
            "automq_object_store_requests_total",
            op="get",
            bucket_id="0",
            status="not_found",
        )
        == 2
    )


def test_missing_bucket_is_not_reported_as_missing_object(aws, registry):
    with ObjectStorage("5@s3://no-such-bucket", metrics=ObjectStoreMetrics(registry)) as st:
        with pytest.raises(ObjectStoreError, match="does not exist") as info:
            st.get_object(5, "k")
        assert not isinstance(info.value, ObjectNotFoundError)


def test_if_none_match(store):
    store.put_object(0, "once", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailedError, match="412"):
        store.put_object(0, "once", b"second", if_none_match=True)
    assert store.get_object(0, "once") == b"first"
    store.put_object(0, "once", b"overwrite")  # unconditional put is allowed
    assert store.get_object(0, "once") == b"overwrite"


def test_async_put_and_get(store):
    futures = [store.put_object_async(0, f"k{i}", bytes([i]) * 1000) for i in range(20)]
    for f in futures:
        assert f.result(timeout=10) is None
    reads = [store.get_range_async(0, f"k{i}", 10, 20) for i in range(20)]
    assert [r.result(timeout=10) for r in reads] == [bytes([i]) * 10 for i in range(20)]
    with pytest.raises(PreconditionFailedError):
        store.put_object_async(0, "k3", b"x", if_none_match=True).result(timeout=10)


def test_delete_is_batched_by_1000(store):
    for i in range(5):
        store.put_object(0, f"del/{i}", b"x")
    deletes = count_calls(store, 0, "DeleteObjects")
    keys = [f"del/{i}" for i in range(2500)]  # most do not exist: deleting them is fine
    assert store.delete_objects(0, keys) == 2500
    assert [len(c["Delete"]["Objects"]) for c in deletes] == [1000, 1000, 500]
    assert store.list_keys(0, "del/") == []
    assert store.delete_objects(0, []) == 0


def test_delete_reports_per_key_errors(store):
    client = store.boto3_client(0)

    def fake_errors(parsed, **_):
        parsed["Errors"] = [
            {"Key": "a", "Code": "AccessDenied", "Message": "nope"},
            {"Key": "b", "Code": "NoSuchKey", "Message": "gone"},
        ]

    client.meta.events.register("after-call.s3.DeleteObjects", fake_errors)
    with pytest.raises(AccessDeniedError, match="1 keys not deleted"):
        store.delete_objects(0, ["a", "b"])


def test_unknown_bucket_and_bad_keys(store):
    with pytest.raises(ObjectStoreError, match=r"unknown bucket id 9; configured ids: \[0, 1\]"):
        store.get_object(9, "k")
    with pytest.raises(ObjectStoreError, match="unknown bucket id"):
        store.get_range_async(9, "k", 0, 1)
    with pytest.raises(ValueError):
        store.put_object(0, "", b"x")
    with pytest.raises(ValueError):
        store.put_object(0, "k" * 1025, b"x")


def test_size_limits(aws, registry):
    with ObjectStorage(URIS, metrics=ObjectStoreMetrics(registry), max_object_bytes=1000) as st:
        with pytest.raises(ObjectStoreError, match="max_object_bytes"):
            st.put_object(0, "big", b"x" * 1001)
        aws.put_object(Bucket="automq-main", Key="big", Body=b"x" * 2000)
        with pytest.raises(ObjectStoreError, match="max_object_bytes"):
            st.get_object(0, "big")
        with pytest.raises(ObjectStoreError, match="max_object_bytes"):
            st.get_range(0, "big", 0, 1001)
        assert st.get_range(0, "big", 0, 1000) == b"x" * 1000


def test_pending_requests_are_bounded(aws, registry):
    with ObjectStorage(
        URIS, metrics=ObjectStoreMetrics(registry), max_pending_requests=2, merge_window_ms=1000
    ) as st:
        st.put_object(0, "k", b"0123456789")
        f1 = st.get_range_async(0, "k", 0, 2)
        f2 = st.get_range_async(0, "k", 2, 4)
        with pytest.raises(ObjectStoreError, match="too many pending"):
            st.get_range_async(0, "k", 4, 6)
    # close() flushed the held batch instead of waiting for the window
    assert f1.result(timeout=5) == b"01" and f2.result(timeout=5) == b"23"


def test_an_unmerged_range_read_does_not_wait_for_the_merge_window(aws, registry, monkeypatch):
    """A caller reading a long range in pieces (catch-up readahead) sends each GET at once:
    merge=False never goes through the merger, even for a range it would hold."""
    with ObjectStorage(URIS, metrics=ObjectStoreMetrics(registry), merge_window_ms=1000) as st:
        st.put_object(0, "k", b"0123456789")
        held = st.get_range_async(0, "k", 0, 2, max_gap_bytes=0)  # waits for the window

        def no_merging(*args, **kwargs):
            raise AssertionError("merge=False went through the merger")

        monkeypatch.setattr(st._merger, "submit", no_merging)
        assert st.get_range_async(0, "k", 2, 4, merge=False).result(timeout=5) == b"23"
        with pytest.raises(AssertionError, match="merger"):
            st.get_range_async(0, "k", 4, 6)  # the default still merges
    assert held.result(timeout=5) == b"01"  # close() flushed it


def test_closed_store_rejects_requests(aws, registry):
    st = ObjectStorage(URIS, metrics=ObjectStoreMetrics(registry))
    st.close()
    st.close()  # idempotent
    with pytest.raises(ObjectStoreError, match="closed"):
        st.get_object(0, "k")
    with pytest.raises(ObjectStoreError, match="closed"):
        st.get_range_async(0, "k", 0, 10)
    with pytest.raises(ObjectStoreError, match="closed"):
        st.put_object_async(0, "k", b"x")


def test_botocore_client_configuration(aws, registry):
    with ObjectStorage(
        URIS,
        metrics=ObjectStoreMetrics(registry),
        connect_timeout_ms=1500,
        read_timeout_ms=7000,
        max_concurrency=6,
        extra_sync_connections=2,
    ) as st:
        cfg = st.boto3_client(0).meta.config
        assert cfg.connect_timeout == 1.5
        assert cfg.read_timeout == 7.0
        assert cfg.max_pool_connections == 8
        assert cfg.s3["addressing_style"] == "path"
        assert cfg.retries["total_max_attempts"] == 1
        assert st.boto3_client(0) is st.boto3_client(0)  # one client per bucket
        assert st.boto3_client(0) is not st.boto3_client(1)
        assert st._executor._max_workers == 6


def test_virtual_host_style_from_uri(aws, registry):
    with ObjectStorage(
        "0@s3://automq-main?pathStyle=false", metrics=ObjectStoreMetrics(registry)
    ) as st:
        assert st.boto3_client(0).meta.config.s3["addressing_style"] == "virtual"


def test_config_is_validated(aws):
    with pytest.raises(ValidationError):
        ObjectStorage(URIS, max_attempts=0)
    with pytest.raises(ValidationError):
        ObjectStorage(URIS, no_such_option=1)
    with pytest.raises(ValidationError):
        ObjectStorage(URIS, backoff_base_ms=100, backoff_max_ms=10)
    with pytest.raises(ValueError, match="duplicate"):
        ObjectStorage(parse_bucket_uris("0@s3://aaa") + parse_bucket_uris("0@s3://bbb"))


def test_read_bandwidth_limit_throttles(aws, registry):
    with ObjectStorage(
        URIS,
        metrics=ObjectStoreMetrics(registry),
        read_bandwidth_bytes_per_s=1000,
        throttle_timeout_ms=50,
    ) as st:
        st.put_object(0, "k", b"x" * 2000)
        assert st.get_range(0, "k", 0, 900, Priority.CATCH_UP) == b"x" * 900
        with pytest.raises(BandwidthLimitTimeoutError) as info:
            st.get_range(0, "k", 0, 900, Priority.COMPACTION)
        assert info.value.op == "get" and info.value.bucket_id == 0


def test_an_upload_is_not_delayed_by_throttled_catch_up_reads(aws, registry):
    """Catch-up GETs waiting for read tokens hold at most the pool's low-priority share of
    workers: an upload queued after them runs at once (seed 002: producer traffic first)."""
    with ObjectStorage(
        URIS,
        metrics=ObjectStoreMetrics(registry),
        max_concurrency=4,
        read_bandwidth_bytes_per_s=100,  # one 900-byte GET now, the next after 9 s
        throttle_timeout_ms=60_000,
    ) as st:
        st.put_object(0, "k", b"x" * 2000)
        gets = [
            st.get_range_async(0, "k", 0, 900, Priority.CATCH_UP, merge=False) for _ in range(8)
        ]
        st.put_object_async(0, "upload", b"y" * 100).result(timeout=10)
        assert sum(g.done() for g in gets) <= 1  # the catch-up is still throttled
        st.read_limiter.set_rate(0)  # unlimited: the waiting GETs go
        assert all(g.result(timeout=10) == b"x" * 900 for g in gets)


def test_metrics_count_requests_and_bytes(store, registry):
    store.put_object(0, "m", b"x" * 300)
    store.get_range(0, "m", 0, 100)
    store.get_object(0, "m")
    with pytest.raises(ObjectNotFoundError):
        store.head_object(0, "nope")
    assert (
        sample(registry, "automq_object_store_requests_total", op="put", bucket_id="0", status="ok")
        == 1
    )
    assert (
        sample(registry, "automq_object_store_requests_total", op="get", bucket_id="0", status="ok")
        == 2
    )
    assert (
        sample(
            registry,
            "automq_object_store_requests_total",
            op="head",
            bucket_id="0",
            status="not_found",
        )
        == 1
    )
    assert sample(registry, "automq_object_store_bytes_total", op="put", bucket_id="0") == 300
    assert sample(registry, "automq_object_store_bytes_total", op="get", bucket_id="0") == 400
    assert sample(registry, "automq_object_store_request_latency_seconds_count", op="get") == 2


def test_metrics_registration_is_idempotent(aws):
    registry = CollectorRegistry()
    a, b = ObjectStoreMetrics(registry), ObjectStoreMetrics(registry)
    assert a.requests is b.requests and a.latency is b.latency
    # many stores on the global registry, and a reload of the module, never re-register
    stores = [ObjectStorage(URIS) for _ in range(3)]
    for st in stores:
        st.close()
    reloaded = importlib.reload(metrics_module)
    assert reloaded.default_metrics().requests is stores[0].metrics.requests
    assert (
        REGISTRY.get_sample_value(
            "automq_object_store_requests_total", {"op": "x", "bucket_id": "0", "status": "ok"}
        )
        is None
    )


def test_object_keys_spread_and_round_trip():
    keys = [object_key(i) for i in range(1000)]
    assert keys[42].startswith("data/") and keys[42].endswith("/42")
    assert len({k.split("/")[1] for k in keys}) > 990  # hash prefixes are spread
    assert all(object_id_from_key(k) == i for i, k in enumerate(keys))
    assert object_key(2**63 - 1).endswith("/9223372036854775807")
    for bad in (-1, 2**63):
        with pytest.raises(ValueError):
            object_key(bad)
    with pytest.raises(TypeError):
        object_key("7")  # type: ignore[arg-type]
    for bad_key in ("data/00000000/1", "data/x/1", "1", object_key(5) + "0", "data//5"):
        with pytest.raises(ValueError):
            object_id_from_key(bad_key)


def test_concurrent_sync_calls_share_one_client(store):
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            store.put_object(0, f"t/{i}", str(i).encode())
            assert store.get_object(0, f"t/{i}") == str(i).encode()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert len(store.list_keys(0, "t/")) == 8
