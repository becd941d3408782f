"""The Kafka listener's framing (`FrameProtocol`): the event loop reads into its buffers,
it cuts frames (4-byte signed size + payload) wherever the reads end, refuses bad sizes and
stops reading while too many frames wait for the connection."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.kafka.framing import (
    DIRECT_CHUNK_BYTES,
    DIRECT_FRAME_BYTES,
    DIRECT_GROWTH,
    QUEUED_FRAME_BYTES,
    FrameProtocol,
    ReadBufferPool,
)

MAX_REQUEST_BYTES = 8 * 1024 * 1024


class FakeTransport:
    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class FakeServer:
    max_request_bytes = MAX_REQUEST_BYTES

    def __init__(self) -> None:
        self.accepted: list[FrameProtocol] = []

    def accept(self, protocol: FrameProtocol) -> None:
        self.accepted.append(protocol)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def payload_of(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def make_protocol() -> tuple[FrameProtocol, FakeTransport]:
    proto = FrameProtocol(FakeServer().accept, MAX_REQUEST_BYTES)
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, transport


def feed(proto: FrameProtocol, data: bytes, chunks: Iterator[int] | None = None) -> None:
    """Deliver `data` as the event loop would: into `get_buffer`'s view, in reads of at most
    the next `chunks` size (default: as much as the buffer takes)."""
    pos = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), len(data) - pos)
        if chunks is not None:
            n = min(n, next(chunks))
        buf[:n] = data[pos : pos + n]
        proto.buffer_updated(n)
        pos += n


def take_all(proto: FrameProtocol) -> list[bytes]:
    out = []
    while (f := proto.take_frame()) is not None:
        out.append(bytes(f))
    return out


def run(coro_fn):
    async def main():
        return coro_fn()

    return asyncio.run(main())


def test_many_frames_in_one_read_come_out_in_order() -> None:
    def body():
        proto, _ = make_protocol()
        payloads = [payload_of(size, i) for i, size in enumerate([0, 1, 17, 1000, 5, 300] * 20)]
        feed(proto, b"".join(frame(p) for p in payloads))
        assert take_all(proto) == payloads
        assert proto.partial_frame_bytes == 0

    run(body)


@pytest.mark.parametrize("size", [1, 12, 2000, DIRECT_FRAME_BYTES + 1, 300_000])
def test_frame_split_across_reads_anywhere(size: int) -> None:
    def body():
        payload = payload_of(size, size)
        data = frame(payload) + frame(b"next")
        # every split point of the header and around the body's edges, plus a few inside
        cuts = sorted({1, 2, 3, 4, 5, len(data) - 9, len(data) - 8, len(data) - 1, len(data) // 2})
        for cut in (c for c in cuts if 0 < c < len(data)):
            proto, _ = make_protocol()
            feed(proto, data[:cut])
            if cut < 4 + size:
                assert proto.take_frame() is None
                assert proto.partial_frame_bytes == cut
            feed(proto, data[cut:])
            assert take_all(proto) == [payload, b"next"], cut

    run(body)


def test_large_frame_is_read_into_its_own_buffer() -> None:
    def body():
        proto, _ = make_protocol()
        payload = payload_of(1_000_000, 7)
        data = frame(payload)
        feed(proto, data[:10_000])
        # the rest of the frame goes straight into the frame's buffer, exactly its size
        assert len(proto.get_buffer(-1)) == len(data) - 10_000
        feed(proto, data[10_000:])
        got = proto.take_frame()
        assert isinstance(got, bytearray) and got == payload

    run(body)


def test_a_size_prefix_alone_does_not_allocate_the_whole_frame() -> None:
    def body():
        proto, _ = make_protocol()
        payload = payload_of(MAX_REQUEST_BYTES - 100, 9)  # larger than one chunk
        data = frame(payload)
        feed(proto, data[:5])
        assert len(proto.get_buffer(-1)) <= DIRECT_CHUNK_BYTES  # memory follows the bytes
        feed(proto, data[5:], iter(lambda: 1 << 20, None))
        assert proto.take_frame() == payload
        assert proto.partial_frame_bytes == 0

    run(body)


def test_a_frame_larger_than_a_chunk_ends_in_one_buffer_grown_with_its_bytes() -> None:
    """A frame above DIRECT_CHUNK_BYTES is handed on as one buffer of its exact size (no
    join of chunks at the end); while it arrives, the memory it holds stays within
    DIRECT_GROWTH times the bytes received (or one first chunk)."""

    def body():
        proto, _ = make_protocol()
        payload = payload_of(MAX_REQUEST_BYTES - 100, 11)
        data = frame(payload)
        pos = 0
        while pos < len(data):
            buf = proto.get_buffer(-1)
            received = max(pos - 4, 0)
            allocated = received + len(buf) if pos > 4 else len(buf)
            assert allocated <= max(DIRECT_CHUNK_BYTES, DIRECT_GROWTH * received) + 64 * 1024
            n = min(len(buf), len(data) - pos, 300_000)
            buf[:n] = data[pos : pos + n]
            proto.buffer_updated(n)
            pos += n
        got = proto.take_frame()
        assert isinstance(got, bytearray) and len(got) == len(payload) and got == payload

    run(body)


def test_random_reads_of_a_random_stream() -> None:
    def body():
        rng = random.Random(16)
        sizes = [rng.choice([0, 3, 100, 4000, 70_000, 200_000, 700_000]) for _ in range(60)]
        payloads = [payload_of(s, i) for i, s in enumerate(sizes)]
        data = b"".join(frame(p) for p in payloads)
        proto, _ = make_protocol()
        got: list[bytes] = []
        chunks = iter(lambda: rng.choice([1, 7, 4096, 65_536, 1 << 20]), None)
        pos = 0
        while pos < len(data):  # take frames as they come, as the connection does
            step = min(len(data) - pos, 3 * 1024 * 1024)
            feed(proto, data[pos : pos + step], chunks)
            pos += step
            got += take_all(proto)
        assert got == payloads
        assert proto.partial_frame_bytes == 0

    run(body)


@pytest.mark.parametrize("size", [MAX_REQUEST_BYTES + 1, -1, -(2**31)])
def test_bad_size_stops_reading_after_the_good_frames(size: int) -> None:
    def body():
        proto, transport = make_protocol()
        feed(proto, frame(b"good") + struct.pack(">i", size) + b"x" * 100)
        assert transport.paused
        assert proto.take_frame() == b"good"
        assert proto.take_frame() is None
        assert proto.error is not None
        reason = "exceeds max_request_bytes" if size > 0 else "negative frame size"
        assert reason in proto.error
        assert transport.paused  # taking the good frame does not resume reading

    run(body)


def test_a_frame_of_exactly_the_limit_is_accepted() -> None:
    def body():
        proto, _ = make_protocol()
        payload = payload_of(MAX_REQUEST_BYTES, 3)
        feed(proto, frame(payload))
        assert proto.take_frame() == payload and proto.error is None

    run(body)


def test_reading_pauses_while_frames_wait_and_resumes_when_taken() -> None:
    def body():
        proto, transport = make_protocol()
        payloads = [payload_of(200_000, i) for i in range(8)]  # > QUEUED_FRAME_BYTES
        assert sum(map(len, payloads)) > QUEUED_FRAME_BYTES
        feed(proto, b"".join(frame(p) for p in payloads))
        assert transport.paused
        got = take_all(proto)
        assert got == payloads
        assert not transport.paused

    run(body)


def test_eof_inside_a_frame_reports_the_partial_bytes() -> None:
    def body():
        proto, _ = make_protocol()
        feed(proto, frame(b"whole") + frame(b"cut short")[:7])
        proto.eof_received()
        assert proto.eof
        assert proto.take_frame() == b"whole"
        assert proto.partial_frame_bytes == 7

    run(body)


def test_read_buffers_are_lent_per_read_not_held_per_connection() -> None:
    def body():
        pool = ReadBufferPool(max_free=2)
        protos = []
        for _ in range(10):
            proto = FrameProtocol(FakeServer().accept, MAX_REQUEST_BYTES, pool)
            proto.connection_made(FakeTransport())  # type: ignore[arg-type]
            protos.append(proto)
        for i, proto in enumerate(protos):
            # a whole frame, then a frame's first bytes: between reads nothing is borrowed
            feed(proto, frame(b"hello") + frame(payload_of(1000, i))[: 1 + i % 7])
            assert proto.take_frame() == b"hello"
            assert proto.partial_frame_bytes == 1 + i % 7
        assert pool.free_count == 1  # one buffer served every read of every connection
        for i, proto in enumerate(protos):
            feed(proto, frame(payload_of(1000, i))[1 + i % 7 :])
            assert proto.take_frame() == payload_of(1000, i)
            assert proto.partial_frame_bytes == 0
        assert pool.free_count == 1

    run(body)
