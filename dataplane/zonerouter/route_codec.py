"""Compact zone routes (issue #32, `ZoneRouteRequest` versions 2 to 4): a batch's entries and
their answers packed as zigzag varints instead of fixed-width fields.

A route entry is ~28 bytes in version 1 (a 16-byte topic id, a 4-byte partition, an
8-byte channel offset) and its answer ~22; packed, a batch names each topic once and each
entry is its topic's index, its partition and its channel offset as a delta from the
previous entry's (~3-7 bytes); an answer is its error code, base offset, stream id and
end offset as varints (the base and end offsets as deltas of the previous answer's) plus
the message of an error. All functions are pure.

Version 4 keeps a route session per proxy and main (`ProxyRouteSession`, `RouteSessions`)
as GetPartitionSnapshot v4 does for polls: each topic id is sent once per session, then
named by its index; the route epoch, timeout and first channel offset go as deltas of the
previous request's; a session out of step (the main restarted) is refused before any
append and the proxy starts a new one. A one-route request shrinks from ~29 packed bytes
to ~9, its answer by the end offset's ~3.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from dataplane.formats.varint import get_uvarint, get_zigzag, put_uvarint, put_zigzag

MAX_PACKED_ENTRIES = 1024  # entries one packed batch may hold
MAX_PACKED_TOPICS = 1024
MAX_MESSAGE_BYTES = 4096  # an error message in a packed answer
MAX_SESSION_ID = 8191  # version 4 session ids are 1..this (two varint bytes at most)
PROXY_SESSION_IDS = 63  # a proxy takes ids 1..this (one varint byte)
# version 5: a route session remembers the next offset and stream of this many partitions
MAX_SESSION_PARTITIONS = 4096

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
    return _unpack_routes(data, pos, topics, 0)


def _unpack_routes(
    data: bytes, pos: int, topics: list[uuid.UUID], previous: int
) -> list[RouteEntry]:
    """The packed entries from `pos` to the end: each its topic's index in `topics`, its
    partition and its channel offset as a delta from the previous entry's (the first from
    `previous`). Raises ValueError on bad input."""
    out: list[RouteEntry] = []
    count = len(topics)
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


def pack_answers(answers: list[RouteAnswer], end_from_base: bool = False) -> bytes:
    """The answers of one batch, in its entries' order: error code (and, when not 0, the
    message's length + 1, 0 for none, then its UTF-8 bytes), base offset's delta, stream
    id, end offset's delta (version 4, `end_from_base`: from the answer's own base offset,
    a byte for a batch of a few records; else from the previous answer's end)."""
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
        _put(out, end_offset - (base_offset if end_from_base else end))
        base, end = base_offset, end_offset
    return bytes(out)


def unpack_answers(data: bytes, end_from_base: bool = False) -> list[RouteAnswer]:
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
        end = (base if end_from_base else end) + delta_end
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


# ------------------------------------------------------------ version 4: route sessions


class RouteSessionMismatch(ValueError):
    """A version 4 request whose session the main does not have as the proxy thinks (the
    main restarted or dropped it): refused before anything is appended; the proxy starts
    a new session and sends the batch again."""


@dataclass
class RouteSessionState:
    """What both sides of a route session remember after each request: the topics named
    so far (by index), the last entry's channel offset, the route epoch and timeout;
    version 5: per (topic, partition) the end offset and stream of its last answer
    (shared by the session's successive states, changed by each answer)."""

    topics: list[uuid.UUID] = field(default_factory=list)
    last_offset: int = 0
    epoch: int = 0
    timeout_ms: int = 0
    partitions: dict[tuple[uuid.UUID, int], tuple[int, int]] = field(default_factory=dict)


# a process's route sessions get distinct ids (from a random start: a restarted proxy's
# first request starts its session over anyway); `next` on a count is atomic
_SESSION_IDS = itertools.count(uuid.uuid4().int % PROXY_SESSION_IDS)


class ProxyRouteSession:
    """The proxy's side of a version 4 route session to one main: each topic id is sent
    once per session, then named by index; the first entry's channel offset, the route
    epoch and the timeout are sent as deltas of the previous request's. `pack` prepares
    a request; `confirm` (its answer came without a whole-request error) makes it the
    session's state; `reset` (no answer, or refused) starts a new session, whose first
    request carries everything. Used by one thread (the route batcher's)."""

    def __init__(self) -> None:
        self.session_id = 0
        self.state = RouteSessionState()
        self._pending: RouteSessionState | None = None
        self.reset()

    def reset(self) -> None:
        self.session_id = next(_SESSION_IDS) % PROXY_SESSION_IDS + 1
        self.state = RouteSessionState()
        self._pending = None

    def pack(
        self, route_epoch: int, source_node_id: int, timeout_ms: int, entries: list[RouteEntry]
    ) -> bytes:
        """Version 4's `PackedEntries`: source node, session id, the session's topic
        count (0: a new session), a byte of flags saying which of the epoch's and the
        timeout's deltas and the new topic count follow (those not 0), the new topics,
        then per entry its topic's index, partition and channel offset's delta."""
        state = self.state
        topics = {topic_id: i for i, topic_id in enumerate(state.topics)}
        new: list[uuid.UUID] = []
        for topic_id, _, _ in entries:
            if topic_id not in topics:
                topics[topic_id] = len(topics)
                new.append(topic_id)
        out = bytearray()
        for value in (source_node_id, self.session_id, len(state.topics)):
            _put(out, value)
        # which of the epoch's and timeout's deltas and the new topic count follow (a
        # steady session's request: none, one byte)
        changes = (route_epoch - state.epoch, timeout_ms - state.timeout_ms, len(new))
        out.append(sum(1 << bit for bit, value in enumerate(changes) if value))
        for value in changes:
            if value:
                _put(out, value)
        for topic_id in new:
            out += topic_id.bytes
        previous = state.last_offset
        for topic_id, partition, channel_offset in entries:
            _put(out, topics[topic_id])
            _put(out, partition)
            _put(out, channel_offset - previous)
            previous = channel_offset
        self._pending = RouteSessionState(
            state.topics + new, previous, route_epoch, timeout_ms, state.partitions
        )
        return bytes(out)

    def confirm(self) -> None:
        if self._pending is not None:
            self.state, self._pending = self._pending, None


class RouteSessions:
    """The main's side of version 4 route sessions: per (source node, session id) the
    state the proxy's next request is packed against; at most `max_sessions` (the least
    recently used dropped: its proxy's next request is refused and it starts over).
    Thread-safe; no I/O."""

    def __init__(self, max_sessions: int = 1024):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[tuple[int, int], RouteSessionState] = OrderedDict()

    def unpack(self, data: bytes) -> tuple[int, int, int, list[RouteEntry]]:
        """A version 4 `PackedEntries` undone against its session, which it advances:
        (route epoch, source node id, timeout ms, entries). Raises RouteSessionMismatch
        when the session is not as the proxy thinks, ValueError on bad input (the
        session unchanged either way)."""
        state, source, entries = self.unpack_session(data)
        return state.epoch, source, state.timeout_ms, entries

    def unpack_session(self, data: bytes) -> tuple[RouteSessionState, int, list[RouteEntry]]:
        """As `unpack`: the session's new state (version 5's answers are packed against
        its `partitions`), the source node id and the entries."""
        source, pos = _get(data, 0)
        session_id, pos = _get(data, pos)
        size, pos = _get(data, pos)
        if not 0 <= source <= 0x7FFFFFFF or not 0 < session_id <= MAX_SESSION_ID:
            raise ValueError(f"bad source {source} or session {session_id} in a zone route")
        key = (source, session_id)
        with self._lock:
            state = RouteSessionState() if size == 0 else self._sessions.get(key)
            if state is None or len(state.topics) != size:
                known = "none" if state is None else len(state.topics)
                raise RouteSessionMismatch(
                    f"route session {session_id} of node {source}: the proxy has {size} "
                    f"topics, this main {known}"
                )
            new_state, entries = _unpack_session_entries(data, pos, state)
            self._sessions[key] = new_state
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return new_state, source, entries


def _unpack_session_entries(
    data: bytes, pos: int, state: RouteSessionState
) -> tuple[RouteSessionState, list[RouteEntry]]:
    """The rest of a version 4 request from `pos`, against `state`: the session's next
    state and the entries (raises ValueError on bad input)."""
    if pos >= len(data) or data[pos] > 7:
        raise ValueError("bad or missing change flags in a zone route")
    flags, pos = data[pos], pos + 1
    changes = [0, 0, 0]
    for bit in range(3):
        if flags & (1 << bit):
            changes[bit], pos = _get(data, pos)
    delta_epoch, delta_timeout, new = changes
    timeout_ms = state.timeout_ms + delta_timeout
    if not 0 <= timeout_ms <= 0x7FFFFFFF:
        raise ValueError(f"bad timeout {timeout_ms} in a zone route")
    count = len(state.topics) + new
    if new < 0 or count > MAX_PACKED_TOPICS or pos + 16 * new > len(data):
        raise ValueError(f"bad new topic count {new} in a zone route")
    topics = state.topics + [
        uuid.UUID(bytes=data[pos + 16 * i : pos + 16 * (i + 1)]) for i in range(new)
    ]
    pos += 16 * new
    out = _unpack_routes(data, pos, topics, state.last_offset)
    last_offset = out[-1][2] if out else state.last_offset
    epoch = state.epoch + delta_epoch
    return RouteSessionState(topics, last_offset, epoch, timeout_ms, state.partitions), out


# ------------------------------------------------------------ version 5: answers in sessions

# what a version 5 answer's first byte says follows (its high 4 bits: the end offset's
# distance from the base offset, 1 to 15, when it is not sent)
_ANSWER_ERROR, _ANSWER_BASE, _ANSWER_STREAM, _ANSWER_END = 1, 2, 4, 8


def _put_message(out: bytearray, message: str | None) -> None:
    raw = None if message is None else message.encode()[:MAX_MESSAGE_BYTES]
    put_uvarint(out, 0 if raw is None else len(raw) + 1)
    out += raw or b""


def _get_message(data: bytes, pos: int) -> tuple[str | None, int]:
    size, pos = get_uvarint(data, pos, "a packed zone route answer")
    if size > MAX_MESSAGE_BYTES + 1 or pos + max(size - 1, 0) > len(data):
        raise ValueError(f"bad message size {size} in a packed zone route answer")
    if not size:
        return None, pos
    return data[pos : pos + size - 1].decode(errors="replace"), pos + size - 1


def pack_refusal_v5(error_code: int, message: str | None) -> bytes:
    """A version 5 answer refusing the whole request: its error code and message (the
    fields versions 0-4 send on their own, packed)."""
    out = bytearray()
    put_zigzag(out, error_code)
    _put_message(out, message)
    return bytes(out)


def pack_answers_v5(
    answers: list[RouteAnswer], entries: list[RouteEntry], state: RouteSessionState
) -> bytes:
    """Version 5's `PackedAnswers`: 0 (the request's error code), then per entry a byte
    of flags saying which of its error code and message, base offset (a delta from the
    end of the partition's last answer in the session), stream id (when not that
    answer's) and end offset (a delta from the base, else in the byte's high 4 bits)
    follow. A steady partition's answer is one byte instead of ~5. `state.partitions`
    learns each answer without an error (the proxy's mirror does the same)."""
    out = bytearray(b"\0")
    for (error_code, message, base, stream_id, end), (topic_id, partition, _) in zip(
        answers, entries, strict=True
    ):
        key = (topic_id, partition)
        if error_code:
            out.append(_ANSWER_ERROR | _ANSWER_BASE | _ANSWER_STREAM | _ANSWER_END)
            put_zigzag(out, error_code)
            _put_message(out, message)
            for value in (base, stream_id, end - base):
                put_zigzag(out, value)
            continue
        expected_base, expected_stream = state.partitions.get(key, (0, -1))
        span = end - base
        flags = (
            (_ANSWER_BASE if base != expected_base else 0)
            | (_ANSWER_STREAM if stream_id != expected_stream else 0)
            | (_ANSWER_END if not 0 < span < 16 else span << 4)
        )
        out.append(flags)
        if flags & _ANSWER_BASE:
            put_zigzag(out, base - expected_base)
        if flags & _ANSWER_STREAM:
            put_zigzag(out, stream_id)
        if flags & _ANSWER_END:
            put_zigzag(out, span)
        _learn(state, key, end, stream_id)
    return bytes(out)


def _learn(state: RouteSessionState, key: tuple[uuid.UUID, int], end: int, stream: int) -> None:
    """An answer without an error: the partition's next append is expected at `end` (when
    links were written) in `stream` (at most MAX_SESSION_PARTITIONS partitions remembered:
    both sides refuse the same new ones)."""
    if end >= 0 and (key in state.partitions or len(state.partitions) < MAX_SESSION_PARTITIONS):
        state.partitions[key] = (end, stream)


def unpack_answers_v5(
    data: bytes, entries: list[RouteEntry], state: RouteSessionState
) -> tuple[int, str | None, list[RouteAnswer]]:
    """A version 5 `PackedAnswers` undone: (the request's error code, its message, the
    answers: none when refused), `state.partitions` changed as the main's was. Raises
    ValueError on bad input (the proxy then starts a new session)."""
    error_code, pos = get_zigzag(data, 0, "a packed zone route answer")
    if error_code:
        message, pos = _get_message(data, pos)
        return error_code, message, []
    out: list[RouteAnswer] = []
    for topic_id, partition, _ in entries:
        if pos >= len(data):
            raise ValueError(f"{len(out)} zone route answers for {len(entries)} routes")
        flags, pos = data[pos], pos + 1
        key = (topic_id, partition)
        if flags & _ANSWER_ERROR:
            if flags != 15:
                raise ValueError(f"bad answer flags {flags} in a packed zone route answer")
            code, pos = _get(data, pos)
            message, pos = _get_message(data, pos)
            base, pos = _get(data, pos)
            stream_id, pos = _get(data, pos)
            span, pos = _get(data, pos)
            out.append((code, message, base, stream_id, base + span))
            continue
        expected_base, stream_id = state.partitions.get(key, (0, -1))
        delta = 0
        if flags & _ANSWER_BASE:
            delta, pos = _get(data, pos)
        if flags & _ANSWER_STREAM:
            stream_id, pos = _get(data, pos)
        span = flags >> 4
        if flags & _ANSWER_END:
            if span:
                raise ValueError(f"bad answer flags {flags} in a packed zone route answer")
            span, pos = _get(data, pos)
        base = expected_base + delta
        out.append((0, None, base, stream_id, base + span))
        _learn(state, key, base + span, stream_id)
    if pos != len(data):
        raise ValueError("trailing bytes in packed zone route answers")
    return 0, None, out
