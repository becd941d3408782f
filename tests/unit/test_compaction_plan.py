"""The compaction planner (pure) and the executor's object writing, against an in-process
controller and moto S3: plan -> write objects -> one commit -> a cold reader gets every
batch back identical (no Spark here: tests/e2e/test_compaction.py runs the real job)."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from controlplane.inprocess import InProcessController
from controlplane.records import BucketFailoverRecord, ObjectState
from controlplane.requests import (
    CommitStreamSetObjectRequest,
    CompactorIdentity,
    PrepareObjectsRequest,
    RegisterCompactorRequest,
)
from controlplane.settings import ControllerSettings
from dataplane.config import StorageConfig, WALConfig
from dataplane.formats.object_format import ObjectWriter
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import ObjectStorage, object_key
from dataplane.s3stream.storage import S3Storage
from spark_jobs import objects_io
from spark_jobs.compact import compaction_commit_request
from spark_jobs.execute import write_object
from spark_jobs.plan import (
    PlanConfig,
    build_plan,
    committed_object_count,
    paused_reason,
    select_sources,
)

BUCKET_URI = "0@s3://automq-main?region=us-east-1"
NODE = {"node_id": 1, "node_epoch": 0}


@pytest.fixture
def controller() -> InProcessController:
    c = InProcessController(ControllerSettings(bucket_ids=[0]))
    c.call(
        "register_broker",
        {"node_id": 1, "az": "a", "host": "h", "kafka_port": 1, "incarnation_id": "b1"},
    )
    c.call("broker_heartbeat", NODE)
    return c


class Cluster:
    """A controller plus the objects its brokers 'uploaded' (kept in memory, and put in
    the moto bucket when one is given)."""

    def __init__(self, controller: InProcessController, s3=None):
        self.c = controller
        self.s3 = s3
        self.data: dict[int, bytes] = {}
        self.index: dict[int, list] = {}
        self.next: dict[int, int] = {}
        self.payloads: dict[int, list[bytes]] = {}

    def stream(self) -> int:
        sid = self.c.call("create_stream", NODE)["stream_id"]
        self.c.call("open_stream", {**NODE, "stream_id": sid, "stream_epoch": 0})
        self.next[sid] = 0
        self.payloads[sid] = []
        return sid

    def _batches(self, sid: int, n: int, size: int) -> list[StreamRecordBatch]:
        out = []
        for _ in range(n):
            payload = f"{sid}:{self.next[sid]}:".encode().ljust(size, b"x")
            out.append(StreamRecordBatch(sid, 0, self.next[sid], 1, payload))
            self.payloads[sid].append(payload)
            self.next[sid] += 1
        return out

    def _object(self, batches: list[StreamRecordBatch]) -> tuple[int, object]:
        writer = ObjectWriter(block_size_bytes=4096)
        writer.add_all(batches)
        obj = writer.finish()
        oid = self.c.prepare_objects(
            PrepareObjectsRequest(**NODE, count=1, ttl_ms=60_000)
        ).first_object_id
        self.data[oid] = obj.data
        self.index[oid] = obj.index
        if self.s3 is not None:
            objects_io.put(BUCKET_URI, oid, obj.data)
        return oid, obj

    def sso(self, per_stream: dict[int, int], size: int = 100) -> int:
        batches = [b for sid, n in per_stream.items() for b in self._batches(sid, n, size)]
        oid, obj = self._object(batches)
        self.c.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                **NODE,
                object_id=oid,
                order_id=oid,
                size_bytes=len(obj.data),
                bucket_id=0,
                stream_ranges=[
                    {
                        "stream_id": r.stream_id,
                        "stream_epoch": 0,
                        "start_offset": r.start_offset,
                        "end_offset": r.end_offset,
                    }
                    for r in obj.ranges
                ],
            )
        )
        return oid

    def so(self, sid: int, n: int, size: int = 100) -> int:
        oid, obj = self._object(self._batches(sid, n, size))
        r = obj.ranges[0]
        self.c.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                **NODE,
                object_id=-1,
                order_id=oid,
                size_bytes=0,
                bucket_id=0,
                stream_objects=[
                    {
                        "object_id": oid,
                        "stream_id": sid,
                        "stream_epoch": 0,
                        "start_offset": r.start_offset,
                        "end_offset": r.end_offset,
                        "size_bytes": len(obj.data),
                    }
                ],
            )
        )
        return oid

    def plan(self, config: PlanConfig | None = None, now_ms: int = 0):
        config = config or PlanConfig()
        image = self.c.machine.image
        sources = select_sources(image, config)
        return build_plan(
            image, sources, {s.object_id: self.index[s.object_id] for s in sources}, config, now_ms
        )


def test_stream_set_objects_merge_into_one(controller):
    cl = Cluster(controller)
    a, b = cl.stream(), cl.stream()
    old = [cl.sso({a: 3, b: 2}) for _ in range(4)]
    plan = cl.plan()
    assert sorted(plan.compacted_object_ids) == old
    assert [t.kind for t in plan.tasks] == ["sso"]
    (task,) = plan.tasks
    assert [(p.stream_id, p.start_offset, p.end_offset) for p in task.pieces] == [
        (a, 0, 12),
        (b, 0, 8),
    ]


def test_a_large_stream_becomes_a_stream_object(controller):
    cl = Cluster(controller)
    big, small = cl.stream(), cl.stream()
    for _ in range(3):
        cl.sso({big: 10, small: 1}, size=1000)
    plan = cl.plan(PlanConfig(stream_split_bytes=20_000))
    kinds = {t.kind: [p.stream_id for p in t.pieces] for t in plan.tasks}
    assert kinds == {"sso": [small], "so": [big]}


def test_old_stream_set_objects_are_split_into_stream_objects(controller):
    cl = Cluster(controller)
    a, b = cl.stream(), cl.stream()
    old = [cl.sso({a: 2, b: 1}) for _ in range(2)]
    committed = max(controller.machine.image.stream_set_objects[o].committed_ms for o in old)
    new = cl.sso({a: 1, b: 1})  # committed now
    controller.machine.image.stream_set_objects[new].committed_ms = committed + 10**9
    plan = cl.plan(PlanConfig(force_split_after_ms=10**9), now_ms=committed + 10**9)
    assert sorted(plan.compacted_object_ids) == [*old, new]
    layout = sorted(
        (t.kind, p.stream_id, p.start_offset, p.end_offset) for t in plan.tasks for p in t.pieces
    )
    # the old objects' data per stream; the new object's data merged as a stream-set object
    assert layout == [("so", a, 0, 4), ("so", b, 0, 2), ("sso", a, 4, 5), ("sso", b, 2, 3)]


def test_compacted_partitions_leave_stream_set_objects_even_from_one(controller):
    """A compacted topic's streams (split_stream_ids) become stream objects, which the log
    cleaner rewrites alone; the other streams stay in a stream-set object."""
    cl = Cluster(controller)
    compacted, other = cl.stream(), cl.stream()
    old = cl.sso({compacted: 3, other: 2})  # one object: normally left alone
    assert cl.plan().empty
    plan = cl.plan(PlanConfig(split_stream_ids=frozenset({compacted})))
    assert plan.compacted_object_ids == [old]
    layout = sorted(
        (t.kind, p.stream_id, p.start_offset, p.end_offset) for t in plan.tasks for p in t.pieces
    )
    assert layout == [("so", compacted, 0, 3), ("sso", other, 0, 2)]


def test_one_object_and_nothing_dead_is_left_alone(controller):
    cl = Cluster(controller)
    a = cl.stream()
    cl.sso({a: 3})
    assert cl.plan().empty


def test_at_most_n_objects_per_run_oldest_first(controller):
    cl = Cluster(controller)
    a = cl.stream()
    old = [cl.sso({a: 1}) for _ in range(6)]
    plan = cl.plan(PlanConfig(max_objects_per_run=4))
    assert plan.compacted_object_ids == old[:4]
    assert plan.tasks[0].pieces[0].end_offset == 4


def test_deleted_and_trimmed_data_is_dropped(controller):
    cl = Cluster(controller)
    gone, trimmed, kept = cl.stream(), cl.stream(), cl.stream()
    old = [cl.sso({gone: 2, trimmed: 2, kept: 1}) for _ in range(3)]
    controller.call("delete_stream", {**NODE, "stream_id": gone, "stream_epoch": 0})
    controller.call(
        "trim_stream", {**NODE, "stream_id": trimmed, "stream_epoch": 0, "new_start_offset": 3}
    )
    plan = cl.plan()
    assert sorted(plan.compacted_object_ids) == old
    pieces = {p.stream_id: p for p in plan.tasks[0].pieces}
    assert set(pieces) == {trimmed, kept}
    assert pieces[trimmed].trim_offset == 3
    assert pieces[trimmed].start_offset == 2  # the block holding offset 3 starts at 2


def test_adjacent_small_stream_objects_merge(controller):
    cl = Cluster(controller)
    a = cl.stream()
    sos = [cl.so(a, 2) for _ in range(3)]
    plan = cl.plan()
    assert sorted(plan.compacted_object_ids) == sos
    assert [(t.kind, t.pieces[0].start_offset, t.pieces[0].end_offset) for t in plan.tasks] == [
        ("so", 0, 6)
    ]


def test_paused_in_bucket_failover(controller):
    image = controller.machine.image
    assert paused_reason(image) is None
    switched, _ = image.with_records(
        [(BucketFailoverRecord(active_bucket_id=1, reason="main failing", mode="failover"), None)]
    )
    assert "failover" in paused_reason(switched) and "main failing" in paused_reason(switched)
    back, _ = switched.with_records(
        [(BucketFailoverRecord(active_bucket_id=0, reason="healed", mode="normal"), None)]
    )
    assert paused_reason(back) is None


def test_a_source_deleted_since_the_plan_is_named_and_nothing_is_written(controller, monkeypatch):
    """A topic deleted between the plan and the run: its objects go from the bucket soon
    after (the delete delay), and a task reading one reports it instead of failing the
    Spark job; the driver then refuses the run whole (`compact._compact_objects`)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        objects_io._clients.clear()
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="automq-main")
        cl = Cluster(controller, s3=True)
        a, b = cl.stream(), cl.stream()
        for _ in range(3):
            cl.sso({a: 5, b: 3}, size=600)
        plan = cl.plan(PlanConfig(stream_split_bytes=20_000))
        assert plan.tasks
        sources = {oid: s.bucket_id for oid, s in plan.sources.items()}
        gone = plan.tasks[0].pieces[0].blocks[0][0]
        s3.delete_object(Bucket="automq-main", Key=object_key(gone))
        plan.tasks[0].object_id = 9_999
        written = write_object(plan.tasks[0], {0: BUCKET_URI}, sources, 0)
        assert written["source_gone"] == gone and written["object_id"] == 9_999
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="automq-main").get("Contents", [])}
        assert object_key(9_999) not in keys


def test_plan_write_commit_and_read_back(controller, tmp_path, monkeypatch):
    """The executor's object writing and the driver's commit, without Spark: every batch
    reads back identical from the compacted objects; objects go from 6 to 2."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        objects_io._clients.clear()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        cl = Cluster(controller, s3=True)
        a, b, big = cl.stream(), cl.stream(), cl.stream()
        for _ in range(3):
            cl.sso({a: 5, b: 3, big: 20}, size=600)
        sos = [cl.so(b, 2) for _ in range(3)]
        assert committed_object_count(controller.machine.image) == 6
        plan = cl.plan(PlanConfig(stream_split_bytes=20_000))
        assert sorted(plan.compacted_object_ids) == sorted([*cl.index][:3] + sos)
        job = controller.register_compactor(RegisterCompactorRequest(name="t", incarnation_id="x"))
        ident = CompactorIdentity(name="t", epoch=job.epoch)
        prepared = controller.prepare_objects(
            PrepareObjectsRequest(compactor=ident, count=len(plan.tasks), ttl_ms=60_000)
        )
        for i, task in enumerate(plan.tasks):
            task.object_id = prepared.first_object_id + i
        sources = {oid: s.bucket_id for oid, s in plan.sources.items()}
        written = [write_object(t, {0: BUCKET_URI}, sources, 0) for t in plan.tasks]
        controller.commit_stream_set_object(compaction_commit_request(ident, plan, written, 0))
        image = controller.machine.image
        assert all(
            image.objects[o].state == ObjectState.MARK_DESTROYED for o in plan.compacted_object_ids
        )
        # one stream-set object (a, and b's first run), big's and b's merged stream objects
        assert committed_object_count(image) == len(plan.tasks) == 3
        reader = S3Storage(
            StorageConfig(block_cache_bytes=16 << 20),
            1,
            0,
            controller,
            ObjectStorage(BUCKET_URI),
            data_dir=tmp_path / "r",
            wal=WALConfig(capacity_bytes=32 << 20),
        )
        for sid in (a, b, big):
            got = reader.read_committed(sid, 0, cl.next[sid], 1 << 30)
            assert [x.payload for x in got] == cl.payloads[sid]
        objects_io._clients.clear()


def test_a_reader_whose_object_was_compacted_and_deleted_relocates(
    controller, tmp_path, monkeypatch
):
    """A reader located the old objects (and cached their indexes); compaction replaced
    them and their retention passed (deleted from the bucket): the next read re-locates to
    the new object and returns the right batches instead of failing."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        objects_io._clients.clear()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        cl = Cluster(controller, s3=True)
        a = cl.stream()
        old = [cl.sso({a: 40}, size=20_000) for _ in range(3)]  # 2.4 MB > the readahead
        reader = S3Storage(
            StorageConfig(block_cache_bytes=16 << 20),
            1,
            0,
            controller,
            ObjectStorage(BUCKET_URI),
            data_dir=tmp_path / "r",
            wal=WALConfig(capacity_bytes=32 << 20),
        )
        first = reader.read_committed(a, 0, cl.next[a], 1)
        assert [x.payload for x in first] == cl.payloads[a][:1]
        plan = cl.plan()
        job = controller.register_compactor(RegisterCompactorRequest(name="t", incarnation_id="x"))
        ident = CompactorIdentity(name="t", epoch=job.epoch)
        prepared = controller.prepare_objects(
            PrepareObjectsRequest(compactor=ident, count=len(plan.tasks), ttl_ms=60_000)
        )
        for i, task in enumerate(plan.tasks):
            task.object_id = prepared.first_object_id + i
        written = [write_object(t, {0: BUCKET_URI}, {o: 0 for o in old}, 0) for t in plan.tasks]
        controller.commit_stream_set_object(compaction_commit_request(ident, plan, written, 0))
        objects_io.delete(BUCKET_URI, old)  # the lifecycle deleter, after the retention
        got = list(first)
        while len(got) < cl.next[a]:
            batches = reader.read_committed(a, len(got), cl.next[a], 1 << 20)
            assert batches
            got += batches
        assert [x.payload for x in got] == cl.payloads[a]
        objects_io._clients.clear()


def test_the_job_refuses_a_bad_config_or_an_unreachable_controller(tmp_path, capsys, monkeypatch):
    from spark_jobs.compact import main

    assert main(["--config", str(tmp_path / "missing.json")]) == 1
    (tmp_path / "bad.json").write_text('{"controllers": []}')
    assert main(["--config", str(tmp_path / "bad.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: bad job config") for line in err)
    (tmp_path / "job.json").write_text(
        '{"controllers": ["127.0.0.1:9"], "buckets": {"0": "' + BUCKET_URI + '"}}'
    )
    import spark_jobs.compact as compact

    original = compact.ControllerClient
    monkeypatch.setattr(
        compact, "ControllerClient", lambda addrs, timeout_s: original(addrs, timeout_s=0.5)
    )
    assert main(["--config", str(tmp_path / "job.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: controller:")
