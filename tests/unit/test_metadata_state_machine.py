"""The metadata state machine: fencing rules, object lifecycle, idempotent and atomic commits."""

from __future__ import annotations

import pytest

from controlplane.image import MetadataImage
from controlplane.records import ObjectState, StreamState, decode_record
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine

NOW = 1_000_000


def ok(result: dict) -> dict:
    assert "error" not in result, result
    return result["result"]


def err(result: dict) -> str:
    assert "error" in result, result
    return result["error"]["code"]


@pytest.fixture
def sm() -> MetadataStateMachine:
    machine = MetadataStateMachine(ControllerSettings(bucket_ids=[0, 1]))
    for node in (1, 2):
        ok(
            machine.execute(
                "register_broker",
                {
                    "node_id": node,
                    "az": f"az{node}",
                    "host": "127.0.0.1",
                    "kafka_port": 9000 + node,
                    "incarnation_id": f"inc-{node}",
                },
                NOW,
            )
        )
        ok(machine.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0}, NOW))
    return machine


def rejected_without_change(sm: MetadataStateMachine, command: str, body: dict) -> str:
    before = (sm.image.fingerprint(), sm.next_offset)
    code = err(sm.execute(command, body, NOW))
    assert (sm.image.fingerprint(), sm.next_offset) == before
    return code


def open_stream(sm, stream_id=0, node=1, node_epoch=0, epoch=0):
    return sm.execute(
        "open_stream",
        {"node_id": node, "node_epoch": node_epoch, "stream_id": stream_id, "stream_epoch": epoch},
        NOW,
    )


def commit(
    sm,
    object_id,
    ranges,
    node=1,
    node_epoch=0,
    stream_objects=(),
    compacted=(),
    bucket_id=0,
    order_id=None,
):
    return sm.execute(
        "commit_stream_set_object",
        {
            "node_id": node,
            "node_epoch": node_epoch,
            "object_id": object_id,
            "order_id": object_id if order_id is None else order_id,
            "size_bytes": 1000,
            "bucket_id": bucket_id,
            "stream_ranges": [
                {"stream_id": s, "stream_epoch": e, "start_offset": a, "end_offset": b}
                for s, e, a, b in ranges
            ],
            "stream_objects": list(stream_objects),
            "compacted_object_ids": list(compacted),
        },
        NOW,
    )


def prepare(sm, count=1, node=1, ttl_ms=60_000):
    return ok(
        sm.execute(
            "prepare_objects",
            {"node_id": node, "node_epoch": 0, "count": count, "ttl_ms": ttl_ms},
            NOW,
        )
    )["first_object_id"]


def make_stream(sm, node=1) -> int:
    return ok(sm.execute("create_stream", {"node_id": node, "node_epoch": 0}, NOW))["stream_id"]


# ---------------------------------------------------------------- brokers


def test_registration_bumps_node_epoch_and_starts_fenced(sm):
    assert sm.image.brokers[1].node_epoch == 0 and not sm.image.brokers[1].fenced
    res = ok(
        sm.execute(
            "register_broker",
            {"node_id": 1, "az": "az1", "host": "h", "kafka_port": 1, "incarnation_id": "new"},
            NOW,
        )
    )
    assert res["node_epoch"] == 1
    assert sm.image.brokers[1].fenced
    # the old epoch is fenced for writes
    assert (
        rejected_without_change(
            sm, "prepare_objects", {"node_id": 1, "node_epoch": 0, "count": 1, "ttl_ms": 1000}
        )
        == "STALE_NODE_EPOCH"
    )


def test_a_starting_broker_stays_fenced_while_it_wants_to(sm):
    """WantFence: heartbeats of a broker still opening its WAL keep it fenced (no record),
    the first one without it unfences."""
    ok(
        sm.execute(
            "register_broker",
            {"node_id": 1, "az": "az1", "host": "h", "kafka_port": 1, "incarnation_id": "new"},
            NOW,
        )
    )
    offset = sm.image.offset
    hb = {"node_id": 1, "node_epoch": 1, "want_fence": True}
    res = ok(sm.execute("broker_heartbeat", hb, NOW))
    assert res["fenced"] and res["fence_reason"] == "registered"
    assert sm.image.offset == offset and sm.image.brokers[1].fenced
    assert not ok(sm.execute("broker_heartbeat", {**hb, "want_fence": False}, NOW))["fenced"]
    assert not sm.image.brokers[1].fenced


def test_retried_registration_with_same_incarnation_is_idempotent(sm):
    before = sm.next_offset
    res = ok(
        sm.execute(
            "register_broker",
            {
                "node_id": 1,
                "az": "az1",
                "host": "127.0.0.1",
                "kafka_port": 9001,
                "incarnation_id": "inc-1",
            },
            NOW,
        )
    )
    assert res["node_epoch"] == 0 and sm.next_offset == before


def test_session_expiry_fences_for_good_and_reregistration_recovers(sm):
    ok(sm.execute("lifecycle_tick", {"expired_brokers": [[1, 0]]}, NOW))
    assert sm.image.brokers[1].fenced
    assert sm.image.brokers[1].fence_reason == "session expired"
    # heartbeats of the fenced epoch do not unfence it: the node must come back with a new epoch
    assert ok(sm.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 0}, NOW))["fenced"]
    assert (
        rejected_without_change(
            sm, "prepare_objects", {"node_id": 1, "node_epoch": 0, "count": 1, "ttl_ms": 1000}
        )
        == "NODE_FENCED"
    )
    ok(
        sm.execute(
            "register_broker",
            {"node_id": 1, "az": "az1", "host": "h", "kafka_port": 1, "incarnation_id": "again"},
            NOW,
        )
    )
    assert not ok(sm.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 1}, NOW))["fenced"]


def test_expiry_of_a_stale_epoch_is_ignored(sm):
    ok(
        sm.execute(
            "register_broker",
            {"node_id": 1, "az": "az1", "host": "h", "kafka_port": 1, "incarnation_id": "x"},
            NOW,
        )
    )
    ok(sm.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 1}, NOW))
    ok(sm.execute("lifecycle_tick", {"expired_brokers": [[1, 0]]}, NOW))
    assert not sm.image.brokers[1].fenced


def test_unknown_node_and_never_issued_epoch(sm):
    assert (
        rejected_without_change(sm, "create_stream", {"node_id": 9, "node_epoch": 0})
        == "UNKNOWN_NODE"
    )
    assert (
        rejected_without_change(sm, "create_stream", {"node_id": 1, "node_epoch": 5})
        == "INVALID_REQUEST"
    )


# ---------------------------------------------------------------- streams


def test_stream_open_close_and_epoch_fencing(sm):
    sid = make_stream(sm)
    res = ok(open_stream(sm, sid, epoch=0))
    assert res["next_offset"] == 0
    assert ok(open_stream(sm, sid, epoch=0)) == res  # a retried open
    # another node cannot take the stream while it is open on node 1
    assert (
        rejected_without_change(
            sm, "open_stream", {"node_id": 2, "node_epoch": 0, "stream_id": sid, "stream_epoch": 1}
        )
        == "STREAM_NOT_CLOSED"
    )
    ok(
        sm.execute(
            "close_stream",
            {"node_id": 1, "node_epoch": 0, "stream_id": sid, "stream_epoch": 0},
            NOW,
        )
    )
    assert sm.image.streams[sid].state == StreamState.CLOSED
    ok(
        sm.execute(
            "open_stream", {"node_id": 2, "node_epoch": 0, "stream_id": sid, "stream_epoch": 1}, NOW
        )
    )
    # the old epoch can neither reopen nor write
    assert err(open_stream(sm, sid, node=1, epoch=0)) == "STREAM_FENCED"
    first = prepare(sm)
    assert (
        rejected_without_change(
            sm,
            "commit_stream_set_object",
            {
                "node_id": 1,
                "node_epoch": 0,
                "object_id": first,
                "order_id": 0,
                "size_bytes": 1,
                "bucket_id": 0,
                "stream_ranges": [
                    {"stream_id": sid, "stream_epoch": 0, "start_offset": 0, "end_offset": 5}
                ],
            },
        )
        == "STREAM_FENCED"
    )
    assert len(sm.image.streams[sid].ranges) == 2  # one range per epoch


def test_unknown_stream(sm):
    assert err(open_stream(sm, 77)) == "UNKNOWN_STREAM"


# ---------------------------------------------------------------- objects and commits


def test_object_lifecycle_prepare_commit_destroy_delete(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    oid = prepare(sm)
    assert sm.image.objects[oid].state == ObjectState.PREPARED
    ok(commit(sm, oid, [(sid, 0, 0, 100)], bucket_id=1))
    meta = sm.image.objects[oid]
    assert meta.state == ObjectState.COMMITTED and meta.bucket_id == 1
    assert sm.image.streams[sid].end_offset == 100
    [(rng, found)] = sm.image.stream_objects_in_range(sid, 0, 100)
    assert rng.object_id == oid and found.bucket_id == 1
    ok(
        sm.execute(
            "trim_stream",
            {
                "node_id": 1,
                "node_epoch": 0,
                "stream_id": sid,
                "stream_epoch": 0,
                "new_start_offset": 100,
            },
            NOW,
        )
    )
    assert sm.image.objects[oid].state == ObjectState.MARK_DESTROYED
    assert sm.image.stream_objects_in_range(sid, 0, 100) == []
    assert sm.image.streams[sid].trimmed_ms == NOW  # `topic describe`: last retention
    ok(sm.execute("objects_deleted", {"object_ids": [oid]}, NOW))
    assert oid not in sm.image.objects


def test_commit_is_atomic_and_checks_continuity(sm):
    a, b = make_stream(sm), make_stream(sm)
    ok(open_stream(sm, a))
    ok(open_stream(sm, b))
    oid = prepare(sm, 2)
    # b's range leaves a gap: nothing of the commit may apply, not even a's range
    assert (
        rejected_without_change(
            sm,
            "commit_stream_set_object",
            {
                "node_id": 1,
                "node_epoch": 0,
                "object_id": oid,
                "order_id": 0,
                "size_bytes": 1,
                "bucket_id": 0,
                "stream_ranges": [
                    {"stream_id": a, "stream_epoch": 0, "start_offset": 0, "end_offset": 10},
                    {"stream_id": b, "stream_epoch": 0, "start_offset": 5, "end_offset": 10},
                ],
            },
        )
        == "STREAM_OFFSET_GAP"
    )
    ok(
        commit(
            sm,
            oid,
            [(a, 0, 0, 10), (b, 0, 0, 10)],
            stream_objects=[
                {
                    "object_id": oid + 1,
                    "stream_id": a,
                    "stream_epoch": 0,
                    "start_offset": 10,
                    "end_offset": 30,
                    "size_bytes": 5,
                }
            ],
        )
    )
    assert sm.image.streams[a].end_offset == 30 and sm.image.streams[b].end_offset == 10
    kinds = [r.kind for r, _ in sm.image.stream_objects_in_range(a, 0, 30)]
    assert kinds == ["sso", "so"]


def test_repeated_commit_is_idempotent(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    oid = prepare(sm)
    assert ok(commit(sm, oid, [(sid, 0, 0, 10)]))["idempotent"] is False
    before = (sm.image.fingerprint(), sm.next_offset)
    assert ok(commit(sm, oid, [(sid, 0, 0, 10)]))["idempotent"] is True
    assert (sm.image.fingerprint(), sm.next_offset) == before


def test_commit_rejections_change_nothing(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    oid = prepare(sm)
    base = {
        "node_id": 1,
        "node_epoch": 0,
        "object_id": oid,
        "order_id": 0,
        "size_bytes": 1,
        "bucket_id": 0,
        "stream_ranges": [
            {"stream_id": sid, "stream_epoch": 0, "start_offset": 0, "end_offset": 10}
        ],
    }
    assert (
        rejected_without_change(sm, "commit_stream_set_object", {**base, "object_id": 999})
        == "UNKNOWN_OBJECT"
    )
    assert (
        rejected_without_change(sm, "commit_stream_set_object", {**base, "bucket_id": 7})
        == "UNKNOWN_BUCKET"
    )
    assert (
        rejected_without_change(sm, "commit_stream_set_object", {**base, "node_epoch": "x"})
        == "INVALID_REQUEST"
    )
    assert (
        rejected_without_change(sm, "commit_stream_set_object", {**base, "surprise": 1})
        == "INVALID_REQUEST"
    )
    assert (
        rejected_without_change(
            sm,
            "commit_stream_set_object",
            {
                **base,
                "stream_ranges": [
                    {"stream_id": 42, "stream_epoch": 0, "start_offset": 0, "end_offset": 1}
                ],
            },
        )
        == "UNKNOWN_STREAM"
    )
    assert (
        rejected_without_change(
            sm,
            "commit_stream_set_object",
            {
                **base,
                "stream_ranges": [
                    {"stream_id": sid, "stream_epoch": 0, "start_offset": 0, "end_offset": 0}
                ],
            },
        )
        == "INVALID_OFFSET"
    )
    assert rejected_without_change(sm, "no_such_command", {}) == "UNKNOWN_COMMAND"


def test_committed_object_cannot_be_committed_as_another(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    oid = prepare(sm)
    ok(commit(sm, oid, [(sid, 0, 0, 10)]))
    assert (
        rejected_without_change(
            sm,
            "commit_stream_set_object",
            {
                "node_id": 1,
                "node_epoch": 0,
                "object_id": -1,
                "order_id": 0,
                "size_bytes": 1,
                "bucket_id": 0,
                "stream_objects": [
                    {
                        "object_id": oid,
                        "stream_id": sid,
                        "stream_epoch": 0,
                        "start_offset": 10,
                        "end_offset": 20,
                        "size_bytes": 1,
                    }
                ],
            },
        )
        == "OBJECT_NOT_PREPARED"
    )


def test_compaction_replaces_objects_and_marks_sources_destroyed(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    first = prepare(sm, 3)
    ok(commit(sm, first, [(sid, 0, 0, 10)]))
    ok(commit(sm, first + 1, [(sid, 0, 10, 20)]))
    # compaction writes one SSO covering both, unlinking the sources atomically
    ok(commit(sm, first + 2, [(sid, 0, 0, 20)], compacted=[first, first + 1]))
    assert [r.object_id for r, _ in sm.image.stream_objects_in_range(sid, 0, 20)] == [first + 2]
    assert sm.image.objects[first].state == ObjectState.MARK_DESTROYED
    assert sm.image.objects[first + 1].state == ObjectState.MARK_DESTROYED
    assert sm.image.streams[sid].end_offset == 20  # compaction does not advance the stream


def test_stream_object_compaction(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    first = prepare(sm, 3)
    sos = [
        {
            "object_id": first + i,
            "stream_id": sid,
            "stream_epoch": 0,
            "start_offset": 10 * i,
            "end_offset": 10 * i + 10,
            "size_bytes": 10,
        }
        for i in range(2)
    ]
    ok(commit(sm, -1, [], stream_objects=sos, order_id=0))
    body = {
        "node_id": 1,
        "node_epoch": 0,
        "object_id": first + 2,
        "stream_id": sid,
        "start_offset": 0,
        "end_offset": 20,
        "size_bytes": 20,
        "bucket_id": 0,
        "source_object_ids": [first, first + 1],
    }
    assert (
        rejected_without_change(sm, "commit_stream_object", {**body, "end_offset": 25})
        == "STREAM_OFFSET_GAP"
    )
    ok(sm.execute("commit_stream_object", body, NOW))
    assert [r.object_id for r, _ in sm.image.stream_objects_in_range(sid, 0, 20)] == [first + 2]
    assert ok(sm.execute("commit_stream_object", body, NOW))["idempotent"] is True


def test_prepared_objects_expire_after_their_deadline(sm):
    oid = prepare(sm, ttl_ms=1000)
    ok(sm.execute("lifecycle_tick", {}, NOW + 999))
    assert sm.image.objects[oid].state == ObjectState.PREPARED
    ok(sm.execute("lifecycle_tick", {}, NOW + 1000))
    assert sm.image.objects[oid].state == ObjectState.MARK_DESTROYED
    # an expired object can no longer be committed: its writer is too late
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    assert err(commit(sm, oid, [(sid, 0, 0, 1)])) == "OBJECT_NOT_PREPARED"


def test_new_objects_go_to_the_active_bucket(sm):
    ok(sm.execute("set_active_bucket", {"bucket_id": 1, "reason": "drill"}, NOW))
    assert (
        ok(
            sm.execute(
                "prepare_objects", {"node_id": 1, "node_epoch": 0, "count": 1, "ttl_ms": 1000}, NOW
            )
        )["bucket_id"]
        == 1
    )
    assert rejected_without_change(sm, "set_active_bucket", {"bucket_id": 5}) == "UNKNOWN_BUCKET"


# ---------------------------------------------------------------- topics


def test_topics_balance_leaders_and_map_partitions_to_streams(sm):
    res = ok(
        sm.execute("create_topic", {"name": "orders", "partitions": 4, "topic_id": "t-1"}, NOW)
    )
    assert res["partitions"] == 4
    topic = sm.image.topic_by_name("orders")
    leaders = sorted(p.leader_node_id for p in topic.partitions.values())
    assert leaders == [1, 1, 2, 2]
    assert len({p.stream_id for p in topic.partitions.values()}) == 4
    assert (
        rejected_without_change(
            sm, "create_topic", {"name": "orders", "partitions": 1, "topic_id": "t-2"}
        )
        == "TOPIC_ALREADY_EXISTS"
    )
    assert (
        rejected_without_change(
            sm, "create_topic", {"name": "bad name!", "partitions": 1, "topic_id": "t-3"}
        )
        == "INVALID_TOPIC_NAME"
    )
    assert (
        rejected_without_change(
            sm, "create_topic", {"name": "x", "partitions": 0, "topic_id": "t-4"}
        )
        == "INVALID_REQUEST"
    )
    ok(sm.execute("create_partitions", {"name": "orders", "total_count": 6}, NOW))
    assert len(sm.image.topic_by_name("orders").partitions) == 6
    assert (
        rejected_without_change(sm, "create_partitions", {"name": "orders", "total_count": 3})
        == "INVALID_PARTITIONS"
    )
    ok(sm.execute("delete_topic", {"name": "orders"}, NOW))
    assert sm.image.topic_by_name("orders") is None and not sm.image.streams
    assert rejected_without_change(sm, "delete_topic", {"name": "orders"}) == "UNKNOWN_TOPIC"


def test_topic_needs_an_unfenced_broker():
    sm = MetadataStateMachine()
    assert (
        err(sm.execute("create_topic", {"name": "t", "partitions": 1, "topic_id": "x"}, NOW))
        == "NOT_ENOUGH_BROKERS"
    )


# ---------------------------------------------------------------- the log


def test_replaying_the_log_builds_the_same_image(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))
    oid = prepare(sm)
    ok(commit(sm, oid, [(sid, 0, 0, 10)]))
    ok(sm.execute("create_topic", {"name": "t", "partitions": 2, "topic_id": "x"}, NOW))
    replica = MetadataImage()
    data = sm.read_log(-1, 10_000)
    for item in data["records"]:
        replica.apply(decode_record(item["record"]), item["offset"])
    assert replica.fingerprint() == sm.image.fingerprint()
    assert replica.offset == sm.next_offset - 1


def test_a_reader_behind_the_retained_log_gets_a_snapshot():
    sm = MetadataStateMachine(ControllerSettings(log_retention_records=100))
    for i in range(300):
        ok(sm.execute("put_kv", {"key": f"k{i}", "value": "v"}, NOW))
    data = sm.read_log(10)
    assert "snapshot" in data and data["snapshot_offset"] == 299
    image = MetadataImage.model_validate(data["snapshot"])
    assert image.fingerprint() == sm.image.fingerprint()
    recent = sm.read_log(250, 10)
    assert [r["offset"] for r in recent["records"]] == list(range(251, 261))


def test_producer_id_blocks_never_overlap(sm):
    a = ok(sm.execute("allocate_producer_ids", {"node_id": 1, "node_epoch": 0, "count": 100}, NOW))
    b = ok(sm.execute("allocate_producer_ids", {"node_id": 2, "node_epoch": 0, "count": 100}, NOW))
    assert (a["first_producer_id"], b["first_producer_id"]) == (0, 100)
    assert (
        rejected_without_change(
            sm, "allocate_producer_ids", {"node_id": 1, "node_epoch": 3, "count": 1}
        )
        == "INVALID_REQUEST"
    )


def test_heartbeat_tells_a_finally_fenced_broker_why(sm):
    ok(sm.execute("lifecycle_tick", {"expired_brokers": [[1, 0]]}, NOW))
    res = ok(sm.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 0}, NOW))
    assert res["fenced"] and res["fence_reason"] == "session expired"


# ---------------------------------------------------------------- aborted transactions


def test_aborted_transactions_stay_with_the_stream_until_trimmed(sm):
    sid = make_stream(sm)
    ok(open_stream(sm, sid))

    def record(entries, node=1, epoch=0):
        return sm.execute(
            "record_aborted_txns",
            {
                "node_id": node,
                "node_epoch": 0,
                "stream_id": sid,
                "stream_epoch": epoch,
                "aborted": [
                    {"producer_id": p, "first_offset": f, "marker_offset": m} for p, f, m in entries
                ],
            },
            NOW,
        )

    assert ok(record([(7, 10, 20), (8, 15, 30)]))["recorded"] == 2
    # a retried request (and anything not past the last marker) is skipped, not doubled
    assert ok(record([(8, 15, 30), (9, 40, 50)]))["recorded"] == 1
    assert sm.image.streams[sid].aborted_txns == [(7, 10, 20), (8, 15, 30), (9, 40, 50)]
    # only the stream's owner at its epoch; a first offset past the marker is refused
    assert rejected_without_change(sm, "record_aborted_txns", {
        "node_id": 2, "node_epoch": 0, "stream_id": sid, "stream_epoch": 0,
        "aborted": [{"producer_id": 1, "first_offset": 60, "marker_offset": 70}],
    }) == "STREAM_FENCED"  # fmt: skip
    assert err(record([(1, 90, 80)])) == "INVALID_REQUEST"
    # the log replays to the same list
    replica = MetadataImage()
    for item in sm.read_log(-1, 10_000)["records"]:
        replica.apply(decode_record(item["record"]), item["offset"])
    assert replica.fingerprint() == sm.image.fingerprint()
    assert replica.streams[sid].aborted_txns == [(7, 10, 20), (8, 15, 30), (9, 40, 50)]
    # trimming past a marker forgets that transaction
    oid = prepare(sm)
    ok(commit(sm, oid, [(sid, 0, 0, 100)]))
    ok(
        sm.execute(
            "trim_stream",
            {
                "node_id": 1,
                "node_epoch": 0,
                "stream_id": sid,
                "stream_epoch": 0,
                "new_start_offset": 30,
            },
            NOW,
        )
    )
    assert sm.image.streams[sid].aborted_txns == [(8, 15, 30), (9, 40, 50)]
