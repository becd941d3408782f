"""The S3Stream engine against a real quorum (3 processes) and a real SeaweedFS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.errors import ControllerError
from dataplane.objectstore import ObjectStoreUnavailableError
from tests.integration.engine_harness import make_engine, register
from tests.integration.quorum_harness import QuorumHarness

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    with QuorumHarness(tmp_path_factory.mktemp("quorum"), session_timeout_ms=30_000) as q:
        q.leader()
        yield q


def read_all(stream, start: int, end: int, max_bytes: int = 64 * 1024) -> list:
    out, offset = [], start
    for _ in range(100_000):
        if offset >= end:
            break
        batches = stream.fetch(offset, end, max_bytes)
        assert batches, f"no data at {offset} (end {end})"
        out += batches
        offset = batches[-1].last_offset
    return out


def test_append_upload_and_catch_up_read_from_objects(quorum, seaweed, tmp_path):
    # no uploaded data kept in the LogCache: every read below goes to the object store
    engine = make_engine(
        quorum.client,
        seaweed,
        tmp_path / "b1",
        1,
        upload_threshold_bytes=256 * 1024,
        log_cache_uploaded_bytes=0,
        stream_split_bytes=64 * 1024,
    )
    engine.start()
    try:
        ids = [engine.create_stream() for _ in range(3)]
        streams = [engine.open_stream(sid, 0) for sid in ids]
        payloads = {sid: [] for sid in ids}
        futures = []
        for i in range(3000):
            st = streams[i % 3]
            # stream 0 gets big records so it is split into its own stream objects
            data = (b"%d-%d|" % (st.stream_id, i)) * (200 if st is streams[0] else 10)
            payloads[st.stream_id].append(data)
            futures.append(st.append(data, 1))
        for f in futures:
            f.result(timeout=30)
        engine.flush()
        for st in streams:
            meta = quorum.client.stream(st.stream_id)
            assert meta["end_offset"] == 1000 == st.next_offset
            got = read_all(st, 0, 1000)
            assert [b.base_offset for b in got] == list(range(1000))
            assert [b.payload for b in got] == payloads[st.stream_id]
        # two consumers reading one stream in step: their cursors meet at the same offset;
        # every block still watched belongs to a cursor the engine keeps (none leaked)
        first = engine.read_committed(ids[1], 0, 1000, 4096)
        second = engine.read_committed(ids[1], 0, 1000, 4096)
        assert [b.base_offset for b in first] == [b.base_offset for b in second]
        assert first[-1].last_offset < 1000  # stopped at max_bytes: its window holds blocks
        kept = engine.readers
        assert engine.block_cache.watcher_count <= len(kept)
        assert engine.fetcher.readahead_held_bytes <= sum(r.held_bytes for r in kept)
        objs = quorum.client.stream_objects(ids[0], 0, 1000)
        assert objs and all(o["bucket_id"] == 0 for o in objs)
        kinds = {o["kind"] for sid in ids for o in quorum.client.stream_objects(sid, 0, 1000)}
        assert kinds == {"so", "sso"}
        # a fetch spanning objects and the LogCache tail is contiguous
        tail = [streams[1].append(b"tail-%d" % i, 1) for i in range(10)]
        [f.result(timeout=10) for f in tail]
        got = read_all(streams[1], 990, 1010)
        assert [b.base_offset for b in got] == list(range(990, 1010))
        assert engine.fetcher.bytes_fetched > 0
    finally:
        engine.close()


def test_reads_route_to_the_bucket_each_object_records(quorum, seaweed, tmp_path):
    engine = make_engine(quorum.client, seaweed, tmp_path / "b2", 2, log_cache_uploaded_bytes=0)
    engine.start()
    try:
        sid = engine.create_stream()
        st = engine.open_stream(sid, 0)
        [st.append(b"before-%d" % i, 1).result(10) for i in range(100)]
        engine.flush()
        quorum.client.call("set_active_bucket", {"bucket_id": 1, "reason": "test"})
        [st.append(b"after-%d" % i, 1).result(10) for i in range(100)]
        engine.flush()
        buckets = [o["bucket_id"] for o in quorum.client.stream_objects(sid, 0, 200)]
        assert buckets == [0, 1]
        got = read_all(st, 0, 200)
        assert [b.payload for b in got] == [b"before-%d" % i for i in range(100)] + [
            b"after-%d" % i for i in range(100)
        ]
    finally:
        quorum.client.call("set_active_bucket", {"bucket_id": 0, "reason": "test done"})
        engine.close()


def test_kill_9_then_restart_recovers_every_acknowledged_record(quorum, seaweed, tmp_path):
    data_dir = tmp_path / "b3"
    # set up the stream as node 3 epoch E, opened with stream epoch 0
    setup = make_engine(quorum.client, seaweed, data_dir, 3)
    setup.start()
    sid = setup.create_stream()
    setup.close()
    args = {
        "controllers": quorum.client.addresses,
        "data_dir": str(data_dir),
        "node_id": 3,
        "stream_id": sid,
        "epoch": 0,
        "count": 100_000,
        "upload_threshold_bytes": 64 * 1024,
        "s3": {
            "endpoint": seaweed.config.endpoint,
            "access_key": seaweed.config.access_key,
            "secret_key": seaweed.config.secret_key,
        },
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.crash_writer", json.dumps(args)],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    acked: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if line.startswith("acked"):
                _, offset, i = line.split()
                acked[int(offset)] = int(i)
            if len(acked) >= 3000 or time.monotonic() > deadline:
                break
        os.kill(proc.pid, signal.SIGKILL)  # crash mid-stream, uploads in flight
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert len(acked) >= 3000
    committed_before = quorum.client.stream(sid)["end_offset"]
    # the node restarts: new node epoch, same WAL
    engine = make_engine(quorum.client, seaweed, data_dir, 3, log_cache_uploaded_bytes=0)
    recovered = engine.start()
    try:
        end = quorum.client.stream(sid)["end_offset"]
        assert end >= max(acked) + 1, (end, max(acked))
        assert recovered == end - committed_before
        st = engine.open_stream(sid, 1)  # reopen with a new epoch, continues at `end`
        assert st.next_offset == end
        got = read_all(st, 0, end)
        assert [b.base_offset for b in got] == list(range(end))  # no gap, no duplicate
        for offset, i in acked.items():
            assert got[offset].payload == f"record-{i}".encode() * 20
        assert st.append(b"next", 1).result(10) == end
    finally:
        engine.close()


def test_upload_retries_through_object_store_faults(quorum, seaweed, tmp_path):
    engine = make_engine(quorum.client, seaweed, tmp_path / "b4", 4, log_cache_uploaded_bytes=0)
    real = engine.objects
    failures = {"left": 3}

    class Flaky:
        """Fails the first puts like an overloaded store (503 after the store's own retries)."""

        def __getattr__(self, name):
            return getattr(real, name)

        def put_object_async(self, *a, **kw):
            if failures["left"] > 0:
                failures["left"] -= 1
                raise ObjectStoreUnavailableError("injected 503", op="put", bucket_id=0, key="x")
            return real.put_object_async(*a, **kw)

    engine.uploader.objects = Flaky()  # uploads put through the uploader
    engine.start()
    try:
        sid = engine.create_stream()
        st = engine.open_stream(sid, 0)
        [st.append(b"r%d" % i, 1).result(10) for i in range(50)]
        engine.flush()
        assert failures["left"] == 0
        assert quorum.client.stream(sid)["end_offset"] == 50
        assert [b.payload for b in read_all(st, 0, 50)] == [b"r%d" % i for i in range(50)]
    finally:
        engine.close()


def test_fenced_node_cannot_commit(quorum, seaweed, tmp_path):
    engine = make_engine(quorum.client, seaweed, tmp_path / "b5", 5)
    engine.start()
    try:
        sid = engine.create_stream()
        st = engine.open_stream(sid, 0)
        st.append(b"a", 1).result(10)
        register(quorum.client, 5)  # the node re-registered elsewhere: this epoch is stale
        with pytest.raises(ControllerError) as exc:
            engine.flush()
        assert exc.value.code.value == "STALE_NODE_EPOCH"
        assert quorum.client.stream(sid)["end_offset"] == 0
    finally:
        engine._stop.set()
        engine.wal.close()


def test_destroyed_objects_are_deleted_from_their_own_bucket(seaweed, tmp_path):
    from controlplane.config import BucketConfig
    from dataplane.objectstore import object_key

    c = seaweed.config
    buckets = [
        BucketConfig(
            bucket_id=i,
            uri=f"{i}@s3://{name}?region=us-east-1&endpoint={c.endpoint}",
            access_key=c.access_key,
            secret_key=c.secret_key,
        )
        for i, name in enumerate(["automq-main", "automq-failover"])
    ]
    with QuorumHarness(
        tmp_path / "q", session_timeout_ms=30_000, buckets=buckets, destroy_retention_ms=500
    ) as q:
        q.leader()
        q.client.call("set_active_bucket", {"bucket_id": 1})
        engine = make_engine(q.client, seaweed, tmp_path / "b", 1)
        engine.start()
        try:
            sid = engine.create_stream()
            st = engine.open_stream(sid, 0)
            [st.append(b"x%d" % i, 1).result(10) for i in range(20)]
            engine.flush()
            [obj] = q.client.stream_objects(sid, 0, 20)
            assert obj["bucket_id"] == 1
            key = object_key(obj["object_id"])
            assert engine.objects.head_object(1, key) > 0
            st.trim(20)  # everything trimmed: the object is no longer needed
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if str(obj["object_id"]) not in q.client.image()["objects"]:
                    break
                time.sleep(0.2)
            assert str(obj["object_id"]) not in q.client.image()["objects"]
            assert key not in engine.objects.list_keys(1, "data/")
        finally:
            engine.close()
