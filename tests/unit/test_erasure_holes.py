"""The hole rules: write-once, k holes win, a 3/3 split is void, and a reader's fill makes an
offset final."""

from __future__ import annotations

import pytest

from dataplane.erasure.codec import ErasureCodec
from dataplane.erasure.holes import (
    CORRUPT,
    EMPTY,
    JUNK,
    UNKNOWN,
    AcceptResult,
    Ack,
    DecisionKind,
    Hole,
    HoleKind,
    WriteOutcome,
    accept,
    classify,
    decide,
    may_have_won,
    write_outcome,
)
from dataplane.erasure.shard_format import JUNK_MARKER, Shard, encode_shard, payload_checksum

K = 4
STREAM = 3
OFFSET = 1_000


def _frames(writer_id: int, payload: bytes) -> list[bytes]:
    codec = ErasureCodec(4, 2)
    crc = payload_checksum(payload)
    return [
        encode_shard(Shard(writer_id, STREAM, OFFSET, i, 4, 2, len(payload), crc, b))
        for i, b in enumerate(codec.encode(payload))
    ]


def _holes(contents: list[bytes | None]) -> list[Hole]:
    return [classify(c, STREAM, OFFSET, i) for i, c in enumerate(contents)]


def test_a_hole_is_written_once() -> None:
    assert accept(None, b"a") is AcceptResult.ACCEPTED
    assert accept(b"a", b"a") is AcceptResult.ACCEPTED  # a retried identical shard
    assert accept(b"a", b"b") is AcceptResult.TAKEN
    assert accept(JUNK_MARKER, b"a") is AcceptResult.TAKEN


@pytest.mark.parametrize(
    ("acks", "outcome"),
    [
        ([Ack.ACCEPTED] * 4 + [Ack.PENDING] * 2, WriteOutcome.WON),
        ([Ack.ACCEPTED] * 4 + [Ack.FAILED] * 2, WriteOutcome.WON),
        ([Ack.ACCEPTED] * 3 + [Ack.TAKEN] * 3, WriteOutcome.LOST),
        ([Ack.ACCEPTED] * 3 + [Ack.TAKEN, Ack.PENDING, Ack.PENDING], WriteOutcome.PENDING),
        ([Ack.ACCEPTED] * 3 + [Ack.FAILED] * 3, WriteOutcome.LOST),
        ([Ack.TAKEN] * 3 + [Ack.PENDING] * 3, WriteOutcome.LOST),
        ([Ack.ACCEPTED] * 4 + [Ack.SKIPPED] * 2, WriteOutcome.WON),
        ([Ack.ACCEPTED] * 3 + [Ack.SKIPPED] * 3, WriteOutcome.LOST),
    ],
)
def test_write_outcome(acks: list[Ack], outcome: WriteOutcome) -> None:
    assert write_outcome(acks, K) is outcome


def test_a_lost_write_may_have_won_only_through_unanswered_shards() -> None:
    # sent but unanswered: the 4th shard may be in its hole
    assert may_have_won([Ack.ACCEPTED] * 3 + [Ack.FAILED] + [Ack.TAKEN] * 2, K)
    # never sent, or refused: it cannot be
    assert not may_have_won([Ack.ACCEPTED] * 3 + [Ack.SKIPPED] * 3, K)
    assert not may_have_won([Ack.ACCEPTED] * 3 + [Ack.TAKEN] * 3, K)
    assert not may_have_won([Ack.ACCEPTED] * 4 + [Ack.FAILED] * 2, K)  # it won


def test_four_matching_shards_decide_the_offset() -> None:
    a = _frames(1, b"payload-a")
    decision = decide(_holes([a[0], a[1], None, a[3], a[4], None]), K)
    assert decision.kind is DecisionKind.DECIDED
    assert {s.shard_index for s in decision.shards} == {0, 1, 3, 4}


def test_two_writers_can_never_both_win() -> None:
    a, b = _frames(1, b"payload-a"), _frames(2, b"payload-b")
    for split in range(7):
        contents = [a[i] if i < split else b[i] for i in range(6)]
        decision = decide(_holes(contents), K)
        winners = {s.writer_id for s in decision.shards}
        assert len(winners) <= 1
        if split in (3,):
            assert decision.kind is DecisionKind.VOID


def test_same_writer_different_payload_does_not_combine() -> None:
    a, a2 = _frames(1, b"first"), _frames(1, b"other")
    decision = decide(_holes([a[0], a[1], a2[2], a2[3], JUNK_MARKER, JUNK_MARKER]), K)
    assert decision.kind is DecisionKind.VOID


def test_open_holes_leave_the_offset_undecided_until_filled() -> None:
    a = _frames(1, b"payload-a")
    holes = _holes([a[0], a[1], a[2], None, None, None])
    assert decide(holes, K).kind is DecisionKind.UNDECIDED
    # after a reader filled the empty holes, the same offset is void for good
    filled = _holes([a[0], a[1], a[2], JUNK_MARKER, JUNK_MARKER, JUNK_MARKER])
    assert decide(filled, K).kind is DecisionKind.VOID
    # a store that did not answer may hold the 4th shard: the reader must not skip
    partly = [*_holes([a[0], a[1], a[2], JUNK_MARKER, JUNK_MARKER]), UNKNOWN]
    assert decide(partly, K).kind is DecisionKind.UNDECIDED


def test_all_empty_is_undecided_and_all_junk_is_void() -> None:
    assert decide([EMPTY] * 6, K).kind is DecisionKind.UNDECIDED
    assert decide([JUNK] * 6, K).kind is DecisionKind.VOID
    assert decide([UNKNOWN] * 2 + [JUNK] * 4, K).kind is DecisionKind.VOID


def test_corrupt_shards_are_never_counted() -> None:
    a = _frames(1, b"payload-a")
    bad = bytearray(a[3])
    bad[-1] ^= 1
    holes = _holes([a[0], a[1], a[2], bytes(bad), JUNK_MARKER, JUNK_MARKER])
    assert holes[3].kind is HoleKind.CORRUPT
    # the corrupt hole may have been the 4th shard of an acknowledged write: never call it void
    assert decide(holes, K).kind is DecisionKind.UNDECIDED
    holes = _holes([a[0], a[1], a[2], bytes(bad), a[4], JUNK_MARKER])
    decision = decide(holes, K)
    assert decision.kind is DecisionKind.DECIDED
    assert 3 not in {s.shard_index for s in decision.shards}
    assert decide([CORRUPT] * 6, K).kind is DecisionKind.UNDECIDED
    assert decide([CORRUPT] * 2 + [JUNK] * 4, K).kind is DecisionKind.VOID
