"""The pure transaction state machine (dataplane/kafka/txn/state.py) and control batches."""

from __future__ import annotations

import pytest
from kafka.record.memory_records import MemoryRecords

from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.record_batch import parse_batches
from dataplane.kafka.txn import state as st
from dataplane.kafka.txn.markers import build_marker, marker_of

S = st.TxnState


def fresh(epoch: int = 0) -> st.TxnMetadata:
    t = st.init_producer(None, "t", 60_000, 7, 100)
    assert t.error == KafkaError.NONE and t.new is not None
    return t.new if epoch == 0 else st.TxnMetadata("t", 7, epoch, 60_000, last_update_ms=100)


def test_init_producer_new_id_epoch_zero_and_timeout_limits():
    m = fresh()
    assert (m.producer_id, m.producer_epoch, m.state) == (7, 0, S.EMPTY)
    assert (
        st.init_producer(None, "t", 900_001, 7, 0).error == KafkaError.INVALID_TRANSACTION_TIMEOUT
    )
    assert st.init_producer(None, "t", 0, 7, 0).error == KafkaError.INVALID_TRANSACTION_TIMEOUT
    assert st.init_producer(None, "t", 900_000, 7, 0).error == KafkaError.NONE


def test_init_producer_bumps_the_epoch_and_a_new_id_when_exhausted():
    m = fresh()
    bumped = st.init_producer(m, "t", 60_000, 99, 200).new
    assert (bumped.producer_id, bumped.producer_epoch) == (7, 1)
    last = st.TxnMetadata("t", 7, st.MAX_PRODUCER_EPOCH - 1, 60_000)
    renewed = st.init_producer(last, "t", 60_000, 99, 200).new
    assert (renewed.producer_id, renewed.producer_epoch) == (99, 0)


def test_init_producer_kip360_expected_epoch():
    m = st.TxnMetadata("t", 7, 3, 60_000)
    assert st.init_producer(m, "t", 60_000, 0, 0, expected=(7, 3)).new.producer_epoch == 4
    assert st.init_producer(m, "t", 60_000, 0, 0, expected=(7, 2)).error == KafkaError.NONE
    assert (
        st.init_producer(m, "t", 60_000, 0, 0, expected=(7, 1)).error == KafkaError.PRODUCER_FENCED
    )
    assert (
        st.init_producer(m, "t", 60_000, 0, 0, expected=(8, 3)).error == KafkaError.PRODUCER_FENCED
    )


def test_add_partitions_then_commit_then_complete():
    m = fresh()
    t = st.add_to_txn(m, 7, 0, 1_000, frozenset({("a", 0)}))
    ongoing = t.new
    assert ongoing.state == S.ONGOING and ongoing.txn_start_ms == 1_000
    # a retry of the same add changes nothing; more partitions keep the start time
    assert st.add_to_txn(ongoing, 7, 0, 2_000, frozenset({("a", 0)})).new is None
    more = st.add_to_txn(ongoing, 7, 0, 2_000, frozenset({("a", 1)}), frozenset({"g"})).new
    assert more.partitions == {("a", 0), ("a", 1)} and more.groups == {"g"}
    assert more.txn_start_ms == 1_000
    end = st.end_txn(more, 7, 0, True, 3_000)
    assert end.markers and end.new.state == S.PREPARE_COMMIT
    # while preparing: adds and the same EndTxn wait
    assert (
        st.add_to_txn(end.new, 7, 0, 0, frozenset({("b", 0)})).error
        == KafkaError.CONCURRENT_TRANSACTIONS
    )
    assert st.end_txn(end.new, 7, 0, True, 0).error == KafkaError.CONCURRENT_TRANSACTIONS
    done = st.complete(end.new, 4_000)
    assert done.state == S.COMPLETE_COMMIT and not done.partitions and not done.groups
    assert st.end_txn(done, 7, 0, True, 0) == st.Transition()  # retried commit: fine
    assert st.end_txn(done, 7, 0, False, 0).error == KafkaError.INVALID_TXN_STATE
    # the next transaction starts from scratch
    nxt = st.add_to_txn(done, 7, 0, 5_000, frozenset({("c", 0)})).new
    assert nxt.partitions == {("c", 0)} and nxt.txn_start_ms == 5_000


def test_fencing_and_unknown_producers():
    m = st.add_to_txn(fresh(), 7, 0, 0, frozenset({("a", 0)})).new
    assert st.add_to_txn(m, 7, 1, 0, frozenset()).error == KafkaError.PRODUCER_FENCED
    assert st.end_txn(m, 7, 1, True, 0).error == KafkaError.PRODUCER_FENCED
    assert st.add_to_txn(m, 8, 0, 0, frozenset()).error == KafkaError.INVALID_PRODUCER_ID_MAPPING
    assert st.end_txn(None, 7, 0, True, 0).error == KafkaError.INVALID_PRODUCER_ID_MAPPING
    assert st.init_producer(m, "t", 60_000, 0, 0).error == KafkaError.CONCURRENT_TRANSACTIONS
    assert st.end_txn(fresh(), 7, 0, True, 0).error == KafkaError.INVALID_TXN_STATE


def test_timeout_abort_bumps_the_epoch():
    m = st.add_to_txn(fresh(), 7, 0, 1_000, frozenset({("a", 0)})).new
    assert not m.expired(61_000) and m.expired(61_001)
    aborting = st.begin_abort(m, 61_001, bump_epoch=True)
    assert aborting.state == S.PREPARE_ABORT and aborting.producer_epoch == 1
    assert st.complete(aborting, 61_002).state == S.COMPLETE_ABORT


def test_metadata_json_round_trip():
    m = st.add_to_txn(fresh(), 7, 0, 1_000, frozenset({("a", 0), ("b", 2)}), frozenset({"g"})).new
    assert st.TxnMetadata.from_json("t", m.to_json()) == m


def test_marker_is_a_valid_control_batch_clients_read():
    data = build_marker(42, 3, True, 5, 1_700_000_000_000)
    (h,) = parse_batches(data, client_origin=False)
    assert h.is_control and h.is_transactional and (h.producer_id, h.producer_epoch) == (42, 3)
    assert marker_of(h).commit is True
    assert (
        marker_of(parse_batches(build_marker(42, 3, False, 5, 0), client_origin=False)[0]).commit
        is False
    )
    batch = MemoryRecords(data).next_batch()
    assert batch.is_control_batch and batch.is_transactional and batch.producer_id == 42
    # a client may not write one
    with pytest.raises(InvalidRecordBatchError) as refused:
        parse_batches(data)
    assert refused.value.error_code == KafkaError.INVALID_RECORD
