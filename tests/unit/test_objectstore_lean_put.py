"""Uploads' PUTs without botocore (`lean_put.py`): botocore's SigV4 signature, the body's
bytes exactly as given (many buffers, paced ones at their pace), the same errors, retries
and metrics through `ObjectStorage`, kept-alive connections (one the store closed while idle
is replaced before the PUT goes out), and only for the buckets and settings it serves."""

from __future__ import annotations

import datetime
import os
import threading
from unittest import mock

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from prometheus_client import CollectorRegistry

from dataplane.objectstore import (
    AccessDeniedError,
    ObjectBody,
    ObjectStoreUnavailableError,
    PreconditionFailedError,
    SendPace,
    parse_bucket_uris,
)
from dataplane.objectstore.lean_put import MAX_BUFFERS_PER_SEND, LeanPutClient
from tests.support.fake_s3 import FakeStore, answer, requests_counted, store_of

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
OK = (answer(200, b"", 'ETag: "x"\r\n'), False)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def count(registry: CollectorRegistry, status: str) -> float:
    return requests_counted(registry, "put", status)


def test_signature_is_botocores():
    """The Authorization header is the one botocore's S3 SigV4 signer makes for the same PUT
    (unsigned payload; Content-Length, If-None-Match and the session token signed)."""
    uri = "0@s3://bkt?region=eu-west-1&endpoint=http://127.0.0.1:9000&accessKey=AK&secretKey=SK"
    bucket = parse_bucket_uris(uri + "&sessionToken=TOK")[0]
    client = LeanPutClient({0: bucket}, 1.0, 1.0, 4, now=lambda: NOW)
    head = client._targets[0].request_head(
        "PUT", "data/a b/7", {"content-length": "1234", "if-none-match": "*"}, NOW
    )
    text = head.decode()
    mine = dict(line.split(": ", 1) for line in text.split("\r\n")[1:] if ": " in line)
    assert text.startswith("PUT /bkt/data/a%20b/7 HTTP/1.1\r\n")

    theirs = AWSRequest(
        method="PUT",
        url="http://127.0.0.1:9000/bkt/data/a%20b/7",
        headers={"Content-Length": "1234", "If-None-Match": "*"},
    )
    theirs.context["client_config"] = BotoConfig(s3={"payload_signing_enabled": False})
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        S3SigV4Auth(Credentials("AK", "SK", "TOK"), "s3", "eu-west-1").add_auth(theirs)
    assert mine["authorization"] == theirs.headers["Authorization"]
    assert mine["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"


def test_bodies_arrive_exactly_over_one_kept_alive_connection(registry):
    """A body of more buffers than one sendmsg takes, a bytes body and an empty one arrive
    byte for byte, in order, over one connection, with their Content-Length."""
    parts = [os.urandom(97 + i % 13) for i in range(MAX_BUFFERS_PER_SEND * 2 + 5)]
    big = ObjectBody(parts)
    store = FakeStore(lambda n, path, headers: OK)
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            objects.put_object(0, "data/big", big, if_none_match=True)
            objects.put_object(0, "data/small", b"hello")
            objects.put_object(0, "data/empty", b"")
        assert store.methods == ["PUT"] * 3
        assert store.bodies == [b"".join(parts), b"hello", b""]
        assert [p for p, _ in store.requests] == [
            "/bkt/data/big",
            "/bkt/data/small",
            "/bkt/data/empty",
        ]
        assert store.requests[0][1]["if-none-match"] == "*"
        assert "if-none-match" not in store.requests[1][1]
        assert store.requests[0][1]["content-length"] == str(len(big))
        assert "botocore" not in store.requests[0][1].get("user-agent", "").lower()
        assert store.connections == 1
        assert count(registry, "ok") == 3
    finally:
        store.close()


class CountingPace(SendPace):
    """A pace that lets everything through at once and counts what was taken."""

    def __init__(self) -> None:
        super().__init__(1e12)
        self.taken: list[int] = []

    def take(self, n_bytes: int) -> None:
        self.taken.append(n_bytes)


def test_a_paced_body_is_sent_as_its_pace_hands_it_out(registry):
    pace = CountingPace()
    data = os.urandom(3 * 1024 * 1024 + 5)
    body = ObjectBody([data[: 1 << 20], data[1 << 20 :]]).paced(pace)
    store = FakeStore(lambda n, path, headers: OK)
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            objects.put_object(0, "paced", body)
        assert store.bodies == [data]
        assert sum(pace.taken) == len(data) and len(pace.taken) >= 3
    finally:
        store.close()


def test_errors_are_botocores(registry):
    """412 on a first attempt is final (PreconditionFailedError: the key exists); 503 is
    retried, and fails after max_attempts; error answers keep the connection."""
    flaky: list[int] = []

    def script(n: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool]:
        if path.endswith("/taken"):
            return answer(412, b"<Error><Code>PreconditionFailed</Code></Error>"), False
        if path.endswith("/down") or (path.endswith("/flaky") and len(flaky) < 2):
            flaky.append(n)
            return answer(503, b"<Error><Code>SlowDown</Code></Error>"), False
        return OK

    store = FakeStore(script)
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            with pytest.raises(PreconditionFailedError, match="PreconditionFailed"):
                objects.put_object(0, "taken", b"x", if_none_match=True)
            objects.put_object(0, "flaky", b"y")
            with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts.*SlowDown"):
                objects.put_object(0, "down", b"z")
        assert count(registry, "precondition_failed") == 1
        assert count(registry, "server_error") == 2 + 3
        assert count(registry, "ok") == 1
        assert store.connections == 1
    finally:
        store.close()


def test_a_store_refusing_before_the_body_is_in_is_heard(registry):
    """A store that answers 403 as soon as it has the head and closes (the body still being
    sent): the PUT fails as access denied, not as a broken connection."""
    store = FakeStore(
        lambda n, path, headers: (answer(403, b"<Error><Code>AccessDenied</Code></Error>"), True),
        answer_before_body=True,
    )
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            for _ in range(2):  # a second refusal is heard the same way
                with pytest.raises(AccessDeniedError, match="AccessDenied"):
                    objects.put_object(0, "k", os.urandom(8 * 1024 * 1024))
        assert count(registry, "access_denied") == 2
        assert store.connections == 2
    finally:
        store.close()


def test_interim_answers_and_answers_ended_by_the_connection_are_read(registry):
    """A 100 Continue the store sends unasked is passed over; a 200 without a length that
    ends with the connection (HTTP/1.0) is a success too, and that connection is not kept."""

    def script(n: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool]:
        if path.endswith("/interim"):
            return b"HTTP/1.1 100 Continue\r\n\r\n" + OK[0], False
        return b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\n", True

    store = FakeStore(script)
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            objects.put_object(0, "interim", b"a")
            objects.put_object(0, "interim", b"b")  # the same connection: kept after it
            objects.put_object(0, "closing", b"c")
            objects.put_object(0, "interim", b"d")
        assert store.bodies == [b"a", b"b", b"c", b"d"]
        assert store.connections == 2
        assert count(registry, "ok") == 4 and count(registry, "connection_error") == 0
    finally:
        store.close()


def test_a_garbled_answer_is_a_retried_connection_error(registry):
    def script(n: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool]:
        if n == 0:
            return b"HTTP/1.1 200 X\r\nContent-Length: many\r\n\r\n", True
        return OK

    store = FakeStore(script)
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            objects.put_object(0, "k", b"v")
        assert store.bodies == [b"v", b"v"]
        assert count(registry, "connection_error") == 1 and count(registry, "ok") == 1
    finally:
        store.close()


def test_an_idle_connection_the_store_closed_is_replaced_before_the_put(registry):
    """The store closes each kept-alive connection after its answer: the next PUT sees it
    closed before sending and takes a new one; no attempt failed, nothing was sent twice."""
    store = FakeStore(lambda n, path, headers: (OK[0], True))
    try:
        with store_of(store.uri(accessKey="a", secretKey="b"), registry) as objects:
            for i in range(3):
                objects.put_object(0, f"k{i}", b"v%d" % i, if_none_match=True)
                store.wait_closed(i + 1)  # the next PUT finds its idle connection closed
        assert store.bodies == [b"v0", b"v1", b"v2"]
        assert store.connections == 3
        assert count(registry, "ok") == 3 and count(registry, "connection_error") == 0
    finally:
        store.close()


def test_a_silent_store_times_out_and_is_retried(registry):
    store = FakeStore(lambda n, path, headers: (threading.Event().wait(1), None)[1])
    try:
        with store_of(
            store.uri(accessKey="a", secretKey="b"), registry, read_timeout_ms=200
        ) as objects:
            with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts.*[Tt]imeout"):
                objects.put_object(0, "silent", b"x")
        assert count(registry, "timeout") == 3
    finally:
        store.close()


def test_only_where_it_serves_exactly(registry, monkeypatch):
    """https endpoints, AWS itself and buckets without static credentials stay on botocore;
    so do signed payloads (`sign_payloads`), `lean_puts=false` and a store with its own
    client factory."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    uris = parse_bucket_uris(
        "0@s3://a?endpoint=http://127.0.0.1:1&accessKey=k&secretKey=s,"
        "1@s3://b?endpoint=https://127.0.0.1:1&accessKey=k&secretKey=s,"
        "2@s3://c?accessKey=k&secretKey=s,"
        "3@s3://d?endpoint=http://127.0.0.1:1"
    )
    client = LeanPutClient({u.bucket_id: u for u in uris}, 1.0, 1.0, 4)
    assert [client.usable(i) for i in range(4)] == [True, False, False, False]
    store = FakeStore(lambda n, path, headers: OK)
    try:
        for settings in ({"sign_payloads": True}, {"lean_puts": False}):
            with store_of(store.uri(accessKey="a", secretKey="b"), registry, **settings) as o:
                o.put_object(0, "k", b"v")
        assert all("botocore" in h.get("user-agent", "").lower() for _, h in store.requests)
        assert len(store.requests) == 2
    finally:
        store.close()
