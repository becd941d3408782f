"""The Kafka listener's framing (`FrameProtocol`): the event loop reads into its buffers,
it cuts frames (4-byte signed size + payload) wherever the reads end, refuses bad sizes and
stops reading while too many frames wait for the connection."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import struct
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.kafka.framing import (
    DIRECT_FRAME_BYTES,
    MAX_POOLED_FRAME_BYTES,
    QUEUED_FRAME_BYTES,
    FrameProtocol,
    ReadBufferPool,
    new_frame_buffer_pool,
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
        # the rest of the frame goes straight into the frame's buffer, not past its end
        assert len(proto.get_buffer(-1)) == len(data) - 10_000
        feed(proto, data[10_000:])
        got = proto.take_frame()
        assert isinstance(got, memoryview) and got.readonly and got == payload

    run(body)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_size_prefix_alone_does_not_commit_the_whole_frame() -> None:
    """A client announcing a huge frame makes the server commit memory only as its bytes
    arrive (the frame's buffer is a mapping whose pages are committed when written)."""

    def body():
        size = 200 * 1024 * 1024
        proto = FrameProtocol(FakeServer().accept, size + 100)
        proto.connection_made(FakeTransport())  # type: ignore[arg-type]
        before = resident_bytes()
        feed(proto, struct.pack(">i", size) + b"x" * 1000)
        assert len(proto.get_buffer(-1)) == size - 1000
        assert resident_bytes() - before < 32 * 1024 * 1024  # not the frame's 200 MiB
        assert proto.partial_frame_bytes == 1004

    run(body)


def test_large_frames_buffers_are_used_again_once_no_view_of_them_is_left() -> None:
    """A large frame's buffer serves a later frame only once nothing holds a view of the
    first (e.g. a Produce request's record sets still being appended), never while one
    does: the first frame's bytes stay as they were."""

    def body():
        pool = new_frame_buffer_pool()
        proto = FrameProtocol(FakeServer().accept, MAX_REQUEST_BYTES, frame_buffers=pool)
        proto.connection_made(FakeTransport())  # type: ignore[arg-type]
        first_payload, second_payload = payload_of(1_000_000, 1), payload_of(900_000, 2)
        feed(proto, frame(first_payload))
        first = proto.take_frame()
        assert isinstance(first, memoryview)
        records = first[100:5000]  # a view the request keeps while its append is under way
        first_buffer = weakref.ref(first.obj)
        del first
        feed(proto, frame(second_payload))
        second = proto.take_frame()
        assert isinstance(second, memoryview) and second == second_payload
        assert second.obj is not first_buffer()  # the first is still viewed: not reused
        assert records == first_payload[100:5000]
        del records, second
        feed(proto, frame(payload_of(700_000, 3)))
        third = proto.take_frame()
        assert isinstance(third, memoryview) and third == payload_of(700_000, 3)
        assert third.obj is first_buffer()  # free again: the same buffer, no fresh pages
        # a frame above MAX_POOLED_FRAME_BYTES gets a buffer the pool does not keep
        held = pool.held_bytes
        big = payload_of(MAX_POOLED_FRAME_BYTES + 1, 4)
        proto.max_frame_bytes = len(big)
        feed(proto, frame(big))
        assert proto.take_frame() == big
        assert pool.held_bytes == held

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


def test_a_wait_times_out_at_its_own_deadline_after_many_waits_that_did_not() -> None:
    """The connection's idle timeout: one timer serves every wait for bytes. Waits that
    frames ended (many, each shorter than the timeout) never time out; the wait that finds
    no frame for `timeout_s` does, then and not at an earlier wait's deadline."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        proto, _ = make_protocol()
        timeout_s = 0.3
        started = loop.time()
        for i in range(6):  # 0.6 s of traffic, a frame every 0.1 s: longer than the timeout
            loop.call_later(0.1, feed, proto, frame(b"x%d" % i))
            await proto.wait_for_bytes(timeout_s)
            assert take_all(proto) == [b"x%d" % i]
        assert loop.time() - started >= 0.55
        last_wait = loop.time()
        with pytest.raises(TimeoutError):
            await proto.wait_for_bytes(timeout_s)
        waited = loop.time() - last_wait
        assert timeout_s - 0.01 <= waited < timeout_s + 0.25, waited

    asyncio.run(main())


def test_a_lost_connection_leaves_no_wait_timer_behind() -> None:
    """A closed connection is not kept by its idle timer (600 s by default)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        proto, _ = make_protocol()
        loop.call_soon(feed, proto, frame(b"a"))
        await proto.wait_for_bytes(600)
        take_all(proto)
        ref = weakref.ref(proto)
        proto.connection_lost(None)
        del proto
        await asyncio.sleep(0)
        gc.collect()  # (the protocol and its server's callback refer to each other)
        assert ref() is None

    asyncio.run(main())
