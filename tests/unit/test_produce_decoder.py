"""The hand-written Produce request decoder against kafka-python's: every version, requests
encoded by kafka-python as a client would; corrupt bodies are MalformedRequestError."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.kafka.codec import MalformedRequestError, decode_request, encode_request
from dataplane.kafka.produce_decoder import decode_produce_body

VERSIONS = range(3, 14)
TOPIC_ID = uuid.UUID("6f1c1f1e-2a3b-4c5d-8e9f-0a1b2c3d4e5f")


def _records(n: int, tag: bytes = b"") -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(n):
        builder.append(timestamp=1_700_000_000_000 + i, key=tag, value=b"v%d" % i, headers=[])
    builder.close()
    return bytes(builder.buffer())


def _request(version: int, transactional_id: str | None = "txn-é") -> ProduceRequest:
    P = ProduceRequest.TopicProduceData.PartitionProduceData

    def topic(name: str, topic_id: uuid.UUID, partitions: list) -> ProduceRequest.TopicProduceData:
        if version >= 13:
            return ProduceRequest.TopicProduceData(topic_id=topic_id, partition_data=partitions)
        return ProduceRequest.TopicProduceData(name=name, partition_data=partitions)

    return ProduceRequest[version](
        transactional_id=transactional_id,
        acks=-1,
        timeout_ms=12_345,
        topic_data=[
            topic(
                "orders",
                TOPIC_ID,
                [P(index=0, records=_records(3, b"a")), P(index=7, records=_records(1))],
            ),
            topic("empty", uuid.UUID(int=0), []),
            topic("nulls", uuid.UUID(int=5), [P(index=2, records=None), P(index=3, records=b"")]),
        ],
    )


def _reference(frame: bytes, version: int):
    """kafka-python's own decoding of the body of `frame` (size prefix and header included)."""
    return ProduceRequest[version].decode(frame, header=True, framed=True)


def _state(obj):
    """An object tree's attributes as kafka-python's decoder leaves them (views as bytes)."""
    if isinstance(obj, list):
        return [_state(o) for o in obj]
    if isinstance(obj, memoryview):
        return bytes(obj)
    slots = [n for cls in type(obj).__mro__ for n in getattr(cls, "__slots__", ())]
    if not slots:
        return obj
    unset = object()
    state = {n: getattr(obj, n, unset) for n in slots if n not in ("_header", "__weakref__")}
    return type(obj), {n: "<unset>" if v is unset else _state(v) for n, v in state.items()}


def _body_start(frame: bytes) -> int:
    """Where the body starts in a frame without its size prefix (header v1 or v2)."""
    (client_id_len,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(client_id_len, 0)
    version = struct.unpack_from(">h", frame, 2)[0]
    return pos + 1 if version >= 9 else pos  # v2 header: empty tagged fields


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("transactional_id", [None, "txn-é"])
def test_same_objects_as_kafka_python(version: int, transactional_id: str | None) -> None:
    frame = encode_request(_request(version, transactional_id), 3, version=version)
    decoded = decode_request(frame[4:])
    assert decoded.body.to_dict() == _reference(frame, version).to_dict()
    assert decoded.trailing_bytes == 0
    generated = ProduceRequest._struct.compiled_decode_from(
        version, compact=version >= 9, tagged=version >= 9, data_class=ProduceRequest
    )(memoryview(frame[4:]), _body_start(frame[4:]))[0]
    ours = _state(decoded.body)
    for name in ("_min_version", "_max_version"):  # set by decode_request
        ours[1][name] = "<unset>"
    assert ours == _state(generated)  # the same attributes, set the same way
    topic = decoded.body.topic_data[0]
    if version >= 13:
        assert topic.topic_id == TOPIC_ID
        assert decoded.body.topic_data[1].topic_id is None  # the zero uuid, as kafka-python
    else:
        assert topic.name == "orders"
    assert decoded.body.topic_data[2].partition_data[0].records is None
    assert bytes(decoded.body.topic_data[2].partition_data[1].records) == b""


@pytest.mark.parametrize("version", VERSIONS)
def test_records_are_read_only_views_of_the_frame(version: int) -> None:
    frame = bytearray(encode_request(_request(version), 3, version=version)[4:])
    records = decode_request(frame).body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and records.readonly
    assert records == _records(3, b"a")
    assert records.obj is frame  # not a copy


def test_tagged_fields_are_decoded_by_kafka_python() -> None:
    """A tagged field anywhere (Kafka defines none for Produce) goes to kafka-python's
    decoder, which reads it; the result is the same request."""
    version = 9
    frame = encode_request(_request(version), 3, version=version)[4:]
    start = _body_start(frame)
    # the last byte is the request's empty tagged fields: one unknown tag (7) of 2 bytes
    tagged = frame[:-1] + b"\x01\x07\x02zz"
    body, end = decode_produce_body(memoryview(tagged), start, version)
    assert end == len(tagged)
    assert body.unknown_tags == {"_7": b"zz"}
    plain = decode_request(frame).body.to_dict()
    assert {k: v for k, v in body.to_dict().items() if k != "_7"} == plain


@pytest.mark.parametrize("version", [3, 8, 9, 13])
def test_every_truncation_is_malformed(version: int) -> None:
    frame = encode_request(_request(version), 1, version=version)[4:]
    for cut in range(len(frame)):
        with pytest.raises(MalformedRequestError):
            decode_request(frame[:cut])


@pytest.mark.parametrize("version", [3, 9])
def test_lengths_out_of_range_are_malformed(version: int) -> None:
    P = ProduceRequest.TopicProduceData.PartitionProduceData
    req = ProduceRequest[version](
        transactional_id=None,
        acks=1,
        timeout_ms=1,
        topic_data=[
            ProduceRequest.TopicProduceData(name="t", partition_data=[P(index=0, records=b"abcd")])
        ],
    )
    frame = bytearray(encode_request(req, 1, version=version)[4:])
    at = bytes(frame).rindex(b"abcd")
    too_long = bytearray(frame)
    if version >= 9:
        too_long[at - 1] = 0x7F  # compact length 126: past the frame's end
    else:
        struct.pack_into(">i", too_long, at - 4, 1000)
    with pytest.raises(MalformedRequestError, match="frame ends inside a field"):
        decode_request(too_long)
    negative = bytearray(frame)
    if version >= 9:
        # a topic count of 0 (compact: null array): Produce has no null arrays
        negative[_body_start(bytes(frame)) + 1 + 6] = 0
        expected = "array count -1"
    else:
        struct.pack_into(">i", negative, at - 4, -7)
        expected = "negative records length -7"
    with pytest.raises(MalformedRequestError, match=expected):
        decode_request(negative)


def test_invalid_utf8_topic_name_is_malformed() -> None:
    frame = encode_request(_request(5), 1, version=5)[4:]
    at = frame.index(b"orders")
    with pytest.raises(MalformedRequestError, match="UnicodeDecodeError"):
        decode_request(frame[:at] + b"\xff\xfe" + frame[at + 2 :])
