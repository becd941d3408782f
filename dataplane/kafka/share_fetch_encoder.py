"""The ShareFetch response (KIP-932): `ShareFetchAnswer`, encoded directly into a list of
buffers.

The share-group counterpart of `fetch_encoder.py`: the ShareFetch handler answers with plain
slotted objects and `ShareFetchAnswer.encode_parts` writes Kafka's ShareFetchResponse.json at
the version the broker serves (v1, flexible: compact strings and arrays, tagged fields; the
current leader a struct with tagged fields of its own; no node endpoints, as this broker
names no other leader), each partition's record buffers placed in the list as they are (not
copied), instead of encoding kafka-python's objects and splicing the records in afterwards.
tests/unit/test_share_fetch_encoder.py compares it with kafka-python's encoding byte for
byte.

Pure module: no I/O.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import Any

from dataplane.formats.share_messages import ShareFetchResponse
from dataplane.kafka.fetch_encoder import (
    Buffer,
    Records,
    array_length,
    put_nullable_string,
    put_records,
    put_topic_id,
)

__all__ = [
    "MAX_VERSION",
    "MIN_VERSION",
    "ShareFetchAnswer",
    "ShareFetchPartitionAnswer",
    "ShareFetchTopicAnswer",
]

MIN_VERSION = 1
MAX_VERSION = 1
_FLEXIBLE = True  # ShareFetchResponse is flexible in every version
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_LEADER = struct.Struct(">iix")  # leader id, leader epoch, and no tagged fields
_ACQUIRED = struct.Struct(">qqhx")  # first offset, last offset, delivery count, no tags
_INT32_INT16 = struct.Struct(">ih")  # throttle time or partition index, error code


class ShareFetchPartitionAnswer:
    """One share-partition's answer (kafka-python's PartitionData field names, the current
    leader as `leader_id` and `leader_epoch`). `records` is a buffer (b"" for none),
    `RecordChunks`, or None (written as null, as kafka-python writes it);
    `acquired_records` holds (first offset, last offset, delivery count) triples."""

    __slots__ = (
        "acknowledge_error_code",
        "acknowledge_error_message",
        "acquired_records",
        "error_code",
        "error_message",
        "leader_epoch",
        "leader_id",
        "partition_index",
        "records",
    )

    def __init__(
        self,
        partition_index: int,
        error_code: int = 0,
        error_message: str | None = None,
        acknowledge_error_code: int = 0,
        acknowledge_error_message: str | None = None,
        leader_id: int = -1,
        leader_epoch: int = -1,
        records: Records = b"",
        acquired_records: Sequence[tuple[int, int, int]] = (),
    ) -> None:
        self.partition_index = partition_index
        self.error_code = error_code
        self.error_message = error_message
        self.acknowledge_error_code = acknowledge_error_code
        self.acknowledge_error_message = acknowledge_error_message
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.records = records
        self.acquired_records = acquired_records


class ShareFetchTopicAnswer:
    """One topic's answers, under its id (None: the nil id)."""

    __slots__ = ("partitions", "topic_id")

    def __init__(
        self, topic_id: uuid.UUID | None, partitions: list[ShareFetchPartitionAnswer]
    ) -> None:
        self.topic_id = topic_id
        self.partitions = partitions


class ShareFetchAnswer:
    """A ShareFetchResponse of `version`: `responses` holds `ShareFetchTopicAnswer`s; a
    request-level error has `error_code` / `error_message` and usually no responses.

    Thread-safety: built and encoded on one thread (the event loop)."""

    __slots__ = (
        "acquisition_lock_timeout_ms",
        "error_code",
        "error_message",
        "responses",
        "throttle_time_ms",
        "version",
    )

    def __init__(
        self,
        version: int,
        responses: list[ShareFetchTopicAnswer],
        acquisition_lock_timeout_ms: int = 0,
        error_code: int = 0,
        error_message: str | None = None,
        throttle_time_ms: int = 0,
    ) -> None:
        self.version = version
        self.responses = responses
        self.acquisition_lock_timeout_ms = acquisition_lock_timeout_ms
        self.error_code = error_code
        self.error_message = error_message
        self.throttle_time_ms = throttle_time_ms

    def encode_parts(self) -> list[Buffer]:
        """The body as buffers, each record set's buffers in it as they are (not copied).
        Raises ValueError for a version not written here or a topic id that is not a UUID."""
        v = self.version
        if not MIN_VERSION <= v <= MAX_VERSION:
            raise ValueError(
                f"ShareFetchResponse v{v} is not written here (v{MIN_VERSION}-v{MAX_VERSION})"
            )
        parts: list[Buffer] = []
        out = bytearray(_INT32_INT16.pack(self.throttle_time_ms, self.error_code))
        put_nullable_string(out, self.error_message, _FLEXIBLE)
        out += _INT32.pack(self.acquisition_lock_timeout_ms)
        out += array_length(len(self.responses), _FLEXIBLE)
        for topic in self.responses:
            put_topic_id(out, topic.topic_id, f"a ShareFetchResponse v{v} topic")
            out += array_length(len(topic.partitions), _FLEXIBLE)
            for p in topic.partitions:
                _partition(out, parts, p)
            out += b"\x00"  # the topic's tagged fields: none
        out += b"\x01"  # node endpoints: none
        out += b"\x00"  # the response's tagged fields: none
        parts.append(bytes(out))
        return parts

    def resolved(self) -> Any:
        """kafka-python's ShareFetchResponse object of the same answer, decoded from the
        encoded bytes (for in-process callers and tests)."""
        body = b"".join(bytes(p) for p in self.encode_parts())
        return ShareFetchResponse[self.version].decode(body, version=self.version)


def _partition(out: bytearray, parts: list[Buffer], p: ShareFetchPartitionAnswer) -> None:
    """One partition's answer after `out` (its records into `parts`, see `put_records`)."""
    out += _INT32_INT16.pack(p.partition_index, p.error_code)
    put_nullable_string(out, p.error_message, _FLEXIBLE)
    out += _INT16.pack(p.acknowledge_error_code)
    put_nullable_string(out, p.acknowledge_error_message, _FLEXIBLE)
    out += _LEADER.pack(p.leader_id, p.leader_epoch)
    put_records(out, parts, p.records, _FLEXIBLE)
    acquired = p.acquired_records
    out += array_length(len(acquired), _FLEXIBLE)
    for first_offset, last_offset, delivery_count in acquired:
        out += _ACQUIRED.pack(first_offset, last_offset, delivery_count)
    out += b"\x00"  # the partition's tagged fields: none
