"""The object WAL's layout in the object store (pure: names and bytes, no I/O).

Under a WAL prefix ``P`` (docs/formats.md, "Object WAL"):

* ``P/owner``: JSON ``{"node_id", "epoch", "incarnation"}``, the current writer;
* ``P/seal/<epoch:020d>.<incarnation:06d>-<end:020d>``: written by each writer (an owner
  opening the WAL or a recoverer taking it over) after it listed the objects and before it
  appends or reads: ``end`` is the end of the record chain it found. Objects of any older
  writer that end beyond ``end`` are not part of the WAL (they landed after the takeover
  and were never acknowledged);
* ``P/data/<epoch:020d>.<incarnation:06d>/<start:020d>-<end:020d>``: one group commit, the
  records with logical offsets ``[start, end)``;
* ``P/trim/<offset:020d>``: a trim point (the greatest one counts).

A writer is ``(epoch, incarnation)``: the node epoch, and a counter of re-opens with the
same epoch, so writers are totally ordered and every object names the writer that made it.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from dataplane.s3stream.wal.base import WALCorruptError

__all__ = [
    "DataKey",
    "OBJECT_HEADER_BYTES",
    "OBJECT_RECORD_HEADER_BYTES",
    "Owner",
    "SealKey",
    "Writer",
    "data_key",
    "decode_object",
    "encode_object",
    "parse_data_key",
    "parse_seal_key",
    "parse_trim_key",
    "seal_key",
    "trim_key",
]

_MAGIC = b"AMQWAL01"
# magic, node id, epoch, incarnation, start offset, end offset, record count, header crc32c
_HEADER = struct.Struct(">8sQQIQQII")
OBJECT_HEADER_BYTES = _HEADER.size
_RECORD_HEADER = struct.Struct(">II")  # body length, body crc32c
OBJECT_RECORD_HEADER_BYTES = _RECORD_HEADER.size
_N = r"(\d{20})"
_DATA_RE = re.compile(r"data/(\d{20})\.(\d{6})/" + _N + "-" + _N + "$")
_SEAL_RE = re.compile(r"seal/(\d{20})\.(\d{6})-" + _N + "$")
_TRIM_RE = re.compile(r"trim/" + _N + "$")
MAX_INCARNATION = 999_999


@dataclass(frozen=True, slots=True, order=True)
class Writer:
    """One writer of a WAL: ordered by (epoch, incarnation)."""

    epoch: int
    incarnation: int

    @property
    def tag(self) -> str:
        return f"{self.epoch:020d}.{self.incarnation:06d}"


@dataclass(frozen=True, slots=True)
class Owner:
    """The contents of ``P/owner``."""

    node_id: int
    epoch: int
    incarnation: int

    @property
    def writer(self) -> Writer:
        return Writer(self.epoch, self.incarnation)

    def encode(self) -> bytes:
        return json.dumps(
            {"node_id": self.node_id, "epoch": self.epoch, "incarnation": self.incarnation}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Owner:
        try:
            raw = json.loads(data)
            return cls(int(raw["node_id"]), int(raw["epoch"]), int(raw["incarnation"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise WALCorruptError(f"unreadable WAL owner object: {exc}") from None


@dataclass(frozen=True, slots=True)
class DataKey:
    """A data object's name: who wrote it and which offsets it holds."""

    writer: Writer
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class SealKey:
    """A seal: ``writer`` found the record chain ending at ``end_offset``."""

    writer: Writer
    end_offset: int


def data_key(prefix: str, writer: Writer, start: int, end: int) -> str:
    return f"{prefix}/data/{writer.tag}/{start:020d}-{end:020d}"


def seal_key(prefix: str, writer: Writer, end: int) -> str:
    return f"{prefix}/seal/{writer.tag}-{end:020d}"


def trim_key(prefix: str, offset: int) -> str:
    return f"{prefix}/trim/{offset:020d}"


def _rest(prefix: str, key: str) -> str | None:
    head = prefix + "/"
    return key[len(head) :] if key.startswith(head) else None


def parse_data_key(prefix: str, key: str) -> DataKey | None:
    """The DataKey named by ``key``, or None when it is not a data object of ``prefix``."""
    rest = _rest(prefix, key)
    m = _DATA_RE.match(rest) if rest is not None else None
    if m is None:
        return None
    return DataKey(Writer(int(m[1]), int(m[2])), int(m[3]), int(m[4]))


def parse_seal_key(prefix: str, key: str) -> SealKey | None:
    rest = _rest(prefix, key)
    m = _SEAL_RE.match(rest) if rest is not None else None
    if m is None:
        return None
    return SealKey(Writer(int(m[1]), int(m[2])), int(m[3]))


def parse_trim_key(prefix: str, key: str) -> int | None:
    rest = _rest(prefix, key)
    m = _TRIM_RE.match(rest) if rest is not None else None
    return int(m[1]) if m is not None else None


def encode_object(node_id: int, writer: Writer, start: int, bodies: list[bytes]) -> bytes:
    """One data object: header, then each record as (length, crc32c, body).

    A record's logical size is its header plus body, so the records of an object starting at
    ``start`` take the offsets ``start, start + 8 + len(body0), ...``.
    """
    parts: list[bytes] = []
    offset = start
    for body in bodies:
        parts.append(_RECORD_HEADER.pack(len(body), _crc32c.crc32c(body)))
        parts.append(body)
        offset += OBJECT_RECORD_HEADER_BYTES + len(body)
    head = _HEADER.pack(
        _MAGIC, node_id, writer.epoch, writer.incarnation, start, offset, len(bodies), 0
    )
    crc = _crc32c.crc32c(head[:-4])
    return head[:-4] + struct.pack(">I", crc) + b"".join(parts)


def decode_object(key: DataKey, data: bytes) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, body) of the object's records; WALCorruptError on any mismatch."""
    if len(data) < OBJECT_HEADER_BYTES:
        raise WALCorruptError(f"WAL object {key} is truncated ({len(data)} B)")
    magic, _node, epoch, inc, start, end, count, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC or crc != _crc32c.crc32c(data[: OBJECT_HEADER_BYTES - 4]):
        raise WALCorruptError(f"WAL object {key} has a bad header")
    if (Writer(epoch, inc), start, end) != (key.writer, key.start_offset, key.end_offset):
        raise WALCorruptError(f"WAL object {key} does not match its name")
    view = memoryview(data)
    pos = OBJECT_HEADER_BYTES
    offset = start
    for _ in range(count):
        if pos + OBJECT_RECORD_HEADER_BYTES > len(data):
            raise WALCorruptError(f"WAL object {key} is truncated at record {offset}")
        length, body_crc = _RECORD_HEADER.unpack_from(data, pos)
        pos += OBJECT_RECORD_HEADER_BYTES
        body = bytes(view[pos : pos + length])
        if len(body) != length or _crc32c.crc32c(body) != body_crc:
            raise WALCorruptError(f"WAL object {key}: record at {offset} does not validate")
        pos += length
        yield offset, body
        offset += OBJECT_RECORD_HEADER_BYTES + length
    if offset != end or pos != len(data):
        raise WALCorruptError(f"WAL object {key}: records end at {offset}, expected {end}")


def record_ends(start: int, bodies: list[bytes]) -> array:
    """The offsets just past each record of an object (the object's trim points)."""
    ends = array("q")
    offset = start
    for body in bodies:
        offset += OBJECT_RECORD_HEADER_BYTES + len(body)
        ends.append(offset)
    return ends


@dataclass(frozen=True, slots=True)
class Chain:
    """What a listing of a WAL prefix holds (see :func:`resolve_chain`).

    Attributes:
        trim_offset: the greatest trim point.
        objects: the data objects of the record chain, in offset order (the first one may
            start below ``trim_offset``: a trim point need not be an object boundary).
        end_offset: just past the chain's last record (``trim_offset`` when empty).
        stale: data objects that are not part of the WAL (an older writer's, beyond the
            end its successor sealed; or past a gap of a writer that failed).
        trimmed: data objects wholly below the trim point.
    """

    trim_offset: int
    objects: list[DataKey]
    end_offset: int
    stale: list[DataKey]
    trimmed: list[DataKey]


def resolve_chain(datas: list[DataKey], seals: list[SealKey], trims: list[int]) -> Chain:
    """The record chain of a WAL from its listing (the fencing rule of docs/formats.md).

    1. An object of writer W is valid only if, for the first seal by a writer newer than W,
       the object ends at or below that seal's end (the successor sealed where W's
       acknowledged records could end; anything W wrote beyond landed after the takeover).
    2. From the greatest trim point on, valid objects must follow each other without a gap;
       the chain stops at the first gap (the in-flight tail of a writer that failed).
    3. The chain must reach the newest seal's end: every record before it was acknowledged
       or recovered, so a chain that stops short lost data (WALCorruptError).
    """
    trim = max(trims, default=0)
    ordered_seals = sorted(seals, key=lambda s: s.writer)
    valid: list[DataKey] = []
    stale: list[DataKey] = []
    for d in datas:
        bound = next((s.end_offset for s in ordered_seals if s.writer > d.writer), None)
        (stale if bound is not None and d.end_offset > bound else valid).append(d)
    # at one start offset the newest writer wins: it began there after sealing, so an older
    # writer's object starting there can only be one that landed late
    valid.sort(key=lambda d: (d.start_offset, -d.writer.epoch, -d.writer.incarnation))
    chain: list[DataKey] = []
    trimmed: list[DataKey] = []
    pos = trim
    for d in valid:
        if d.end_offset <= trim:
            trimmed.append(d)
            continue
        if d.end_offset <= pos or d.start_offset > pos or (d.start_offset < pos and chain):
            stale.append(d)  # overlaps the chain, or lies past its first gap
            continue
        chain.append(d)
        pos = d.end_offset
    newest_seal_end = ordered_seals[-1].end_offset if ordered_seals else 0
    if pos < newest_seal_end:
        raise WALCorruptError(
            f"the WAL's records end at {pos}, but a writer sealed it at {newest_seal_end}: "
            "acknowledged data objects are missing"
        )
    return Chain(trim, chain, pos, stale, trimmed)
