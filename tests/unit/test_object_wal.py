"""The object-storage WAL (s3://bucket/prefix) against moto: group commit, recovery,
trim, and the fencing rule that keeps an old owner's late objects out of every recovery."""

from __future__ import annotations

import threading

import boto3
import pytest
from moto import mock_aws

from dataplane.config import ObjectWALConfig
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal import (
    WALCorruptError,
    WALError,
    WALFencedError,
    WALTakeoverRefusedError,
    WriteAheadLog,
)
from dataplane.s3stream.wal.factory import (
    UnsupportedWALError,
    open_wal,
    take_over_wal,
    wal_exists,
    wal_uri_for_path,
)
from dataplane.s3stream.wal.object_format import (
    DataKey,
    SealKey,
    Writer,
    data_key,
    encode_object,
    resolve_chain,
)
from dataplane.s3stream.wal.object_wal import ObjectWAL

BUCKETS = "0@s3://automq-main?region=us-east-1,1@s3://automq-wal?region=us-east-1"
URI = "s3://automq-wal/wal/node-1"
CAPACITY = 64 << 20


@pytest.fixture
def objects(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="automq-main")
        s3.create_bucket(Bucket="automq-wal")
        with ObjectStorage(BUCKETS, merge_window_ms=0) as store:
            yield store


def wal_keys(objects: ObjectStorage, kind: str) -> list[str]:
    return objects.list_keys(1, f"wal/node-1/{kind}/")


def test_appends_are_group_committed_and_recovered_in_order_like_the_file_wal(objects, tmp_path):
    records = [f"record-{i}".encode() * (i % 7 + 1) for i in range(60)]
    assert not wal_exists(URI, objects=objects)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    assert isinstance(wal, ObjectWAL) and isinstance(wal, WriteAheadLog)
    futures: list = [None] * len(records)

    def produce(part: int) -> None:  # 4 threads append at once: one PUT carries many
        for i in range(part, len(records), 4):
            futures[i] = (i, wal.append(records[i]))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = {i: f.result(10) for i, f in futures}
    by_offset = [records[i] for i, _ in sorted(results.items(), key=lambda kv: kv[1].offset)]
    assert wal.end_offset == max(r.next_offset for r in results.values())
    assert wal.put_count == len(wal_keys(objects, "data")) < len(records)
    wal.close()
    assert wal_exists(URI, objects=objects)

    # the same records the file WAL returns for the same appends, in the same order
    file_wal = open_wal(wal_uri_for_path(tmp_path / "wal"), 1, 0, capacity_bytes=CAPACITY)
    for rec in by_offset:
        file_wal.append(rec).result(5)
    file_wal.close()
    file_records = [r.data for r in open_wal(wal_uri_for_path(tmp_path / "wal"), 1, 1).recover()]

    reopened = open_wal(URI, 1, 1, capacity_bytes=CAPACITY, objects=objects)
    try:
        recovered = list(reopened.recover())
        assert [r.data for r in recovered] == by_offset == file_records
        assert [r.offset for r in recovered] == sorted(r.offset for r in results.values())
        assert reopened.end_offset == recovered[-1].next_offset
        # appends continue after the recovered chain
        assert reopened.append(b"after").result(10).offset == recovered[-1].next_offset
    finally:
        reopened.close()


def test_trim_deletes_objects_wholly_below_the_trim_point(objects):
    config = ObjectWALConfig(linger_s=0, max_batch_bytes=1 << 20, max_record_bytes=1 << 19)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    results = [wal.append(b"r%d" % i).result(10) for i in range(6)]  # one object each
    assert len(wal_keys(objects, "data")) == 6
    with pytest.raises(ValueError, match="record boundary"):
        wal.trim(results[2].offset + 1)
    with pytest.raises(ValueError, match="beyond the durable end"):
        wal.trim(results[-1].next_offset + 1)
    wal.trim(results[2].next_offset)
    assert len(wal_keys(objects, "data")) == 3  # the first three objects are gone
    assert wal.start_offset == results[2].next_offset
    assert [r.data for r in wal.recover()] == [b"r3", b"r4", b"r5"]
    wal.close()
    reopened = open_wal(URI, 1, 1, capacity_bytes=CAPACITY, objects=objects)
    try:
        assert [r.data for r in reopened.recover()] == [b"r3", b"r4", b"r5"]
        assert reopened.start_offset == results[2].next_offset
        assert len(wal_keys(objects, "trim")) == 1
    finally:
        reopened.close()


def test_trim_inside_a_batch_keeps_the_object_and_recovers_from_the_trim_point(objects):
    # the writer lingers up to 1 s for more appends: the five land in one object even when
    # a loaded machine stalls this thread between appends for longer than the 2 ms default
    # (seen once: two objects)
    lingering = ObjectWALConfig(linger_s=1.0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=lingering)
    futures = [wal.append(b"x%d" % i) for i in range(5)]
    results = [f.result(10) for f in futures]
    assert len(wal_keys(objects, "data")) == 1
    list(wal.recover())  # learns the record boundaries of the recovered objects
    wal.close()
    handle = take_over_wal(URI, 2, 1, objects=objects)
    try:
        assert [r.data for r in handle.recover()] == [b"x%d" % i for i in range(5)]
        handle.trim(results[1].next_offset)
        assert len(wal_keys(objects, "data")) == 1
        assert [r.data for r in handle.recover()] == [b"x2", b"x3", b"x4"]
    finally:
        handle.close()


def test_takeover_fences_the_old_owner_and_its_late_objects_are_never_recovered(objects):
    old = open_wal(URI, 1, 3, capacity_bytes=CAPACITY, objects=objects)
    acked = [old.append(b"acked-%d" % i).result(10) for i in range(3)]
    end = acked[-1].next_offset

    with pytest.raises(WALTakeoverRefusedError):  # a takeover needs a newer epoch
        take_over_wal(URI, 2, 3, objects=objects)
    handle = take_over_wal(URI, 2, 4, objects=objects)
    try:
        # the old owner's next append is stored but never acknowledged
        with pytest.raises(WALFencedError):
            old.append(b"late").result(10)
        assert old.fenced
        with pytest.raises(WALFencedError):
            old.append(b"later")
        # a PUT of the old writer that was in flight lands after the takeover's listing
        incarnation = 0
        late = encode_object(1, Writer(3, incarnation), end, [b"ghost"])
        objects.put_object(1, data_key("wal/node-1", Writer(3, incarnation), end, end + 13), late)
        assert [r.data for r in handle.recover()] == [b"acked-0", b"acked-1", b"acked-2"]
        handle.trim(end)
    finally:
        handle.close()
        old.close()
    # the old epoch can never open the WAL again; the node's next epoch can, and its
    # recovery ignores (and deletes) what the fenced writer stored after the takeover
    with pytest.raises(WALFencedError):
        open_wal(URI, 1, 3, capacity_bytes=CAPACITY, objects=objects)
    reopened = open_wal(URI, 1, 5, capacity_bytes=CAPACITY, objects=objects)
    try:
        assert list(reopened.recover()) == []
        assert wal_keys(objects, "data") == []
        assert reopened.append(b"new").result(10).offset == end
    finally:
        reopened.close()


def test_the_same_node_and_epoch_reopening_is_a_new_writer(objects):
    first = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    first.append(b"a").result(10)
    second = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    try:
        with pytest.raises(WALFencedError):  # the first incarnation is fenced by the second
            first.append(b"b").result(10)
        assert [r.data for r in second.recover()] == [b"a"]
    finally:
        first.close()
        second.close()
    with pytest.raises(WALFencedError):  # another node at the same epoch may not open it
        open_wal(URI, 2, 0, capacity_bytes=CAPACITY, objects=objects)


def test_chain_rule_gaps_seals_and_missing_acknowledged_objects():
    w1, w2 = Writer(1, 0), Writer(2, 0)
    datas = [DataKey(w1, 0, 10), DataKey(w1, 10, 20), DataKey(w1, 30, 40)]  # gap at 20
    chain = resolve_chain(datas, [SealKey(w1, 0)], [])
    assert [d.end_offset for d in chain.objects] == [10, 20] and chain.end_offset == 20
    assert chain.stale == [DataKey(w1, 30, 40)]
    # w2 sealed at 10: w1's object [10, 20) landed after the takeover
    datas = [DataKey(w1, 0, 10), DataKey(w1, 10, 20), DataKey(w2, 10, 15)]
    chain = resolve_chain(datas, [SealKey(w1, 0), SealKey(w2, 10)], [5])
    assert chain.objects == [DataKey(w1, 0, 10), DataKey(w2, 10, 15)]
    assert chain.stale == [DataKey(w1, 10, 20)] and chain.trim_offset == 5
    # an acknowledged object below the newest seal is missing: refuse, never skip it
    with pytest.raises(WALCorruptError):
        resolve_chain([DataKey(w1, 10, 20)], [SealKey(w2, 20)], [])


def test_s3_uris_are_resolved_against_the_brokers_buckets(objects):
    with pytest.raises(UnsupportedWALError, match="not configured"):
        open_wal("s3://elsewhere/wal", 1, 0, capacity_bytes=CAPACITY, objects=objects)
    with pytest.raises(UnsupportedWALError, match="no bucket config"):
        wal_exists(URI)
    for bad in ("s3://automq-wal/../x", "s3://automq-wal/", "s3://automq-wal/w?accessKey=k"):
        with pytest.raises(UnsupportedWALError):
            open_wal(bad, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    assert objects.list_keys(1) == []  # nothing was written by the refused opens
    wal = open_wal("s3://1/wal/by-id", 1, 0, capacity_bytes=CAPACITY, objects=objects)
    try:
        wal.append(b"x").result(10)
    finally:
        wal.close()
    assert objects.list_keys(1, "wal/by-id/data/")


def test_the_storage_engine_runs_on_an_s3_wal_and_another_node_fails_it_over(objects, tmp_path):
    """S3Storage appends through the object WAL unchanged; node 1 crashes with acknowledged,
    not uploaded data; node 2 recovers node 1's WAL from the object store alone."""
    from controlplane.records import ObjectState
    from controlplane.settings import ControllerSettings
    from controlplane.state_machine import MetadataStateMachine
    from dataplane.config import StorageConfig, WALConfig
    from dataplane.formats.object_format import decode_block, parse_object
    from dataplane.objectstore import object_key
    from dataplane.s3stream.storage import S3Storage
    from dataplane.s3stream.wal_failover import recover_failed_wal
    from tests.unit.test_upload_stream_errors import HookedController

    ctrl = HookedController(MetadataStateMachine(ControllerSettings(bucket_ids=[0, 1])))
    for node in (1, 2):
        ctrl.execute(
            "register_broker",
            {
                "node_id": node,
                "az": "az1",
                "host": "127.0.0.1",
                "kafka_port": 9000 + node,
                "incarnation_id": f"i{node}",
                "wal_uri": f"s3://automq-wal/wal/node-{node}",
            },
        )
        ctrl.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0})

    def engine(node: int) -> S3Storage:
        cfg = StorageConfig(
            upload_interval_s=3600, upload_threshold_bytes=1 << 30, block_cache_bytes=16 << 20
        )
        wal = WALConfig(uri=f"s3://automq-wal/wal/node-{node}", capacity_bytes=16 << 20)
        e = S3Storage(cfg, node, 0, ctrl, objects, data_dir=tmp_path / f"node{node}", wal=wal)
        e.start()
        return e

    failed = engine(1)
    assert isinstance(failed.wal, ObjectWAL)
    stream = failed.open_stream(failed.create_stream(), 0)
    for f in [stream.append(b"v%d" % i) for i in range(20)]:
        f.result(10)
    assert not list((tmp_path / "node1").rglob("wal*"))  # no local WAL file
    # crash: no final upload; the WAL objects are all that is left
    failed._stop.set()
    failed.request_upload()
    failed._uploader.join(10)
    failed.wal.close()
    assert ctrl.machine.image.streams[stream.stream_id].end_offset == 0

    ctrl.execute("fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "test crash"})
    ctrl.execute("lifecycle_tick", {"expired_brokers": []})
    wal = ctrl.machine.image.node_wals[1]
    assert wal.failover_mode and wal.failover_target_node_id == 2
    target = engine(2)
    try:
        result = recover_failed_wal(
            target,
            1,
            wal.wal_uri,
            wal.node_epoch,
            lambda: [
                (s.stream_id, s.epoch)
                for s in ctrl.machine.image.streams.values()
                if s.state.value == "opened" and s.node_id == 1
            ],
        )
        assert result.records_read == 20 and result.batches_uploaded == 20
        assert ctrl.machine.image.streams[stream.stream_id].end_offset == 20
        assert not ctrl.machine.image.node_wals[1].failover_mode
        assert objects.list_keys(1, "wal/node-1/data/") == []  # trimmed after the upload
        got = []  # read back from the committed stream-set objects themselves
        for obj in ctrl.machine.image.objects.values():
            if obj.state == ObjectState.COMMITTED:
                data = objects.get_object(obj.bucket_id, object_key(obj.object_id))
                for entry in parse_object(data)[1]:
                    block = data[entry.position : entry.end_position]
                    got += [(b.base_offset, b.payload) for b in decode_block(block, entry)]
        assert sorted(got) == [(i, b"v%d" % i) for i in range(20)]
    finally:
        target._stop.set()
        target.request_upload()
        target._uploader.join(10)
        target.wal.close()


def test_cluster_up_wal_s3_gives_each_broker_an_object_wal_in_the_main_bucket(tmp_path):
    from cli.cluster_config import broker_wal_uri
    from cli.flag_differences import flag_differences
    from cli.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "c")
    config = cluster.create(3, 1, ["az1"], None, None, 6000, wal="s3")
    assert cluster.load().broker_wal == "s3"
    assert broker_wal_uri(config, 2) == "s3://automq-main/wal/node-2"
    assert flag_differences(config, wal="s3") == []
    assert flag_differences(config, wal="file") == ["--wal file (the cluster has s3)"]


def test_a_stalled_put_is_hedged_with_a_copy_and_a_failed_one_stops_the_wal(objects, monkeypatch):
    from concurrent.futures import Future

    real_put = objects.put_object_async
    stalled: list[Future] = []

    def stall_first_data_put(bucket_id, key, data, **kw):
        if "/data/" in key and not stalled:
            stalled.append(Future())  # a connection that never answers
            return stalled[0]
        return real_put(bucket_id, key, data, **kw)

    monkeypatch.setattr(objects, "put_object_async", stall_first_data_put)
    # one copy at most: a copy slower than 0.1 s on a loaded machine would get copies too
    config = ObjectWALConfig(hedge_after_s=0.1, linger_s=0, max_hedges=1)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    try:
        assert wal.append(b"a").result(5).offset == 0  # acknowledged by the copy
        assert wal.hedged_puts == 1 and stalled
    finally:
        wal.close()

    def failing_put(bucket_id, key, data, **kw):
        f: Future = Future()
        f.set_exception(OSError("store gone"))
        return f

    wal = open_wal(URI, 1, 1, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    monkeypatch.setattr(objects, "put_object_async", failing_put)
    try:
        with pytest.raises(WALError, match="store gone"):
            wal.append(b"b").result(5)
        with pytest.raises(WALError):
            wal.append(b"c")
    finally:
        wal.close()
    monkeypatch.setattr(objects, "put_object_async", real_put)
    again = open_wal(URI, 1, 2, capacity_bytes=CAPACITY, objects=objects)
    try:
        assert [r.data for r in again.recover()] == [b"a"]  # the failed append is not there
    finally:
        again.close()


def test_a_failover_retry_with_the_same_epoch_reclaims_and_fences_its_first_attempt(objects):
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    acked = [wal.append(b"a%d" % i).result(10) for i in range(3)]
    first = take_over_wal(URI, 2, 1, objects=objects)
    retry = take_over_wal(URI, 2, 1, objects=objects)  # the target retries its failover
    try:
        with pytest.raises(WALFencedError):
            first.trim(acked[0].next_offset)
        assert [r.data for r in retry.recover()] == [b"a0", b"a1", b"a2"]
    finally:
        first.close()
        retry.close()
        wal.close()
    with pytest.raises(WALTakeoverRefusedError):  # another node still needs a newer epoch
        take_over_wal(URI, 3, 1, objects=objects)


def test_recovery_skips_an_object_a_racing_trim_deleted_and_refuses_a_lost_one(objects):
    config = ObjectWALConfig(linger_s=0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    acked = [wal.append(b"r%d" % i).result(10) for i in range(3)]  # one object each
    handle = take_over_wal(URI, 2, 1, objects=objects)
    first, second = sorted(wal_keys(objects, "data"))[:2]
    # the fenced owner had uploaded r0 and trims it while the recoverer reads
    objects.put_object(1, f"wal/node-1/trim/{acked[0].next_offset:020d}", b"")
    objects.delete_objects(1, [first])
    assert [r.data for r in handle.recover()] == [b"r1", b"r2"]
    objects.delete_objects(1, [second])  # r1 vanishes with no trim covering it
    with pytest.raises(WALCorruptError, match="missing"):
        list(handle.recover())
    handle.close()
    wal.close()


def test_any_node_reads_acknowledged_records_by_offset_without_claiming(objects):
    from dataplane.s3stream.wal.object_chain import ObjectWALLocation
    from dataplane.s3stream.wal.object_readers import ObjectWALReader, WALTrimmedError

    config = ObjectWALConfig(linger_s=0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    reader = ObjectWALReader(objects, ObjectWALLocation(1, "wal/node-1"), cached_objects=2)
    try:
        first = [wal.append(b"first-%d" % i).result(10) for i in range(3)]
        assert [reader.read(r.offset).data for r in first] == [b"first-0", b"first-1", b"first-2"]
        later = wal.append(b"later").result(10)  # past the reader's cached listing
        assert reader.read(later.offset).data == b"later"
        with pytest.raises(ValueError, match="no record"):
            reader.read(first[1].offset + 1)
        with pytest.raises(ValueError, match="ends at"):
            reader.read(later.next_offset)
        wal.trim(first[1].next_offset)
        with pytest.raises(WALTrimmedError):
            ObjectWALReader(objects, ObjectWALLocation(1, "wal/node-1")).read(first[0].offset)
        assert reader.read(first[2].offset).data == b"first-2"
        assert not wal.fenced  # reading never disturbs the writer
        assert wal.append(b"more").result(10).offset == later.next_offset
    finally:
        wal.close()


def test_a_zombies_late_copy_never_displaces_a_newer_writers_objects():
    e, f, g = Writer(1, 0), Writer(2, 0), Writer(3, 0)
    seals = [SealKey(e, 0), SealKey(f, 100), SealKey(g, 300)]
    datas = [
        DataKey(e, 0, 100),
        DataKey(f, 100, 150),
        DataKey(f, 150, 300),
        DataKey(e, 100, 140),  # e's late copy: starts where f began
        DataKey(e, 150, 160),  # and one starting at one of f's boundaries
    ]
    chain = resolve_chain(datas, seals, [])
    assert chain.objects == [DataKey(e, 0, 100), DataKey(f, 100, 150), DataKey(f, 150, 300)]
    assert set(chain.stale) == {DataKey(e, 100, 140), DataKey(e, 150, 160)}
    # even with f's seal gone, the newer writer wins at the same start offset
    chain = resolve_chain(datas, [SealKey(e, 0), SealKey(g, 300)], [])
    assert chain.objects == [DataKey(e, 0, 100), DataKey(f, 100, 150), DataKey(f, 150, 300)]


def test_recovery_ends_at_an_object_whose_put_was_cut_short(objects, caplog):
    # a writer killed during a PUT can leave the object listed with what the store got
    # (SeaweedFS: even nothing); it was never acknowledged, nor was anything after it
    config = ObjectWALConfig(linger_s=0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    [wal.append(b"r%d" % i).result(10) for i in range(4)]  # one object each
    wal.close()
    keys = sorted(wal_keys(objects, "data"))
    objects.put_object(1, keys[2], b"")  # r2's object cut short; r3's stored whole after it
    handle = take_over_wal(URI, 2, 1, objects=objects)
    with caplog.at_level("WARNING"):
        assert [r.data for r in handle.recover()] == [b"r0", b"r1"]
    assert "truncated" in caplog.text and "1 later objects" in caplog.text
    handle.close()


def test_fenced_while_the_writer_lingers_the_writer_exits_cleanly(objects, monkeypatch, caplog):
    """Issue 33: the ack loop fences the WAL (failing the queue) while the writer lingers for
    a batch; the writer found an empty queue and died of an IndexError. Now it goes back to
    its wait, sees the fence and exits; the append fails with WALFencedError."""
    from dataplane.s3stream.wal.append_queue import FENCED

    wal = open_wal(URI, 1, 3, capacity_bytes=CAPACITY, objects=objects)
    real_linger = wal._linger

    def fenced_meanwhile(max_batch_bytes: int, linger_s: float) -> None:
        real_linger(max_batch_bytes, 0)
        reason = "owned by node 2 epoch 4"  # what the ack loop does (`_stop`)
        wal._fail_appends(wal._fail_queue(FENCED, reason), FENCED, reason)

    monkeypatch.setattr(wal, "_linger", fenced_meanwhile)
    try:
        future = wal.append(b"lingering")
        with pytest.raises(WALFencedError):
            future.result(10)
        writer = next(t for t in wal._threads if "writer" in t.name)
        writer.join(10)
        assert not writer.is_alive()
        assert not [r for r in caplog.records if "crashed" in r.getMessage()], caplog.text
    finally:
        wal.close()


def test_a_reader_lists_only_the_keys_after_the_newest_data_object_it_knows(objects, monkeypatch):
    """Issue #32: a main (or proxy) reading a RouterChannel must not LIST the whole prefix
    for each new channel object: later listings send StartAfter (the newest data key
    known) and get back only the new data objects (plus the owner, seals, trim points)."""
    from botocore.client import BaseClient

    from dataplane.s3stream.wal.object_chain import ObjectWALLocation
    from dataplane.s3stream.wal.object_readers import ObjectWALReader

    listings: list[tuple[dict, list[str]]] = []
    real_call = BaseClient._make_api_call

    def spy(self, operation, params):
        result = real_call(self, operation, params)
        if operation == "ListObjectsV2":
            listings.append((dict(params), [c["Key"] for c in result.get("Contents", [])]))
        return result

    monkeypatch.setattr(BaseClient, "_make_api_call", spy)
    config = ObjectWALConfig(linger_s=0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    reader = ObjectWALReader(objects, ObjectWALLocation(1, "wal/node-1"))
    try:
        first = [wal.append(b"first-%d" % i).result(10) for i in range(3)]
        assert reader.read(first[0].offset).data == b"first-0"
        old_data = set(wal_keys(objects, "data"))
        listings.clear()
        later = [wal.append(b"later-%d" % i).result(10) for i in range(2)]
        assert reader.read(later[1].offset).data == b"later-1"
        assert reader.read(first[2].offset).data == b"first-2"  # still known: no listing
        assert len(listings) == 1
        params, keys = listings[0]
        assert params["StartAfter"] == max(old_data)  # the chain's last object
        listed_data = {k for k in keys if "/data/" in k}
        assert listed_data == set(wal_keys(objects, "data")) - old_data
        assert listed_data and all(k > max(old_data) for k in keys)
        # after a trim the reader forgets the trimmed objects and keeps reading on
        wal.trim(later[0].offset)
        more = wal.append(b"more").result(10)
        assert reader.read(more.offset).data == b"more"
        assert reader.read(later[0].offset).data == b"later-0"
        assert "StartAfter" in listings[-1][0]
    finally:
        wal.close()


def test_readers_at_once_make_one_listing_and_one_get_per_object(objects, monkeypatch):
    """A failover resolves its Link Records on several threads: readers of the same
    RouterChannel must not each LIST the prefix and GET the same object."""
    from botocore.client import BaseClient

    from dataplane.s3stream.wal.object_chain import ObjectWALLocation
    from dataplane.s3stream.wal.object_readers import ObjectWALReader

    readers_count = 4
    calls: list[str] = []
    entered = threading.Semaphore(0)
    real_call = BaseClient._make_api_call

    def spy(self, operation, params):
        if operation in (
            "ListObjectsV2",
            "GetObject",
        ) and threading.current_thread().name.startswith("reader"):
            calls.append(operation)
            if len(calls) == 1:  # the first request waits until every reader has asked
                for _ in range(readers_count - 1):
                    assert entered.acquire(timeout=10)
        return real_call(self, operation, params)

    config = ObjectWALConfig(linger_s=0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    reader = ObjectWALReader(objects, ObjectWALLocation(1, "wal/node-1"))
    got: list[bytes] = []
    try:
        acked = [wal.append(b"record-%d" % i).result(10) for i in range(2)]
        monkeypatch.setattr(BaseClient, "_make_api_call", spy)

        def read(i: int) -> None:
            if i:
                entered.release()
            got.append(reader.read(acked[1].offset).data)

        threads = [
            threading.Thread(target=read, args=(i,), name=f"reader-{i}")
            for i in range(readers_count)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got == [b"record-1"] * readers_count
        assert sorted(calls) == ["GetObject", "ListObjectsV2"]
    finally:
        wal.close()


def test_a_reader_finds_an_object_that_became_visible_after_a_later_one(objects):
    """PUTs run in parallel: a reader may list a later object before an earlier one is
    visible. The next listing starts after the chain's last object (not the newest key
    seen), so the earlier one is found once it is there (issue #32, StartAfter listing)."""
    from dataplane.s3stream.wal.object_chain import ObjectWALLocation
    from dataplane.s3stream.wal.object_readers import ObjectWALReader

    config = ObjectWALConfig(linger_s=0)
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects, object_config=config)
    reader = ObjectWALReader(objects, ObjectWALLocation(1, "wal/node-1"))
    try:
        acked = [wal.append(b"record-%d" % i).result(10) for i in range(3)]
        keys = sorted(wal_keys(objects, "data"))
        assert len(keys) == 3  # one object per append (no linger)
        middle = objects.get_object(1, keys[1])
        objects.delete_objects(1, [keys[1]])  # not visible yet: the third is
        assert reader.read(acked[0].offset).data == b"record-0"
        objects.put_object(1, keys[1], middle)  # its PUT lands
        assert reader.read(acked[1].offset).data == b"record-1"
        assert reader.read(acked[2].offset).data == b"record-2"
    finally:
        wal.close()


def test_an_empty_owner_object_left_by_a_dead_writer_does_not_lock_the_wal_out(objects):
    """A writer that died while storing its owner object can leave it empty (SeaweedFS keeps
    an aborted PUT as an empty object). The next open must not fail on it forever: it
    claims after the greatest writer of the WAL's objects, so its own objects never share
    a writer tag with theirs, and every acknowledged record is recovered."""
    wal = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    acked = [wal.append(b"before-%d" % i).result(10) for i in range(3)]
    wal.close()
    objects.put_object(1, "wal/node-1/owner", b"")  # a re-open (epoch 0) died storing it

    reopened = open_wal(URI, 1, 0, capacity_bytes=CAPACITY, objects=objects)
    try:
        assert [r.data for r in reopened.recover()] == [b"before-%d" % i for i in range(3)]
        after = reopened.append(b"after").result(10)
        assert after.offset == acked[-1].next_offset
        # the writer of the first objects was (0, 0): the new one is (0, 1), not (0, 0) again
        assert any("/00000000000000000000.000001/" in k for k in wal_keys(objects, "data"))
    finally:
        reopened.close()
    again = open_wal(URI, 1, 1, capacity_bytes=CAPACITY, objects=objects)
    try:
        assert [r.data for r in again.recover()] == [b"before-%d" % i for i in range(3)] + [
            b"after"
        ]
    finally:
        again.close()


def test_an_empty_owner_object_alone_is_an_empty_wal_to_open_or_take_over(objects):
    objects.put_object(1, "wal/node-1/owner", b"")  # a first open died storing it
    handle = take_over_wal(URI, 2, 1, objects=objects)
    try:
        assert list(handle.recover()) == []
    finally:
        handle.close()
    objects.put_object(1, "wal/node-1/owner", b"")
    wal = open_wal(URI, 1, 3, capacity_bytes=CAPACITY, objects=objects)
    try:
        assert list(wal.recover()) == []
        assert wal.append(b"x").result(10).offset == 0
    finally:
        wal.close()
    # anything else that is not an owner is still refused as corrupt
    objects.put_object(1, "wal/node-1/owner", b"garbage")
    with pytest.raises(WALCorruptError, match="unreadable WAL owner object"):
        open_wal(URI, 1, 4, capacity_bytes=CAPACITY, objects=objects)
