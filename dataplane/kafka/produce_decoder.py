"""The Produce request body decoder: kafka-python's objects, the record sets not copied.

kafka-python's generated decoder copies each partition's ``records`` field out of the frame
(``bytes(data[pos:pos+n])``): at saturation that is one more pass over every produced
byte on the event loop. `decode_produce_body` reads the same wire format (Produce v3-v13,
flexible from v9, ``topic_id`` instead of ``name`` from v13: Kafka's ProduceRequest.json)
into the same kafka-python objects, with each ``records`` a read-only ``memoryview`` of
the frame. Anything it does not read the common way (a tagged field present) is handed to
kafka-python's own decoder, so the two always agree (tests/unit/test_produce_decoder.py
compares them).

Pure module: no I/O.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from kafka.protocol.producer import ProduceRequest

__all__ = ["ProduceDecodeError", "decode_produce_body"]

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_ZERO_UUID = uuid.UUID(int=0)
_TOPIC = ProduceRequest.TopicProduceData
_PARTITION = ProduceRequest.TopicProduceData.PartitionProduceData
_FIRST_FLEXIBLE = 9
_FIRST_TOPIC_ID = 13


class ProduceDecodeError(ValueError):
    """The bytes are not a Produce request body of the version (the caller's error names it)."""


class _TaggedFieldsPresent(Exception):
    """Internal: a tagged field is present; kafka-python's decoder reads the request."""


def _uvarint(view: memoryview, pos: int) -> tuple[int, int]:
    """Kafka's unsigned varint (at most 5 bytes)."""
    value = 0
    for shift in range(0, 35, 7):
        if pos >= len(view):
            raise ProduceDecodeError("the frame ends inside a varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise ProduceDecodeError("varint longer than 5 bytes")


class _Reader:
    """One body's fields, in order: a position in the frame and the version's encodings."""

    __slots__ = ("view", "pos", "flexible")

    def __init__(self, view: memoryview, pos: int, flexible: bool) -> None:
        self.view = view
        self.pos = pos
        self.flexible = flexible

    def _take(self, size: int) -> int:
        """The position of the next `size` bytes (checked to lie in the frame)."""
        start = self.pos
        end = start + size
        if end > len(self.view):
            raise ProduceDecodeError(f"the frame ends inside a field ({size} B at {start})")
        self.pos = end
        return start

    def int16_length(self) -> int:
        if self.flexible:
            value, self.pos = _uvarint(self.view, self.pos)
            return value - 1
        return _INT16.unpack_from(self.view, self._take(2))[0]

    def int32_length(self) -> int:
        if self.flexible:
            value, self.pos = _uvarint(self.view, self.pos)
            return value - 1
        return _INT32.unpack_from(self.view, self._take(4))[0]

    def string(self) -> str | None:
        size = self.int16_length()
        if size < -1:
            raise ProduceDecodeError(f"negative string length {size}")
        if size == -1:
            return None
        start = self._take(size)
        return str(self.view[start : start + size], "utf-8")

    def records(self) -> memoryview | None:
        size = self.int32_length()
        if size < -1:
            raise ProduceDecodeError(f"negative records length {size}")
        if size == -1:
            return None
        start = self._take(size)
        return self.view[start : start + size]

    def count(self) -> int:
        """An array's element count; null arrays are refused (Produce has none)."""
        count = self.int32_length()
        if count < 0:
            raise ProduceDecodeError(f"array count {count}")
        return count

    def int32(self) -> int:
        return _INT32.unpack_from(self.view, self._take(4))[0]

    def no_tagged_fields(self) -> None:
        """Flexible versions: the (empty) tagged fields of a struct."""
        if self.flexible:
            start = self._take(1)
            if self.view[start] != 0:
                raise _TaggedFieldsPresent


def _new(cls: type, version: int) -> Any:
    """An empty kafka-python data object of `version`, as its generated decoder makes one."""
    obj = object.__new__(cls)
    obj._version = version
    obj.tags = None
    obj.unknown_tags = None
    return obj


def decode_produce_body(
    frame: memoryview, pos: int, version: int, request_cls: type = ProduceRequest
) -> tuple[Any, int]:
    """The Produce request body of `version` at `frame[pos:]`: (the kafka-python request
    object, the position after it). Each partition's ``records`` is a read-only view of
    `frame` (None when null): the caller keeps `frame`'s bytes unchanged while the request
    lives. Raises ProduceDecodeError (or struct.error, UnicodeDecodeError) on bytes that
    are not such a body."""
    view = frame if frame.readonly else frame.toreadonly()
    flexible = version >= _FIRST_FLEXIBLE
    reader = _Reader(view, pos, flexible)
    try:
        return _decode(reader, version, request_cls), reader.pos
    except _TaggedFieldsPresent:
        decoder = request_cls._struct.compiled_decode_from(
            version, compact=True, tagged=True, data_class=request_cls
        )
        return decoder(view, pos)


def _decode(reader: _Reader, version: int, request_cls: type) -> Any:
    request = _new(request_cls, version)
    request.transactional_id = reader.string()
    request.acks, request.timeout_ms = _ACKS_TIMEOUT.unpack_from(reader.view, reader._take(6))
    topics = []
    for _ in range(reader.count()):
        topic = _new(_TOPIC, version)
        if version >= _FIRST_TOPIC_ID:
            start = reader._take(16)
            topic_id = uuid.UUID(bytes=bytes(reader.view[start : start + 16]))
            topic.topic_id = None if topic_id == _ZERO_UUID else topic_id
        else:
            topic.name = reader.string()
        partitions = []
        for _ in range(reader.count()):
            partition = _new(_PARTITION, version)
            partition.index = reader.int32()
            partition.records = reader.records()
            reader.no_tagged_fields()
            partitions.append(partition)
        topic.partition_data = partitions
        reader.no_tagged_fields()
        topics.append(topic)
    request.topic_data = topics
    reader.no_tagged_fields()
    return request
