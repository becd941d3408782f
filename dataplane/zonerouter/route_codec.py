"""Compact zone routes (issue #32, `ZoneRouteRequest` versions 2 and 3): a batch's entries and
their answers packed as zigzag varints instead of fixed-width fields.

A route entry is ~28 bytes in version 1 (a 16-byte topic id, a 4-byte partition, an
8-byte channel offset) and its answer ~22; packed, a batch names each topic once and each
entry is its topic's index, its partition and its channel offset as a delta from the
previous entry's (~3-7 bytes); an answer is its error code, base offset, stream id and
end offset as varints (the base and end offsets as deltas of the previous answer's) plus
the message of an error. All functions are pure.
"""

from __future__ import annotations

import uuid

from dataplane.formats.varint import get_zigzag, put_zigzag

MAX_PACKED_ENTRIES = 1024  # entries one packed batch may hold
MAX_PACKED_TOPICS = 1024
MAX_MESSAGE_BYTES = 4096  # an error message in a packed answer

# one route: topic id, partition, channel offset
RouteEntry = tuple[uuid.UUID, int, int]
# one answer: error code, message, base offset, stream id, end offset
RouteAnswer = tuple[int, str | None, int, int, int]


def _put(out: bytearray, value: int) -> None:
    put_zigzag(out, value)


def _get(data: bytes, pos: int) -> tuple[int, int]:
    return get_zigzag(data, pos, "a packed zone route")


def pack_entries(entries: list[RouteEntry]) -> bytes:
    """The routes of one batch: the distinct topics (count, then 16 bytes each), then per
    entry its topic's index, its partition and its channel offset's delta."""
    topics: dict[uuid.UUID, int] = {}
    for topic_id, _, _ in entries:
        topics.setdefault(topic_id, len(topics))
    out = bytearray()
    _put(out, len(topics))
    for topic_id in topics:
        out += topic_id.bytes
    previous = 0
    for topic_id, partition, channel_offset in entries:
        _put(out, topics[topic_id])
        _put(out, partition)
        _put(out, channel_offset - previous)
        previous = channel_offset
    return bytes(out)


def unpack_entries(data: bytes) -> list[RouteEntry]:
    """`pack_entries` undone (raises ValueError on bad input)."""
    count, pos = _get(data, 0)
    if not 0 <= count <= MAX_PACKED_TOPICS or pos + 16 * count > len(data):
        raise ValueError(f"bad topic count {count} in a packed zone route")
    topics = [uuid.UUID(bytes=data[pos + 16 * i : pos + 16 * (i + 1)]) for i in range(count)]
    pos += 16 * count
    out: list[RouteEntry] = []
    previous = 0
    while pos < len(data):
        if len(out) >= MAX_PACKED_ENTRIES:
            raise ValueError(f"more than {MAX_PACKED_ENTRIES} packed zone routes")
        index, pos = _get(data, pos)
        partition, pos = _get(data, pos)
        delta, pos = _get(data, pos)
        if not 0 <= index < count:
            raise ValueError(f"topic index {index} of {count} in a packed zone route")
        previous += delta
        out.append((topics[index], partition, previous))
    return out


def pack_answers(answers: list[RouteAnswer]) -> bytes:
    """The answers of one batch, in its entries' order: error code (and, when not 0, the
    message's length + 1, 0 for none, then its UTF-8 bytes), base offset's delta, stream
    id, end offset's delta."""
    out = bytearray()
    base = end = 0
    for error_code, message, base_offset, stream_id, end_offset in answers:
        _put(out, error_code)
        if error_code:
            raw = (message or "").encode()[:MAX_MESSAGE_BYTES] if message is not None else None
            _put(out, 0 if raw is None else len(raw) + 1)
            out += raw or b""
        _put(out, base_offset - base)
        _put(out, stream_id)
        _put(out, end_offset - end)
        base, end = base_offset, end_offset
    return bytes(out)


def unpack_answers(data: bytes) -> list[RouteAnswer]:
    """`pack_answers` undone (raises ValueError on bad input)."""
    out: list[RouteAnswer] = []
    pos = base = end = 0
    while pos < len(data):
        if len(out) >= MAX_PACKED_ENTRIES:
            raise ValueError(f"more than {MAX_PACKED_ENTRIES} packed zone route answers")
        error_code, pos = _get(data, pos)
        message = None
        if error_code:
            size, pos = _get(data, pos)
            if not 0 <= size <= MAX_MESSAGE_BYTES + 1 or pos + max(size - 1, 0) > len(data):
                raise ValueError(f"bad message size {size} in a packed zone route answer")
            if size:
                message = data[pos : pos + size - 1].decode(errors="replace")
                pos += size - 1
        delta_base, pos = _get(data, pos)
        stream_id, pos = _get(data, pos)
        delta_end, pos = _get(data, pos)
        base += delta_base
        end += delta_end
        out.append((error_code, message, base, stream_id, end))
    return out


def pack_request(route_epoch: int, source_node_id: int, timeout_ms: int, entries: list) -> bytes:
    """Version 3's `PackedEntries`: the route epoch, source node id and timeout as varints
    (~5 bytes instead of 16), then `pack_entries`."""
    out = bytearray()
    for value in (route_epoch, source_node_id, timeout_ms):
        _put(out, value)
    return bytes(out) + pack_entries(entries)


def unpack_request(data: bytes) -> tuple[int, int, int, list[RouteEntry]]:
    """`pack_request` undone: (route epoch, source node id, timeout ms, entries); raises
    ValueError on bad input."""
    route_epoch, pos = _get(data, 0)
    source_node_id, pos = _get(data, pos)
    timeout_ms, pos = _get(data, pos)
    if not 0 <= timeout_ms <= 0x7FFFFFFF or not 0 <= source_node_id <= 0x7FFFFFFF:
        raise ValueError(f"bad source {source_node_id} or timeout {timeout_ms} in a zone route")
    return route_epoch, source_node_id, timeout_ms, unpack_entries(data[pos:])
