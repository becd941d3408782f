"""fetch_encoder: the Fetch response written directly is kafka-python's, byte for byte, with
the record buffers placed in the frame as they are."""

from __future__ import annotations

import random
import uuid

import pytest
from kafka.protocol.consumer import FetchResponse

from dataplane.formats.record_batch import RecordChunks
from dataplane.kafka.codec import (
    ResponseEncodingError,
    decode_request,
    encode_request,
    encode_response,
)
from dataplane.kafka.fetch_encoder import FetchAnswer, FetchPartitionAnswer, FetchTopicAnswer
from tests.support.kafka_requests import fetch_request, random_record_set

F = FetchResponse.FetchableTopicResponse
P = F.PartitionData
VERSIONS = range(4, 17)


def _fetch_request(version: int, correlation_id: int = 7):
    request = fetch_request(
        "t", {0: 0}, version, topic_id=uuid.uuid4(), max_wait_ms=500, min_bytes=1,
        max_bytes=50 << 20, isolation_level=1,
    )  # fmt: skip
    return decode_request(encode_request(request, correlation_id=correlation_id)[4:])


def _old_path(request, answer: FetchAnswer) -> bytes:
    """The frame the handler wrote before: kafka-python's objects, encoded with the record
    sets inline (the socket path spliced them in at placeholders, which gave the same
    bytes)."""
    topics = []
    for t in answer.responses:
        parts = [
            P(
                partition_index=p.partition_index,
                error_code=p.error_code,
                high_watermark=p.high_watermark,
                last_stable_offset=p.last_stable_offset,
                log_start_offset=p.log_start_offset,
                aborted_transactions=None
                if p.aborted_transactions is None
                else [
                    P.AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in p.aborted_transactions
                ],
                preferred_read_replica=p.preferred_read_replica,
                records=None if p.records is None else bytes(p.records),
            )
            for p in t.partitions
        ]
        key = {"topic_id": t.topic_id} if answer.version >= 13 else {"topic": t.topic}
        topics.append(F(partitions=parts, **key))
    response = FetchResponse[answer.version](
        throttle_time_ms=answer.throttle_time_ms,
        error_code=answer.error_code,
        session_id=answer.session_id,
        responses=topics,
    )
    frame = encode_response(request, response)
    return frame if isinstance(frame, bytes) else b"".join(bytes(p) for p in frame)


def _random_answer(rng: random.Random, version: int) -> FetchAnswer:
    topics = []
    for t in range(rng.randint(0, 4)):
        parts = []
        for i in range(rng.randint(0, 7)):
            aborted = rng.choice([None, [], [(7, 3)], [(1, 0), (2**40, 2**33), (-1, 5)]])
            parts.append(
                FetchPartitionAnswer(
                    rng.randint(0, 2**31 - 1) if i == 0 else i,
                    rng.choice([0, 0, 1, 6, 74]),
                    rng.randint(-1, 2**50),
                    rng.randint(-1, 2**50),
                    rng.randint(-1, 2**40),
                    aborted,
                    rng.choice([-1, -1, 0, 3]),
                    random_record_set(rng),
                )
            )
        name = rng.choice(["t", "orders", "ü" * 70, "x" * 200]) + str(t)
        topics.append(FetchTopicAnswer(name, uuid.UUID(int=rng.getrandbits(128)), parts))
    return FetchAnswer(
        version,
        topics,
        throttle_time_ms=rng.choice([0, 0, 5, 2**31 - 1]),
        error_code=rng.choice([0, 0, 71]) if version >= 7 else 0,
        session_id=rng.choice([0, 12345, -1]) if version >= 7 else 0,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_the_answer_written_directly_is_the_old_frame_byte_for_byte(version: int) -> None:
    rng = random.Random(version)
    request = _fetch_request(version)
    for _ in range(60):
        answer = _random_answer(rng, version)
        frame = encode_response(request, answer)
        flat = frame if isinstance(frame, bytes) else b"".join(bytes(p) for p in frame)
        assert flat == _old_path(request, answer)
        if isinstance(frame, list):
            assert int.from_bytes(frame[0][:4], "big") == len(flat) - 4


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_record_buffers_go_into_the_frame_uncopied(version: int) -> None:
    request = _fetch_request(version)
    single = memoryview(b"\x05" * 70_000)
    chunk = memoryview(b"\x03" * 20_000)
    chunks = RecordChunks([chunk, b"\x04" * 5])
    answer = FetchAnswer(
        version,
        [
            FetchTopicAnswer(
                "t",
                uuid.uuid4(),
                [
                    FetchPartitionAnswer(0, 0, 10, 10, 0, [(3, 1)], -1, single),
                    FetchPartitionAnswer(1, 0, 10, 10, 0, [], -1, b""),
                    FetchPartitionAnswer(2, 0, 10, 10, 0, None, 2, chunks),
                ],
            )
        ],
    )
    frame = encode_response(request, answer)
    assert isinstance(frame, list)
    assert any(p is single for p in frame)
    assert any(p is chunk for p in frame)
    resolved = answer.resolved()
    got = resolved.responses[0].partitions
    assert [bytes(p.records or b"") for p in got] == [bytes(single), b"", bytes(chunks)]
    assert [(a.producer_id, a.first_offset) for a in got[0].aborted_transactions] == [(3, 1)]


def test_without_records_the_frame_is_one_buffer() -> None:
    request = _fetch_request(12)
    answer = FetchAnswer(12, [FetchTopicAnswer("t", None, [FetchPartitionAnswer(0, 1, -1)])])
    frame = encode_response(request, answer)
    assert isinstance(frame, bytes)
    assert frame == _old_path(request, answer)


def test_kafka_python_topic_entries_are_written_alike() -> None:
    """The ACL layer adds kafka-python FetchableTopicResponse objects for denied topics."""
    request = _fetch_request(11)
    denied = F(
        topic="secret",
        partitions=[
            P(
                partition_index=0,
                error_code=29,
                high_watermark=-1,
                last_stable_offset=-1,
                log_start_offset=-1,
                aborted_transactions=[P.AbortedTransaction(producer_id=4, first_offset=2)],
                records=b"",
            )
        ],
    )
    answer = FetchAnswer(11, [denied])
    expected = encode_response(
        request,
        FetchResponse[11](throttle_time_ms=0, error_code=0, session_id=0, responses=[denied]),
    )
    assert encode_response(request, answer) == expected


def test_another_version_or_api_or_a_nameless_topic_is_an_encoding_error() -> None:
    request = _fetch_request(12)
    with pytest.raises(ResponseEncodingError, match="v11"):
        encode_response(request, FetchAnswer(11, []))
    with pytest.raises(ResponseEncodingError, match="needs a name"):
        encode_response(request, FetchAnswer(12, [FetchTopicAnswer(None, uuid.uuid4(), [])]))
    with pytest.raises(ResponseEncodingError, match="needs an id"):
        encode_response(_fetch_request(13), FetchAnswer(13, [FetchTopicAnswer("t", "t", [])]))


@pytest.mark.parametrize("version", [13, 16])
def test_a_topic_asked_by_the_nil_id_is_answered_under_it(version: int) -> None:
    """kafka-python decodes a request's zero topic id as None (a fuzzed frame, or a client
    that sent the nil id): the answer carries the nil id, as kafka-python's encoder wrote
    it, instead of failing the request."""
    request = _fetch_request(version)
    part = FetchPartitionAnswer(0, 100, -1, -1, -1, [], -1, b"")  # UNKNOWN_TOPIC_ID
    answer = FetchAnswer(version, [FetchTopicAnswer(None, None, [part])])
    assert encode_response(request, answer) == _old_path(request, answer)
    with pytest.raises(ResponseEncodingError):
        encode_response(_fetch_request(17), FetchAnswer(17, []))
