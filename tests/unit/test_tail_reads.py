"""Tail reads from memory: `Stream.fetch_cached` serves what is in the LogCache without I/O
(so a Fetch at the tail is answered on the event loop, with no I/O-pool hand-off), and
says None for anything older, which `fetch` then reads from objects."""

from __future__ import annotations

import pytest

from tests.unit.test_upload_stream_errors import FakeObjects, append, crash, ctrl, make_engine

__all__ = ["ctrl"]  # the fixture, imported for these tests


def payloads(batches) -> list[bytes]:
    return [bytes(b.payload) for b in batches]


def test_the_tail_is_read_from_memory_and_older_records_from_objects(ctrl, tmp_path):
    objects = FakeObjects()  # it can store objects, not read them: a tail read needs no GET
    # uploaded records leave the LogCache at once: after a flush only objects hold them
    engine = make_engine(ctrl, objects, tmp_path / "node1", log_cache_uploaded_bytes=0)
    try:
        stream = engine.open_stream(engine.create_stream(), 0)
        append(stream, 10)
        tail = stream.fetch_cached(0, 10, 1 << 20)
        assert tail is not None and payloads(tail) == payloads(stream.fetch(0, 10, 1 << 20))
        assert [b.base_offset for b in tail] == list(range(10))
        assert payloads(stream.fetch_cached(3, 5, 1 << 20)) == payloads(tail[3:5])
        assert stream.fetch_cached(10, 10, 1 << 20) == []  # nothing past the end

        engine.flush()  # uploaded and evicted: older records need a GET (`fetch`)
        assert len(objects.data) == 1
        assert stream.fetch_cached(0, 10, 1 << 20) is None

        append(stream, 5)  # the new tail is in memory again; a read from before it is not
        assert [b.base_offset for b in stream.fetch_cached(10, 15, 1 << 20)] == list(range(10, 15))
        assert stream.fetch_cached(9, 15, 1 << 20) is None
    finally:
        crash(engine)


def test_a_tail_read_stays_within_max_bytes_but_returns_at_least_one_batch(ctrl, tmp_path):
    engine = make_engine(ctrl, FakeObjects(), tmp_path / "node1")
    try:
        stream = engine.open_stream(engine.create_stream(), 0)
        append(stream, 6, size=1000)
        assert len(stream.fetch_cached(0, 6, 1)) == 1
        assert 1 < len(stream.fetch_cached(0, 6, 3000)) < 6
    finally:
        crash(engine)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
