"""The Kafka listener under hostile input (issue 33): 20,000 mutated request frames over real
sockets to the in-process broker's APIs behind a real `KafkaServerThread` get an answer or a
closed connection, never an error log line (an unhandled exception); and a thousand idle
connections cost no read buffer each: the process's RSS after they close is within 10% of
before, its thread count does not move."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import socket
import struct
import time
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from dataplane.kafka.codec import encode_request
from dataplane.kafka.registry import ApiRegistry
from dataplane.kafka.server import KafkaServerThread
from tests.unit.inprocess_broker import inprocess_broker
from tests.unit.test_kafka_fuzz import VALID_FRAMES, _fetch, _produce

pytestmark = pytest.mark.integration

FRAMES = 20_000
CLIENTS = 4
SEED = 33
PROBE_ID = 0x7ABC0000  # correlation ids of the ApiVersions probes that follow each frame
SLOW_ANSWER_S = 2.0  # a frame still unanswered (a mutated Fetch's long-poll): next socket
IDLE_CONNECTIONS = 1_000


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


def _null_array_frames() -> list[bytes]:
    """Fetches with a null topics / partitions array (Kafka's schema forbids both)."""
    frames = []
    for version in (4, 12, 16):
        whole = _fetch(version)
        no_topics = FetchRequest[version](**{**whole.to_dict(), "topics": None})
        frames.append(encode_request(no_topics, correlation_id=1, client_id="fuzz")[4:])
        topic = FetchRequest.FetchTopic(topic="fuzz", partitions=None)
        if version >= 13:
            topic = FetchRequest.FetchTopic(topic_id=None, partitions=None)
        no_parts = FetchRequest[version](**{**whole.to_dict(), "topics": [topic]})
        frames.append(encode_request(no_parts, correlation_id=2, client_id="fuzz")[4:])
    return frames


def _corpus() -> list[bytes]:
    extra = [
        encode_request(req, correlation_id=i, client_id="fuzz")[4:]
        for i, req in enumerate(
            [
                MetadataRequest[1](topics=[MetadataRequest.MetadataRequestTopic(name="fuzz")]),
                _produce(9),
            ]
        )
    ]
    return VALID_FRAMES + extra + _null_array_frames()


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["flip", "set", "truncate", "insert", "delete", "int", "null"])
        pos = rng.randrange(max(len(data), 1))
        if kind == "flip" and data:
            data[pos] ^= 1 << rng.randrange(8)
        elif kind == "set" and data:
            data[pos] = rng.choice([0x00, 0x7F, 0x80, 0xFF, 0x01])
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == "delete":
            del data[pos : pos + rng.randint(1, 8)]
        elif kind in ("int", "null") and len(data) >= pos + 4:
            value = -1 if kind == "null" else rng.choice([-2, 0x7FFFFFFF, 0x10000, 1000, 0])
            data[pos : pos + 4] = struct.pack(">i", value)
    return bytes(data)


def _probe(correlation_id: int) -> bytes:
    return encode_request(ApiVersionsRequest[0](), correlation_id, client_id="probe")


class _Client:
    """One fuzzing connection: a frame, then a probe; answered when the probe's answer comes."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            self.buf = b""
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def send(self, wire: bytes, probe_id: int) -> str:
        """ "answered", "closed" or "slow" (then the socket is dropped)."""
        sock = self._connect()
        try:
            sock.sendall(wire + _probe(probe_id))
            deadline = time.monotonic() + SLOW_ANSWER_S
            while True:
                while len(self.buf) >= 8:
                    size = struct.unpack_from(">i", self.buf)[0]
                    if len(self.buf) < 4 + size:
                        break
                    correlation_id = struct.unpack_from(">i", self.buf, 4)[0]
                    self.buf = self.buf[4 + size :]
                    if correlation_id == probe_id:
                        return "answered"
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    return "slow"
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    self.close()
                    return "closed"
                self.buf += chunk
        except TimeoutError:
            self.close()
            return "slow"
        except OSError:
            self.close()
            return "closed"


def _registry(apis) -> ApiRegistry:
    registry = ApiRegistry()
    for cls, lo, hi, handler in apis.registrations():
        registry.register(cls, lo, hi, handler)
    return registry


def _fuzz(port: int, frames: int) -> dict[str, int]:
    import threading

    outcomes: dict[str, int] = {"answered": 0, "closed": 0, "slow": 0, "framing": 0}
    lock = threading.Lock()
    corpus = _corpus()

    def run(worker: int) -> None:
        rng = random.Random(SEED * 100 + worker)
        client = _Client(port)
        for i in range(worker, frames, CLIENTS):
            frame = _mutate(rng, rng.choice(corpus))
            if rng.random() < 0.02:
                # a lying size prefix: the server waits for the rest, then sees EOF
                wire = struct.pack(">i", rng.choice([-1, len(frame) + 100, 2**31 - 1])) + frame
                sock = client._connect()
                sock.sendall(wire)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(10)
                while sock.recv(65536):
                    pass
                client.close()
                outcome = "framing"
            else:
                outcome = client.send(struct.pack(">i", len(frame)) + frame, PROBE_ID + i)
            with lock:
                outcomes[outcome] += 1
        client.close()

    threads = [threading.Thread(target=run, args=(w,), name=f"fuzz-{w}") for w in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def _idle_connections_rss(port: int, server: KafkaServerThread) -> tuple[int, int, int, int, int]:
    """(rss before, with, after; threads before, with) for IDLE_CONNECTIONS idle clients
    that each sent one ApiVersions first (so each connection has read once)."""
    rss_before, threads_before = _rss_bytes(), _threads()
    socks = []
    for i in range(IDLE_CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(_probe(i))
        socks.append(sock)
    for sock in socks:
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        sock.recv(size, socket.MSG_WAITALL)
    deadline = time.monotonic() + 10
    while server.server.connection_count < IDLE_CONNECTIONS and time.monotonic() < deadline:
        time.sleep(0.05)
    rss_with, threads_with = _rss_bytes(), _threads()
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 10
    while server.server.connection_count > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.server.connection_count == 0
    return rss_before, rss_with, _rss_bytes(), threads_before, threads_with


def test_mutated_frames_get_an_answer_or_a_close_and_idle_connections_cost_no_buffer(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    caplog.set_level(logging.WARNING)
    with inprocess_broker(tmp_path) as (apis, controller, sync):
        controller.call("create_topic", {"name": "fuzz", "partitions": 2})
        controller.call("create_topic", {"name": "t", "partitions": 2})
        sync()
        server = KafkaServerThread(_registry(apis), "127.0.0.1", 0, idle_timeout_s=60)
        server.start()
        try:
            # a thousand idle connections: no read buffer each, nothing left after they
            # close. The first round grows the allocators' pools (Python objects of the
            # connections, the client's sockets: both in this process); the second reuses them
            for round_ in (1, 2):
                gc.collect()
                rss_before, rss_with, rss_after, threads_before, threads_with = (
                    _idle_connections_rss(server.port, server)
                )
                gc.collect()
                print(
                    f"round {round_}, idle x{IDLE_CONNECTIONS}: RSS {rss_before >> 20} -> "
                    f"{rss_with >> 20} -> {rss_after >> 20} MiB, "
                    f"threads {threads_before} -> {threads_with}"
                )
                assert threads_with <= threads_before + 2  # background threads come and go
                assert rss_with - rss_before < IDLE_CONNECTIONS * 64 * 1024  # < 64 KiB each
            assert abs(rss_after - rss_before) <= rss_before // 10
            assert server.server.read_buffers.free_count <= server.server.read_buffers.max_free

            threads_before = _threads()
            started = time.monotonic()
            outcomes = _fuzz(server.port, FRAMES)
            elapsed_s = time.monotonic() - started
            print(f"{FRAMES} mutated frames in {elapsed_s:.1f} s: {outcomes}")
            assert sum(outcomes.values()) == FRAMES
            assert outcomes["answered"] > FRAMES // 10  # the mutations leave many valid
            assert outcomes["closed"] > 0
            # the server is still serving
            assert _Client(server.port).send(b"", PROBE_ID - 1) == "answered"
            # no thread per connection or per request was left behind (the broker's io pool
            # is bounded: io_threads)
            assert _threads() <= threads_before + 4
        finally:
            server.stop()
            asyncio.set_event_loop(None)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [(r.name, r.getMessage(), r.exc_text) for r in errors[:5]]
    # a null array Kafka forbids closed its connection with a warning naming the field
    assert any("is null" in r.getMessage() for r in caplog.records)
