"""A partition opened by a new leader rebuilds idempotent-producer state from the stream's
tail, so a producer retrying a batch the previous leader wrote gets its original offset."""

from __future__ import annotations

from dataplane.kafka import partitions as p
from dataplane.kafka.partitions import ProducerStateTable, rebuild_producer_state
from dataplane.kafka.record_batch import patch_batch
from dataplane.s3stream.records import StreamRecordBatch
from tests.unit.test_kafka_record_batch import client_batch


class FakeStream:
    """The part of `Stream` the rebuild uses, over a list of stored batches."""

    def __init__(self, batches: list[StreamRecordBatch], start_offset: int = 0):
        self.batches = batches
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
    assert table.check(1000, 0, 88, 91)[0] == "error"
    assert table.check(1001, 1, 80, 83) == ("error", 47)


def test_the_scan_is_bounded_in_bytes_for_large_records(monkeypatch):
    monkeypatch.setattr(p, "PRODUCER_SCAN_MAX_BYTES", 64 * 1024)
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
    manager = p.PartitionManager(1, _Storage(stream))
    manager._open(("t", 0), "topic", 0, 7)
    assert manager.get("t", 0) is None and manager._retry
    manager._retry = False
    manager._open(("t", 0), "topic", 0, 7)  # the next reconcile: the tail reads now
    plog = manager.get("t", 0)
    assert plog is not None and not manager._retry
    assert plog.producers.check(5, 0, 8, 11) == (ProducerStateTable.DUPLICATE, 8)


def test_open_and_aborted_transactions_are_rebuilt_from_the_tail():
    """A new leader knows which transactions are still open (the last stable offset stays
    below them) and which were aborted (read_committed fetches report them)."""
    from dataplane.kafka.partitions import TxnIndex
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
