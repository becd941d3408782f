"""Transaction control batches (Kafka's `EndTransactionMarker`), pure.

A marker is a v2 batch with the transactional and control attributes set, the producer id
and epoch of the transaction, and one record: key = (version int16 0, type int16: 0 ABORT,
1 COMMIT), value = (version int16 0, coordinator epoch int32). Clients skip control batches
when they hand records to the application; a read_committed consumer uses the ABORT marker
(with the fetch's aborted-transactions list) to drop the aborted records before it.

No I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from dataplane.formats.record_batch import RecordBatchHeader, build_batch, zigzag_varint

ABORT = 0
COMMIT = 1
TRANSACTIONAL_ATTRIBUTE = 0x10
CONTROL_ATTRIBUTE = 0x20


def build_marker(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int
) -> bytes:
    """One control batch (base offset 0: the partition assigns it) ending a transaction."""
    key = struct.pack(">hh", 0, COMMIT if commit else ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (
        b"\x00"  # record attributes
        + zigzag_varint(0)  # timestamp delta
        + zigzag_varint(0)  # offset delta
        + zigzag_varint(len(key))
        + key
        + zigzag_varint(len(value))
        + value
        + zigzag_varint(0)  # headers
    )
    record = zigzag_varint(len(body)) + body
    return build_batch(
        record,
        1,
        attributes=TRANSACTIONAL_ATTRIBUTE | CONTROL_ATTRIBUTE,
        base_timestamp=now_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
    )


@dataclass(frozen=True)
class Marker:
    producer_id: int
    producer_epoch: int
    commit: bool


def marker_of(batch: RecordBatchHeader) -> Marker | None:
    """The marker a stored control batch holds (None if it is not a txn marker)."""
    if not batch.is_control:
        return None
    payload = batch.data[61:]
    # one record: length, attributes, ts delta, offset delta, key length (all varints but
    # attributes); the key is 4 bytes: version, type
    try:
        pos = 0
        for _ in range(1):  # record length
            pos = _skipzigzag_varint(payload, pos)
        pos += 1  # attributes
        pos = _skipzigzag_varint(payload, pos)
        pos = _skipzigzag_varint(payload, pos)
        pos = _skipzigzag_varint(payload, pos)  # key length (4)
        _version, kind = struct.unpack_from(">hh", payload, pos)
    except (struct.error, IndexError):
        return None
    if kind not in (ABORT, COMMIT):
        return None
    return Marker(batch.producer_id, batch.producer_epoch, kind == COMMIT)


def _skipzigzag_varint(data: bytes, pos: int) -> int:
    for _ in range(10):
        if not data[pos] & 0x80:
            return pos + 1
        pos += 1
    raise IndexError("varint too long")
