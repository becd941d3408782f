"""Object WALs that follow the active bucket (issue #32): the RouterChannel and `--wal s3`
write to the bucket the metadata names, read each record from the bucket it was written to
(its offset names it), trim and recover across a switch, and replace a segment whose
bucket stopped answering. Against moto, two buckets."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import boto3
import pytest
from moto import mock_aws

from dataplane.config import ObjectWALConfig
from dataplane.objectstore import ObjectStorage, ObjectStoreError
from dataplane.s3stream.wal.base import WALError
from dataplane.s3stream.wal.bucket_segments import (
    SEGMENT_CAPACITY_BYTES,
    SegmentedReader,
    SegmentId,
    global_offset,
    split_offset,
    take_over_segments,
)
from dataplane.s3stream.wal.factory import open_wal, take_over_wal, wal_exists
from dataplane.s3stream.wal.object_chain import ObjectWALLocation
from dataplane.s3stream.wal.object_readers import WALTrimmedError
from dataplane.s3stream.wal.segmented_wal import BucketFollowingWAL
from dataplane.zonerouter.channel import ChannelReaders, channel_bucket_of

BUCKETS = "0@s3://automq-main?region=us-east-1,1@s3://automq-failover?region=us-east-1"
HOME = ObjectWALLocation(0, "wal/node-1")
CAPACITY = 64 << 20
CONFIG = ObjectWALConfig(linger_s=0, put_timeout_s=2.0, hedge_after_s=1.0, return_after_s=0.5)


@pytest.fixture
def objects(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="automq-main")
        s3.create_bucket(Bucket="automq-failover")
        with ObjectStorage(BUCKETS, merge_window_ms=0) as store:
            yield store


class Active:
    """The active bucket as the metadata says (set by the test)."""

    def __init__(self, bucket_id: int | None = 0):
        self.bucket_id = bucket_id

    def __call__(self) -> int | None:
        return self.bucket_id


def wait_until(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s} s")
        time.sleep(0.02)


def keys(objects: ObjectStorage, bucket_id: int, prefix: str) -> list[str]:
    return objects.list_keys(bucket_id, prefix)


def test_offsets_name_their_segment_and_grow_across_segments():
    legacy = SegmentId(0, 0)
    assert global_offset(legacy, 1234) == 1234  # a WAL that never switched: same offsets
    later = SegmentId(1, 1)
    back = SegmentId(2, 0)
    assert split_offset(global_offset(later, 77)) == (later, 77)
    assert global_offset(legacy, SEGMENT_CAPACITY_BYTES) < global_offset(later, 0)
    assert global_offset(later, SEGMENT_CAPACITY_BYTES) < global_offset(back, 0)
    assert channel_bucket_of(global_offset(later, 5)) == 1
    assert later.location("router-channel/node-2") == ObjectWALLocation(
        1, "router-channel/node-2-g1"
    )
    with pytest.raises(ValueError):
        split_offset(-1)
    with pytest.raises(ValueError):
        SegmentId(0, 256)  # bucket ids above 255 cannot hold a segment


def test_appends_follow_the_active_bucket_and_each_record_is_read_where_it_was_written(
    objects,
):
    active = Active(0)
    wal = BucketFollowingWAL.open(
        objects, HOME, 1, 0, capacity_bytes=CAPACITY, config=CONFIG, active_bucket=active
    )
    try:
        first = wal.append(b"in bucket 0").result(10)
        assert channel_bucket_of(first.offset) == 0
        active.bucket_id = 1  # `automqctl failover --bucket 1`
        wait_until(lambda: wal.current_bucket_id == 1, "appends in bucket 1")
        second = wal.append(b"in bucket 1").result(10)
        assert channel_bucket_of(second.offset) == 1 and second.offset > first.offset
        assert keys(objects, 1, "wal/node-1-g1/") and keys(objects, 0, "wal/node-1/")
        active.bucket_id = 0  # and back
        wait_until(lambda: wal.current_bucket_id == 0, "appends in bucket 0 again")
        third = wal.append(b"in bucket 0 again").result(10)
        assert channel_bucket_of(third.offset) == 0 and third.offset > second.offset
        assert wal.segments == [SegmentId(0, 0), SegmentId(1, 1), SegmentId(2, 0)]

        reader = SegmentedReader(objects, HOME.prefix)  # another node, by offset alone
        for appended, data in (
            (first, b"in bucket 0"),
            (second, b"in bucket 1"),
            (third, b"in bucket 0 again"),
        ):
            assert reader.read(appended.offset).data == data
        assert [r.data for r in wal.recover()] == [
            b"in bucket 0",
            b"in bucket 1",
            b"in bucket 0 again",
        ]

        # trimming past a segment deletes it; the record in the segment holding the point
        # stays readable
        wal.trim(second.offset)
        assert wal.segments == [SegmentId(1, 1), SegmentId(2, 0)]
        assert keys(objects, 0, "wal/node-1/") == []
        with pytest.raises(WALTrimmedError):
            SegmentedReader(objects, HOME.prefix).read(first.offset)
        assert reader.read(second.offset).data == b"in bucket 1"
        wal.trim(third.offset)
        assert wal.segments == [SegmentId(2, 0)] and keys(objects, 1, "wal/node-1-g1/") == []
        assert wal.start_offset == third.offset
    finally:
        wal.close()


def test_a_restart_after_a_switch_recovers_every_segment_in_order_and_goes_on(objects):
    active = Active(0)
    wal = BucketFollowingWAL.open(
        objects, HOME, 1, 0, capacity_bytes=CAPACITY, config=CONFIG, active_bucket=active
    )
    first = wal.append(b"a").result(10)
    active.bucket_id = 1
    wait_until(lambda: wal.current_bucket_id == 1, "appends in bucket 1")
    second = wal.append(b"b").result(10)
    wal.close()

    reopened = BucketFollowingWAL.open(
        objects, HOME, 1, 1, capacity_bytes=CAPACITY, config=CONFIG, active_bucket=active
    )
    try:
        recovered = list(reopened.recover())
        assert [(r.offset, r.data) for r in recovered] == [
            (first.offset, b"a"),
            (second.offset, b"b"),
        ]
        assert reopened.segments == [SegmentId(0, 0), SegmentId(1, 1)]  # no new segment
        third = reopened.append(b"c").result(10)
        assert third.offset > second.offset and channel_bucket_of(third.offset) == 1
        reopened.trim(third.offset)
        assert [r.data for r in reopened.recover()] == [b"c"]
    finally:
        reopened.close()


def test_a_failed_nodes_wal_is_taken_over_across_its_segments(objects):
    active = Active(0)
    uri = "s3://automq-main/wal/node-1"
    wal = open_wal(
        uri,
        1,
        0,
        capacity_bytes=CAPACITY,
        objects=objects,
        object_config=CONFIG,
        active_bucket=active,
    )
    assert isinstance(wal, BucketFollowingWAL)
    first = wal.append(b"a").result(10)
    active.bucket_id = 1
    wait_until(lambda: wal.current_bucket_id == 1, "appends in bucket 1")
    second = wal.append(b"b").result(10)
    assert wal_exists(uri, objects=objects)
    handle = take_over_wal(uri, 2, 1, objects=objects)
    try:
        assert [(r.offset, r.data) for r in handle.recover()] == [
            (first.offset, b"a"),
            (second.offset, b"b"),
        ]
        handle.trim(second.offset)  # the first segment wholly, the second up to b
        assert [r.data for r in handle.recover()] == [b"b"]
        with pytest.raises(WALError):  # the old owner acknowledges nothing more
            wal.append(b"late").result(10)
    finally:
        handle.close()
        wal.close()
    with pytest.raises(Exception, match="does not exist"):
        take_over_segments(objects, "wal/node-9", 2, 1)


class PausedBucket:
    """The broker's ObjectStorage with one bucket that stops answering (a paused store):
    its requests fail as after the store's retries. Every other call goes through."""

    def __init__(self, objects: ObjectStorage, bucket_id: int, hang_puts: bool = False):
        self._objects = objects
        self._bucket_id = bucket_id
        self._hang_puts = hang_puts  # a PUT gets no answer at all (a frozen store)
        self.hung: list[Future] = []  # those PUTs, for the test to answer
        self.paused = False

    def __getattr__(self, name):
        attr = getattr(self._objects, name)
        if not callable(attr) or name in ("bucket", "bucket_ids"):
            return attr

        def call(*args, **kwargs):
            if self.paused and args and args[0] == self._bucket_id:
                if self._hang_puts and name == "put_object_async":
                    self.hung.append(Future())  # not answered until the test says
                    return self.hung[-1]
                raise ObjectStoreError(f"bucket {self._bucket_id} does not answer")
            return attr(*args, **kwargs)

        return call


def test_a_segment_whose_bucket_stops_answering_is_replaced_before_any_switch(objects):
    """The RouterChannel of a broker: with the main bucket down, appends fail only until
    the failed segment is replaced in a bucket that answers, before the controller even
    switched; the records stay readable by offset; the channel goes back once told."""
    store = PausedBucket(objects, 0)
    active = Active(0)
    channel = BucketFollowingWAL.open(
        store,
        ObjectWALLocation(0, "router-channel/node-2"),
        2,
        0,
        capacity_bytes=CAPACITY,
        config=CONFIG,
        active_bucket=active,
    )
    try:
        before = channel.append(b"before").result(10)
        store.paused = True
        with pytest.raises(WALError):
            channel.append(b"lost").result(10)  # its PUT failed: the producer retries
        wait_until(lambda: channel.current_bucket_id == 1, "a segment in bucket 1")
        during = channel.append(b"during").result(10)
        assert channel_bucket_of(during.offset) == 1
        readers = ChannelReaders(store)
        assert readers.reader(2).read(during.offset).data == b"during"
        store.paused = False
        assert readers.reader(2).read(before.offset).data == b"before"
        # the metadata still names bucket 0: the channel goes back once it answers (and
        # `return_after_s`, here 0.5 s, passed)
        wait_until(lambda: channel.current_bucket_id == 0, "back in bucket 0")
        after = channel.append(b"after").result(10)
        assert after.offset > during.offset and channel_bucket_of(after.offset) == 0
    finally:
        channel.close()


def test_a_put_left_unanswered_moves_the_appends_to_another_bucket(objects):
    """A frozen main store answers nothing: after `stall_switch_s` the appends go to the
    other bucket. As the RouterChannel opens it, the appends stuck in the frozen bucket
    fail at once (the producer retries them into the new segment)."""
    store = PausedBucket(objects, 0, hang_puts=True)
    patient = ObjectWALConfig(linger_s=0, put_timeout_s=60.0, hedge_after_s=1.0, close_timeout_s=1)
    wal = BucketFollowingWAL.open(
        store,
        HOME,
        1,
        0,
        capacity_bytes=CAPACITY,
        config=patient,
        active_bucket=Active(0),
        ordered_acks=False,
        fail_stalled_appends=True,
    )
    try:
        store.paused = True
        stuck = wal.append(b"stuck")
        with pytest.raises(WALError, match="abandoned"):
            stuck.result(10)
        assert wal.current_bucket_id == 1
        moved = wal.append(b"moved").result(10)
        assert channel_bucket_of(moved.offset) == 1
    finally:
        store.paused = False
        wal.close()


class HungOwnerChecks:
    """The broker's ObjectStorage where the store froze between a PUT's answer and the
    acknowledging ownership check: PUTs of `bucket_id` are answered, then its GETs hang
    (until `release`)."""

    def __init__(self, objects: ObjectStorage, bucket_id: int):
        self._objects = objects
        self._bucket_id = bucket_id
        self.frozen = False
        self.released = threading.Event()

    def __getattr__(self, name):
        attr = getattr(self._objects, name)
        if name != "get_object":
            return attr

        def get_object(bucket_id, *args, **kwargs):
            if self.frozen and bucket_id == self._bucket_id:
                self.released.wait(30)
                raise ObjectStoreError(f"bucket {bucket_id} does not answer")
            return attr(bucket_id, *args, **kwargs)

        return get_object


def test_a_hung_ownership_check_counts_as_a_stall(objects):
    """A store that froze after answering a PUT leaves the acker in its ownership check
    (a GET): that is a stall too, so the appends move to another bucket after
    `stall_switch_s` instead of waiting until the controller switches buckets."""
    store = HungOwnerChecks(objects, 0)
    patient = ObjectWALConfig(linger_s=0, put_timeout_s=60.0, hedge_after_s=1.0, close_timeout_s=1)
    wal = BucketFollowingWAL.open(
        store,
        HOME,
        1,
        0,
        capacity_bytes=CAPACITY,
        config=patient,
        active_bucket=Active(0),
        ordered_acks=False,
        fail_stalled_appends=True,
    )
    try:
        store.frozen = True
        stuck = wal.append(b"stuck")
        with pytest.raises(WALError, match="abandoned"):
            stuck.result(10)
        assert wal.current_bucket_id == 1
        moved = wal.append(b"moved").result(10)
        assert channel_bucket_of(moved.offset) == 1
    finally:
        store.released.set()
        wal.close()


def test_appends_stay_acknowledged_in_offset_order_across_segments(objects):
    """As the brokers' own s3:// WAL opens it (the storage engine needs acks in offset
    order): an append in the new segment resolves only after the one stuck in the stalled
    segment resolved, whatever its outcome."""
    store = PausedBucket(objects, 0, hang_puts=True)
    patient = ObjectWALConfig(linger_s=0, put_timeout_s=60.0, hedge_after_s=30.0, close_timeout_s=1)
    wal = BucketFollowingWAL.open(
        store, HOME, 1, 0, capacity_bytes=CAPACITY, config=patient, active_bucket=Active(0)
    )
    try:
        store.paused = True
        stuck = wal.append(b"stuck")
        wait_until(lambda: wal.current_bucket_id == 1, "a segment in bucket 1")
        later = wal.append(b"later")
        wait_until(lambda: wal.segments[-1] == SegmentId(1, 1), "the new segment")
        assert not stuck.done() and not later.done()
        store.hung[0].set_exception(ObjectStoreError("the frozen PUT failed"))
        with pytest.raises(WALError):
            stuck.result(10)
        assert channel_bucket_of(later.result(10).offset) == 1
    finally:
        store.paused = False
        wal.close()


def test_a_segment_whose_owner_put_died_with_its_writer_is_opened_on_restart(objects):
    """A broker moved its appends to a new segment in the failover bucket and was restarted
    (fenced) while storing that segment's owner object, which the store kept empty: the
    restarted broker opens every segment, recovers every record and goes on appending."""
    active = Active(0)
    wal = BucketFollowingWAL.open(
        objects, HOME, 1, 0, capacity_bytes=CAPACITY, config=CONFIG, active_bucket=active
    )
    acked = [wal.append(b"r%d" % i).result(10) for i in range(3)]
    wal.close()
    objects.put_object(1, "wal/node-1-g1/owner", b"")  # the new segment's owner, unfinished

    reopened = BucketFollowingWAL.open(
        objects, HOME, 1, 2, capacity_bytes=CAPACITY, config=CONFIG, active_bucket=active
    )
    try:
        assert [r.data for r in reopened.recover()] == [b"r0", b"r1", b"r2"]
        assert SegmentId(1, 1) in reopened.segments
        assert reopened.append(b"r3").result(10).offset > acked[-1].offset
    finally:
        reopened.close()
