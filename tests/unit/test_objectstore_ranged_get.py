"""The catch-up read's ranged GETs without botocore (`ranged_get.py`): the same SigV4
signature as botocore's, the same errors, retries and metrics through `ObjectStorage`, kept-
alive connections (reopened once when the store closed one meanwhile), and only for the
buckets it can serve exactly."""

from __future__ import annotations

import datetime
import threading
import weakref
from unittest import mock

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from prometheus_client import CollectorRegistry

from dataplane.formats.buffer_pool import BufferPool
from dataplane.objectstore import (
    ObjectNotFoundError,
    ObjectStorage,
    ObjectStoreUnavailableError,
    parse_bucket_uris,
)
from dataplane.objectstore.clients import default_client_factory
from dataplane.objectstore.ranged_get import RangedGetClient
from tests.support.fake_s3 import FakeStore, answer, requests_counted, store_of

OBJECT = bytes(range(256)) * 64  # 16 KiB
NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def ranged(headers: dict[str, str]) -> bytes:
    first, last = headers["range"].removeprefix("bytes=").split("-")
    return answer(
        206,
        OBJECT[int(first) : int(last) + 1],
        f"Content-Range: bytes {first}-{last}/{len(OBJECT)}\r\n",
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def count(registry: CollectorRegistry, status: str) -> float:
    return requests_counted(registry, "get", status)


def test_signature_is_botocores():
    """The Authorization header is the one botocore's S3 SigV4 signer makes for the same GET
    (unsigned payload, session token signed)."""
    uri = "0@s3://bkt?region=eu-west-1&endpoint=http://127.0.0.1:9000&accessKey=AK&secretKey=SK"
    bucket = parse_bucket_uris(uri + "&sessionToken=TOK")[0]
    client = RangedGetClient({0: bucket}, 1.0, 1.0, 4, now=lambda: NOW)
    request = client._request(client._targets[0], "data/a b/7", 100, 200).decode()
    mine = dict(line.split(": ", 1) for line in request.split("\r\n")[1:] if ": " in line)
    assert request.startswith("GET /bkt/data/a%20b/7 HTTP/1.1\r\n")

    theirs = AWSRequest(
        method="GET",
        url="http://127.0.0.1:9000/bkt/data/a%20b/7",
        headers={"Range": "bytes=100-199"},
    )
    theirs.context["client_config"] = BotoConfig(s3={"payload_signing_enabled": False})
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        S3SigV4Auth(Credentials("AK", "SK", "TOK"), "s3", "eu-west-1").add_auth(theirs)
    assert mine["authorization"] == theirs.headers["Authorization"]
    assert mine["x-amz-date"] == theirs.headers["X-Amz-Date"] == "20260102T030405Z"


def test_gets_go_over_one_kept_alive_connection_into_read_only_buffers(registry):
    store = FakeStore(lambda n, path, headers: (ranged(headers), False))
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            first = objects.get_range_async(0, "data/k", 10, 4000, merge=False).result(10)
            second = objects.get_range_async(0, "data/k", 5000, 16384, merge=False).result(10)
        assert bytes(first) == OBJECT[10:4000] and bytes(second) == OBJECT[5000:16384]
        assert isinstance(first, memoryview) and first.readonly
        assert store.connections == 1
        assert [p for p, _ in store.requests] == ["/bkt/data/k", "/bkt/data/k"]
        assert store.requests[0][1]["authorization"].startswith("AWS4-HMAC-SHA256 Credential=a/")
        assert count(registry, "ok") == 2
    finally:
        store.close()


def test_sync_range_reads_go_lean_too_and_return_bytes(registry):
    """`get_range` (a catch-up's object index reads) takes the same lean GET, and returns
    bytes of its own: the pooled buffer is free again at once."""
    store = FakeStore(lambda n, path, headers: (ranged(headers), False))
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            got = objects.get_range(0, "data/k", 100, 9000)
            again = objects.get_range(0, "data/k", 0, 16384)
        assert isinstance(got, bytes) and got == OBJECT[100:9000]
        assert again == OBJECT
        assert store.connections == 1
        assert "botocore" not in store.requests[0][1].get("user-agent", "").lower()
        assert count(registry, "ok") == 2
    finally:
        store.close()


def test_a_store_ignoring_the_range_is_cut_to_it(registry):
    store = FakeStore(lambda n, path, headers: (answer(200, OBJECT), False))
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            got = objects.get_range_async(0, "k", 300, 700, merge=False).result(10)
        assert bytes(got) == OBJECT[300:700]
    finally:
        store.close()


def test_errors_are_botocores(registry):
    """404 NoSuchKey is final (ObjectNotFoundError); 503 SlowDown is retried, and fails
    after max_attempts; error answers keep the connection."""
    flaky: list[int] = []

    def script(n: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool]:
        if path.endswith("/missing"):
            body = b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>"
            return answer(404, body), False
        if path.endswith("/down") or (path.endswith("/flaky") and len(flaky) < 2):
            flaky.append(n)
            return answer(503, b"<Error><Code>SlowDown</Code></Error>"), False
        return ranged(headers), False

    store = FakeStore(script)
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            with pytest.raises(ObjectNotFoundError, match="NoSuchKey"):
                objects.get_range_async(0, "missing", 0, 10, merge=False).result(10)
            got = objects.get_range_async(0, "flaky", 0, 10, merge=False).result(10)
            assert bytes(got) == OBJECT[:10]
            with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts.*SlowDown"):
                objects.get_range_async(0, "down", 0, 10, merge=False).result(10)
        assert count(registry, "not_found") == 1
        assert count(registry, "server_error") == 2 + 3
        assert count(registry, "ok") == 1
        assert store.connections == 1
    finally:
        store.close()


def test_a_connection_the_store_closed_is_reopened_at_once(registry):
    """The store closes each kept-alive connection after its answer without saying so: the
    next GET finds it closed before any answer byte and reopens it; no attempt failed."""
    store = FakeStore(lambda n, path, headers: (ranged(headers), True))
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            for i in range(3):
                got = objects.get_range_async(0, "k", i, i + 100, merge=False).result(10)
                assert bytes(got) == OBJECT[i : i + 100]
        assert store.connections == 3
        assert count(registry, "ok") == 3 and count(registry, "connection_error") == 0
    finally:
        store.close()


def test_cut_bodies_and_a_silent_store_are_retried_then_fail(registry):
    """A body cut short by a closed connection is a retried connection error, one that
    stops coming a retried timeout; a store that never answers fails after max_attempts
    timeouts of read_timeout_ms each."""
    cut: list[str] = []

    def script(n: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool] | None:
        if path.endswith("/silent"):
            threading.Event().wait(1)
            return None
        if path not in cut:
            cut.append(path)
            full = ranged(headers)
            # /closed: the connection closes after part of the body; /stalled: it stays open
            return full[: len(full) - 50], path.endswith("/closed")
        return ranged(headers), False

    store = FakeStore(script)
    try:
        with store_of(
            store.uri(accessKey="a", secretKey="b"), registry, read_timeout_ms=200
        ) as objects:
            for key in ("closed", "stalled"):
                got = objects.get_range_async(0, key, 0, 1000, merge=False).result(10)
                assert bytes(got) == OBJECT[:1000]
            with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts.*[Tt]imeout"):
                objects.get_range_async(0, "silent", 0, 10, merge=False).result(10)
        assert count(registry, "connection_error") == 1
        assert count(registry, "timeout") == 1 + 3
    finally:
        store.close()


def test_only_buckets_it_serves_exactly(registry, monkeypatch):
    """https endpoints, AWS itself, and buckets without static credentials (in the URI or the
    environment) stay on botocore, and so does every bucket of a store given its own client
    factory (tests, mocks)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AUTOMQ_S3_ACCESS_KEY_3"):
        monkeypatch.delenv(name, raising=False)
    uris = parse_bucket_uris(
        "0@s3://a?endpoint=http://127.0.0.1:1&accessKey=k&secretKey=s,"
        "1@s3://b?endpoint=https://127.0.0.1:1&accessKey=k&secretKey=s,"
        "2@s3://c?accessKey=k&secretKey=s,"
        "3@s3://d?endpoint=http://127.0.0.1:1"
    )
    client = RangedGetClient({u.bucket_id: u for u in uris}, 1.0, 1.0, 4)
    assert [client.usable(i) for i in range(4)] == [True, False, False, False]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    client = RangedGetClient({u.bucket_id: u for u in uris}, 1.0, 1.0, 4)
    assert [client.usable(i) for i in range(4)] == [True, False, False, True]
    store = FakeStore(lambda n, path, headers: (ranged(headers), False))
    try:
        with ObjectStorage(
            store.uri(accessKey="a", secretKey="b"),
            client_factory=default_client_factory,
            max_attempts=1,
        ) as objects:
            objects.get_range_async(0, "k", 0, 10, merge=False).result(10)
        assert "botocore" in store.requests[0][1].get("user-agent", "").lower()
        with ObjectStorage(store.uri(accessKey="a", secretKey="b"), lean_range_gets=False) as o:
            o.get_range_async(0, "k", 0, 10, merge=False).result(10)
        assert "botocore" in store.requests[1][1].get("user-agent", "").lower()
    finally:
        store.close()


def test_body_buffers_are_used_again_only_once_no_view_holds_them():
    pool = BufferPool(max_bytes=1 << 20)
    first = pool.take(1000)
    payload = memoryview(first)[10:20].toreadonly()  # e.g. a record payload in an answer
    del first
    second = pool.take(1000)
    assert payload.obj is not second  # the first is still read: not handed out again
    del payload, second
    third = pool.take(900)  # a free one of at most twice the size serves
    assert len(third) == 1000
    del third
    assert len(pool.take(100)) == 100  # not one ten times the size
    # bounded: the oldest are forgotten past max_bytes
    held = [pool.take(300_000) for _ in range(5)]
    assert sum(len(b) for b in pool._buffers) <= 1 << 20
    assert len(held) == 5


def test_reused_body_buffers_carry_only_their_own_body(registry):
    """Bodies read into reused buffers are exactly the ranges asked for, also a shorter one
    in a longer buffer."""
    store = FakeStore(lambda n, path, headers: (ranged(headers), False))
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            for start, end in [(0, 8000), (100, 4200), (5000, 9000), (0, 16384), (7, 9000)]:
                got = objects.get_range_async(0, "k", start, end, merge=False).result(10)
                assert bytes(got) == OBJECT[start:end]
                del got
    finally:
        store.close()


def test_large_bodies_share_power_of_two_buffers():
    """Bodies from 1 MiB on get buffers of a power-of-two size, so a free buffer of the
    class serves the next body whatever its exact size (catch-up GETs are 2-8 MiB)."""
    mib = 1 << 20
    pool = BufferPool(max_bytes=64 * mib)
    first = pool.take(5 * mib + 123)
    assert len(first) == 8 * mib
    first[0] = 7  # a mark: the pool does not clear a buffer it hands out again
    held = weakref.ref(first)
    del first
    second = pool.take(7 * mib)
    assert second is held() and second[0] == 7  # the same 8 MiB buffer, not a fresh one
    third = pool.take(5 * mib)  # the first one is in use: a fresh one of the class
    assert third is not second and len(third) == 8 * mib
    del second, third
    assert len(pool.take(3 * mib)) == 4 * mib  # not one of more than twice the body
    assert len(pool.take(1000)) == 1000  # a small body gets its own size
    # bounded by the classes' whole sizes
    held_buffers = [pool.take(6 * mib) for _ in range(10)]
    assert sum(len(b) for b in pool._buffers) <= 64 * mib
    assert len(held_buffers) == 10


def test_large_bodies_in_reused_class_buffers_are_exactly_their_range(registry):
    """Bodies of a few MiB read into class buffers used again (a shorter one after a longer
    one) are exactly the ranges asked for, read-only."""
    big = bytes(range(251)) * (3 * 1024 * 1024 // 251 + 1)

    def script(n: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool]:
        first, last = headers["range"].removeprefix("bytes=").split("-")
        return (
            answer(
                206,
                big[int(first) : int(last) + 1],
                f"Content-Range: bytes {first}-{last}/{len(big)}\r\n",
            ),
            False,
        )

    store = FakeStore(script)
    mib = 1 << 20
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            for start, end in [(0, 3 * mib), (100, 2 * mib + 5), (mib + 7, 3 * mib), (0, 9000)]:
                got = objects.get_range_async(0, "k", start, end, merge=False).result(10)
                assert got.readonly and bytes(got) == big[start:end]
                del got
    finally:
        store.close()
