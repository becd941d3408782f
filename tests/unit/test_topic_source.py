"""The `automq` Spark source without Spark: options, the driver's plan from a metadata image,
and an executor's read of objects in moto S3 (every compression codec, transactions,
control batches, split boundaries, a corrupt block). The real-Spark path is
tests/e2e/test_topic_source.py."""

from __future__ import annotations

import json

import boto3
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from moto import mock_aws

from controlplane.image import (
    MetadataImage,
    ObjectMetaState,
    ObjectRange,
    PartitionState,
    RangeState,
    StreamMetaState,
    StreamObjectState,
    TopicState,
)
from controlplane.records import ObjectState, PartitionKind
from dataplane.formats.object_format import ObjectWriter
from dataplane.formats.record_batch import RECORD_BATCH_OVERHEAD, build_batch, parse_batch_header
from dataplane.formats.stream_records import StreamRecordBatch
from spark_jobs import objects_io
from spark_jobs.topic_source.options import TopicSourceError, parse_options
from spark_jobs.topic_source.plan import partition_ranges, splits
from spark_jobs.topic_source.read import AbortedIndex, split_records
from spark_jobs.topic_source.source import limit_ends

URI = "0@s3://topics?region=us-east-1&endpoint=http://127.0.0.1:1"
STREAM = 7
CODECS = (0, 1, 2, 3, 4)  # none, gzip, snappy, lz4, zstd
TXN_PRODUCER = 42


def _batch(base: int, count: int, codec: int, *, txn: bool = False, control: bool = False):
    builder = DefaultRecordBatchBuilder(2, codec, txn, TXN_PRODUCER if txn else -1, 0, 0, 1 << 24)
    for i in range(count):
        o = base + i
        builder.append(i, 1000 + o, f"k{o}".encode(), f"v{o}".encode(), [("h", b"%d" % o)])
    data = bytes(builder.build())
    if control:  # the same records section, marked a control batch
        header = parse_batch_header(memoryview(data), 0)
        data = build_batch(
            data[RECORD_BATCH_OVERHEAD:],
            count,
            attributes=header.attributes | 0x30,
            base_timestamp=header.base_timestamp,
            producer_id=TXN_PRODUCER,
        )
    # stored batches carry their partition offsets (the broker patches the base offset,
    # outside the CRC)
    data = base.to_bytes(8, "big") + data[8:]
    return StreamRecordBatch(STREAM, 0, base, count, data)


def _stored_objects() -> list[list[StreamRecordBatch]]:
    """Two objects: offsets 0..50 (every codec) and 50..80 (aborted txn, marker, committed)."""
    first = [_batch(i * 10, 10, CODECS[i]) for i in range(5)]
    second = [
        _batch(50, 10, 4, txn=True),  # aborted (marker at 60)
        _batch(60, 1, 0, control=True),
        _batch(61, 9, 1, txn=True),  # committed (marker at 70)
        _batch(70, 1, 0, control=True),
        _batch(71, 9, 0),
    ]
    return [first, second]


def _image(objects: list[tuple[int, int, int, int]], start: int = 0) -> MetadataImage:
    """(object id, size, start, end) pieces of one partition's stream."""
    end = objects[-1][3]
    return MetadataImage(
        topics={
            "t1": TopicState(
                topic_id="t1",
                name="orders",
                partitions={
                    0: PartitionState(
                        partition=0,
                        kind=PartitionKind.LEADER,
                        leader_node_id=1,
                        leader_epoch=0,
                        stream_id=STREAM,
                    )
                },
            )
        },
        topic_ids_by_name={"orders": "t1"},
        streams={
            STREAM: StreamMetaState(
                stream_id=STREAM,
                start_offset=start,
                ranges=[
                    RangeState(range_index=0, epoch=0, start_offset=0, end_offset=end, node_id=1)
                ],
                object_ranges=[
                    ObjectRange(object_id=o, start_offset=s, end_offset=e, kind="so")
                    for o, _, s, e in objects
                ],
                aborted_txns=[(TXN_PRODUCER, 50, 60)],
            )
        },
        objects={
            o: ObjectMetaState(
                object_id=o, state=ObjectState.COMMITTED, bucket_id=0, size_bytes=size
            )
            for o, size, _, _ in objects
        },
        stream_objects={
            o: StreamObjectState(
                object_id=o, stream_id=STREAM, start_offset=s, end_offset=e, committed_ms=1
            )
            for o, _, s, e in objects
        },
    )


@pytest.fixture
def stored(monkeypatch):
    """The two objects PUT to moto S3; the image describing them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="topics")
        objects_io._clients.clear()  # noqa: SLF001 - a fresh client inside moto
        monkeypatch.setattr(
            objects_io, "client", lambda uri: boto3.client("s3", region_name="us-east-1")
        )
        pieces = []
        for oid, batches in enumerate(_stored_objects(), start=1):
            writer = ObjectWriter(256, 1 << 20)  # small blocks: many per object
            writer.add_all(batches)
            obj = writer.finish()
            objects_io.put(URI, oid, obj.data)
            pieces.append((oid, obj.size_bytes, batches[0].base_offset, batches[-1].last_offset))
        yield _image(pieces)


def _opts(**extra) -> object:
    return parse_options(
        {"cluster": "127.0.0.1:1", "topic": "orders", "buckets": json.dumps({"0": URI}), **extra},
        streaming=False,
    )


def _read(image, opts) -> list[tuple]:
    ranges = partition_ranges(image, opts)
    return [r for s in splits(image, ranges, opts, opts.buckets) for r in split_records(s)]


def test_every_codec_decodes_and_read_committed_drops_the_aborted_and_markers(stored):
    rows = _read(stored, _opts())
    offsets = [r[2] for r in rows]
    assert offsets == list(range(50)) + list(range(61, 70)) + list(range(71, 80))
    key, value, offset, ts, ts_type, headers = rows[13]
    assert (key, value, offset, ts, ts_type, headers) == (
        b"k13",
        b"v13",
        13,
        1013,
        0,
        [("h", b"13")],
    )


def test_read_uncommitted_keeps_the_aborted_records_but_never_markers(stored):
    offsets = [r[2] for r in _read(stored, _opts(**{"isolation.level": "read_uncommitted"}))]
    assert offsets == list(range(60)) + list(range(61, 70)) + list(range(71, 80))


def test_small_splits_cover_every_offset_once(stored):
    opts = _opts(**{"automq.split.bytes": str(64 * 1024)})
    opts = type(opts)(**{**opts.__dict__, "split_bytes": 100})  # below the option's floor
    ranges = partition_ranges(stored, opts)
    parts = splits(stored, ranges, opts, opts.buckets)
    assert len(parts) > 2
    offsets = [r[2] for s in parts for r in split_records(s)]
    assert offsets == list(range(50)) + list(range(61, 70)) + list(range(71, 80))


def test_offsets_json_and_starting_timestamp(stored):
    opts = _opts(
        startingOffsets=json.dumps({"orders": {"0": 5}}),
        endingOffsets=json.dumps({"orders": {"0": 12}}),
    )
    assert [r[2] for r in _read(stored, opts)] == list(range(5, 12))
    assert [r[2] for r in _read(stored, _opts(startingTimestamp="1075"))][0] == 75


def test_below_the_log_start_is_data_loss(stored):
    stored.streams[STREAM].start_offset = 20
    with pytest.raises(TopicSourceError, match="below the log start offset 20"):
        _read(stored, _opts(startingOffsets=json.dumps({"orders": {"0": 3}})))
    rows = _read(
        stored, _opts(failOnDataLoss="false", startingOffsets=json.dumps({"orders": {"0": 3}}))
    )
    assert rows[0][2] == 20
    assert [r[2] for r in _read(stored, _opts())][0] == 20  # earliest = the log start


def test_a_corrupt_block_names_the_object(stored):
    data = bytearray(objects_io.get_range(URI, 1, 0, stored.objects[1].size_bytes))
    data[100] ^= 0xFF
    objects_io.put(URI, 1, bytes(data))
    with pytest.raises(
        TopicSourceError,
        match=r"orders-0: cannot read object 1 \(bucket 0 \(topics\), key .*CRC32C",
    ):
        _read(stored, _opts())


def test_missing_topic_and_bad_options():
    image = _image([(1, 100, 0, 10)])
    with pytest.raises(TopicSourceError, match="topic 'nope' does not exist"):
        partition_ranges(image, _opts(topic="nope"))
    with pytest.raises(TopicSourceError, match='option "cluster" is required'):
        parse_options({"topic": "x"}, streaming=False)
    with pytest.raises(TopicSourceError, match="exactly one of"):
        parse_options({"cluster": "a:1", "topic": "x", "subscribe": "y"}, streaming=False)
    with pytest.raises(TopicSourceError, match="startingOffsets must be"):
        parse_options({"cluster": "a:1", "topic": "x", "startingOffsets": "{oops"}, streaming=False)
    with pytest.raises(TopicSourceError, match="isolation.level"):
        parse_options({"cluster": "a:1", "topic": "x", "isolation.level": "x"}, streaming=False)
    with pytest.raises(TopicSourceError, match="past the uploaded end 10"):
        partition_ranges(image, _opts(endingOffsets=json.dumps({"orders": {"0": 11}})))


def test_aborted_index_and_trigger_limits():
    index = AbortedIndex(((1, 10, 20), (1, 30, 40), (2, 0, 5)))
    assert [index.aborted(1, o) for o in (9, 10, 19, 20, 35)] == [False, True, True, False, True]
    assert not index.aborted(3, 10)
    from spark_jobs.topic_source.plan import PartitionRange

    ranges = [PartitionRange("t", p, p, 0, end, 0, end) for p, end in enumerate((100, 300, 0))]
    limit_ends(ranges, 40)
    assert [r.end for r in ranges] == [10, 30, 0]
