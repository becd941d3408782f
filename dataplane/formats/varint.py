"""Varints: zigzag (Kafka's and protobuf's encoding of signed integers) and unsigned (Kafka's
compact lengths); the packed zone routes and snapshot answers of the zone router and the
Kafka codec use them. Pure."""

from __future__ import annotations


def put_zigzag(out: bytearray, value: int) -> None:
    """Append `value` (a signed 64-bit integer) to `out`: small negatives (-1) stay small."""
    _put_unsigned(out, (value << 1) ^ (value >> 63))


def _put_unsigned(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_bytes(value: int) -> bytes:
    """`value` (>= 0) as an unsigned varint (Kafka's UNSIGNED_VARINT: compact lengths)."""
    out = bytearray()
    _put_unsigned(out, value)
    return bytes(out)


def get_zigzag(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """The signed integer at `pos` of `data` and the position after it. ValueError naming
    `what` (e.g. "a packed zone route") for a truncated or overlong varint."""
    result, pos = _get_unsigned(data, pos, what, 63)
    return (result >> 1) ^ -(result & 1), pos


def _get_unsigned(data: bytes, pos: int, what: str, max_shift: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > max_shift:
            raise ValueError(f"truncated or overlong varint in {what}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def put_uvarint(out: bytearray, value: int) -> None:
    """Append `value` (0 to 2**63 - 1) as an unsigned varint (a byte up to 127): fields
    that are never negative take half the room of a zigzag varint. ValueError when
    negative or too large."""
    if not 0 <= value < 1 << 63:
        raise ValueError(f"{value} cannot be an unsigned varint")
    _put_unsigned(out, value)


def get_uvarint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """The unsigned integer at `pos` of `data` and the position after it. ValueError naming
    `what` for a truncated or overlong varint."""
    return _get_unsigned(data, pos, what, 56)
