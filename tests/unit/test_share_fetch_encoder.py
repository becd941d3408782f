"""share_fetch_encoder: the ShareFetch response written directly is kafka-python's, byte for
byte, with the record buffers placed in the frame as they are."""

from __future__ import annotations

import random
import uuid

import pytest

from dataplane.formats.record_batch import RecordChunks
from dataplane.kafka.codec import (
    ResponseEncodingError,
    decode_request,
    encode_request,
    encode_response,
)
from dataplane.kafka.fetch_encoder import FetchAnswer
from dataplane.kafka.share.protocol import ShareFetchRequest, ShareFetchResponse
from dataplane.kafka.share_fetch_encoder import (
    MAX_VERSION,
    MIN_VERSION,
    ShareFetchAnswer,
    ShareFetchPartitionAnswer,
    ShareFetchTopicAnswer,
)
from tests.support.kafka_requests import fetch_request, random_record_set

T = ShareFetchResponse.ShareFetchableTopicResponse
P = T.PartitionData
VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)


def _share_fetch_request(version: int, correlation_id: int = 7):
    F = ShareFetchRequest
    request = F(
        version=version,
        group_id="g",
        member_id="m",
        share_session_epoch=1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        max_records=10,
        batch_size=10,
        topics=[
            F.FetchTopic(
                topic_id=uuid.uuid4(),
                partitions=[F.FetchTopic.FetchPartition(partition_index=0)],
            )
        ],
        forgotten_topics_data=[],
    )
    return decode_request(encode_request(request, correlation_id=correlation_id)[4:])


def _flat(frame) -> bytes:
    return frame if isinstance(frame, bytes) else b"".join(bytes(p) for p in frame)


def _old_path(request, answer: ShareFetchAnswer) -> bytes:
    """The frame the handler wrote before: kafka-python's objects built as it built them,
    encoded with the record sets inline (the socket path spliced them in at placeholders,
    which gave the same bytes)."""
    topics = []
    for t in answer.responses:
        parts = [
            P(
                partition_index=p.partition_index,
                error_code=p.error_code,
                error_message=p.error_message,
                acknowledge_error_code=p.acknowledge_error_code,
                acknowledge_error_message=p.acknowledge_error_message,
                current_leader=P.LeaderIdAndEpoch(
                    leader_id=p.leader_id, leader_epoch=p.leader_epoch
                ),
                records=None if p.records is None else bytes(p.records),
                acquired_records=[
                    P.AcquiredRecords(first_offset=f, last_offset=last, delivery_count=n)
                    for f, last, n in p.acquired_records
                ],
            )
            for p in t.partitions
        ]
        topics.append(T(topic_id=t.topic_id, partitions=parts))
    response = ShareFetchResponse(
        version=answer.version,
        throttle_time_ms=answer.throttle_time_ms,
        error_code=answer.error_code,
        error_message=answer.error_message,
        acquisition_lock_timeout_ms=answer.acquisition_lock_timeout_ms,
        responses=topics,
        node_endpoints=[],
    )
    return _flat(encode_response(request, response))


def _message(rng: random.Random) -> str | None:
    # lengths on both sides of the compact string's one-byte varint (126 + 1 = 127)
    return rng.choice([None, None, "", "not the leader", "ü" * 63, "x" * 126, "y" * 127, "z" * 300])


def _acquired(rng: random.Random) -> list[tuple[int, int, int]]:
    ranges = []
    for _ in range(rng.choice([0, 0, 1, 2, 5])):
        first = rng.randint(0, 2**62)
        ranges.append((first, first + rng.randint(0, 10_000), rng.randint(1, 2**15 - 1)))
    return ranges


def _random_partition(rng: random.Random, index: int) -> ShareFetchPartitionAnswer:
    return ShareFetchPartitionAnswer(
        partition_index=index,
        error_code=rng.choice([0, 0, 3, 6, 100]),
        error_message=_message(rng),
        acknowledge_error_code=rng.choice([0, 0, 42, 124]),
        acknowledge_error_message=_message(rng),
        leader_id=rng.choice([-1, 0, 3, 2**31 - 1]),
        leader_epoch=rng.choice([-1, 0, 17, 2**31 - 1]),
        records=random_record_set(rng),
        acquired_records=_acquired(rng),
    )


def _random_answer(rng: random.Random, version: int) -> ShareFetchAnswer:
    topics = []
    for _ in range(rng.randint(0, 4)):
        # partition counts on both sides of the compact array's one-byte varint
        count = rng.choice([0, 1, 3, 7, 126, 127])
        parts = [
            _random_partition(rng, rng.randint(0, 2**31 - 1) if i == 0 else i) for i in range(count)
        ]
        topic_id = None if rng.random() < 0.1 else uuid.UUID(int=rng.getrandbits(128))
        topics.append(ShareFetchTopicAnswer(topic_id, parts))
    error = rng.random() < 0.2
    return ShareFetchAnswer(
        version,
        topics if not error else [],
        acquisition_lock_timeout_ms=rng.choice([0, 15_000, 2**31 - 1]),
        error_code=rng.choice([72, 87, 122]) if error else 0,
        error_message=_message(rng) if error else rng.choice([None, ""]),
        throttle_time_ms=rng.choice([0, 0, 5, 2**31 - 1]),
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_the_answer_written_directly_is_the_old_frame_byte_for_byte(version: int) -> None:
    rng = random.Random(version)
    request = _share_fetch_request(version)
    for _ in range(40):
        answer = _random_answer(rng, version)
        frame = encode_response(request, answer)
        flat = _flat(frame)
        assert flat == _old_path(request, answer)
        if isinstance(frame, list):
            assert int.from_bytes(frame[0][:4], "big") == len(flat) - 4


def test_record_buffers_go_into_the_frame_uncopied() -> None:
    request = _share_fetch_request(1)
    single = memoryview(b"\x05" * 70_000)
    chunk = memoryview(b"\x03" * 20_000)
    chunks = RecordChunks([chunk, b"\x04" * 5])
    topic_id = uuid.uuid4()
    answer = ShareFetchAnswer(
        1,
        [
            ShareFetchTopicAnswer(
                topic_id,
                [
                    ShareFetchPartitionAnswer(0, records=single, acquired_records=[(0, 9, 1)]),
                    ShareFetchPartitionAnswer(1, 6, "not the leader", leader_id=2, leader_epoch=5),
                    ShareFetchPartitionAnswer(2, records=chunks, acquired_records=[(4, 4, 3)]),
                ],
            )
        ],
        acquisition_lock_timeout_ms=30_000,
    )
    frame = encode_response(request, answer)
    assert isinstance(frame, list)
    assert any(p is single for p in frame)
    assert any(p is chunk for p in frame)
    resolved = answer.resolved()
    assert resolved.acquisition_lock_timeout_ms == 30_000
    assert resolved.responses[0].topic_id == topic_id
    got = resolved.responses[0].partitions
    assert [bytes(p.records or b"") for p in got] == [bytes(single), b"", bytes(chunks)]
    assert [[(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
            for p in got] == [[(0, 9, 1)], [], [(4, 4, 3)]]  # fmt: skip
    leader = got[1].current_leader
    assert (got[1].error_message, leader.leader_id, leader.leader_epoch) == ("not the leader", 2, 5)


def test_an_error_or_an_answer_without_records_is_one_buffer() -> None:
    request = _share_fetch_request(1)
    error = ShareFetchAnswer(1, [], 5_000, error_code=122, error_message="epoch 3")
    empty = ShareFetchAnswer(
        1, [ShareFetchTopicAnswer(uuid.uuid4(), [ShareFetchPartitionAnswer(0, 100)])]
    )
    for answer in (error, empty):
        frame = encode_response(request, answer)
        assert isinstance(frame, bytes)
        assert frame == _old_path(request, answer)
    assert (error.resolved().error_code, error.resolved().error_message) == (122, "epoch 3")


def test_another_version_or_api_or_an_ill_typed_topic_id_is_an_encoding_error() -> None:
    request = _share_fetch_request(1)
    with pytest.raises(ResponseEncodingError, match="v2 to ShareFetchRequest v1"):
        encode_response(request, ShareFetchAnswer(2, []))
    with pytest.raises(ResponseEncodingError, match="needs an id"):
        encode_response(request, ShareFetchAnswer(1, [ShareFetchTopicAnswer("t", [])]))
    with pytest.raises(ResponseEncodingError, match="a FetchResponse v1"):
        encode_response(request, FetchAnswer(1, []))
    fetch = decode_request(encode_request(fetch_request("t", {0: 0}, 12), correlation_id=3)[4:])
    with pytest.raises(ResponseEncodingError, match="ShareFetchResponse v12 to FetchRequest"):
        encode_response(fetch, ShareFetchAnswer(12, []))
    with pytest.raises(ValueError, match="v0 is not written here"):
        ShareFetchAnswer(0, []).encode_parts()
