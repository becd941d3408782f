"""produce_encoder: the Produce response written directly is kafka-python's, byte for byte."""

from __future__ import annotations

import random
import uuid

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from dataplane.kafka.codec import (
    ResponseEncodingError,
    decode_request,
    encode_request,
    encode_response,
)
from dataplane.kafka.produce_encoder import (
    PartitionAnswer,
    ProduceAnswer,
    TopicAnswer,
    encode_produce_response,
)

R = ProduceResponse
P = R.TopicProduceResponse.PartitionProduceResponse


def _kafka(version: int, answer: ProduceAnswer) -> bytes:
    """kafka-python's encoding of the same answer, built field by field here."""
    topics = []
    for t in answer.responses:
        key = {"topic_id": t.topic_id} if version >= 13 else {"name": t.name}
        parts = [
            P(
                index=p.index,
                error_code=p.error_code,
                base_offset=p.base_offset,
                log_append_time_ms=p.log_append_time_ms,
                log_start_offset=p.log_start_offset,
                record_errors=[
                    P.BatchIndexAndErrorMessage(
                        batch_index=e.batch_index,
                        batch_index_error_message=e.batch_index_error_message,
                    )
                    for e in p.record_errors
                ],
                error_message=p.error_message,
            )
            for p in t.partition_responses
        ]
        topics.append(R.TopicProduceResponse(partition_responses=parts, **key))
    return bytes(R[version](responses=topics, throttle_time_ms=0).encode())


def _random_answer(rng: random.Random, version: int, errors: bool) -> ProduceAnswer:
    topics = []
    for _ in range(rng.randint(0, 3)):
        parts = []
        for _ in range(rng.randint(0, 7)):
            record_errors = [(1, "no key"), (3, None)] if errors and rng.random() < 0.5 else []
            message = "refused" if errors and rng.random() < 0.3 else None
            parts.append(
                PartitionAnswer(
                    rng.randint(0, 2**31 - 1),
                    rng.choice([0, 0, 6, 10, 87]),
                    rng.choice([-1, 0, rng.randint(0, 2**62)]),
                    rng.choice([-1, 1_700_000_000_000]),
                    rng.choice([-1, rng.randint(0, 2**40)]),
                    record_errors,
                    message,
                )
            )
        name = f"topic-{rng.randint(0, 10**6)}-é" if version < 13 else None
        topic_id = uuid.UUID(int=rng.getrandbits(128)) if version >= 13 else None
        topics.append(TopicAnswer(name, topic_id, parts))
    return ProduceAnswer(version, topics)


@pytest.mark.parametrize("version", range(3, 14))
def test_the_common_answer_is_kafka_pythons_bytes(version: int) -> None:
    rng = random.Random(version)
    for _ in range(60):
        answer = _random_answer(rng, version, errors=False)
        body = answer.encode_body()
        assert body is not None
        assert body == _kafka(version, answer)


@pytest.mark.parametrize("version", [3, 8, 9, 12, 13])
def test_record_errors_and_foreign_entries_go_through_kafka_python(version: int) -> None:
    rng = random.Random(100 + version)
    for _ in range(30):
        answer = _random_answer(rng, version, errors=True)
        expected = _kafka(version, answer)
        has_errors = any(
            p.record_errors or p.error_message is not None
            for t in answer.responses
            for p in t.partition_responses
        )
        assert (answer.encode_body() is None) == has_errors
        assert answer.encode() == expected
    # a denied topic added as kafka-python's object (the ACL layer does so)
    key = {"topic_id": uuid.uuid4()} if version >= 13 else {"name": "denied"}
    denied = R.TopicProduceResponse(
        partition_responses=[P(index=0, error_code=29, base_offset=-1)], **key
    )
    answer = ProduceAnswer(version, [denied])
    assert answer.encode_body() is None
    assert answer.encode() == bytes(R[version](responses=[denied], throttle_time_ms=0).encode())


def test_versions_and_topics_it_does_not_write() -> None:
    assert encode_produce_response(2, []) is None
    assert encode_produce_response(14, []) is None
    assert encode_produce_response(13, [("by-name", [])]) is None  # v13 needs a topic id
    assert encode_produce_response(9, [(None, [])]) is None


def _decoded_produce(version: int, correlation_id: int):
    request = ProduceRequest[version](
        transactional_id=None,
        acks=-1,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="t",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=None)
                ],
            )
        ],
    )
    return decode_request(
        encode_request(request, correlation_id=correlation_id, version=version)[4:]
    )


def test_the_codec_frames_the_answer_and_refuses_another_version() -> None:
    answer = ProduceAnswer(9, [TopicAnswer("t", None, [PartitionAnswer(0, 0, 5, -1, 0)])])
    frame = encode_response(_decoded_produce(9, 7), answer)
    assert frame == encode_response(_decoded_produce(9, 7), answer.to_kafka())
    assert frame[4:8] == (7).to_bytes(4, "big")
    with pytest.raises(ResponseEncodingError, match="v8"):
        encode_response(_decoded_produce(9, 7), ProduceAnswer(8, []))
