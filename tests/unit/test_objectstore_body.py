"""`ObjectBody`: an object sent as its list of buffers (never joined). Its reader yields the
concatenation at any read size and seek; a PUT retried after a failure in the middle of the
body sends the same bytes from the start; payloads are sent as UNSIGNED-PAYLOAD by default."""

from __future__ import annotations

import io
import random

import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ReadTimeoutError
from moto import mock_aws
from prometheus_client import CollectorRegistry

from dataplane.objectstore import BucketURI, ObjectBody, ObjectStorage, ObjectStoreMetrics
from dataplane.objectstore.clients import default_client_factory

URIS = "0@s3://automq-main?region=us-east-1"


def parts_of(seed: int) -> list[bytes | bytearray]:
    rng = random.Random(seed)
    out: list[bytes | bytearray] = []
    for _ in range(20):
        part = rng.randbytes(rng.choice([0, 1, 31, 4096, 70_000]))
        out.append(bytearray(part) if rng.random() < 0.5 else part)
    return out


def test_reader_yields_the_concatenation_at_any_read_size() -> None:
    parts = parts_of(1)
    whole = b"".join(parts)
    body = ObjectBody(parts)
    assert len(body) == len(whole) and body.tobytes() == whole
    for size in (1, 7, 16384, 1 << 20):
        reader = body.reader()
        got = bytearray()
        while chunk := reader.read(size):
            assert 0 < len(chunk) <= size
            got += chunk
        assert got == whole and reader.tell() == len(whole)
    assert body.reader().read() == whole


def test_reader_seeks_like_a_file() -> None:
    parts = parts_of(2)
    whole = b"".join(parts)
    reader = ObjectBody(parts).reader()
    assert reader.seek(0, io.SEEK_END) == len(whole)  # how botocore learns Content-Length
    assert reader.read(10) == b""
    for pos in (0, 1, 4095, 4097, len(whole) // 2, len(whole) - 1):
        reader.seek(pos)
        assert reader.tell() == pos
        got = bytearray()
        while len(got) < 100 and (chunk := reader.read(100 - len(got))):
            got += chunk  # short reads stop at a buffer's end
        assert got == whole[pos : pos + 100]
    reader.seek(-5, io.SEEK_END)
    assert reader.read() == whole[-5:]
    with pytest.raises(ValueError):
        reader.seek(-1)


def test_equals_and_md5() -> None:
    import hashlib

    parts = parts_of(3)
    whole = b"".join(parts)
    body = ObjectBody(parts)
    assert body.md5_hex() == hashlib.md5(whole).hexdigest()
    assert body.equals(whole)
    assert not body.equals(whole[:-1] + bytes([whole[-1] ^ 1]))
    assert not body.equals(whole + b"x")


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        s3 = default_client_factory(BucketURI(bucket_id=0, bucket="automq-main"), BotoConfig())
        s3.create_bucket(Bucket="automq-main")
        yield s3


class FailMidBody:
    """before-send hook: the first send reads part of the body, then times out."""

    def __init__(self) -> None:
        self.sends = 0
        self.headers: list[dict] = []

    def __call__(self, request, **_: object):
        self.sends += 1
        self.headers.append(
            {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        )
        if self.sends == 1:
            request.body.read(50_000)  # the body was partly on the wire
            raise ReadTimeoutError(endpoint_url=request.url)
        return None


def test_a_retried_put_resends_the_same_bytes(aws) -> None:
    parts = parts_of(4)
    whole = b"".join(parts)
    store = ObjectStorage(
        URIS,
        metrics=ObjectStoreMetrics(CollectorRegistry()),
        max_attempts=3,
        backoff_base_ms=1,
        backoff_max_ms=2,
        merge_window_ms=0,
    )
    with store:
        hook = FailMidBody()
        store.boto3_client(0).meta.events.register_first("before-send.s3.PutObject", hook)
        store.put_object(0, "obj", ObjectBody(parts))
        assert hook.sends == 2
        assert store.get_object(0, "obj") == whole
        assert {h["Content-Length"] for h in hook.headers} == {str(len(whole))}
        # SigV4 without hashing the payload first
        assert hook.headers[1]["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
        assert "AWS4-HMAC-SHA256" in hook.headers[1]["Authorization"]


def test_payload_signing_can_be_turned_on(aws) -> None:
    store = ObjectStorage(
        URIS, metrics=ObjectStoreMetrics(CollectorRegistry()), merge_window_ms=0, sign_payloads=True
    )
    with store:
        hook = FailMidBody()
        hook.sends = 1  # let every send through
        store.boto3_client(0).meta.events.register_first("before-send.s3.PutObject", hook)
        store.put_object(0, "obj", ObjectBody([b"abc", b"def"]))
        assert hook.headers[0]["X-Amz-Content-SHA256"] not in ("UNSIGNED-PAYLOAD", None)
        assert store.get_object(0, "obj") == b"abcdef"


def test_a_streamed_put_sends_its_body_without_waiting_for_100_continue(aws) -> None:
    """botocore adds `Expect: 100-continue` to file-like bodies and waits up to 1 s for the
    interim answer; a late one was misparsed and hung the PUT for its read timeout."""
    store = ObjectStorage(URIS, metrics=ObjectStoreMetrics(CollectorRegistry()), merge_window_ms=0)
    with store:
        hook = FailMidBody()
        hook.sends = 1  # let every send through
        store.boto3_client(0).meta.events.register_first("before-send.s3.PutObject", hook)
        store.put_object(0, "obj", ObjectBody([b"abc", b"def"]))
        assert "Expect" not in hook.headers[0], hook.headers[0]
        assert store.get_object(0, "obj") == b"abcdef"


class _FakeClock:
    """A clock and the event a pace waits on: waiting advances the clock."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept_s = 0.0
        self.unpaced = False

    def monotonic(self) -> float:
        return self.now_s

    def wait(self, seconds: float) -> bool:
        if not self.unpaced:
            self.now_s += seconds
            self.slept_s += seconds
        return self.unpaced

    def set(self) -> None:
        self.unpaced = True


def test_paced_bodies_hand_out_their_bytes_at_their_shared_rate() -> None:
    """Paced readers yield the same bytes, but no faster than their pace once the first
    PACE_BURST_BYTES are out, counted over every body sharing it (objects sent in
    parallel); once unpaced (a flush, a filling WAL) and unpaced bodies never wait."""
    from dataplane.objectstore import SendPace

    clock = _FakeClock()
    parts = [bytes([i]) * (512 * 1024) for i in range(10)]  # 5 MiB
    pace = SendPace(1024 * 1024, clock=clock.monotonic, unpaced=clock)
    reader = ObjectBody(parts).paced(pace).reader()
    got = bytearray()
    while chunk := reader.read(64 * 1024):
        got += chunk
    assert bytes(got) == b"".join(parts)
    assert clock.slept_s == pytest.approx(4.0)  # (5 - 1) MiB at 1 MiB/s
    other = ObjectBody(parts[:2]).paced(pace).reader()  # 1 MiB more on the same pace
    while other.read(64 * 1024):
        pass
    assert clock.slept_s == pytest.approx(5.0)
    before = clock.slept_s
    pace.unpace()
    again = ObjectBody(parts).paced(pace).reader()
    while again.read(64 * 1024):
        pass
    unpaced = ObjectBody(parts).reader()
    while unpaced.read(64 * 1024):
        pass
    assert clock.slept_s == before
    with pytest.raises(ValueError):
        SendPace(0)


def test_a_paced_body_read_in_small_blocks_waits_a_few_times_a_second_not_per_block() -> None:
    """An HTTP client reads a body 16 KiB at a time: a pace of 16 MiB/s makes it wait about
    every PACE_SLACK_S (each wait a thread sleep and wake-up), not before every block, and
    it is never more than PACE_SLACK_S of bytes ahead of its rate."""
    from dataplane.objectstore import SendPace
    from dataplane.objectstore.body import PACE_BURST_BYTES, PACE_SLACK_S

    class CountingClock(_FakeClock):
        waits = 0

        def wait(self, seconds: float) -> bool:
            self.waits += 1
            return super().wait(seconds)

    clock = CountingClock()
    rate = 16 * 1024 * 1024
    pace = SendPace(rate, clock=clock.monotonic, unpaced=clock)
    reader = ObjectBody([bytes(5 * 1024 * 1024)]).paced(pace).reader()
    sent = 0
    while chunk := reader.read(16 * 1024):
        sent += len(chunk)
        on_pace_s = (sent - PACE_BURST_BYTES) / rate
        assert clock.now_s - 100.0 >= on_pace_s - PACE_SLACK_S - 1e-9  # never far ahead
    paced_s = (5 - 1) / 16
    assert paced_s - PACE_SLACK_S <= clock.slept_s <= paced_s
    assert clock.waits <= paced_s / PACE_SLACK_S + 1  # 256 blocks, a handful of waits


def test_regular_uploads_are_sent_at_twice_their_arrival_rate_unless_the_wal_fills() -> None:
    from dataplane.s3stream.uploader import upload_send_rate

    mib = 1024 * 1024
    assert upload_send_rate(50 * mib, 5.0, 16 * mib, 0.1) == 20 * mib  # 10 MiB/s arrived
    assert upload_send_rate(5 * mib, 5.0, 16 * mib, 0.1) == 16 * mib  # the floor
    assert upload_send_rate(50 * mib, 5.0, 16 * mib, 0.5) == 0  # the WAL half full: at once
    assert upload_send_rate(50 * mib, 5.0, 0, 0.1) == 0  # pacing off
