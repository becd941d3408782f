"""The Fetch response: `FetchAnswer`, encoded directly into a list of buffers.

A tail consumer sends hundreds of Fetches a second, each answering a few partitions; building
kafka-python's response objects (a data container per topic, partition and aborted
transaction), encoding them, then searching the encoded body for the placeholders of the
record sets was the event loop's largest Python cost per Fetch. The fetch handler answers
with a `FetchAnswer` (plain slotted objects with kafka-python's field names, so callers read
it the same way) and `FetchAnswer.encode_parts` writes Kafka's FetchResponse.json v4-v16
directly (flexible from v12, ``topic_id`` instead of ``topic`` from v13, log start offset
from v5, aborted transactions nullable, preferred read replica from v11; the v12+ tagged
fields diverging_epoch, current_leader, snapshot_id and v16's node_endpoints left absent, as
this broker never sets them), each partition's record buffers placed in the list as they
are (not copied). tests/unit/test_fetch_encoder.py compares it with kafka-python's encoding
byte for byte.

Pure module: no I/O.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import Any

from kafka.protocol.consumer import FetchResponse

from dataplane.formats.record_batch import RecordChunks
from dataplane.formats.varint import uvarint_bytes

__all__ = [
    "MAX_VERSION",
    "MIN_VERSION",
    "Buffer",
    "FetchAnswer",
    "FetchPartitionAnswer",
    "FetchTopicAnswer",
    "Records",
    "array_length",
    "put_nullable_string",
    "put_records",
    "put_topic_id",
]

MIN_VERSION = 4
MAX_VERSION = 16
_FIRST_FLEXIBLE = 12
_FIRST_TOPIC_ID = 13
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_HEAD_V7 = struct.Struct(">ihi")  # throttle time, error code, session id
_PARTITION = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_ABORTED_TAGGED = struct.Struct(">qqx")  # ... and no tagged fields (a zero byte)
_NULL_INT32 = b"\xff\xff\xff\xff"
_NIL_UUID = bytes(16)

Buffer = bytes | bytearray | memoryview
Records = Buffer | RecordChunks | None


class FetchPartitionAnswer:
    """One partition's answer (kafka-python's PartitionData field names). `records` is None
    (a null record set), a buffer (b"" for none) or `RecordChunks`; `aborted_transactions`
    is None (null) or (producer id, first offset) pairs."""

    __slots__ = (
        "aborted_transactions",
        "error_code",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "partition_index",
        "preferred_read_replica",
        "records",
    )

    def __init__(
        self,
        partition_index: int,
        error_code: int,
        high_watermark: int,
        last_stable_offset: int = -1,
        log_start_offset: int = -1,
        aborted_transactions: Sequence[tuple[int, int]] | None = (),
        preferred_read_replica: int = -1,
        records: Records = b"",
    ) -> None:
        self.partition_index = partition_index
        self.error_code = error_code
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted_transactions = aborted_transactions
        self.preferred_read_replica = preferred_read_replica
        self.records = records


class FetchTopicAnswer:
    """One topic's answers: `topic` (v4-v12) or `topic_id` (v13+)."""

    __slots__ = ("partitions", "topic", "topic_id")

    def __init__(
        self,
        topic: str | None,
        topic_id: uuid.UUID | None,
        partitions: list[FetchPartitionAnswer],
    ) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.partitions = partitions


class FetchAnswer:
    """A FetchResponse of `version`: `responses` holds `FetchTopicAnswer`s, and kafka-python
    FetchableTopicResponse objects others added (the ACL layer's denied topics), read by
    the same field names (their v12+ tagged fields are not written).

    Thread-safety: built and encoded on one thread (the event loop)."""

    __slots__ = ("error_code", "responses", "session_id", "throttle_time_ms", "version")

    def __init__(
        self,
        version: int,
        responses: list,
        throttle_time_ms: int = 0,
        error_code: int = 0,
        session_id: int = 0,
    ) -> None:
        self.version = version
        self.responses = responses
        self.throttle_time_ms = throttle_time_ms
        self.error_code = error_code
        self.session_id = session_id

    def encode_parts(self) -> list[Buffer]:
        """The body as buffers, each record set's buffers in it as they are (not copied).
        Raises ValueError for a version not written here or a topic without a name (id,
        from v13)."""
        v = self.version
        if not MIN_VERSION <= v <= MAX_VERSION:
            raise ValueError(f"FetchResponse v{v} is not written here (v4-v16)")
        flexible = v >= _FIRST_FLEXIBLE
        parts: list[Buffer] = []
        out = bytearray(
            _INT32.pack(self.throttle_time_ms)
            if v < 7
            else _HEAD_V7.pack(self.throttle_time_ms, self.error_code, self.session_id)
        )
        out += array_length(len(self.responses), flexible)
        for topic in self.responses:
            _topic_key(out, topic, v, flexible)
            partitions = topic.partitions
            out += array_length(len(partitions), flexible)
            for p in partitions:
                out += _PARTITION.pack(
                    p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset
                )
                if v >= 5:
                    out += _INT64.pack(p.log_start_offset)
                _aborted(out, p.aborted_transactions, flexible)
                if v >= 11:
                    out += _INT32.pack(p.preferred_read_replica)
                put_records(out, parts, p.records, flexible)
                if flexible:
                    out += b"\x00"  # the partition's tagged fields: none
            if flexible:
                out += b"\x00"  # the topic's tagged fields: none
        if flexible:
            out += b"\x00"  # the response's tagged fields: none (no node endpoints)
        parts.append(bytes(out))
        return parts

    def resolved(self) -> Any:
        """kafka-python's FetchResponse object of the same answer, decoded from the encoded
        bytes (for in-process callers and tests)."""
        body = b"".join(bytes(p) for p in self.encode_parts())
        return FetchResponse[self.version].decode(body, version=self.version)


def array_length(n: int, flexible: bool) -> bytes:
    """An array's length: compact (n + 1 as a varint) when flexible, else an int32."""
    return uvarint_bytes(n + 1) if flexible else _INT32.pack(n)


def _topic_key(out: bytearray, topic: Any, version: int, flexible: bool) -> None:
    """A topic's name (v4-v12) or id (v13+) into `out`."""
    if version >= _FIRST_TOPIC_ID:
        put_topic_id(out, topic.topic_id, f"a FetchResponse v{version} topic")
        return
    name = topic.topic
    if not isinstance(name, str):
        raise ValueError(f"a FetchResponse v{version} topic needs a name, got {name!r}")
    put_nullable_string(out, name, flexible)


def put_topic_id(out: bytearray, topic_id: uuid.UUID | None, what: str) -> None:
    """A topic id (UUID) into `out`. None is the nil id (kafka-python decodes a request's
    zero UUID as None: an unknown topic, answered with its error under the id it was asked
    by); anything else is a ValueError naming `what`."""
    if topic_id is None:
        out += _NIL_UUID
        return
    if not isinstance(topic_id, uuid.UUID):
        raise ValueError(f"{what} needs an id, got {topic_id!r}")
    out += topic_id.bytes


def put_nullable_string(out: bytearray, value: str | None, flexible: bool) -> None:
    """A (nullable) string into `out`: compact (length + 1 as a varint, 0 for null) when
    flexible, else an int16 length (-1 for null)."""
    if value is None:
        out += b"\x00" if flexible else b"\xff\xff"
        return
    encoded = value.encode()
    out += uvarint_bytes(len(encoded) + 1) if flexible else _INT16.pack(len(encoded))
    out += encoded


def put_records(out: bytearray, parts: list[Buffer], records: Records, flexible: bool) -> None:
    """A record set (nullable bytes) after `out`'s bytes: None is null, an empty one only
    its length; a non-empty one's length goes into `out`, then `out` moves into `parts`
    (and is cleared) and the record buffers follow it there as they are (not copied), the
    buffers of `RecordChunks` one after the other."""
    if records is None:
        out += b"\x00" if flexible else _NULL_INT32
    elif not records:
        out += b"\x01" if flexible else b"\x00\x00\x00\x00"
    else:
        out += uvarint_bytes(len(records) + 1) if flexible else _INT32.pack(len(records))
        parts.append(bytes(out))
        out.clear()
        if isinstance(records, RecordChunks):
            parts += records.chunks
        else:
            parts.append(records)


def _aborted(out: bytearray, aborted: Any, flexible: bool) -> None:
    """A partition's aborted transactions into `out`: None is null; entries are (producer
    id, first offset) pairs or kafka-python AbortedTransaction objects."""
    if aborted is None:
        out += b"\x00" if flexible else _NULL_INT32
        return
    out += array_length(len(aborted), flexible)
    pack = _ABORTED_TAGGED.pack if flexible else _ABORTED.pack
    for entry in aborted:
        if isinstance(entry, tuple):
            out += pack(*entry)
        else:
            out += pack(entry.producer_id, entry.first_offset)
