"""StreamRecordBatch: the unit of data the S3Stream engine stores.

A ``StreamRecordBatch`` is one append to one stream: a range of stream offsets
``[base_offset, base_offset + record_count)`` and an opaque payload (for Kafka
partitions: one Kafka record batch). It is what the WAL carries (as a record
body), what the LogCache holds, and what data blocks of objects contain.

Wire encoding (big-endian, 33-byte header + payload)::

    magic        u8   0x22
    stream_id    i64
    epoch        i64
    base_offset  i64
    count        i32  negative = Link Record (|count| offsets covered)
    payload_len  i32
    payload      payload_len bytes

A negative ``count`` marks a *Link Record* (zone router, seed 000): the payload
is a pointer to data held elsewhere, and ``|count|`` is the number of stream
offsets it covers. ``record_count`` is always ``|count|`` so offset arithmetic
is the same for both kinds.

A batch decoded out of a buffer that never changes (``bytes``, or a read-only view of a GET's
body) with ``share_payload=True`` (the data
blocks of objects read back from the object store) keeps its payload as a read-only
``memoryview`` of that buffer instead of a copy: a catch-up read then hands the very bytes of
the GET to the Fetch response. Such a view keeps the whole buffer alive while it lives
(`owned` makes a batch that does not).

This module does no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c as _crc32c

from .crc32c_combine import crc32c_combine

__all__ = [
    "MAGIC",
    "HEADER_SIZE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "CorruptRecordError",
    "StreamRecordBatch",
    "decode_all",
]

MAGIC = 0x22
"""First byte of every encoded StreamRecordBatch."""

_HEADER = struct.Struct(">BqqqiI")
HEADER_SIZE_BYTES = _HEADER.size  # 33
"""Size of the fixed header that precedes the payload."""

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
"""Largest payload accepted when encoding or decoding (64 MiB)."""

_I64_MAX = 2**63 - 1
_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


class CorruptRecordError(ValueError):
    """Encoded bytes are not a valid StreamRecordBatch (wrong magic, bad lengths, truncated)."""


@dataclass(frozen=True, slots=True)
class StreamRecordBatch:
    """One append to one stream.

    Attributes:
        stream_id: the stream (>= 0).
        epoch: the stream epoch of the writer (>= 0).
        base_offset: first stream offset covered (>= 0).
        count: number of offsets covered; negative marks a Link Record. Never 0.
        payload: opaque bytes (at most ``MAX_PAYLOAD_BYTES``); a read-only memoryview of
            an immutable ``bytes`` buffer when decoded with ``share_payload=True``. A
            memoryview or bytearray given to the constructor is copied into ``bytes``.
        payload_crc32c: the CRC32C of ``payload`` when its writer knows it without reading
            it (a produced batch's, from its checked Kafka CRC); None: unknown. The WAL
            record and the object block that carry the batch take their checksums from it
            (`encoded_crc32c`) instead of reading the payload again. Not compared. A batch
            made from this one with another payload must not carry it.
    """

    stream_id: int
    epoch: int
    base_offset: int
    count: int
    payload: bytes | memoryview
    payload_crc32c: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # one produced batch's cost: the common valid case in one expression, the named
        # problem from `_validate_fields` only when it fails
        stream_id, epoch, base, count = self.stream_id, self.epoch, self.base_offset, self.count
        if not (
            type(stream_id) is int
            and type(epoch) is int
            and type(base) is int
            and type(count) is int
            and 0 <= stream_id <= _I64_MAX
            and 0 <= epoch <= _I64_MAX
            and 0 < count <= _I32_MAX
            and 0 <= base <= _I64_MAX - count
        ):
            problem = _validate_fields(stream_id, epoch, base, count)
            if problem is not None:
                raise ValueError(problem)
        if not isinstance(self.payload, bytes):
            if isinstance(self.payload, (bytearray, memoryview)):
                object.__setattr__(self, "payload", bytes(self.payload))
            else:
                raise TypeError(f"payload must be bytes, got {type(self.payload).__name__}")
        if len(self.payload) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"payload of {len(self.payload)} B exceeds {MAX_PAYLOAD_BYTES} B")

    # ----------------------------------------------------------------- derived values
    @property
    def is_link(self) -> bool:
        """True for a Link Record (negative count)."""
        return self.count < 0

    @property
    def record_count(self) -> int:
        """Number of stream offsets covered (``|count|``)."""
        return -self.count if self.count < 0 else self.count

    @property
    def last_offset(self) -> int:
        """Exclusive end offset: ``base_offset + record_count`` (the next batch's base)."""
        return self.base_offset + self.record_count

    @property
    def size_bytes(self) -> int:
        """Encoded size in bytes (header + payload)."""
        return HEADER_SIZE_BYTES + len(self.payload)

    # ----------------------------------------------------------------- codec
    def encode(self) -> bytes:
        """Encode to the wire format described in the module docstring."""
        return self.encode_header() + self.payload

    def encode_parts(self) -> tuple[bytes, bytes | memoryview]:
        """The encoding as (header, payload), not joined: what `encode` returns, for a
        writer that takes pieces (a WAL append)."""
        return self.encode_header(), self.payload

    def encode_header(self) -> bytes:
        """The 33-byte header of the encoding (the payload follows it)."""
        return _HEADER.pack(
            MAGIC, self.stream_id, self.epoch, self.base_offset, self.count, len(self.payload)
        )

    def encoded_crc32c(self, header: bytes) -> int | None:
        """The CRC32C of `encode()` from `payload_crc32c` (None when that is unknown), given
        the batch's `header` (`encode_header`, as `encode_parts` returns it)."""
        if self.payload_crc32c is None:
            return None
        return crc32c_combine(_crc32c.crc32c(header), self.payload_crc32c, len(self.payload))

    def owned(self) -> StreamRecordBatch:
        """This batch with a payload of its own (``bytes``): a shared payload is copied, so
        the batch no longer keeps the buffer it was decoded from alive."""
        if type(self.payload) is bytes:
            return self
        return StreamRecordBatch(
            self.stream_id,
            self.epoch,
            self.base_offset,
            self.count,
            self.payload,
            self.payload_crc32c,
        )

    @classmethod
    def decode(
        cls, buf: bytes | bytearray | memoryview, offset: int = 0, share_payload: bool = False
    ) -> tuple[StreamRecordBatch, int]:
        """Decode one batch starting at ``offset``.

        With ``share_payload`` the payload is a view of ``buf`` rather than a copy: only for
        a ``buf`` whose bytes never change (``bytes``, or a read-only view of a buffer nobody
        changes), since the
        batch may outlive the caller's use of it.

        Returns:
            ``(batch, next_offset)`` where ``next_offset`` is the index just past it.

        Raises:
            CorruptRecordError: wrong magic, invalid field, bad payload length, truncation.
        """
        view = memoryview(buf)
        if offset < 0:
            raise CorruptRecordError(f"negative offset {offset}")
        end_of_header = offset + HEADER_SIZE_BYTES
        if end_of_header > len(view):
            raise CorruptRecordError(
                f"truncated record header at {offset}: need {HEADER_SIZE_BYTES} B, "
                f"have {max(0, len(view) - offset)} B"
            )
        magic, stream_id, epoch, base_offset, count, payload_len = _HEADER.unpack_from(view, offset)
        if magic != MAGIC:
            raise CorruptRecordError(
                f"wrong magic 0x{magic:02x} at {offset} (expected 0x{MAGIC:02x})"
            )
        if payload_len > MAX_PAYLOAD_BYTES:
            # payload_len is read unsigned; a negative i32 shows up as >= 2**31 here.
            raise CorruptRecordError(
                f"invalid payload length {_as_i32(payload_len)} at {offset} "
                f"(must be 0..{MAX_PAYLOAD_BYTES})"
            )
        # The fields are ints from the struct: only their ranges need checking (the same
        # rules as _validate_fields, which words the error).
        if (
            stream_id < 0
            or epoch < 0
            or base_offset < 0
            or count == 0
            or count == _I32_MIN
            or base_offset + (count if count > 0 else -count) > _I64_MAX
        ):
            problem = _validate_fields(stream_id, epoch, base_offset, count)
            raise CorruptRecordError(f"invalid record at {offset}: {problem}")
        end = end_of_header + payload_len
        if end > len(view):
            raise CorruptRecordError(
                f"truncated payload at {offset}: need {payload_len} B, "
                f"have {len(view) - end_of_header} B"
            )
        # checked above: build it without __post_init__ validating the same fields again
        batch = _new_batch(cls)
        _set_stream_id(batch, stream_id)
        _set_epoch(batch, epoch)
        _set_base_offset(batch, base_offset)
        _set_count(batch, count)
        payload = view[end_of_header:end]
        _set_payload(batch, payload if share_payload else bytes(payload))
        _set_payload_crc32c(batch, None)
        return batch, end


_new_batch = object.__new__
# the slots' own setters (a frozen dataclass's __setattr__ refuses assignment)
_set_stream_id = StreamRecordBatch.__dict__["stream_id"].__set__
_set_epoch = StreamRecordBatch.__dict__["epoch"].__set__
_set_base_offset = StreamRecordBatch.__dict__["base_offset"].__set__
_set_count = StreamRecordBatch.__dict__["count"].__set__
_set_payload = StreamRecordBatch.__dict__["payload"].__set__
_set_payload_crc32c = StreamRecordBatch.__dict__["payload_crc32c"].__set__


def decode_all(
    buf: bytes | bytearray | memoryview, max_records: int = 1_000_000
) -> list[StreamRecordBatch]:
    """Decode a concatenation of batches that must fill ``buf`` exactly.

    Raises:
        CorruptRecordError: on any invalid batch, trailing garbage, or more than
            ``max_records`` batches.
    """
    out: list[StreamRecordBatch] = []
    pos = 0
    size = len(buf)
    while pos < size:
        if len(out) >= max_records:
            raise CorruptRecordError(f"more than {max_records} records in buffer")
        batch, pos = StreamRecordBatch.decode(buf, pos)
        out.append(batch)
    return out


def _as_i32(value: int) -> int:
    return value - 2**32 if value > _I32_MAX else value


def _validate_fields(stream_id: int, epoch: int, base_offset: int, count: int) -> str | None:
    """Return a description of the first invalid field, or None."""
    for name, value in (("stream_id", stream_id), ("epoch", epoch), ("base_offset", base_offset)):
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} must be int"
        if not 0 <= value <= _I64_MAX:
            return f"{name}={value} out of range 0..2^63-1"
    if not isinstance(count, int) or isinstance(count, bool):
        return "count must be int"
    if count == 0 or not _I32_MIN < count <= _I32_MAX:
        return f"count={count} must be non-zero and within (-2^31, 2^31)"
    if base_offset + abs(count) > _I64_MAX:
        return f"base_offset={base_offset} + |count|={abs(count)} overflows i64"
    return None
