"""ObjectStorage against a real S3 API: the embedded SeaweedFS (`weed mini`) on 127.0.0.1."""

from __future__ import annotations

import os
import random
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from dataplane.objectstore import (
    AccessDeniedError,
    InvalidRangeError,
    ObjectBody,
    ObjectNotFoundError,
    ObjectStorage,
    ObjectStoreMetrics,
    ObjectStoreUnavailableError,
    PreconditionFailedError,
    Priority,
    object_key,
    parse_bucket_uris,
)

pytestmark = pytest.mark.integration

KiB = 1024
MiB = 1024 * KiB


def uris_for(
    seaweed,
    access_key: str | None = None,
    secret_key: str | None = None,
    endpoint: str | None = None,
) -> str:
    cfg = seaweed.config
    ak = access_key or cfg.access_key
    sk = secret_key or cfg.secret_key
    ep = endpoint or cfg.endpoint
    return ",".join(
        f"{i}@s3://{bucket}?region=us-east-1&endpoint={ep}&accessKey={ak}&secretKey={sk}"
        for i, bucket in enumerate(cfg.buckets)
    )


@pytest.fixture
def store(seaweed):
    with ObjectStorage(
        uris_for(seaweed), metrics=ObjectStoreMetrics(CollectorRegistry()), merge_window_ms=20
    ) as st:
        yield st


@pytest.fixture
def prefix() -> str:
    return f"itest/{uuid.uuid4().hex}/"


def test_bucket_ids_map_to_the_right_buckets(store, seaweed, prefix):
    assert [store.bucket(i).bucket for i in (0, 1)] == ["automq-main", "automq-failover"]
    assert seaweed.config.buckets == ["automq-main", "automq-failover"]
    key = prefix + object_key(1234)
    data = os.urandom(10_000)
    store.put_object(1, key, data, if_none_match=True)
    assert store.get_object(1, key) == data
    assert store.head_object(1, key) == 10_000
    assert store.list_keys(1, prefix) == [key]
    with pytest.raises(ObjectNotFoundError):
        store.head_object(0, key)
    with pytest.raises(ObjectNotFoundError):
        store.get_range(0, key, 0, 10)
    assert store.list_keys(0, prefix) == []
    store.delete_objects(1, [key])
    assert store.list_keys(1, prefix) == []
    with pytest.raises(ObjectNotFoundError):
        store.get_object(1, key)


def test_ranged_gets_are_exact(store, prefix):
    key = prefix + "ranged"
    data = random.Random(3).randbytes(3 * MiB + 17)
    store.put_object(0, key, data)
    size = len(data)
    ranges = [
        (0, 1),
        (0, size),
        (size - 1, size),
        (1 * MiB - 5, 1 * MiB + 5),
        (512 * KiB, 1 * MiB),
        (2 * MiB + 3, 3 * MiB + 17),
    ]
    for start, end in ranges:
        assert store.get_range(0, key, start, end) == data[start:end], (start, end)
    # the same through the pool, where nearby ranges are merged
    block_ranges = [(i * 512 * KiB, min(size, (i + 1) * 512 * KiB)) for i in range(7)]
    futures = [store.get_range_async(0, key, s, e, Priority.CATCH_UP) for s, e in block_ranges]
    assert [f.result(timeout=30) for f in futures] == [data[s:e] for s, e in block_ranges]
    merged = store.metrics.registry.get_sample_value(
        "automq_object_store_merged_ranges_total", {"bucket_id": "0"}
    )
    assert merged and merged >= 2
    with pytest.raises(InvalidRangeError):
        store.get_range(0, key, size - 10, size + 10)
    with pytest.raises(InvalidRangeError):
        store.get_range(0, key, size + 10, size + 20)


def test_if_none_match_conflict(store, prefix):
    key = prefix + "once"
    store.put_object(0, key, b"first", if_none_match=True)
    with pytest.raises(PreconditionFailedError):
        store.put_object(0, key, b"second", if_none_match=True)
    with pytest.raises(PreconditionFailedError):
        store.put_object_async(0, key, b"third", if_none_match=True).result(timeout=30)
    assert store.get_object(0, key) == b"first"


def test_many_async_puts_and_reads(store, prefix):
    payloads = {prefix + object_key(i): os.urandom(64 * KiB + i) for i in range(24)}
    puts = [
        store.put_object_async(1, k, v, priority=Priority.COMPACTION) for k, v in payloads.items()
    ]
    for f in puts:
        f.result(timeout=60)
    reads = {k: store.get_range_async(1, k, 100, 64 * KiB) for k in payloads}
    for k, f in reads.items():
        assert f.result(timeout=60) == payloads[k][100 : 64 * KiB]
    assert store.delete_objects(1, list(payloads)) == 24
    assert store.list_keys(1, prefix) == []


def test_object_body_is_stored_as_its_concatenation(store, prefix):
    # the uploader's path: buffers sent one read at a time, UNSIGNED-PAYLOAD (SigV4 headers)
    parts = [os.urandom(n) for n in (5, 512 * KiB, 0, 17, 3 * MiB + 1)]
    key = prefix + object_key(7)
    store.put_object(0, key, ObjectBody([*parts[:2], bytearray(parts[2]), *parts[3:]]))
    assert store.get_object(0, key) == b"".join(parts)
    store.put_object(0, key, ObjectBody(parts), if_none_match=False)  # overwrite: same bytes
    assert store.head_object(0, key) == sum(map(len, parts))


def test_check_reachable(store):
    for bucket_id in (0, 1):
        latency_ms = store.check_reachable(bucket_id)
        assert 0 <= latency_ms < 5000


def test_wrong_credentials_give_a_clear_error(seaweed, prefix):
    wrong_secret = "WrongSecret" + uuid.uuid4().hex
    for uris in (
        uris_for(seaweed, secret_key=wrong_secret),
        uris_for(seaweed, access_key="AKNOBODY", secret_key=wrong_secret),
    ):
        with ObjectStorage(uris, metrics=ObjectStoreMetrics(CollectorRegistry())) as st:
            t0 = time.monotonic()
            with pytest.raises(AccessDeniedError, match="check the credentials") as info:
                st.put_object(0, prefix + "x", b"x")
            assert time.monotonic() - t0 < 10  # not retried
            assert "403" in str(info.value)
            assert wrong_secret not in str(info.value)
            with pytest.raises(AccessDeniedError):
                st.get_object(0, prefix + "x")
            with pytest.raises(ObjectStoreUnavailableError, match="403") as info:
                st.check_reachable(0)
            assert isinstance(info.value.__cause__, AccessDeniedError)
            assert wrong_secret not in str(info.value)


def test_unreachable_endpoint_is_bounded(seaweed, prefix, refused_port):
    port = refused_port  # connections refused on 127.0.0.1
    uris = uris_for(seaweed, endpoint=f"http://127.0.0.1:{port}")
    with ObjectStorage(
        uris,
        metrics=ObjectStoreMetrics(CollectorRegistry()),
        connect_timeout_ms=500,
        read_timeout_ms=1000,
        check_timeout_ms=500,
        max_attempts=3,
        backoff_base_ms=20,
        backoff_max_ms=100,
    ) as st:
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts") as info:
            st.get_range(0, prefix + "k", 0, 10)
        assert f"127.0.0.1:{port}" in str(info.value)
        with pytest.raises(ObjectStoreUnavailableError, match="not usable"):
            st.check_reachable(1)
        with pytest.raises(ObjectStoreUnavailableError):
            st.put_object_async(1, prefix + "k", b"x").result(timeout=30)
        assert time.monotonic() - t0 < 10
        assert seaweed.config.secret_key not in str(info.value)


def test_redacted_uri_hides_the_generated_secret(seaweed):
    for uri in parse_bucket_uris(uris_for(seaweed)):
        assert seaweed.config.secret_key not in uri.to_string()
        assert seaweed.config.secret_key not in repr(uri)
        assert uri.endpoint == seaweed.config.endpoint


def test_weed_log_has_no_failing_plugin_worker(seaweed):
    """weed mini's plugin worker dials the admin gRPC port as admin port + 10000: with the
    ports as configured it connects, instead of logging a refused connection every 5 s."""
    from dataplane.objectstore.seaweed import ADMIN_GRPC_OFFSET

    ports = seaweed.config.ports
    assert ports["admin_grpc"] == ports["admin"] + ADMIN_GRPC_OFFSET
    log = seaweed.config.data_dir / "weed.log"
    started = log.stat().st_ctime
    time.sleep(max(0.0, started + 7 - time.time()))  # past the worker's first retries
    text = log.read_text(errors="replace")
    assert "connection refused" not in text, text[-2000:]
