"""Kafka codec and API registry: requests encoded by kafka-python as a client would, decoded
by our codec; responses encoded by us and decoded back by kafka-python."""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.schemas.fields.array import ArrayField
from kafka.protocol.schemas.fields.struct import StructField
from kafka.protocol.schemas.fields.struct_array import StructArrayField
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka import codec
from dataplane.kafka.codec import (
    DecodedRequest,
    MalformedRequestError,
    ResponseEncodingError,
    UnknownApiKeyError,
    UnsupportedVersionError,
    decode_request,
    decode_response,
    encode_api_versions_error,
    encode_request,
    encode_response,
)
from dataplane.kafka.registry import ApiRegistry, RequestContext
from tests.support.kafka_requests import fetch_request

TOPIC_ID = uuid.UUID("6f1c1f1e-2a3b-4c5d-8e9f-0a1b2c3d4e5f")


def _records(n: int = 3) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(n):
        builder.append(
            timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"value-%d" % i, headers=[]
        )
    builder.close()
    return bytes(builder.buffer())


def _produce(version: int) -> ProduceRequest:
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=2, records=_records())
    topic = ProduceRequest.TopicProduceData(name="orders", partition_data=[part])
    return ProduceRequest[version](
        transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[topic]
    )


def _fetch(version: int) -> FetchRequest:
    return fetch_request(
        "orders", {0: 42}, version, topic_id=TOPIC_ID, max_wait_ms=500, min_bytes=1,
        max_bytes=50 << 20, isolation_level=1, current_leader_epoch=5, rack_id="rack-a",
    )  # fmt: skip


def _metadata(version: int) -> MetadataRequest:
    topics = [
        MetadataRequest.MetadataRequestTopic(
            topic_id=None if version < 10 else uuid.UUID(int=0), name="orders"
        )
    ]
    return MetadataRequest[version](
        topics=None if version == 12 else topics,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=version >= 8,
    )


def _join_group(version: int) -> JoinGroupRequest:
    proto = JoinGroupRequest.JoinGroupRequestProtocol(
        name="range", metadata=b"\x00\x01subscription"
    )
    return JoinGroupRequest[version](
        group_id="group-1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        member_id="",
        group_instance_id="instance-7",
        protocol_type="consumer",
        protocols=[proto],
    )


def _api_versions(version: int) -> ApiVersionsRequest:
    if version >= 3:
        return ApiVersionsRequest[version](
            client_software_name="kafka-python", client_software_version="3.0.12"
        )
    return ApiVersionsRequest[version]()


REQUESTS = [
    *[("ApiVersions", v, _api_versions) for v in (0, 1, 2, 3, 4)],
    *[("Metadata", v, _metadata) for v in (1, 9, 12)],
    *[("Produce", v, _produce) for v in (3, 9)],
    *[("Fetch", v, _fetch) for v in (4, 12, 16)],
    ("JoinGroup", 5, _join_group),
]


def _response_for(api_key: int, version: int):
    """A non-trivial response object for each sampled api."""
    if api_key == 18:
        return ApiRegistry().api_versions_response(version)
    if api_key == 3:
        part = MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
            error_code=0,
            partition_index=0,
            leader_id=1,
            leader_epoch=3,
            replica_nodes=[1],
            isr_nodes=[1],
            offline_replicas=[],
        )
        topic = MetadataResponse.MetadataResponseTopic(
            error_code=0,
            name="orders",
            topic_id=TOPIC_ID,
            is_internal=False,
            partitions=[part],
        )
        broker = MetadataResponse.MetadataResponseBroker(
            node_id=1, host="127.0.0.1", port=9092, rack="az-1"
        )
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id="cluster-x",
            controller_id=1,
            topics=[topic],
        )
    if api_key == 0:
        part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
            index=2,
            error_code=0,
            base_offset=1234,
            log_append_time_ms=-1,
            log_start_offset=0,
            record_errors=[],
            error_message=None,
        )
        return ProduceResponse(
            responses=[
                ProduceResponse.TopicProduceResponse(name="orders", partition_responses=[part])
            ],
            throttle_time_ms=0,
        )
    if api_key == 1:
        part = FetchResponse.FetchableTopicResponse.PartitionData(
            partition_index=0,
            error_code=0,
            high_watermark=45,
            last_stable_offset=45,
            log_start_offset=0,
            aborted_transactions=[],
            preferred_read_replica=-1,
            records=_records(2),
        )
        topic = FetchResponse.FetchableTopicResponse(
            topic="orders", topic_id=TOPIC_ID, partitions=[part]
        )
        return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[topic])
    if api_key == 11:
        member = JoinGroupResponse.JoinGroupResponseMember(
            member_id="m-1", group_instance_id="instance-7", metadata=b"\x00\x01subscription"
        )
        return JoinGroupResponse(
            throttle_time_ms=0,
            error_code=0,
            generation_id=1,
            protocol_type="consumer",
            protocol_name="range",
            leader="m-1",
            skip_assignment=False,
            member_id="m-1",
            members=[member],
        )
    raise AssertionError(api_key)


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize("name,version,build", REQUESTS, ids=[f"{n}-v{v}" for n, v, _ in REQUESTS])
def test_request_round_trip(name: str, version: int, build) -> None:
    original = build(version)
    frame = encode_request(original, correlation_id=4711, client_id="client-é")
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4

    decoded = decode_request(frame[4:])

    assert isinstance(decoded, DecodedRequest)
    assert (decoded.api_key, decoded.api_version) == (original.API_KEY, version)
    assert decoded.correlation_id == 4711
    assert decoded.client_id == "client-é"
    assert decoded.header_version == (2 if type(original).flexible_version_q(version) else 1)
    assert decoded.header.correlation_id == 4711 and decoded.body.header is decoded.header
    assert decoded.body.API_VERSION == version
    assert decoded.size == len(frame) - 4 and decoded.trailing_bytes == 0
    # Same bytes when re-encoded, and the same content as kafka-python's own decoder reads.
    assert bytes(decoded.body.encode(version=version)) == bytes(
        build(version).encode(version=version)
    )
    reference = type(original).decode(frame, version=version, header=True, framed=True)
    assert decoded.body.to_dict() == reference.to_dict()


def test_decoded_fields_are_the_client_values() -> None:
    produce = decode_request(encode_request(_produce(9), 1)[4:]).body
    assert produce.acks == -1 and produce.timeout_ms == 30_000
    assert produce.topic_data[0].name == "orders"
    assert produce.topic_data[0].partition_data[0].index == 2
    assert produce.topic_data[0].partition_data[0].records == _records()

    fetch = decode_request(encode_request(_fetch(16), 2)[4:]).body
    assert fetch.topics[0].topic_id == TOPIC_ID
    assert fetch.topics[0].partitions[0].fetch_offset == 42
    assert fetch.rack_id == "rack-a" and fetch.isolation_level == 1

    join = decode_request(encode_request(_join_group(5), 3)[4:]).body
    assert join.group_instance_id == "instance-7"
    assert join.protocols[0].metadata == b"\x00\x01subscription"


def test_acks_zero_produce_expects_no_response() -> None:
    request = _produce(9)
    request.acks = 0
    assert not decode_request(encode_request(request, 1)[4:]).expects_response
    assert decode_request(encode_request(_produce(9), 1)[4:]).expects_response


def test_null_client_id() -> None:
    decoded = decode_request(encode_request(_metadata(12), 9, client_id=None)[4:])
    assert decoded.client_id is None


def _flexible_frame(tagged: bytes, body: bytes = b"\x01\x00\x00\x00") -> bytes:
    """Metadata v12 (flexible) frame with the given raw header tagged-field section."""
    return struct.pack(">hhi", 3, 12, 77) + struct.pack(">h", 3) + b"cli" + tagged + body


def test_flexible_header_tagged_fields_are_read_and_skipped() -> None:
    # two tagged fields: tag 1 (3 bytes), tag 5 (0 bytes)
    decoded = decode_request(_flexible_frame(b"\x02\x01\x03abc\x05\x00"))
    assert dict(decoded.header_tagged_fields) == {1: b"abc", 5: b""}
    assert decoded.body.topics == [] and decoded.correlation_id == 77


@pytest.mark.parametrize(
    "tagged",
    [
        b"\x02\x05\x00\x01\x00",  # out of order
        b"\x02\x01\x00\x01\x00",  # repeated
        b"\x01\x01\x09ab",  # size beyond the frame... then body missing
        b"\x80\x80\x80\x80\x80\x01",  # varint longer than 5 bytes
        b"\x41" + b"\x00\x00" * 65,  # more tagged fields than allowed
    ],
)
def test_bad_header_tagged_fields(tagged: bytes) -> None:
    with pytest.raises(MalformedRequestError):
        decode_request(_flexible_frame(tagged, body=b""))


def test_non_flexible_header_has_no_tagged_fields() -> None:
    # Metadata v1: header v1; the byte after the client id is already body.
    frame = encode_request(_metadata(1), 5)[4:]
    decoded = decode_request(frame)
    assert decoded.header_version == 1 and decoded.body.topics[0].name == "orders"


def test_trailing_bytes_are_ignored_like_kafka() -> None:
    frame = encode_request(_metadata(12), 5)[4:] + b"\x01\x00\x00"
    decoded = decode_request(frame)
    assert decoded.trailing_bytes == 3 and decoded.body.topics is None


@pytest.mark.parametrize("name,version,build", REQUESTS, ids=[f"{n}-v{v}" for n, v, _ in REQUESTS])
def test_every_truncation_is_malformed(name: str, version: int, build) -> None:
    frame = encode_request(build(version), 1)[4:]
    for cut in range(len(frame)):
        try:
            decode_request(frame[:cut])
        except MalformedRequestError:
            continue
        # A few prefixes are complete bodies followed by nothing: only acceptable if every
        # remaining field was optional-by-encoding, which never happens for these samples.
        pytest.fail(f"prefix of {cut}/{len(frame)} bytes decoded")


def test_short_frames() -> None:
    for n in range(8):
        with pytest.raises(MalformedRequestError):
            decode_request(b"\x00" * n)
    with pytest.raises(TypeError):
        decode_request("not bytes")  # type: ignore[arg-type]


def test_invalid_utf8_client_id() -> None:
    frame = struct.pack(">hhih", 3, 1, 1, 2) + b"\xff\xfe" + b"\x00\x00\x00\x00"
    with pytest.raises(MalformedRequestError) as info:
        decode_request(frame)
    assert info.value.correlation_id == 1 and info.value.api_key == 3


def test_unknown_api_key() -> None:
    for key in (4, 1000, -1):  # LeaderAndIsr is gone from Kafka 4; the others never existed
        with pytest.raises(UnknownApiKeyError) as info:
            decode_request(struct.pack(">hhih", key, 0, 99, -1))
        assert (info.value.api_key, info.value.correlation_id) == (key, 99)


@pytest.mark.parametrize("key,version", [(0, 2), (0, 14), (1, 3), (18, 5), (3, -1)])
def test_unsupported_version(key: int, version: int) -> None:
    frame = struct.pack(">hhih", key, version, 123, 4) + b"abcd" + b"\x00" * 8
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(frame)
    err = info.value
    assert (err.api_key, err.api_version, err.correlation_id, err.client_id) == (
        key,
        version,
        123,
        "abcd",
    )


def test_no_request_schema_has_zero_width_array_elements() -> None:
    """decode_request relies on every array element consuming >= 1 byte: a hostile element
    count then stops at the end of the frame instead of looping 2**31 times."""

    def min_size(struct_field, version: int, flexible: bool) -> int:
        total = 1 if flexible else 0  # tagged-field count byte
        for f in struct_field.untagged_fields(version):
            if isinstance(f, StructArrayField):
                assert min_size(f.array_of, version, flexible) > 0, f.name
                total += 1 if flexible else 4
            elif isinstance(f, ArrayField):
                total += 1 if flexible else 4
            elif isinstance(f, StructField):
                total += min_size(f, version, flexible)
            else:
                total += 1
        return total

    for key in codec.known_api_keys():
        cls = codec.request_class(key)
        lo, hi = codec.supported_versions(key)
        for v in range(lo, hi + 1):
            min_size(cls._struct, v, cls.flexible_version_q(v))


# --------------------------------------------------------------------------- responses


@pytest.mark.parametrize("name,version,build", REQUESTS, ids=[f"{n}-v{v}" for n, v, _ in REQUESTS])
def test_response_round_trip(name: str, version: int, build) -> None:
    request = decode_request(encode_request(build(version), correlation_id=31337)[4:])
    response = _response_for(request.api_key, version)
    frame = encode_response(request, response)

    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert struct.unpack(">i", frame[4:8])[0] == 31337
    # kafka-python's own server-side framing (header version rules included) gives the same bytes.
    reference = _response_for(request.api_key, version)
    reference.API_VERSION = version
    reference.with_header(correlation_id=31337)
    assert frame == bytes(reference.encode(header=True, framed=True))

    correlation_id, decoded = decode_response(frame[4:], request.api_key, version)
    assert correlation_id == 31337
    expected = type(decoded).decode(
        bytes(_response_for(request.api_key, version).encode(version=version)), version=version
    )
    assert decoded.to_dict() == expected.to_dict()
    # A decoded response (it carries a ResponseHeader) can be sent again, e.g. by a proxy.
    assert encode_response(request, decoded) == frame


def test_response_header_versions() -> None:
    # flexible Metadata v12: correlation id, then an empty tagged-field section (0x00)
    md12 = decode_request(encode_request(_metadata(12), 1)[4:])
    frame = encode_response(md12, _response_for(3, 12))
    assert frame[8] == 0 and frame[9:] == bytes(_response_for(3, 12).encode(version=12))
    # non-flexible Metadata v1: the body follows the correlation id
    md1 = decode_request(encode_request(_metadata(1), 1)[4:])
    assert encode_response(md1, _response_for(3, 1))[8:] == bytes(
        _response_for(3, 1).encode(version=1)
    )
    # ApiVersions v3 is flexible, but its response header is always v0
    av3 = decode_request(encode_request(_api_versions(3), 1)[4:])
    body = ApiRegistry().api_versions_response(3)
    assert encode_response(av3, body)[8:] == bytes(body.encode(version=3))
    assert codec.response_header_version(18, 3) == 0
    assert codec.response_header_version(3, 12) == 1 and codec.response_header_version(3, 8) == 0
    assert codec.request_header_version(3, 9) == 2 and codec.request_header_version(3, 8) == 1


def test_response_of_wrong_class_or_bad_field() -> None:
    request = decode_request(encode_request(_metadata(12), 1)[4:])
    with pytest.raises(ResponseEncodingError):
        encode_response(request, ProduceResponse(responses=[], throttle_time_ms=0))
    with pytest.raises(ResponseEncodingError):
        encode_response(request, MetadataResponse(throttle_time_ms="soon", brokers=[], topics=[]))


def test_api_versions_error_frame_is_read_by_kafka_python() -> None:
    frame = encode_api_versions_error(55, [(0, 3, 13), (18, 0, 4)])
    assert struct.unpack(">ii", frame[:8]) == (len(frame) - 4, 55)
    # A client that sent v3 reads the header as v0 and the body as v0 because of the error.
    correlation_id, resp = decode_response(frame[4:], 18, 3)
    assert correlation_id == 55 and resp.error_code == KafkaError.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [
        (0, 3, 13),
        (18, 0, 4),
    ]


# --------------------------------------------------------------------------- registry


def _ctx(request: DecodedRequest) -> RequestContext:
    return RequestContext(
        api_key=request.api_key,
        api_version=request.api_version,
        correlation_id=request.correlation_id,
        client_id=request.client_id,
        peer=("127.0.0.1", 1),
    )


def _handle(registry: ApiRegistry, frame: bytes) -> bytes | None:
    request = decode_request(frame[4:])
    return asyncio.run(registry.handle(request, _ctx(request)))


async def _metadata_handler(body, ctx):
    return _response_for(3, ctx.api_version)


def test_register_clamps_to_kafka_python_versions() -> None:
    registry = ApiRegistry()
    reg = registry.register(ProduceRequest, 0, 99, _metadata_handler)
    assert (reg.min_version, reg.max_version) == (3, 13)
    registry.register(
        MetadataRequest[12], 1, 12, _metadata_handler
    )  # a versioned class means the api
    assert registry.api_versions() == [(0, 3, 13), (3, 1, 12), (18, 0, 4)]


def test_register_rejects_bad_input() -> None:
    registry = ApiRegistry()
    with pytest.raises(ValueError):
        registry.register(FetchRequest, 0, 3, _metadata_handler)  # Kafka 4 has Fetch 4+
    with pytest.raises(ValueError):
        registry.register(FetchRequest, 10, 5, _metadata_handler)
    with pytest.raises(TypeError):
        registry.register(MetadataResponse, 0, 5, _metadata_handler)
    with pytest.raises(TypeError):
        registry.register(int, 0, 5, _metadata_handler)
    with pytest.raises(TypeError):
        registry.register(MetadataRequest, 0, 5, "not callable")  # type: ignore[arg-type]
    registry.register(MetadataRequest, 0, 12, _metadata_handler)
    with pytest.raises(ValueError):
        registry.register(MetadataRequest, 0, 12, _metadata_handler)
    registry.register(MetadataRequest, 5, 6, _metadata_handler, replace=True)
    assert registry.get(3).min_version == 5


def test_api_versions_lists_registered_apis_for_every_version() -> None:
    registry = ApiRegistry()
    registry.register(MetadataRequest, 1, 12, _metadata_handler)
    registry.register(HeartbeatRequest, 0, 4, _metadata_handler)
    for version in range(5):
        frame = _handle(registry, encode_request(_api_versions(version), 10 + version))
        correlation_id, resp = decode_response(frame[4:], 18, version)
        assert correlation_id == 10 + version and resp.error_code == 0
        assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [
            (3, 1, 12),
            (12, 0, 4),
            (18, 0, 4),
        ]


def test_api_versions_unsupported_version_gets_v0_error_with_full_list() -> None:
    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, _metadata_handler)
    # A future client sends ApiVersions v7 with a flexible header: the codec cannot decode it
    frame = struct.pack(">hhih", 18, 7, 5, 3) + b"cli" + b"\x00" + b"\x05name\x041.0\x00"
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(frame)
    answer = registry.unsupported_version_response(info.value)
    correlation_id, resp = decode_response(answer[4:], 18, 4)
    assert (
        correlation_id == 5
        and resp.error_code == KafkaError.UNSUPPORTED_VERSION
        and resp.version == 0
    )
    assert [k.api_key for k in resp.api_keys] == [3, 18]

    # The same when the version is one kafka-python knows but we chose not to serve.
    registry.register(ApiVersionsRequest, 0, 2, registry.get(18).handler, replace=True)
    request = decode_request(encode_request(_api_versions(3), 6)[4:])
    with pytest.raises(UnsupportedVersionError) as info:
        registry.route(request)
    correlation_id, resp = decode_response(
        registry.unsupported_version_response(info.value)[4:], 18, 3
    )
    assert correlation_id == 6 and resp.error_code == KafkaError.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [
        (3, 0, 13),
        (18, 0, 2),
    ]

    # Other apis get no answer: the server closes the connection, as Kafka does.
    assert registry.unsupported_version_response(UnsupportedVersionError(3, 99, 1)) is None


def test_api_versions_invalid_client_software_name() -> None:
    registry = ApiRegistry()
    request = ApiVersionsRequest[3](client_software_name="bad name!", client_software_version="1.0")
    frame = _handle(registry, encode_request(request, 3))
    _, resp = decode_response(frame[4:], 18, 3)
    assert resp.error_code == KafkaError.INVALID_REQUEST and resp.api_keys == []


def test_handler_may_return_an_encoded_body() -> None:
    async def raw(body, ctx):
        return bytes(_response_for(3, ctx.api_version).encode(version=ctx.api_version))

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, raw)
    for version in (1, 12):
        frame = _handle(registry, encode_request(_metadata(version), 40 + version))
        correlation_id, resp = decode_response(frame[4:], 3, version)
        assert correlation_id == 40 + version and resp.topics[0].name == "orders"


def test_route_unserved_key_and_version() -> None:
    registry = ApiRegistry()
    registry.register(MetadataRequest, 9, 12, _metadata_handler)
    with pytest.raises(UnknownApiKeyError):
        registry.route(decode_request(encode_request(_join_group(5), 1)[4:]))
    with pytest.raises(UnsupportedVersionError):
        registry.route(decode_request(encode_request(_metadata(1), 1)[4:]))
    assert registry.route(decode_request(encode_request(_metadata(12), 1)[4:])).api_key == 3


def test_handle_acks_zero_sends_nothing_even_if_handler_answers() -> None:
    async def produce(body, ctx):
        return _response_for(0, ctx.api_version)

    registry = ApiRegistry()
    registry.register(ProduceRequest, 3, 13, produce)
    request = _produce(9)
    request.acks = 0
    assert _handle(registry, encode_request(request, 1)) is None
    frame = _handle(registry, encode_request(_produce(9), 2))
    correlation_id, resp = decode_response(frame[4:], 0, 9)
    assert correlation_id == 2 and resp.responses[0].partition_responses[0].base_offset == 1234


def test_handle_propagates_handler_errors() -> None:
    async def broken(body, ctx):
        raise RuntimeError("bug")

    def not_async(body, ctx):
        return None

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, broken)
    registry.register(CreateTopicsRequest, 2, 7, not_async)
    with pytest.raises(RuntimeError):
        _handle(registry, encode_request(_metadata(12), 1))
    create = CreateTopicsRequest[7](topics=[], timeout_ms=1000, validate_only=False)
    with pytest.raises(TypeError):
        _handle(registry, encode_request(create, 2))
