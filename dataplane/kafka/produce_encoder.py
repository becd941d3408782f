"""The Produce response: `ProduceAnswer`, encoded directly in the common case.

Building kafka-python's response objects (a data container per topic and per partition)
and encoding them costs a fixed ~100 µs of event-loop time per produce request, paid by
every request whatever its size. The produce handler answers with a `ProduceAnswer`
(plain slotted objects with kafka-python's field names, so callers read it the same way),
and the codec encodes it with `encode_produce_response`, which writes the same bytes
directly (Kafka's ProduceResponse.json, v3-v13: flexible from v9, ``topic_id`` instead of
``name`` from v13, the v10+ tagged fields absent as Kafka leaves them at their defaults)
for responses whose partitions carry no KIP-467 record errors and no error message; it
returns None for anything else, which kafka-python encodes as before.
tests/unit/test_produce_encoder.py compares the two byte for byte.

Pure module: no I/O.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import Any

from kafka.protocol.producer import ProduceResponse

from dataplane.formats.varint import uvarint_bytes

__all__ = [
    "PartitionAnswer",
    "ProduceAnswer",
    "TopicAnswer",
    "encode_produce_response",
]

MIN_VERSION = 3
MAX_VERSION = 13
_FIRST_FLEXIBLE = 9
_FIRST_TOPIC_ID = 13
_INT32 = struct.Struct(">i")
_PARTITION_V3 = struct.Struct(">ihqq")  # index, error, base offset, log append time
_INT64 = struct.Struct(">q")
_RECORD_ERROR = (
    ProduceResponse.TopicProduceResponse.PartitionProduceResponse.BatchIndexAndErrorMessage
)

# (index, error code, base offset, log append time ms, log start offset)
PartitionFields = tuple[int, int, int, int, int]
# (name, or topic id from v13, its partitions' answers)
TopicFields = tuple[str | uuid.UUID | None, Sequence[PartitionFields]]


class PartitionAnswer:
    """One partition's answer (kafka-python's PartitionProduceResponse field names);
    `record_errors` is given as (batch index, message) pairs (KIP-467) and kept as
    kafka-python's BatchIndexAndErrorMessage objects."""

    __slots__ = (
        "base_offset",
        "error_code",
        "error_message",
        "index",
        "log_append_time_ms",
        "log_start_offset",
        "record_errors",
    )

    def __init__(
        self,
        index: int,
        error_code: int,
        base_offset: int,
        log_append_time_ms: int,
        log_start_offset: int,
        record_errors: Sequence[tuple[int, str | None]] = (),
        error_message: str | None = None,
    ) -> None:
        self.index = index
        self.error_code = error_code
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self.log_start_offset = log_start_offset
        self.record_errors = [
            _RECORD_ERROR(batch_index=index, batch_index_error_message=message)
            for index, message in record_errors
        ]
        self.error_message = error_message


class TopicAnswer:
    """One topic's answers: `name` (v3-v12) or `topic_id` (v13+)."""

    __slots__ = ("name", "partition_responses", "topic_id")

    def __init__(
        self,
        name: str | None,
        topic_id: uuid.UUID | None,
        partition_responses: list[PartitionAnswer],
    ) -> None:
        self.name = name
        self.topic_id = topic_id
        self.partition_responses = partition_responses


class ProduceAnswer:
    """A ProduceResponse of `version`: `responses` holds `TopicAnswer`s, and kafka-python
    TopicProduceResponse objects others added (the ACL layer's denied topics).

    Thread-safety: built and encoded on one thread (the event loop)."""

    __slots__ = ("responses", "throttle_time_ms", "version")

    def __init__(self, version: int, responses: list, throttle_time_ms: int = 0) -> None:
        self.version = version
        self.responses = responses
        self.throttle_time_ms = throttle_time_ms

    def encode_body(self) -> bytes | None:
        """The body's bytes, or None when it is not the common answer (record errors, an
        error message, a kafka-python entry, a version not written here)."""
        topics = []
        for topic in self.responses:
            if not isinstance(topic, TopicAnswer):
                return None
            fields = []
            for p in topic.partition_responses:
                if p.record_errors or p.error_message is not None:
                    return None
                fields.append(
                    (p.index, p.error_code, p.base_offset, p.log_append_time_ms, p.log_start_offset)
                )
            topics.append(
                (topic.topic_id if self.version >= _FIRST_TOPIC_ID else topic.name, fields)
            )
        return encode_produce_response(self.version, topics, self.throttle_time_ms)

    def encode(self) -> bytes:
        """The body's bytes (kafka-python's encoder when not the common answer)."""
        body = self.encode_body()
        return body if body is not None else bytes(self.to_kafka().encode())

    def to_kafka(self) -> Any:
        """kafka-python's ProduceResponse object of the same answer."""
        R = ProduceResponse
        P = R.TopicProduceResponse.PartitionProduceResponse
        responses = []
        for topic in self.responses:
            if not isinstance(topic, TopicAnswer):
                responses.append(topic)
                continue
            key = (
                {"topic_id": topic.topic_id}
                if self.version >= _FIRST_TOPIC_ID
                else {"name": topic.name}
            )
            partitions = [
                P(
                    index=p.index,
                    error_code=p.error_code,
                    base_offset=p.base_offset,
                    log_append_time_ms=p.log_append_time_ms,
                    log_start_offset=p.log_start_offset,
                    record_errors=p.record_errors,
                    error_message=p.error_message,
                )
                for p in topic.partition_responses
            ]
            responses.append(R.TopicProduceResponse(partition_responses=partitions, **key))
        return R[self.version](responses=responses, throttle_time_ms=self.throttle_time_ms)


def encode_produce_response(
    version: int, topics: Sequence[TopicFields], throttle_time_ms: int = 0
) -> bytes | None:
    """The ProduceResponse body of `version` answering `topics`, or None when this
    encoder does not write that version or a topic has no name (id, from v13)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        return None
    flexible = version >= _FIRST_FLEXIBLE
    parts: list[bytes] = [uvarint_bytes(len(topics) + 1) if flexible else _INT32.pack(len(topics))]
    # per partition after its common fields: v5+ log start offset, v8+ no record errors and
    # a null error message, v9+ no tagged fields
    if version >= _FIRST_FLEXIBLE:
        tail = b"\x01\x00\x00"  # empty compact array, null compact string, no tags
    elif version >= 8:
        tail = b"\x00\x00\x00\x00\xff\xff"  # empty array, null string
    else:
        tail = b""
    with_start = version >= 5
    for topic, partitions in topics:
        if version >= _FIRST_TOPIC_ID:
            if not isinstance(topic, uuid.UUID):
                return None
            parts.append(topic.bytes)
        else:
            if not isinstance(topic, str):
                return None
            name = topic.encode()
            parts.append(uvarint_bytes(len(name) + 1) if flexible else struct.pack(">h", len(name)))
            parts.append(name)
        parts.append(
            uvarint_bytes(len(partitions) + 1) if flexible else _INT32.pack(len(partitions))
        )
        for index, error, base, append_time_ms, log_start in partitions:
            parts.append(_PARTITION_V3.pack(index, error, base, append_time_ms))
            if with_start:
                parts.append(_INT64.pack(log_start))
            parts.append(tail)
        if flexible:
            parts.append(b"\x00")  # the topic's tagged fields: none
    parts.append(_INT32.pack(throttle_time_ms))
    if flexible:
        parts.append(b"\x00")
    return b"".join(parts)
