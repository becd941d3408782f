"""Transactions through the Kafka API layer with no server: the in-process controller (the
real state machine), the real engine and partitions, moto S3; the transaction coordinator
and the group offset store wired as the broker wires them."""

from __future__ import annotations

import asyncio
import threading

import pytest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.offset_store import KVOffsetStore
from dataplane.kafka.registry import RequestContext
from dataplane.kafka.txn.coordinator import TransactionCoordinator
from dataplane.kafka.txn.handlers import TxnHandlers, complete_group_offsets
from tests.support.kafka_requests import fetch_request
from tests.unit.inprocess_broker import inprocess_broker

TOPIC = "txn-topic"


def ctx(api_key: int, version: int) -> RequestContext:
    return RequestContext(
        api_key=api_key, api_version=version, correlation_id=1, client_id="unit", peer=("x", 1)
    )


def txn_batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.set_producer_state(pid, epoch, seq, True)
    for i, value in enumerate(values):
        builder.append(timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


class Harness:
    def __init__(self, apis, controller, sync, clock):
        self.apis, self.controller, self.sync = apis, controller, sync
        image_fn = apis.image_fn
        self.groups = GroupCoordinator()
        self.store = KVOffsetStore(controller, image_fn, 1, apis.node_epoch_fn)
        self.clock = clock
        self.coordinator = self.new_coordinator()
        self.txn = TxnHandlers(
            self.coordinator, image_fn, apis.partitions, self.groups, self.store, lambda g: True
        )
        apis.txn = self.txn

    def new_coordinator(self) -> TransactionCoordinator:
        return TransactionCoordinator(
            1,
            self.apis.image_fn,
            self.controller,
            self.apis.node_epoch_fn,
            self.apis.cluster.next_producer_id,
            self.apis.partitions,
            lambda slot, pid, commit: complete_group_offsets(self.store, slot, pid, commit),
            clock_ms=lambda: self.clock[0],
        )

    def run(self, coro):
        return asyncio.run(coro)

    def wait_aborts_recorded(self, partition: int = 0) -> None:
        """Bounded wait until the partition's aborts are recorded with its stream (on the
        partition manager's pool): until then its last stable offset holds before them."""
        topic_id = self.apis.image_fn().topic_by_name(TOPIC).topic_id
        for _ in range(500):
            plog = self.apis.partitions.get(topic_id, partition)
            if plog is not None and not plog.has_unrecorded_aborts:
                return
            threading.Event().wait(0.01)
        raise AssertionError("aborts not recorded within 5 s")

    def init_pid(self, txn_id: str, timeout_ms: int = 60_000, version: int = 4):
        req = InitProducerIdRequest[version](
            transactional_id=txn_id,
            transaction_timeout_ms=timeout_ms,
            producer_id=-1,
            producer_epoch=-1,
        )
        return self.run(self.apis.cluster.init_producer_id(req, ctx(22, version)))

    def add_partitions(self, txn_id, pid, epoch, partitions=(0,)):
        R = AddPartitionsToTxnRequest
        req = R[3](
            v3_and_below_transactional_id=txn_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[
                R.AddPartitionsToTxnTopic(name=TOPIC, partitions=list(partitions))
            ],
        )
        resp = self.run(self.txn.add_partitions_to_txn(req, ctx(24, 3)))
        return [
            p.partition_error_code
            for t in resp.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ]

    def end(self, txn_id, pid, epoch, commit: bool):
        req = EndTxnRequest[3](
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=commit
        )
        return self.run(self.txn.end_txn(req, ctx(26, 3))).error_code

    def produce(self, records: bytes, partition: int = 0):
        P = ProduceRequest.TopicProduceData
        req = ProduceRequest[9](
            transactional_id="x",
            acks=-1,
            timeout_ms=5_000,
            topic_data=[
                P(
                    name=TOPIC,
                    partition_data=[P.PartitionProduceData(index=partition, records=records)],
                )
            ],
        )
        resp = self.run(self.apis.data.produce(req, ctx(0, 9)))
        return resp.responses[0].partition_responses[0].error_code

    def fetch(self, isolation: int, offset: int = 0):
        req = fetch_request(TOPIC, {0: offset}, isolation_level=isolation)
        resp = self.run(self.apis.data.fetch(req, ctx(1, 12))).resolved()
        p = resp.responses[0].partitions[0]
        values, controls = [], 0
        records = MemoryRecords(p.records) if p.records else None
        while records is not None and records.has_next():
            batch = records.next_batch()
            if batch.is_control_batch:
                controls += 1
                continue
            values += [r.value for r in batch]
        aborted = [(a.producer_id, a.first_offset) for a in p.aborted_transactions or []]
        return values, controls, p.last_stable_offset, p.high_watermark, aborted

    def latest(self, isolation: int) -> int:
        R = ListOffsetsRequest
        req = R[5](
            replica_id=-1,
            isolation_level=isolation,
            topics=[
                R.ListOffsetsTopic(
                    name=TOPIC,
                    partitions=[
                        R.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=0, current_leader_epoch=-1, timestamp=-1
                        )
                    ],
                )
            ],
        )
        resp = self.run(self.apis.data.list_offsets(req, ctx(2, 5)))
        return resp.topics[0].partitions[0].offset


@pytest.fixture
def h(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with inprocess_broker(tmp_path) as (apis, controller, sync):
        controller.call("create_topic", {"name": TOPIC, "partitions": 2})
        sync()
        yield Harness(apis, controller, sync, [1_000_000])


def test_find_coordinator_for_a_transactional_id_names_the_slot_owner(h):
    req = FindCoordinatorRequest[4](key_type=1, coordinator_keys=["my-txn"])
    resp = h.run(h.apis.cluster.find_coordinator(req, ctx(10, 4)))
    c = resp.coordinators[0]
    assert (c.error_code, c.node_id, c.port) == (KafkaError.NONE, 1, 9092)


def test_timeout_above_the_maximum_is_refused_at_once(h):
    resp = h.init_pid("t-timeout", timeout_ms=900_001)
    assert resp.error_code == KafkaError.INVALID_TRANSACTION_TIMEOUT
    assert h.init_pid("t-timeout", timeout_ms=900_000).error_code == KafkaError.NONE


def test_commit_and_abort_with_read_committed_and_aborted_list(h):
    r = h.init_pid("t1")
    assert r.error_code == KafkaError.NONE and r.producer_epoch == 0
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add_partitions("t1", pid, epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, epoch, 0, [b"a", b"b"])) == KafkaError.NONE
    # open transaction: read_committed sees nothing, LSO stays at its first offset
    assert h.fetch(1)[0] == [] and h.fetch(1)[2] == 0
    assert h.fetch(0)[0] == [b"a", b"b"]
    assert h.latest(1) == 0 and h.latest(0) == 2
    assert h.end("t1", pid, epoch, True) == KafkaError.NONE
    values, controls, lso, hw, aborted = h.fetch(1)
    assert values == [b"a", b"b"] and controls == 1 and lso == hw == 3 and aborted == []
    # second transaction, aborted
    assert h.add_partitions("t1", pid, epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, epoch, 2, [b"x"])) == KafkaError.NONE
    assert h.end("t1", pid, epoch, False) == KafkaError.NONE
    h.wait_aborts_recorded()
    values, controls, lso, hw, aborted = h.fetch(1)
    assert lso == hw == 5 and aborted == [(pid, 3)]
    # the client drops aborted records itself; read_uncommitted sees them
    assert h.fetch(0)[0] == [b"a", b"b", b"x"]
    # a retried EndTxn of the completed decision succeeds; the other decision does not
    assert h.end("t1", pid, epoch, False) == KafkaError.NONE
    assert h.end("t1", pid, epoch, True) == KafkaError.INVALID_TXN_STATE


def test_new_instance_fences_the_old_one_and_aborts_its_open_transaction(h):
    old = h.init_pid("t2")
    pid, e0 = old.producer_id, old.producer_epoch
    assert h.add_partitions("t2", pid, e0) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, e0, 0, [b"zombie"])) == KafkaError.NONE
    new = h.init_pid("t2")
    assert new.error_code == KafkaError.NONE and new.producer_id == pid and new.producer_epoch > e0
    # the open transaction was aborted: nothing unstable left
    h.wait_aborts_recorded()
    _, _, lso, hw, aborted = h.fetch(1)
    assert lso == hw and aborted == [(pid, 0)]
    # the old instance is fenced at the coordinator and at the partition
    assert h.add_partitions("t2", pid, e0) == [KafkaError.PRODUCER_FENCED]
    assert h.end("t2", pid, e0, True) == KafkaError.PRODUCER_FENCED
    assert h.produce(txn_batch(pid, e0, 1, [b"late"])) == KafkaError.INVALID_PRODUCER_EPOCH
    # the new one works from sequence 0
    assert h.add_partitions("t2", pid, new.producer_epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, new.producer_epoch, 0, [b"ok"])) == KafkaError.NONE
    assert h.end("t2", pid, new.producer_epoch, True) == KafkaError.NONE
    assert b"ok" in h.fetch(1)[0]


def test_bad_transactional_ids_are_refused_and_store_nothing(h):
    assert h.init_pid("").error_code == KafkaError.INVALID_REQUEST
    assert h.init_pid("x" * 1025).error_code == KafkaError.INVALID_REQUEST
    assert h.add_partitions("", 1, 0) == [KafkaError.INVALID_REQUEST]
    assert h.end("", 1, 0, True) == KafkaError.INVALID_REQUEST
    assert not [k for k in h.apis.image_fn().kv if k.startswith("txn-state/")]


def test_unknown_partition_and_unknown_producer(h):
    r = h.init_pid("t3")
    assert h.add_partitions("t3", r.producer_id, r.producer_epoch, (0, 7)) == [
        KafkaError.OPERATION_NOT_ATTEMPTED,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    assert h.add_partitions("t3", r.producer_id + 999, 0) == [
        KafkaError.INVALID_PRODUCER_ID_MAPPING
    ]
    assert h.add_partitions("nobody", 5, 0) == [KafkaError.INVALID_PRODUCER_ID_MAPPING]


def offset_fetch(h: Harness, require_stable: bool) -> tuple[int, int]:
    """(error, offset) of partition 0 of TOPIC in group g1 via OffsetFetch v7."""
    from kafka.protocol.consumer import OffsetFetchRequest

    from dataplane.kafka.groups.handlers import GroupHandlers

    groups = GroupHandlers(h.groups, h.store, lambda g: True)
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    req = OffsetFetchRequest[7](
        group_id="g1",
        topics=[T(name=TOPIC, partition_indexes=[0])],
        require_stable=require_stable,
    )
    resp = h.run(groups.offset_fetch(req, ctx(9, 7)))
    p = resp.topics[0].partitions[0]
    return p.error_code, p.committed_offset


def test_txn_offsets_become_visible_on_commit_only(h):
    r = h.init_pid("t4")
    pid, epoch = r.producer_id, r.producer_epoch
    req = AddOffsetsToTxnRequest[3](
        transactional_id="t4", producer_id=pid, producer_epoch=epoch, group_id="g1"
    )
    assert h.run(h.txn.add_offsets_to_txn(req, ctx(25, 3))).error_code == KafkaError.NONE

    def commit_offsets(offset: int, generation: int = -1, member: str = ""):
        T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        req = TxnOffsetCommitRequest[3](
            transactional_id="t4",
            group_id="g1",
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=generation,
            member_id=member,
            group_instance_id=None,
            topics=[
                T(
                    name=TOPIC,
                    partitions=[
                        T.TxnOffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=offset,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                    ],
                )
            ],
        )
        resp = h.run(h.txn.txn_offset_commit(req, ctx(28, 3)))
        return resp.topics[0].partitions[0].error_code

    # KIP-447: a generation the group does not have is refused
    assert commit_offsets(10, generation=3, member="m") == KafkaError.ILLEGAL_GENERATION
    assert commit_offsets(10) == KafkaError.NONE
    assert h.run(h.store.fetch("g1", None)) == {}  # pending: not visible
    assert h.store.pending_partitions("g1") == {(TOPIC, 0)}
    # KIP-447: a consumer asking for stable offsets is told to retry meanwhile
    assert offset_fetch(h, require_stable=True) == (KafkaError.UNSTABLE_OFFSET_COMMIT, -1)
    assert offset_fetch(h, require_stable=False) == (KafkaError.NONE, -1)
    assert h.end("t4", pid, epoch, True) == KafkaError.NONE
    assert h.run(h.store.fetch("g1", None))[(TOPIC, 0)].offset == 10
    assert h.store.pending_partitions("g1") == set()
    assert offset_fetch(h, require_stable=True) == (KafkaError.NONE, 10)
    # aborted offsets are dropped
    assert h.run(h.txn.add_offsets_to_txn(req, ctx(25, 3))).error_code == KafkaError.NONE
    assert commit_offsets(20) == KafkaError.NONE
    assert h.end("t4", pid, epoch, False) == KafkaError.NONE
    assert h.run(h.store.fetch("g1", None))[(TOPIC, 0)].offset == 10


def test_write_txn_markers_api_writes_into_the_partition(h):
    r = h.init_pid("t5")
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add_partitions("t5", pid, epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, epoch, 0, [b"m"])) == KafkaError.NONE
    R = WriteTxnMarkersRequest
    req = R[1](
        markers=[
            R.WritableTxnMarker(
                producer_id=pid,
                producer_epoch=epoch,
                transaction_result=True,
                topics=[
                    R.WritableTxnMarker.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])
                ],
                coordinator_epoch=0,
            )
        ]
    )
    resp = h.run(h.txn.write_txn_markers(req, ctx(27, 1)))
    assert resp.markers[0].topics[0].partitions[0].error_code == KafkaError.NONE
    assert h.fetch(1)[0] == [b"m"]


def test_state_is_durable_a_new_coordinator_aborts_expired_and_finishes_prepared(h):
    r = h.init_pid("t6", timeout_ms=10_000)
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add_partitions("t6", pid, epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, epoch, 0, [b"lost"])) == KafkaError.NONE
    # the coordinator dies; a fresh one (as after a slot move) knows only the KV
    fresh = h.new_coordinator()
    h.run(fresh.tick())
    assert fresh.snapshot()["t6"].state.value == "Ongoing"
    assert h.fetch(1)[2] == 0  # still unstable
    h.clock[0] += 10_001
    h.run(fresh.tick())
    meta = fresh.snapshot()["t6"]
    assert meta.state.value == "CompleteAbort" and meta.producer_epoch == epoch + 1
    h.wait_aborts_recorded()
    _, _, lso, hw, aborted = h.fetch(1)
    assert lso == hw and aborted == [(pid, 0)]
    assert h.produce(txn_batch(pid, epoch, 1, [b"zombie"])) == KafkaError.INVALID_PRODUCER_EPOCH


def test_list_describe_transactions_and_describe_producers(h):
    """kafka-transactions.sh list / describe / describe-producers: an open transaction is
    listed with its state, partitions and start; the partition names its producer and the
    first offset of the open transaction; filters and unknown ids answer as Kafka does."""
    from kafka.protocol.admin import (
        DescribeProducersRequest,
        DescribeTransactionsRequest,
        ListTransactionsRequest,
    )

    from dataplane.kafka.admin_apis import AdminApis

    r = h.init_pid("t-admin")
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add_partitions("t-admin", pid, epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, epoch, 0, [b"a", b"b"])) == KafkaError.NONE

    def listed(**filters):
        req = ListTransactionsRequest[1](
            state_filters=filters.get("states", []),
            producer_id_filters=filters.get("pids", []),
            duration_filter=filters.get("duration", -1),
        )
        return h.run(h.txn.list_transactions(req, ctx(66, 1)))

    resp = listed()
    assert [
        (t.transactional_id, t.producer_id, t.transaction_state) for t in resp.transaction_states
    ] == [("t-admin", pid, "Ongoing")]
    assert listed(states=["CompleteCommit"]).transaction_states == []
    assert listed(pids=[pid + 1]).transaction_states == []
    assert listed(states=["Bogus"]).unknown_state_filters == ["Bogus"]
    h.clock[0] += 5_000
    assert len(listed(duration=4_000).transaction_states) == 1
    assert listed(duration=60_000).transaction_states == []

    req = DescribeTransactionsRequest[0](transactional_ids=["t-admin", "nope"])
    found, missing = h.run(h.txn.describe_transactions(req, ctx(65, 0))).transaction_states
    assert found.error_code == KafkaError.NONE and found.transaction_state == "Ongoing"
    assert (found.producer_id, found.producer_epoch) == (pid, epoch)
    assert [(t.topic, list(t.partitions)) for t in found.topics] == [(TOPIC, [0])]
    assert found.transaction_timeout_ms == 60_000 and found.transaction_start_time_ms > 0
    assert missing.error_code == KafkaError.TRANSACTIONAL_ID_NOT_FOUND

    admin = AdminApis(1, h.apis.image_fn, h.controller, h.apis.partitions, h.apis.io)
    T = DescribeProducersRequest.TopicRequest
    req = DescribeProducersRequest[0](
        topics=[T(name=TOPIC, partition_indexes=[0, 1, 9]), T(name="nope", partition_indexes=[0])]
    )
    topics = h.run(admin.describe_producers(req, ctx(61, 0))).topics
    p0, p1, p9 = topics[0].partitions
    [producer] = p0.active_producers
    assert (producer.producer_id, producer.producer_epoch, producer.last_sequence) == (
        pid,
        epoch,
        1,
    )
    assert producer.current_txn_start_offset == 0
    assert p1.error_code == KafkaError.NONE and p1.active_producers == []
    assert p9.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert topics[1].partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION

    # committed: the producer stays, its transaction is no longer open
    assert h.end("t-admin", pid, epoch, True) == KafkaError.NONE
    topics = h.run(admin.describe_producers(req, ctx(61, 0))).topics
    assert topics[0].partitions[0].active_producers[0].current_txn_start_offset == -1
    assert listed(states=["CompleteCommit"]).transaction_states[0].transactional_id == "t-admin"


def test_an_abort_older_than_a_new_leaders_tail_read_is_still_known(h):
    """Kafka's `.txnindex`: the leader records each durable abort with the partition's
    stream in the metadata, so a later leader, which reads only the last 4,096 offsets of
    the log, still hands read_committed consumers that abort."""
    from dataplane.kafka.producer_state import (
        PRODUCER_SCAN_OFFSETS,
        ProducerStateTable,
        TxnIndex,
        rebuild_producer_state,
    )

    r = h.init_pid("t-old-abort")
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add_partitions("t-old-abort", pid, epoch) == [KafkaError.NONE]
    assert h.produce(txn_batch(pid, epoch, 0, [b"x", b"y"])) == KafkaError.NONE
    assert h.end("t-old-abort", pid, epoch, False) == KafkaError.NONE
    # then far more than the tail a new leader reads
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 22)
    for _ in range(PRODUCER_SCAN_OFFSETS + 100):
        builder.append(timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
    builder.close()
    assert h.produce(bytes(builder.buffer())) == KafkaError.NONE
    plog = h.apis.partitions.get(h.apis.image_fn().topic_by_name(TOPIC).topic_id, 0)
    stream_id = plog.stream.stream_id
    for _ in range(200):  # bounded: the recording runs on the partition manager's pool
        h.sync()
        if h.apis.image_fn().streams[stream_id].aborted_txns:
            break
        threading.Event().wait(0.02)
    meta = h.apis.image_fn().streams[stream_id]
    assert [(p, f) for p, f, _ in meta.aborted_txns] == [(pid, 0)]
    # a new leader: without the recorded list its tail read misses the abort ...
    alone = TxnIndex()
    rebuild_producer_state(plog.stream, ProducerStateTable(), alone)
    assert alone.aborted_between(0, plog.high_watermark) == []
    # ... with it (as PartitionManager opens a partition), the abort is known, once
    seeded = TxnIndex()
    seeded.seed_aborted(meta.aborted_txns)
    rebuild_producer_state(plog.stream, ProducerStateTable(), seeded)
    assert seeded.aborted_between(0, plog.high_watermark) == [(pid, 0)]


def test_aborts_are_recorded_in_marker_order_whatever_order_they_become_durable():
    """Two abort markers of one partition whose WAL writes finish in the other order: the
    older one is not skipped (the controller refuses what is not past its last marker), and
    nothing is recorded past a marker still being written (found by review)."""
    from concurrent.futures import Future

    from dataplane.kafka.partition_log import PartitionLog, _AbortSlot

    recorded: list[tuple[int, int, int]] = []

    def record(entries):  # the controller's rule (controlplane/streams.record_aborted_txns)
        last = recorded[-1][2] if recorded else -1
        for e in entries:
            if e[2] > last:
                last = e[2]
                recorded.append(tuple(e))

    plog = PartitionLog("tid", "t", 0, 1, None, record_aborted=record, run_later=lambda fn: fn())
    older, newer = _AbortSlot((7, 0, 10)), _AbortSlot((8, 5, 20))
    plog._unrecorded.extend([older, newer])  # as write_marker queues them, under its lock
    done = Future()
    done.set_result(None)
    plog._marker_done(done, newer)  # marker 20 durable first: nothing may be recorded yet
    assert recorded == [] and plog.has_unrecorded_aborts
    plog._marker_done(done, older)
    assert recorded == [(7, 0, 10), (8, 5, 20)] and not plog.has_unrecorded_aborts
    # a marker whose write failed is never recorded and does not hold back later ones
    failed, later = _AbortSlot((9, 30, 40)), _AbortSlot((10, 35, 50))
    plog._unrecorded.extend([failed, later])
    broken = Future()
    broken.set_exception(OSError("WAL failed"))
    plog._marker_done(broken, failed)
    plog._marker_done(done, later)
    assert recorded[-1] == (10, 35, 50) and (9, 30, 40) not in recorded
    assert not plog.has_unrecorded_aborts


def test_the_last_stable_offset_waits_for_an_abort_to_be_recorded():
    """Readers that skip the brokers (the Spark source, table sync) filter aborted records
    by the stream's metadata up to the last stable offset they ask a broker for: an abort
    whose record has not reached the metadata yet must hold that offset before it."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from dataplane.kafka.partition_log import PartitionLog, _AbortSlot

    recorded: list = []
    stream = SimpleNamespace(stream_id=1, next_offset=100)
    plog = PartitionLog(
        "tid", "t", 0, 1, stream, record_aborted=recorded.extend, run_later=lambda fn: None
    )
    assert plog.last_stable_offset == 100
    slot = _AbortSlot((7, 40, 60))  # producer 7's transaction from 40, aborted at 60
    plog._unrecorded.append(slot)  # as write_marker queues it
    assert plog.last_stable_offset == 40  # the marker's write is not done
    done = Future()
    done.set_result(None)
    plog._marker_done(done, slot)  # durable; recording is queued, not done
    assert plog.last_stable_offset == 40
    plog.record_pending_aborts()  # the controller has it now
    assert recorded == [(7, 40, 60)] and plog.last_stable_offset == 100
