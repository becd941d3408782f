"""The partition seam: the Kafka error of each backend exception, offsets assigned by the
partition (the stream refuses any other), and nothing recorded for a refused batch."""

from __future__ import annotations

import pytest

from dataplane.config import MAX_PARTITION_PRODUCE_BYTES
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    BackendBackpressure,
    BackendError,
    OffsetOutOfRangeError,
    kafka_error_of,
    parse_produced_batches,
)
from dataplane.kafka.partition_log import PartitionLog
from dataplane.s3stream.storage import StorageError
from tests.unit.test_kafka_record_batch import client_batch
from tests.unit.test_producer_state_rebuild import _PendingStream


class _NoRoom:
    def wait(self, after_generation: int, timeout_s: float) -> bool:
        return False

    async def wait_async(self, after_generation: int, timeout_s: float) -> bool:
        return False


def test_each_backend_error_has_one_kafka_code():
    assert kafka_error_of(BackendBackpressure("full", _NoRoom(), 0, 1.0)) == (
        KafkaError.REQUEST_TIMED_OUT
    )
    assert kafka_error_of(BackendError(KafkaError.KAFKA_STORAGE_ERROR, "x")) == (
        KafkaError.KAFKA_STORAGE_ERROR
    )
    assert kafka_error_of(StorageError("stream 3 is closed")) == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert kafka_error_of(OffsetOutOfRangeError("past")) == KafkaError.OFFSET_OUT_OF_RANGE
    assert kafka_error_of(TimeoutError()) == KafkaError.REQUEST_TIMED_OUT


def test_size_limits_are_checked_in_one_place():
    too_big = b"\0" * (MAX_PARTITION_PRODUCE_BYTES + 1)
    assert parse_produced_batches(too_big, {}) == AppendOutcome(KafkaError.MESSAGE_TOO_LARGE)
    batch = client_batch(1, value_size=2000)
    refused = parse_produced_batches(batch, {"max.message.bytes": "1000"})
    assert refused == AppendOutcome(KafkaError.MESSAGE_TOO_LARGE)
    assert len(parse_produced_batches(batch, {})) == 1


def test_the_partition_assigns_offsets_and_the_stream_refuses_others():
    stream = _PendingStream()
    plog = PartitionLog("tid", "t", 0, 1, stream)
    assert plog.append(client_batch(4)).base_offset == 0
    assert plog.append(client_batch(2)).base_offset == 4
    assert stream.append_offset == 6


def test_a_transactional_batch_the_stream_refuses_opens_no_transaction():
    stream = _PendingStream()
    plog = PartitionLog("tid", "t", 0, 1, stream)
    stream.failed = "stream 7 is closed"
    with pytest.raises(StorageError):
        plog.append(client_batch(2, producer=(9, 0, 0), transactional=True))
    assert plog.txns.first_unstable() is None
    assert plog.last_stable_offset == plog.high_watermark
    stream.failed = None
    assert plog.append(client_batch(2, producer=(9, 0, 0), transactional=True)).error == 0
    assert plog.txns.first_unstable() == 0
