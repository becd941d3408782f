"""The share-partition state machine (KIP-932): acquisition, locks, acknowledgements, the
delivery count limit, the start offset, and its durable snapshot."""

from __future__ import annotations

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.share.partition_state import (
    AcknowledgeError,
    AcquiredRange,
    LogBatch,
    RecordState,
    SharePartitionState,
)
from dataplane.kafka.share.protocol import ACK_ACCEPT, ACK_GAP, ACK_REJECT, ACK_RELEASE

LOCK_MS = 30_000


def batches(*ranges: tuple[int, int], control: tuple[int, ...] = ()) -> list[LogBatch]:
    return [LogBatch(first, last, first in control) for first, last in ranges]


def test_records_go_to_one_member_at_a_time():
    s = SharePartitionState(0)
    log = batches((0, 4), (5, 9))
    assert s.acquire("a", log, 3, 0, LOCK_MS) == [AcquiredRange(0, 2, 1)]
    assert s.acquire("b", log, 100, 0, LOCK_MS) == [AcquiredRange(3, 9, 1)]
    # everything is held: nothing for a third member
    assert s.acquire("c", log, 100, 0, LOCK_MS) == []
    assert s.record(0).member_id == "a" and s.record(5).member_id == "b"
    assert (s.start_offset, s.end_offset) == (0, 10)


def test_accept_advances_the_start_offset():
    s = SharePartitionState(0)
    s.acquire("a", batches((0, 9)), 100, 0, LOCK_MS)
    s.acknowledge("a", 2, 4, [ACK_ACCEPT])
    assert s.start_offset == 0  # 0 and 1 are still held
    s.acknowledge("a", 0, 1, [ACK_ACCEPT])
    assert s.start_offset == 5
    s.acknowledge("a", 5, 9, [ACK_ACCEPT])
    assert (s.start_offset, s.end_offset) == (10, 10)
    assert s.in_flight() == {}


def test_release_redelivers_and_reject_archives():
    s = SharePartitionState(0)
    s.acquire("a", batches((0, 3)), 100, 0, LOCK_MS)
    s.acknowledge("a", 0, 3, [ACK_RELEASE, ACK_REJECT, ACK_ACCEPT, ACK_RELEASE])
    assert s.record(0).state is RecordState.AVAILABLE
    assert s.record(1).state is RecordState.ARCHIVED
    assert s.record(3).state is RecordState.AVAILABLE
    assert s.next_fetch_offset() == 0
    # the released records go again, to anyone, delivery count 2
    assert s.acquire("b", batches((0, 3)), 100, 0, LOCK_MS) == [
        AcquiredRange(0, 0, 2),
        AcquiredRange(3, 3, 2),
    ]
    s.acknowledge("b", 0, 0, [ACK_ACCEPT])
    s.acknowledge("b", 3, 3, [ACK_ACCEPT])
    assert s.start_offset == 4


def test_lock_expiry_makes_records_available_again():
    s = SharePartitionState(0)
    s.acquire("a", batches((0, 1)), 100, now_ms=1_000, lock_duration_ms=500)
    assert s.next_lock_deadline_ms() == 1_500
    assert s.expire_locks(1_499) == 0
    assert s.expire_locks(1_500) == 2
    assert s.record(0).state is RecordState.AVAILABLE
    # the first holder can no longer acknowledge them
    with pytest.raises(AcknowledgeError) as err:
        s.acknowledge("a", 0, 1, [ACK_ACCEPT])
    assert err.value.error == KafkaError.INVALID_RECORD_STATE
    assert s.acquire("b", batches((0, 1)), 100, 2_000, 500) == [AcquiredRange(0, 1, 2)]


def test_delivery_count_limit_archives():
    s = SharePartitionState(0, delivery_count_limit=5)
    for delivery in range(1, 6):
        assert s.acquire("a", batches((0, 0)), 1, 0, LOCK_MS) == [AcquiredRange(0, 0, delivery)]
        s.acknowledge("a", 0, 0, [ACK_RELEASE])
    # the fifth release archived it: never delivered again, the start moved past it
    assert s.acquire("a", batches((0, 0)), 1, 0, LOCK_MS) == []
    assert s.start_offset == 1


def test_delivery_count_limit_on_lock_expiry_and_member_release():
    s = SharePartitionState(0, delivery_count_limit=2)
    s.acquire("a", batches((0, 1)), 100, 0, 10)
    s.expire_locks(10)
    s.acquire("b", batches((0, 1)), 100, 20, 10)
    assert s.release_member("b") == 2
    assert (s.start_offset, s.in_flight()) == (2, {})


def test_acknowledgements_are_all_or_nothing():
    s = SharePartitionState(0)
    s.acquire("a", batches((0, 4)), 100, 0, LOCK_MS)
    s.acquire("b", batches((5, 9)), 100, 0, LOCK_MS)
    with pytest.raises(AcknowledgeError) as err:
        s.acknowledge_batches("a", [(0, 4, [ACK_ACCEPT]), (5, 5, [ACK_ACCEPT])])
    assert err.value.error == KafkaError.INVALID_RECORD_STATE
    assert s.record(0).state is RecordState.ACQUIRED  # nothing applied
    for bad in [(3, 1, [ACK_ACCEPT]), (0, 4, []), (0, 4, [1, 1]), (0, 0, [9]), (-1, 0, [1])]:
        with pytest.raises(AcknowledgeError) as err:
            s.acknowledge("a", *bad)
        assert err.value.error == KafkaError.INVALID_REQUEST
    assert s.in_flight() == {"ACQUIRED": 10}


def test_gaps_and_control_batches_are_archived():
    s = SharePartitionState(0)
    # offsets 3-4 were compacted away; 6 is a transaction marker
    got = s.acquire("a", batches((0, 2), (5, 5), (6, 6), (7, 8), control=(6,)), 100, 0, LOCK_MS)
    assert got == [AcquiredRange(0, 2, 1), AcquiredRange(5, 5, 1), AcquiredRange(7, 8, 1)]
    assert s.record(3).state is RecordState.ARCHIVED
    assert s.record(6).state is RecordState.ARCHIVED
    s.acknowledge("a", 0, 8, [1, 1, 1, ACK_GAP, ACK_GAP, 1, ACK_GAP, 1, 1])
    assert (s.start_offset, s.end_offset) == (9, 9)


def test_in_flight_window_is_bounded():
    s = SharePartitionState(0, max_in_flight=4)
    assert s.acquire("a", batches((0, 9)), 100, 0, LOCK_MS) == [AcquiredRange(0, 3, 1)]
    s.acknowledge("a", 0, 1, [ACK_ACCEPT])
    assert s.acquire("a", batches((4, 9)), 100, 0, LOCK_MS) == [AcquiredRange(4, 5, 1)]


def test_log_start_moves_the_window():
    s = SharePartitionState(0)
    s.acquire("a", batches((0, 4)), 100, 0, LOCK_MS)
    assert s.move_start(3)
    assert (s.start_offset, s.end_offset) == (3, 5)
    assert s.record(2) is None


def test_snapshot_round_trip_forgets_locks_keeps_acks():
    s = SharePartitionState(10, delivery_count_limit=3)
    s.acquire("a", batches((10, 19)), 100, 0, LOCK_MS)
    s.acknowledge("a", 11, 12, [ACK_ACCEPT])
    s.acknowledge("a", 13, 13, [ACK_REJECT])
    s.acknowledge("a", 14, 14, [ACK_RELEASE])
    doc = s.snapshot()
    assert doc["start"] == 10
    r = SharePartitionState.restore(doc, delivery_count_limit=3)
    assert (r.start_offset, r.end_offset) == (10, 20)
    # acknowledged and archived stay done; the held ones are available again, counted
    assert r.record(11).state is RecordState.ACKNOWLEDGED
    assert r.record(13).state is RecordState.ARCHIVED
    assert r.record(10).state is RecordState.AVAILABLE and r.record(10).delivery_count == 1
    got = r.acquire("b", batches((10, 19)), 100, 0, LOCK_MS)
    assert got == [AcquiredRange(10, 10, 2), AcquiredRange(14, 19, 2)]
    # every accepted record after a restore stays accepted
    r.acknowledge("b", 10, 10, [ACK_ACCEPT])
    assert r.start_offset == 14


@pytest.mark.parametrize(
    "doc", [{}, {"v": 9, "start": 0}, {"v": 1, "start": 5, "runs": [[1, 2, 0, 0]]}]
)
def test_restore_refuses_what_is_not_a_snapshot(doc):
    with pytest.raises((ValueError, KeyError)):
        SharePartitionState.restore(doc)


def test_a_compacted_gap_wider_than_the_window_is_archived_bit_by_bit():
    s = SharePartitionState(0, max_in_flight=4)
    log = batches((0, 0), (1_000, 1_000))
    assert s.acquire("a", log, 10, 0, LOCK_MS) == [AcquiredRange(0, 0, 1)]
    assert len(s.in_flight()) <= 2 and s.end_offset <= 4
    s.acknowledge("a", 0, 0, [ACK_ACCEPT])
    for _ in range(1_000 // 4 + 2):  # each pass archives one window of the gap
        got = s.acquire("a", log, 10, 0, LOCK_MS)
        if got:
            break
    assert got == [AcquiredRange(1_000, 1_000, 1)]
