"""A partition opened by a new leader rebuilds idempotent-producer state from the stream's
tail, so a producer retrying a batch the previous leader wrote gets its original offset."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import patch_batch
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.kafka import partition_log, partition_manager, producer_state
from dataplane.kafka.producer_state import ProducerStateTable, rebuild_producer_state
from dataplane.s3stream.storage import StorageError
from tests.unit.test_kafka_record_batch import client_batch


class FakeStream:
    """The part of `Stream` the rebuild uses, over a list of stored batches."""

    def __init__(self, batches: list[StreamRecordBatch], start_offset: int = 0, epoch: int = 0):
        self.batches = batches
        self.epoch = epoch
        self.start_offset = start_offset
        self.next_offset = batches[-1].last_offset if batches else start_offset
        self.fetched_bytes = 0
        self.recorded_aborted_txns: list[tuple[int, int, int]] = []

    def fetch(self, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        out, size = [], 0
        for b in self.batches:
            if b.last_offset <= start or b.base_offset >= end:
                continue
            if out and size + b.size_bytes > max_bytes:
                break
            out.append(b)
            size += b.size_bytes
        self.fetched_bytes += size
        return out


def stored_log(
    producers: list[tuple[int, int]], batches_each: int, records: int = 4, value_size: int = 20
) -> list[StreamRecordBatch]:
    """Interleaved idempotent batches of several (producer id, epoch), as a leader stores
    them (baseOffset patched)."""
    out, offset = [], 0
    seqs = {pid: 0 for pid, _ in producers}
    for _ in range(batches_each):
        for pid, epoch in producers:
            data = client_batch(records, producer=(pid, epoch, seqs[pid]), value_size=value_size)
            seqs[pid] += records
            out.append(StreamRecordBatch(7, 0, offset, records, patch_batch(data, offset, 0)))
            offset += records
    return out


def test_the_last_batches_of_every_producer_are_deduplicated_after_a_move():
    log = stored_log([(1000, 0), (1001, 2)], batches_each=20)
    table = ProducerStateTable()
    assert rebuild_producer_state(FakeStream(log), table) == 40
    # the very last batch of each producer, retried: duplicate at its original offset
    last_1000 = log[-2]
    assert table.check(1000, 0, 76, 79) == (ProducerStateTable.DUPLICATE, last_1000.base_offset)
    assert table.check(1001, 2, 76, 79) == (ProducerStateTable.DUPLICATE, log[-1].base_offset)
    # the next batch is accepted, a gap is not, an old epoch is fenced
    assert table.check(1000, 0, 80, 83) == (ProducerStateTable.APPEND, 0)
    # (a gap against state rebuilt from the log: the log may have lost batches, the caller
    # decides; see test_a_gap_after_a_log_that_lost_the_producers_last_batches_is_accepted)
    assert table.check(1000, 0, 88, 91) == (ProducerStateTable.RESET, 59)
    assert table.check(1001, 1, 80, 83) == ("error", 47)


def test_the_scan_is_bounded_in_bytes_for_large_records(monkeypatch):
    monkeypatch.setattr(producer_state, "PRODUCER_SCAN_MAX_BYTES", 64 * 1024)
    log = stored_log([(5, 0)], batches_each=200, records=1, value_size=4000)  # ~800 KB
    stream = FakeStream(log)
    table = ProducerStateTable()
    rebuild_producer_state(stream, table)
    # the tail was found without reading the whole log
    assert table.check(5, 0, 199, 199) == (ProducerStateTable.DUPLICATE, log[-1].base_offset)
    assert stream.fetched_bytes < 400 * 1024


def test_a_stream_without_kafka_batches_rebuilds_nothing():
    stream = FakeStream([StreamRecordBatch(7, 0, 0, 1, b"not a kafka batch" * 10)])
    assert rebuild_producer_state(stream, ProducerStateTable()) == 0


class _FlakyTail(FakeStream):
    stream_id = 7

    def __init__(self, batches, failures: int):
        super().__init__(batches)
        self.failures = failures

    def fetch(self, start, end, max_bytes):
        if self.failures > 0:
            self.failures -= 1
            raise OSError("object store unavailable")
        return super().fetch(start, end, max_bytes)


def reconciled(manager: partition_manager.PartitionManager, *args) -> None:
    """A reconcile pass and the opens it started."""
    for opened in manager.reconcile(*args):
        opened.result()


class _Storage:
    def __init__(self, stream):
        self.stream = stream

    def open_stream(self, stream_id, epoch):
        return self.stream

    def open_stream_ids(self):
        return set()


def test_a_partition_is_not_served_until_its_producer_state_is_rebuilt():
    """An empty idempotence table would append a retry of the previous leader's batch
    again: a partition whose tail cannot be read yet is not served (retried later)."""
    log = stored_log([(5, 0)], batches_each=3)
    stream = _FlakyTail(log, failures=1)
    manager = partition_manager.PartitionManager(1, _Storage(stream))
    manager._open_tracked(None, ("t", 0), "topic", 0, 7)
    assert manager.get("t", 0) is None and manager.retrying() == {("t", 0)}
    manager._open_tracked(None, ("t", 0), "topic", 0, 7)  # the retry: the tail reads now
    plog = manager.get("t", 0)
    assert plog is not None and not manager.retrying()
    assert plog.producers.check(5, 0, 8, 11) == (ProducerStateTable.DUPLICATE, 8)


def test_open_and_aborted_transactions_are_rebuilt_from_the_tail():
    """A new leader knows which transactions are still open (the last stable offset stays
    below them) and which were aborted (read_committed fetches report them)."""
    from dataplane.kafka.producer_state import TxnIndex
    from dataplane.kafka.txn.markers import build_marker
    from tests.unit.test_txn_inprocess import txn_batch

    out, offset = [], 0

    def add(data: bytes, count: int) -> None:
        nonlocal offset
        out.append(StreamRecordBatch(7, 0, offset, count, patch_batch(data, offset, 0)))
        offset += count

    add(txn_batch(10, 0, 0, [b"a", b"b"]), 2)  # 0-1: pid 10, later aborted
    add(txn_batch(11, 0, 0, [b"c"]), 1)  # 2: pid 11, later committed
    add(build_marker(10, 1, False, 0, 0), 1)  # 3: abort of pid 10 (epoch bumped)
    add(build_marker(11, 0, True, 0, 0), 1)  # 4: commit of pid 11
    add(txn_batch(12, 0, 0, [b"d"]), 1)  # 5: pid 12, still open
    table, txns = ProducerStateTable(), TxnIndex()
    rebuild_producer_state(FakeStream(out), table, txns)
    assert txns.first_unstable() == 5
    assert txns.aborted_between(0, 6) == [(10, 0)]
    assert txns.aborted_between(4, 6) == []
    # the abort marker's epoch fences the aborted producer's old epoch
    assert table.check(10, 0, 2, 2) == ("error", 47)


class _LaggingTail(FakeStream):
    """A tail whose newest objects are not found yet (a lookup answered by a controller
    whose image lags the failover's commits): reads stop short of the stream's end."""

    stream_id = 7

    def __init__(self, batches, visible_end: int):
        super().__init__(batches)
        self.visible_end = visible_end

    def fetch(self, start, end, max_bytes):
        return super().fetch(start, min(end, self.visible_end), max_bytes)


def test_a_tail_read_that_stops_short_of_the_end_refuses_to_serve():
    """The failure behind a duplicate seen after a failover: a new leader whose tail read
    missed the last batches appended a producer's retry of one of them a second time."""
    log = stored_log([(5, 0)], batches_each=10)
    stream = _LaggingTail(log, visible_end=log[-2].last_offset)  # the last batch is unseen
    with pytest.raises(producer_state.ProducerStateUnavailableError, match="stopped at offset 36"):
        rebuild_producer_state(stream, ProducerStateTable())
    manager = partition_manager.PartitionManager(1, _Storage(stream))
    manager._open_tracked(None, ("t", 0), "topic", 0, 7)
    assert manager.get("t", 0) is None and manager.retrying() == {("t", 0)}
    stream.visible_end = log[-1].last_offset  # the lookup finds the newest object now
    manager._open_tracked(None, ("t", 0), "topic", 0, 7)
    plog = manager.get("t", 0)
    assert plog is not None
    assert plog.producers.check(5, 0, 36, 39) == (ProducerStateTable.DUPLICATE, 36)


def test_a_single_batch_larger_than_the_scan_budget_is_still_known(monkeypatch):
    monkeypatch.setattr(producer_state, "PRODUCER_SCAN_MAX_BYTES", 16 * 1024)
    log = stored_log([(5, 0)], batches_each=30, records=1, value_size=40_000)
    table = ProducerStateTable()
    rebuild_producer_state(FakeStream(log), table)
    assert table.check(5, 0, 29, 29) == (ProducerStateTable.DUPLICATE, log[-1].base_offset)


class _PendingStream:
    """A stream whose appends become durable (or fail) when the test says so."""

    stream_id = 7
    start_offset = 0
    room_wait_s = 30.0

    def __init__(self) -> None:
        self.next_offset = 0
        self.appended: list[tuple[int, Future]] = []
        self.failed: str | None = None

    @property
    def append_offset(self) -> int:
        return self.next_offset + sum(c for c, _ in self.appended)

    def append_at(
        self, base_offset, count, payload, wal_payload=None, payload_crc32c=None
    ) -> Future:
        self.check_writable()
        assert base_offset == self.append_offset
        fut: Future = Future()
        self.appended.append((count, fut))
        return fut

    def check_writable(self) -> None:
        if self.failed:
            raise StorageError(self.failed)

    def check_room(self, size_bytes: int) -> None:
        """Always room: the WAL of these tests never fills."""


def _retry_outcome(plog, data: bytes):
    outcome = plog.append(data)
    assert outcome.error == 0
    return outcome


def test_a_retry_of_a_batch_still_in_flight_is_answered_when_its_original_is_durable():
    """Kafka answers a duplicate only once its original is committed: a retry must not be
    acknowledged while the original may still fail."""
    stream = _PendingStream()
    plog = partition_log.PartitionLog("tid", "t", 0, 1, stream)
    data = client_batch(4, producer=(5, 0, 0))
    first = plog.append(data)
    retry = _retry_outcome(plog, data)
    assert retry.base_offset == first.base_offset == 0
    assert len(stream.appended) == 1  # deduplicated: appended once
    [waits_for] = retry.durable
    assert not waits_for.done()  # not acknowledged before the original
    waits_for.cancel()  # the produce layer gave up on the retry...
    original = stream.appended[0][1]
    assert not original.cancelled()  # ...which leaves the original alone
    original.set_result(0)
    # once durable, a retry is answered at once
    assert _retry_outcome(plog, data).durable == []


def test_a_retry_of_a_batch_whose_append_failed_is_not_acknowledged():
    stream = _PendingStream()
    plog = partition_log.PartitionLog("tid", "t", 0, 1, stream)
    data = client_batch(4, producer=(5, 0, 0))
    plog.append(data)
    retry = _retry_outcome(plog, data)
    stream.appended[0][1].set_exception(StorageError("WAL failed"))
    with pytest.raises(StorageError):
        retry.durable[0].result(1)
    stream.failed = "stream 7 failed: WAL failed"  # as the engine marks it
    with pytest.raises(StorageError):  # the produce layer answers NOT_LEADER_OR_FOLLOWER
        plog.append(data)


def test_a_refused_sequence_is_answered_and_logged(caplog):
    stream = _PendingStream()
    plog = partition_log.PartitionLog("tid", "t", 0, 1, stream)
    plog.append(client_batch(4, producer=(5, 0, 0)))
    with caplog.at_level("WARNING"):
        gap = plog.append(client_batch(4, producer=(5, 0, 8)))  # 4..7 never came
    assert gap.error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert len(stream.appended) == 1
    assert "OUT_OF_ORDER_SEQUENCE_NUMBER for producer 5 epoch 0 sequences 8..11" in caplog.text
    assert "known here: epoch 0 last sequence 3" in caplog.text


def test_a_stream_opened_but_never_served_is_closed_when_its_partition_moves_on():
    """Else it stays open on this node and its new leader's open is refused for good."""
    from types import SimpleNamespace

    log = stored_log([(5, 0)], batches_each=3)
    stream = _LaggingTail(log, visible_end=4)

    class Storage(_Storage):
        closed: list = []

        def close_streams(self, streams):
            self.closed.extend(streams)
            return [None] * len(streams)

    def image(leader: int):
        part = SimpleNamespace(partition=0, leader_node_id=leader, leader_epoch=3, stream_id=7)
        topic = SimpleNamespace(topic_id="t", name="topic", partitions={0: part})
        return SimpleNamespace(topics={"t": topic}, streams={})

    storage = Storage(stream)
    manager = partition_manager.PartitionManager(1, storage)
    reconciled(manager, image(leader=1))  # led here: opened, its tail not readable yet
    assert manager.get("t", 0) is None and storage.closed == []
    reconciled(manager, image(leader=2))  # moved on before it was served
    assert storage.closed == [stream]
    reconciled(manager, image(leader=2))
    assert storage.closed == [stream]  # closed once


def test_a_gap_right_after_the_open_from_a_producer_known_only_from_the_tail_is_not_leader(
    monkeypatch,
):
    """Two pipelined requests straddling the open: the first got NOT_LEADER_OR_FOLLOWER, so
    the second shows a gap. OUT_OF_ORDER_SEQUENCE_NUMBER would make librdkafka bump its
    epoch and renumber possibly-stored messages; NOT_LEADER_OR_FOLLOWER makes it resend
    both in order."""
    stream = _PendingStream()
    plog = partition_log.PartitionLog("tid", "t", 0, 1, stream)
    plog.producers.record(5, 0, 0, 3, 0)  # as rebuilt from the tail
    straddled = plog.append(client_batch(4, producer=(5, 0, 8)))  # 4..7 was refused
    assert straddled.error == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert plog.append(client_batch(4, producer=(5, 0, 4))).error == KafkaError.NONE
    assert plog.append(client_batch(4, producer=(5, 0, 8))).error == KafkaError.NONE
    # once it appended here, a gap is a gap
    gap = plog.append(client_batch(4, producer=(5, 0, 20)))
    assert gap.error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    # and after the grace period, for anyone
    plog.producers.record(6, 0, 0, 3, 100)
    monkeypatch.setattr(partition_log, "OPEN_GRACE_S", 0.0)
    late = plog.append(client_batch(4, producer=(6, 0, 8)))
    assert late.error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_delta_reconciles_only_the_topics_it_touched_and_failed_opens_are_retried():
    """The manager acts on the metadata delta: a partition of an untouched topic is left
    alone (no rescan of every topic); a partition whose open failed stays in the retry set
    until an open succeeds."""
    from types import SimpleNamespace

    from controlplane.errors import ControllerError, ErrorCode

    log = stored_log([(5, 0)], batches_each=1)
    opened: list[int] = []

    class Storage(_Storage):
        refuse = True

        def open_stream(self, stream_id, epoch):
            opened.append(stream_id)
            if stream_id == 8 and self.refuse:
                self.refuse = False
                raise ControllerError(ErrorCode.STREAM_NOT_CLOSED, "still open elsewhere")
            return FakeStream(log)

    def topic(topic_id: str, stream_id: int):
        part = SimpleNamespace(partition=0, leader_node_id=1, leader_epoch=3, stream_id=stream_id)
        return SimpleNamespace(topic_id=topic_id, name=topic_id, partitions={0: part})

    image = SimpleNamespace(topics={"a": topic("a", 7), "b": topic("b", 8)}, streams={})
    manager = partition_manager.PartitionManager(1, Storage(FakeStream(log)))
    reconciled(manager, image, {"a"}, set())  # a delta that touched topic a only
    assert opened == [7] and manager.get("a", 0) is not None and manager.get("b", 0) is None
    reconciled(manager, image, {"b"}, set())
    assert manager.get("b", 0) is None and manager.retrying() == {("b", 0)}
    reconciled(manager, image, {key[0] for key in manager.retrying()}, set())  # the retry
    assert manager.get("b", 0) is not None and not manager.retrying()
    assert opened == [7, 8, 8]  # topic a was never looked at again


def test_a_gap_after_a_log_that_lost_the_producers_last_batches_is_accepted(monkeypatch):
    """A WAL loss cut the producer's last acknowledged batches off the log: the state rebuilt
    from the tail is behind the producer, and its next sequence is a gap the broker created.
    librdkafka fails for good on OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID for a
    batch it has retried (the one in flight at the crash), so the batch is accepted, as Kafka
    accepts any sequence from a producer whose state is gone; within the open grace period it
    is NOT_LEADER_OR_FOLLOWER first (pipelined requests straddling the open)."""
    log = stored_log([(5, 0)], batches_each=3)  # sequences 0..11 survived; 12..19 were lost
    stream = _PendingStream()
    plog = partition_log.PartitionLog("tid", "t", 0, 1, stream)
    rebuild_producer_state(FakeStream(log), plog.producers)
    early = plog.append(client_batch(4, producer=(5, 0, 20)))
    assert early.error == KafkaError.NOT_LEADER_OR_FOLLOWER
    monkeypatch.setattr(partition_log, "OPEN_GRACE_S", 0.0)
    assert plog.append(client_batch(4, producer=(5, 0, 20))).error == KafkaError.NONE
    assert len(stream.appended) == 1
    # from then on its state is this leader's own: in sequence is fine, a gap is a gap
    assert plog.append(client_batch(4, producer=(5, 0, 24))).error == KafkaError.NONE
    real_gap = plog.append(client_batch(4, producer=(5, 0, 40)))
    assert real_gap.error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_producer_in_sequence_after_the_rebuild_keeps_the_ordinary_rules():
    table = ProducerStateTable()
    rebuild_producer_state(FakeStream(stored_log([(5, 0)], batches_each=2)), table)
    assert table.check(5, 0, 8, 11) == (ProducerStateTable.APPEND, 0)
    table.record(5, 0, 8, 11, 8)
    assert table.check(5, 0, 20, 23) == ("error", KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_a_new_producer_whose_first_batch_failed_cannot_skip_it_on_a_new_partition(monkeypatch):
    """A new topic's partition; a producer's first request (sequence 0) failed before it
    reached the partition (its RouterChannel append stalled) while its pipelined second
    request (sequence 4) got through. Accepting that one makes librdkafka report the first
    batch delivered (it acknowledges every message below an accepted sequence), so the
    broker refuses it: the producer resends both in order and nothing is lost."""
    monkeypatch.setattr(partition_log, "OPEN_GRACE_S", 0.0)
    stream = _PendingStream()
    plog = partition_log.PartitionLog("tid", "t", 0, 1, stream)
    rebuild_producer_state(FakeStream([]), plog.producers)  # its first leader: empty
    skipped = plog.append(client_batch(4, producer=(5, 0, 4)))
    assert skipped.error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert stream.appended == []
    assert plog.append(client_batch(4, producer=(5, 0, 0))).error == KafkaError.NONE
    assert plog.append(client_batch(4, producer=(5, 0, 4))).error == KafkaError.NONE
    # a producer that starts at sequence 0 (in any epoch) is simply new
    assert plog.append(client_batch(4, producer=(6, 3, 0))).error == KafkaError.NONE
    assert len(stream.appended) == 3


def test_an_unknown_producer_may_resume_anywhere_where_the_table_may_miss_producers():
    """A log with batches when the table was built (its tail replayed, or compacted), an
    empty log of a later leader (a WAL loss may have taken the producer's batches), or a
    table that evicted producers: an unknown producer's state may be gone, and Kafka
    accepts any sequence from it."""
    lost = ProducerStateTable()
    rebuild_producer_state(FakeStream([], epoch=3), lost)
    assert not lost.knows_every_producer
    assert lost.check(9, 0, 40, 43) == (ProducerStateTable.APPEND, 0)
    table = ProducerStateTable()
    rebuild_producer_state(FakeStream(stored_log([(5, 0)], batches_each=2)), table)
    assert not table.knows_every_producer
    assert table.check(9, 0, 40, 43) == (ProducerStateTable.APPEND, 0)

    full = ProducerStateTable()
    rebuild_producer_state(FakeStream([]), full)
    assert full.knows_every_producer
    assert full.check(9, 0, 40, 43) == ("error", KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER)
    for pid in range(producer_state.MAX_PRODUCERS_PER_PARTITION + 1):
        full.record(pid, 0, 0, 0, pid)
    assert not full.knows_every_producer  # producer 0 was evicted: it may come back
    assert full.check(0, 0, 1, 1) == (ProducerStateTable.APPEND, 0)
