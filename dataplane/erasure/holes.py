"""The rules of holes (pure, no I/O): write-once acceptance, a writer's outcome, a reader's
decision.

Each offset of an erasure-coded stream has k + m holes, hole i on shard store i. A store
accepts a hole exactly once. A write wins an offset when k holes hold its shards; since
2k > k + m whenever k > m, two writes can never both win. Writes that split the holes so that
none can reach k (e.g. 3/3 with k=4, m=2) leave the offset void.

Why readers fill holes (Corfu's argument): a reader that passed an offset holding fewer than
k matching shards while some holes were still empty could be contradicted later, when a
delayed shard lands in an empty hole and completes k. So before deciding an offset below the
visible end, a reader fills every empty hole it can reach with a junk marker (write-once).
After that only unreachable holes are open; if they cannot complete any write the offset is
final (decided or void) for every reader, forever; otherwise the reader stops there and
retries later (it never skips).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dataplane.erasure.shard_format import Shard, ShardFormatError, decode_shard, is_junk


class AcceptResult(enum.Enum):
    ACCEPTED = "accepted"  # the hole now holds these bytes (or already held the very same bytes)
    TAKEN = "taken"  # the hole holds other bytes: a shard of another write, or junk


def accept(existing: bytes | None, proposed: bytes) -> AcceptResult:
    """Write-once: an empty hole takes the proposed bytes; a filled hole keeps what it has.

    Rewriting identical bytes is accepted, so a writer may retry a shard whose answer it lost.
    """
    if existing is None or existing == proposed:
        return AcceptResult.ACCEPTED
    return AcceptResult.TAKEN


class Ack(enum.Enum):
    """What a writer knows about one of its shards."""

    ACCEPTED = "accepted"
    TAKEN = "taken"
    FAILED = "failed"  # sent, but no answer in time: the shard may or may not be in the hole
    SKIPPED = "skipped"  # not sent (the store is backing off or has too much in flight)
    PENDING = "pending"


class WriteOutcome(enum.Enum):
    WON = "won"
    LOST = "lost"  # can no longer reach k holes: void, or won by another writer
    PENDING = "pending"


def may_have_won(acks: Sequence[Ack], data_shards: int) -> bool:
    """A write reported lost whose unanswered shards may have landed, completing k holes."""
    counts = Counter(acks)
    return (
        counts[Ack.ACCEPTED]
        < data_shards
        <= counts[Ack.ACCEPTED] + counts[Ack.FAILED] + counts[Ack.PENDING]
    )


def write_outcome(acks: Sequence[Ack], data_shards: int) -> WriteOutcome:
    """A write is won with k accepted holes and lost once k is out of reach."""
    counts = Counter(acks)
    if counts[Ack.ACCEPTED] >= data_shards:
        return WriteOutcome.WON
    if counts[Ack.ACCEPTED] + counts[Ack.PENDING] < data_shards:
        return WriteOutcome.LOST
    return WriteOutcome.PENDING


class HoleKind(enum.Enum):
    EMPTY = "empty"  # known empty: a shard may still land
    UNKNOWN = "unknown"  # its store did not answer: treat as possibly holding anything
    JUNK = "junk"  # filled by a reader
    SHARD = "shard"  # a valid shard of this offset
    CORRUPT = "corrupt"  # filled, but with bytes that are not a valid shard of this hole


@dataclass(frozen=True)
class Hole:
    kind: HoleKind
    shard: Shard | None = None


EMPTY = Hole(HoleKind.EMPTY)
UNKNOWN = Hole(HoleKind.UNKNOWN)
JUNK = Hole(HoleKind.JUNK)
CORRUPT = Hole(HoleKind.CORRUPT)


def classify(frame: bytes | None, stream_id: int, offset: int, hole_index: int) -> Hole:
    """A hole's state from its bytes (None: empty). A shard that fails its checksum or does
    not belong to this stream, offset and hole is CORRUPT: never used for decoding."""
    if frame is None:
        return EMPTY
    if is_junk(frame):
        return JUNK
    try:
        shard = decode_shard(frame)
    except ShardFormatError:
        return CORRUPT
    if (shard.stream_id, shard.offset, shard.shard_index) != (stream_id, offset, hole_index):
        return CORRUPT
    return Hole(HoleKind.SHARD, shard)


class DecisionKind(enum.Enum):
    DECIDED = "decided"  # k matching shards: the offset holds that write
    VOID = "void"  # no write can ever reach k here
    UNDECIDED = "undecided"  # open holes could still complete a write: fill them or wait


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    shards: tuple[Shard, ...] = ()  # DECIDED: the winning write's shards (at least k)


def decide(holes: Sequence[Hole], data_shards: int) -> Decision:
    """The state of one offset from its k + m holes."""
    groups: dict[tuple, list[Shard]] = {}
    for hole in holes:
        if hole.kind is HoleKind.SHARD and hole.shard is not None:
            groups.setdefault(hole.shard.write_key, []).append(hole.shard)
    for shards in groups.values():
        # a shard's own k is what its write needs (the store's code might differ after a change)
        if len(shards) >= shards[0].data_shards:
            return Decision(DecisionKind.DECIDED, tuple(shards))
    open_holes = sum(1 for h in holes if h.kind in (HoleKind.EMPTY, HoleKind.UNKNOWN))
    # a corrupt hole may have held a shard of the winning write: it can never be used, but it
    # must not let a reader call an acknowledged write void either (the reader stops instead)
    corrupt = sum(1 for h in holes if h.kind is HoleKind.CORRUPT)
    best = max((len(s) for s in groups.values()), default=0)
    # a new writer could still take k open holes, or some write may have won
    if open_holes >= data_shards or best + open_holes + corrupt >= data_shards:
        return Decision(DecisionKind.UNDECIDED)
    return Decision(DecisionKind.VOID)
