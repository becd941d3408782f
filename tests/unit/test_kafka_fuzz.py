"""Fuzzing the byte-level entry points: decode_request raises only its three error types,
parse_batches only InvalidRecordBatchError, whatever the bytes."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, JoinGroupRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.formats.kafka_errors import InvalidRecordBatchError
from dataplane.formats.record_batch import parse_batches
from dataplane.kafka import codec
from dataplane.kafka.codec import (
    DecodedRequest,
    MalformedRequestError,
    UnknownApiKeyError,
    UnsupportedVersionError,
    decode_request,
    encode_request,
)

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
DECODE_ERRORS = (MalformedRequestError, UnknownApiKeyError, UnsupportedVersionError)


def _batch(n: int, compression: int = 0) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 20)
    for i in range(n):
        builder.append(
            timestamp=1000 + i, key=b"k%d" % i, value=b"v" * (i + 1), headers=[("h", b"x")]
        )
    builder.close()
    return bytes(builder.buffer())


BATCHES = [_batch(1), _batch(3), _batch(4, compression=1), _batch(2) + _batch(1)]


def _produce(version: int) -> ProduceRequest:
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=BATCHES[1])
    return ProduceRequest[version](
        transactional_id="txn",
        acks=1,
        timeout_ms=1000,
        topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[part])],
    )


def _fetch(version: int) -> FetchRequest:
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=1, fetch_offset=5, partition_max_bytes=1000
    )
    return FetchRequest[version](
        replica_id=-1,
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=1000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic="t", partitions=[part])],
        forgotten_topics_data=[],
        rack_id="",
    )


VALID_FRAMES = [
    encode_request(req, correlation_id=i, client_id="fuzz")[4:]
    for i, req in enumerate(
        [
            ApiVersionsRequest[0](),
            ApiVersionsRequest[3](client_software_name="a", client_software_version="1"),
            MetadataRequest[1](topics=[MetadataRequest.MetadataRequestTopic(name="t")]),
            MetadataRequest[12](
                topics=None,
                allow_auto_topic_creation=True,
                include_topic_authorized_operations=False,
            ),
            _produce(3),
            _produce(9),
            _fetch(4),
            _fetch(12),
            _fetch(16),
            JoinGroupRequest[5](
                group_id="g",
                session_timeout_ms=1,
                rebalance_timeout_ms=1,
                member_id="",
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")],
            ),
        ]
    )
]


def _decode_or_known_error(frame: bytes) -> DecodedRequest | None:
    try:
        decoded = decode_request(frame)
    except DECODE_ERRORS:
        return None
    # Whatever decoded is well-formed enough for a handler.
    assert decoded.api_key in codec.known_api_keys()
    assert 0 <= decoded.trailing_bytes <= len(frame)
    return decoded


@st.composite
def mutated_frames(draw) -> bytes:
    frame = bytearray(draw(st.sampled_from(VALID_FRAMES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "int"]))
        pos = draw(st.integers(0, max(len(frame) - 1, 0)))
        if kind == "flip" and frame:
            frame[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and frame:
            frame[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x01]))
        elif kind == "truncate":
            del frame[pos:]
        elif kind == "insert":
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del frame[pos : pos + draw(st.integers(1, 8))]
        elif kind == "int" and len(frame) >= pos + 4:
            # overwrite a 32-bit length/count with a hostile value
            frame[pos : pos + 4] = struct.pack(
                ">i", draw(st.sampled_from([-2, -1, 0x7FFFFFFF, 0x10000, 1000]))
            )
    return bytes(frame)


@st.composite
def random_bodies(draw) -> bytes:
    """A valid header for a random known api and supported version, then random bytes."""
    key = draw(st.sampled_from(sorted(codec.known_api_keys())))
    lo, hi = codec.supported_versions(key)
    version = draw(st.integers(lo, hi))
    header = struct.pack(">hhi", key, version, 1) + b"\x00\x01c"
    if codec.is_flexible(key, version):
        header += b"\x00"
    return header + draw(st.binary(max_size=64))


@FUZZ
@given(st.binary(max_size=200))
def test_decode_request_arbitrary_bytes(frame: bytes) -> None:
    _decode_or_known_error(frame)


@FUZZ
@given(mutated_frames())
def test_decode_request_mutated_frames(frame: bytes) -> None:
    _decode_or_known_error(frame)


@FUZZ
@given(random_bodies())
def test_decode_request_random_bodies_for_every_api(frame: bytes) -> None:
    _decode_or_known_error(frame)


def test_valid_frames_decode() -> None:
    # The mutation corpus itself must be valid, or the fuzzing above tests only error paths.
    for frame in VALID_FRAMES:
        assert decode_request(frame).trailing_bytes == 0


def _parse_or_known_error(data: bytes) -> None:
    for client_origin in (True, False):
        try:
            batches = parse_batches(data, client_origin=client_origin, max_batches=100)
        except InvalidRecordBatchError as exc:
            assert exc.error_code.value in (
                2,
                10,
                76,
                87,
            )  # CORRUPT, TOO_LARGE, COMPRESSION, INVALID_RECORD
            continue
        position = 0
        for batch in batches:
            assert batch.position == position and len(batch.data) == batch.size_in_bytes >= 61
            position = batch.end
        assert position == len(data)


@FUZZ
@given(st.binary(max_size=300))
def test_parse_batches_arbitrary_bytes(data: bytes) -> None:
    _parse_or_known_error(data)


@st.composite
def mutated_batches(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(BATCHES)))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(data) - 1)) if data else 0
        kind = draw(st.sampled_from(["flip", "truncate", "int", "append"]))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "int" and len(data) >= pos + 4:
            data[pos : pos + 4] = struct.pack(">i", draw(st.sampled_from([-1, 0, 49, 0x7FFFFFFF])))
        elif kind == "append":
            data += draw(st.binary(max_size=70))
    return bytes(data)


@FUZZ
@given(mutated_batches())
def test_parse_batches_mutated(data: bytes) -> None:
    _parse_or_known_error(data)
