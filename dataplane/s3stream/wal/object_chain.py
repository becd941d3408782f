"""Where an object WAL lives and the store-level steps on it: claim, list, read, trim.

Claiming (shared by `ObjectWAL.open` and `take_over`) writes the owner object, lists the
prefix, resolves the record chain and writes a seal naming the chain's end before anything
else (see ``object_wal``'s module docstring and docs/formats.md); reading fetches the chain's
data objects ahead; trimming stores the trim point, then deletes the objects wholly below it.
"""

from __future__ import annotations

import logging
import re
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from dataplane.objectstore import ObjectNotFoundError, ObjectStorage, ObjectStoreError, Priority
from dataplane.s3stream.wal.base import (
    RecoveredRecord,
    WALCorruptError,
    WALError,
    WALFencedError,
    WALTakeoverRefusedError,
)
from dataplane.s3stream.wal.object_format import (
    MAX_INCARNATION,
    OBJECT_RECORD_HEADER_BYTES,
    Chain,
    DataKey,
    Owner,
    SealKey,
    data_key,
    decode_object,
    parse_data_key,
    parse_seal_key,
    parse_trim_key,
    resolve_chain,
    seal_key,
    trim_key,
)

__all__ = [
    "MAX_LISTED_KEYS",
    "MAX_PREFIX_CHARS",
    "ClaimedWAL",
    "LiveObject",
    "ObjectWALLocation",
    "WALOwnerUnfinishedError",
    "check_trim_point",
    "claim",
    "list_wal_objects",
    "read_owner",
    "read_records",
    "trim_below",
]

log = logging.getLogger(__name__)

_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
MAX_PREFIX_CHARS = 512
MAX_LISTED_KEYS = 1_000_000  # a WAL holds at most capacity / batch objects; far below this
_I64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ObjectWALLocation:
    """Where a WAL lives: a configured bucket and a key prefix (no leading/trailing '/')."""

    bucket_id: int
    prefix: str

    def __post_init__(self) -> None:
        if len(self.prefix) > MAX_PREFIX_CHARS or not _PREFIX_RE.match(self.prefix):
            raise ValueError(
                f"invalid WAL prefix {self.prefix[:80]!r}: use path segments of letters, "
                "digits, '.', '-' and '_'"
            )
        if any(part in (".", "..") for part in self.prefix.split("/")):
            raise ValueError(f"invalid WAL prefix {self.prefix[:80]!r}: no '.' or '..' segments")


@dataclass(slots=True)
class LiveObject:
    """A data object holding untrimmed records; ``ends`` None until its records were read."""

    key: DataKey
    ends: array | None = None


@dataclass(slots=True)
class ClaimedWAL:
    """What a claim found: the new owner, the resolved chain and its live objects."""

    owner: Owner
    chain: Chain
    live: list[LiveObject] = field(default_factory=list)


class WALOwnerUnfinishedError(WALCorruptError):
    """The owner object is empty: a PUT of it that never completed (its writer died while
    sending it) and that the store kept as an empty object, as SeaweedFS does. Nothing can
    have been written under that ownership: `claim` reads the owner back before it lists
    or writes anything else."""


def read_owner(objects: ObjectStorage, where: ObjectWALLocation) -> Owner | None:
    """The WAL's owner object, None if no writer ever opened it.

    Raises:
        WALOwnerUnfinishedError: the owner object is empty (see there).
        WALCorruptError: it holds anything else that is not an owner.
    """
    try:
        data = objects.get_object(where.bucket_id, f"{where.prefix}/owner", Priority.PRODUCE)
    except ObjectNotFoundError:
        return None
    if not data:
        raise WALOwnerUnfinishedError(
            f"WAL s3 bucket {where.bucket_id} prefix {where.prefix!r}: empty owner object"
        )
    return Owner.decode(data)


def _owner_of_keys(objects: ObjectStorage, where: ObjectWALLocation, node_id: int) -> Owner | None:
    """Who owned the WAL as far as its data objects and seals tell (their greatest writer),
    for `node_id`, or None when it holds neither: the owner to claim after when the owner
    object is unfinished (`WALOwnerUnfinishedError`)."""
    datas, seals, _ = list_wal_objects(objects, where)
    writers = [d.writer for d in datas] + [s.writer for s, _ in seals]
    if not writers:
        return None
    last = max(writers)
    return Owner(node_id, last.epoch, last.incarnation)


def list_wal_objects(
    objects: ObjectStorage, where: ObjectWALLocation, start_after: str = ""
) -> tuple[list[DataKey], list[tuple[SealKey, str]], list[int]]:
    """The WAL's data objects, seals (with their keys) and trim points, as listed now;
    with `start_after` (a data key) only the keys after it: the data objects written since
    (keys sort by writer, then offset) and every seal, trim point and the owner (they sort
    after every data key)."""
    datas: list[DataKey] = []
    seals: list[tuple[SealKey, str]] = []
    trims: list[int] = []
    listed = objects.iter_keys(where.bucket_id, where.prefix + "/", start_after=start_after)
    for n, key in enumerate(listed):
        if n >= MAX_LISTED_KEYS:
            raise WALError(f"WAL prefix {where.prefix!r} holds over {MAX_LISTED_KEYS} objects")
        if (d := parse_data_key(where.prefix, key)) is not None:
            datas.append(d)
        elif (s := parse_seal_key(where.prefix, key)) is not None:
            seals.append((s, key))
        elif (t := parse_trim_key(where.prefix, key)) is not None:
            trims.append(t)
    return datas, seals, trims


def claim(
    objects: ObjectStorage, where: ObjectWALLocation, node_id: int, epoch: int, takeover: bool
) -> ClaimedWAL:
    """Make (node_id, epoch) the WAL's writer; see the module docstring."""
    if not 0 <= node_id <= _I64_MAX or not 0 <= epoch <= _I64_MAX:
        raise ValueError(f"node_id={node_id} and node_epoch={epoch} must be within 0..2^63-1")
    name = f"WAL s3 bucket {where.bucket_id} prefix {where.prefix!r}"
    unfinished = False
    try:
        current = read_owner(objects, where)
    except WALOwnerUnfinishedError:
        # its writer died while storing it: the writers of the objects stand for it, so the
        # new writer still comes after every one of them (and an empty WAL is claimed anew)
        unfinished = True
        current = _owner_of_keys(objects, where, node_id)
        log.warning(
            "%s: empty owner object (a PUT of it never completed); claiming after %s",
            name,
            "no writer" if current is None else f"writer {current.writer.tag}",
        )
    if current is None:
        if takeover and not unfinished:
            raise WALError(f"{name} does not exist")
        incarnation = 0
    elif (current.node_id, current.epoch) == (node_id, epoch):
        # the same node again: a recoverer retrying its failover, or the owner re-opening;
        # either way a new writer that fences the previous incarnation
        incarnation = current.incarnation + 1
    elif takeover:
        if epoch <= current.epoch:
            raise WALTakeoverRefusedError(
                f"{name} is owned by node {current.node_id} epoch {current.epoch}; "
                f"takeover needs an epoch > {current.epoch}, got {epoch}"
            )
        incarnation = 0
    elif epoch > current.epoch:
        incarnation = 0
    else:
        raise WALFencedError(
            f"{name} is owned by node {current.node_id} epoch {current.epoch}; "
            f"node {node_id} epoch {epoch} may not open it (a cluster created anew on a bucket "
            "an earlier cluster used meets that cluster's objects: give the new one its own "
            "key prefix, `automqctl cluster init/up --bucket-prefix NAME`)"
        )
    if incarnation > MAX_INCARNATION:
        raise WALError(f"{name} was re-opened {MAX_INCARNATION} times with epoch {epoch}")
    owner = Owner(node_id, epoch, incarnation)
    objects.put_object(where.bucket_id, f"{where.prefix}/owner", owner.encode())
    # listed only after our ownership is stored: see the module docstring
    datas, seals, trims = list_wal_objects(objects, where)
    chain = resolve_chain(datas, [s for s, _ in seals], trims)
    objects.put_object(where.bucket_id, seal_key(where.prefix, owner.writer, chain.end_offset), b"")
    if read_owner(objects, where) != owner:
        raise WALFencedError(f"{name} was claimed by another writer while node {node_id} opened it")
    # cleanup (best effort): objects no reader will use. Seals stay: each one bounds the
    # writer just before it, should that writer's late PUT (a zombie's hedged copy) land.
    garbage = [data_key(where.prefix, d.writer, d.start_offset, d.end_offset) for d in chain.stale]
    garbage += [
        data_key(where.prefix, d.writer, d.start_offset, d.end_offset) for d in chain.trimmed
    ]
    garbage += [trim_key(where.prefix, t) for t in trims if t < chain.trim_offset]
    if garbage:
        try:
            objects.delete_objects(where.bucket_id, garbage)
        except ObjectStoreError as exc:
            log.warning("%s: cleanup of %d objects failed: %s", name, len(garbage), exc)
    log.info(
        "%s claimed by node %d epoch %d (writer %d): %d objects in [%d, %d), %d stale",
        name,
        node_id,
        epoch,
        incarnation,
        len(chain.objects),
        chain.trim_offset,
        chain.end_offset,
        len(chain.stale),
    )
    return ClaimedWAL(owner, chain, [LiveObject(d) for d in chain.objects])


def read_records(
    objects: ObjectStorage,
    where: ObjectWALLocation,
    live: list[LiveObject],
    trim_offset: int,
    parallelism: int,
) -> Iterator[RecoveredRecord]:
    """Yield the records of ``live`` objects at or past ``trim_offset``, fetching ahead."""
    if not live:
        return
    pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="object-wal-read")
    try:
        keys = [
            data_key(where.prefix, o.key.writer, o.key.start_offset, o.key.end_offset) for o in live
        ]
        ahead: deque[Future] = deque()
        next_i = 0
        for item in live:
            while next_i < len(keys) and len(ahead) < parallelism:
                # the write path's own data (recovery, failover): produce priority
                ahead.append(
                    pool.submit(objects.get_object, where.bucket_id, keys[next_i], Priority.PRODUCE)
                )
                next_i += 1
            try:
                data = ahead.popleft().result()
            except ObjectNotFoundError:
                # deleted under us: fine only if a trim (by a fenced owner that had uploaded
                # it, racing with this recovery) covers it; otherwise acknowledged data is gone
                trims = [
                    t
                    for k in objects.iter_keys(where.bucket_id, where.prefix + "/trim/")
                    if (t := parse_trim_key(where.prefix, k)) is not None
                ]
                if max(trims, default=0) >= item.key.end_offset:
                    item.ends = array("q")
                    continue
                raise WALCorruptError(f"WAL object {item.key} is missing") from None
            try:
                records = list(decode_object(item.key, data))
            except WALCorruptError as exc:
                # a PUT cut short by the writer's death (SeaweedFS then lists the object
                # with what it got, even nothing): S3 stores a PUT whole before it answers,
                # and the writer acks an object only after its PUT answered and only in
                # order, so nothing from this object on was ever acknowledged
                log.warning(
                    "%s: the WAL ends before it (%d later objects, never acknowledged)",
                    exc,
                    len(live) - live.index(item) - 1,
                )
                return
            ends = array("q")
            for offset, body in records:
                size = OBJECT_RECORD_HEADER_BYTES + len(body)
                ends.append(offset + size)
                if offset >= trim_offset:
                    yield RecoveredRecord(offset, size, body)
            item.ends = ends
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def check_trim_point(live: list[LiveObject], up_to: int, end: int) -> None:
    """Raise ValueError unless `up_to` is the durable `end` or a record boundary."""
    if up_to > end:
        raise ValueError(f"cannot trim to {up_to}: beyond the durable end {end}")
    if up_to == end:
        return
    for item in live:
        if item.key.start_offset == up_to:
            return
        if item.key.start_offset < up_to < item.key.end_offset:
            ends = item.ends
            if ends is not None:
                i = bisect_left(ends, up_to)
                if i < len(ends) and ends[i] == up_to:
                    return
            break
    raise ValueError(f"cannot trim to {up_to}: not a record boundary")


def trim_below(
    objects: ObjectStorage, where: ObjectWALLocation, live: list[LiveObject], old: int, up_to: int
) -> list[LiveObject]:
    """Store the trim point, delete the objects wholly below it; returns the live rest."""
    objects.put_object(where.bucket_id, trim_key(where.prefix, up_to), b"")
    dead = [o for o in live if o.key.end_offset <= up_to]
    keys = [
        data_key(where.prefix, o.key.writer, o.key.start_offset, o.key.end_offset) for o in dead
    ]
    if old > 0:
        keys.append(trim_key(where.prefix, old))
    if keys:
        objects.delete_objects(where.bucket_id, keys)
    return [o for o in live if o.key.end_offset > up_to]
