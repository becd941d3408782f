"""Retries: injected 5xx/timeouts are retried and then succeed; persistent failures end in
ObjectStoreUnavailableError after exactly max_attempts; real timeouts on a silent socket."""

from __future__ import annotations

import socket
import time

import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config as BotoConfig
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from moto import mock_aws
from prometheus_client import CollectorRegistry

from dataplane.objectstore import (
    AccessDeniedError,
    BucketURI,
    ObjectStorage,
    ObjectStoreError,
    ObjectStoreMetrics,
    ObjectStoreUnavailableError,
    PreconditionFailedError,
)
from dataplane.objectstore.clients import default_client_factory
from dataplane.objectstore.retry import RetryPolicy, classify

URIS = "0@s3://automq-main?region=us-east-1"


class _RawBody:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: object):
        yield self._body


def error_response(request, status: int, code: str) -> AWSResponse:
    body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
    return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _RawBody(body))


class Injector:
    """botocore before-send hook: fail the first `failures` sends of one operation.

    Registered first, so its response (or exception) replaces the real (moto) send.
    """

    def __init__(self, failures: int, kind: str) -> None:
        self.failures = failures
        self.kind = kind
        self.sends = 0

    def __call__(self, request, **_: object):
        self.sends += 1
        if self.sends > self.failures:
            return None  # let the request through
        if self.kind == "503":
            return error_response(request, 503, "SlowDown")
        if self.kind == "500":
            return error_response(request, 500, "InternalError")
        if self.kind == "403":
            return error_response(request, 403, "SignatureDoesNotMatch")
        if self.kind == "timeout":
            raise ReadTimeoutError(endpoint_url=request.url)
        if self.kind == "refused":
            raise EndpointConnectionError(endpoint_url=request.url)
        raise AssertionError(self.kind)


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        s3 = default_client_factory(BucketURI(bucket_id=0, bucket="automq-main"), BotoConfig())
        s3.create_bucket(Bucket="automq-main")
        s3.put_object(Bucket="automq-main", Key="obj", Body=bytes(range(256)) * 40)
        yield s3


@pytest.fixture
def registry():
    return CollectorRegistry()


def make_store(registry, **overrides) -> ObjectStorage:
    options = dict(max_attempts=4, backoff_base_ms=1, backoff_max_ms=4, merge_window_ms=0)
    options.update(overrides)
    return ObjectStorage(URIS, metrics=ObjectStoreMetrics(registry), **options)


def inject(store: ObjectStorage, operation: str, injector: Injector) -> Injector:
    store.boto3_client(0).meta.events.register_first(f"before-send.s3.{operation}", injector)
    return injector


def count(registry, op: str, status: str) -> float:
    return (
        registry.get_sample_value(
            "automq_object_store_requests_total", {"op": op, "bucket_id": "0", "status": status}
        )
        or 0.0
    )


EXPECTED = (bytes(range(256)) * 40)[100:300]


@pytest.mark.parametrize(
    "kind, status",
    [
        ("503", "server_error"),
        ("500", "server_error"),
        ("timeout", "timeout"),
        ("refused", "connection_error"),
    ],
)
def test_transient_failures_are_retried_then_succeed(aws, registry, kind, status):
    with make_store(registry) as store:
        injector = inject(store, "GetObject", Injector(failures=3, kind=kind))
        assert store.get_range(0, "obj", 100, 300) == EXPECTED
        assert injector.sends == 4  # 3 failures + the success, within max_attempts=4
        assert count(registry, "get", status) == 3
        assert count(registry, "get", "ok") == 1


def test_retry_applies_to_every_operation(aws, registry):
    with make_store(registry) as store:
        injectors = {
            op: inject(store, op, Injector(failures=1, kind="503"))
            for op in ("PutObject", "HeadObject", "DeleteObjects", "ListObjectsV2")
        }
        store.put_object(0, "new", b"payload")
        assert store.head_object(0, "new") == 7
        assert store.list_keys(0) == ["new", "obj"]
        store.delete_objects(0, ["new"])
        assert {op: i.sends for op, i in injectors.items()} == {
            "PutObject": 2,
            "HeadObject": 2,
            "DeleteObjects": 2,
            "ListObjectsV2": 2,
        }
        assert aws.list_objects_v2(Bucket="automq-main")["KeyCount"] == 1


def test_async_reads_retry_too(aws, registry):
    # the five ranges fill merge_max_bytes (500): the batch goes out as the fifth joins, not
    # at the end of a short window a stalled submitting thread could outlast (two GETs)
    with make_store(registry, merge_window_ms=1_000, merge_max_bytes=500) as store:
        injector = inject(store, "GetObject", Injector(failures=2, kind="timeout"))
        futures = [store.get_range_async(0, "obj", i * 100, i * 100 + 100) for i in range(5)]
        data = bytes(range(256)) * 40
        assert [f.result(timeout=10) for f in futures] == [
            data[i * 100 : i * 100 + 100] for i in range(5)
        ]
        assert injector.sends == 3  # one merged GET, retried twice


@pytest.mark.parametrize("kind", ["503", "timeout", "refused"])
def test_persistent_failure_raises_unavailable_after_max_attempts(aws, registry, kind):
    with make_store(registry, max_attempts=3) as store:
        injector = inject(store, "GetObject", Injector(failures=10**6, kind=kind))
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts") as info:
            store.get_range(0, "obj", 0, 10)
        assert time.monotonic() - t0 < 5.0
        assert injector.sends == 3
        assert info.value.op == "get" and info.value.bucket_id == 0 and info.value.key == "obj"
        assert "bucket 0 (s3://automq-main" in str(info.value)
        # and through the pool
        with pytest.raises(ObjectStoreUnavailableError):
            store.get_range_async(0, "obj", 0, 10).result(timeout=10)
        assert injector.sends == 6


def test_client_errors_are_not_retried(aws, registry):
    with make_store(registry) as store:
        injector = inject(store, "GetObject", Injector(failures=10, kind="403"))
        with pytest.raises(AccessDeniedError, match="check the credentials"):
            store.get_object(0, "obj")
        assert injector.sends == 1
        assert count(registry, "get", "access_denied") == 1


def test_put_retry_meeting_its_own_write_succeeds(aws, registry):
    """First attempt lands but its response is lost; the retry's 412 is our own object."""
    with make_store(registry) as store:
        sends = []

        def lose_response(request, **_):  # runs after moto stored the object
            sends.append(1)
            if len(sends) == 1:
                raise ReadTimeoutError(endpoint_url=request.url)

        store.boto3_client(0).meta.events.register("before-send.s3.PutObject", lose_response)
        store.put_object(0, "ambiguous", b"mine", if_none_match=True)
        assert len(sends) == 2
        assert store.get_object(0, "ambiguous") == b"mine"
        # a different writer's object is still a conflict, even after an ambiguous attempt
        sends.clear()
        with pytest.raises(PreconditionFailedError):
            store.put_object(0, "ambiguous", b"theirs", if_none_match=True)
        assert len(sends) == 2


def test_read_timeout_on_a_silent_server_is_bounded(registry):
    """A listener that accepts (kernel backlog) but never answers: real read timeouts."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(32)
    port = listener.getsockname()[1]
    try:
        store = ObjectStorage(
            f"0@s3://automq-main?endpoint=http://127.0.0.1:{port}&accessKey=a&secretKey=b",
            metrics=ObjectStoreMetrics(registry),
            connect_timeout_ms=200,
            read_timeout_ms=200,
            check_timeout_ms=200,
            max_attempts=2,
            backoff_base_ms=1,
            backoff_max_ms=2,
        )
        with store:
            t0 = time.monotonic()
            with pytest.raises(ObjectStoreUnavailableError, match="after 2 attempts.*[Tt]imeout"):
                store.get_range(0, "obj", 0, 10)
            assert time.monotonic() - t0 < 3.0
            assert count(registry, "get", "timeout") == 2
            with pytest.raises(ObjectStoreUnavailableError, match="not usable"):
                store.check_reachable(0)
    finally:
        listener.close()


def test_unreachable_endpoint_fails_fast(registry, refused_port):
    port = refused_port  # nothing listens there
    with ObjectStorage(
        f"0@s3://automq-main?endpoint=http://127.0.0.1:{port}&accessKey=a&secretKey=b",
        metrics=ObjectStoreMetrics(registry),
        max_attempts=3,
        backoff_base_ms=1,
        backoff_max_ms=2,
    ) as store:
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreUnavailableError, match="connect") as info:
            store.check_reachable(0)
        assert f"127.0.0.1:{port}" in str(info.value)
        with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts"):
            store.put_object(0, "k", b"x")
        assert time.monotonic() - t0 < 3.0


def test_backoff_grows_and_is_bounded():
    policy = RetryPolicy(max_attempts=10, backoff_base_ms=100, backoff_max_ms=1000)

    class Fixed:
        def __init__(self, r: float) -> None:
            self.r = r

        def random(self) -> float:
            return self.r

    lows = [policy.backoff_s(a, Fixed(0.0)) for a in range(1, 8)]
    highs = [policy.backoff_s(a, Fixed(1.0)) for a in range(1, 8)]
    assert lows == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5])
    assert highs == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_classification_table():
    from botocore.exceptions import ClientError, NoCredentialsError

    def client_error(status: int, code: str) -> ClientError:
        return ClientError(
            {
                "Error": {"Code": code, "Message": "m"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            "GetObject",
        )

    cases = {
        (404, "NoSuchKey"): ("not_found", False),
        (412, "PreconditionFailed"): ("precondition_failed", False),
        (416, "InvalidRange"): ("invalid_range", False),
        (403, "AccessDenied"): ("access_denied", False),
        (400, "RequestTimeout"): ("server_error", True),
        (409, "ConditionalRequestConflict"): ("server_error", True),
        (429, "TooManyRequests"): ("server_error", True),
        (503, "SlowDown"): ("server_error", True),
        (400, "InvalidArgument"): ("client_error", False),
        (404, "NoSuchBucket"): ("client_error", False),
    }
    for (status, code), expected in cases.items():
        failure = classify(client_error(status, code))
        assert (failure.status, failure.retryable) == expected, (status, code)
    assert classify(NoCredentialsError()).error_type is AccessDeniedError
    assert classify(ValueError("bug")).error_type is ObjectStoreError
    assert not classify(ValueError("bug")).retryable
