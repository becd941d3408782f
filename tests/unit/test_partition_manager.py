"""The partition manager's passes do not wait for the opens they start: one slow open (a long
producer-state replay, a slow controller) does not hold up the partitions later metadata
deltas give this broker, and a move that comes while an open is in flight is acted on once
it ends."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import StreamMetaState
from controlplane.records import StreamState
from dataplane.kafka import partition_manager
from dataplane.kafka.partition_manager import PartitionManager
from tests.unit.test_producer_state_rebuild import FakeStream, stored_log

WAIT_S = 10.0  # bound of every wait below; a passing run waits far less


def topic(topic_id: str, stream_id: int, leader: int = 1, epoch: int = 3) -> SimpleNamespace:
    part = SimpleNamespace(
        partition=0, leader_node_id=leader, leader_epoch=epoch, stream_id=stream_id
    )
    return SimpleNamespace(topic_id=topic_id, name=topic_id, partitions={0: part})


def image_of(*topics: SimpleNamespace, streams: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(topics={t.topic_id: t for t in topics}, streams=streams or {})


def delta(topics: set[str] = frozenset(), streams: set[int] = frozenset()) -> SimpleNamespace:
    return SimpleNamespace(touched={"topics": set(topics), "streams": set(streams)})


class GatedStorage:
    """Opens of the streams in `gated` at epoch 3 wait for `release`; every call is recorded."""

    def __init__(self, gated: set[int]):
        self.gated = gated
        self.release = threading.Event()
        self.open_started: dict[int, threading.Event] = {}
        self.open_epochs: dict[int, list[int]] = {}
        self.opened: dict[int, threading.Event] = {}
        self.closed: list[int] = []
        self.closed_event = threading.Event()
        self.orphan_closes: list[int] = []
        self.registered: set[int] = set()
        self._lock = threading.Lock()

    def _event(self, events: dict[int, threading.Event], stream_id: int) -> threading.Event:
        with self._lock:
            return events.setdefault(stream_id, threading.Event())

    def open_stream(self, stream_id: int, epoch: int) -> FakeStream:
        with self._lock:
            self.open_epochs.setdefault(stream_id, []).append(epoch)
        self._event(self.open_started, stream_id).set()
        if stream_id in self.gated and epoch == 3:
            assert self.release.wait(3 * WAIT_S)  # longer than any wait of the test
        stream = FakeStream(stored_log([(5, 0)], batches_each=1), epoch=epoch)
        stream.stream_id = stream_id
        with self._lock:
            self.registered.add(stream_id)
        self._event(self.opened, stream_id).set()
        return stream

    def open_stream_ids(self) -> set[int]:
        with self._lock:
            return set(self.registered)

    def close_streams(self, streams) -> list:
        with self._lock:
            for s in streams:
                self.closed.append(s.stream_id)
                self.registered.discard(s.stream_id)
        self.closed_event.set()
        return [None] * len(streams)

    def close_orphan_stream(self, stream_id: int, epoch: int) -> None:
        self.orphan_closes.append(stream_id)


def wait_until(condition, what: str) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


def test_a_slow_open_does_not_hold_up_a_partition_a_later_delta_brings():
    storage = GatedStorage(gated={7})
    manager = PartitionManager(1, storage)
    manager.start()
    try:
        manager.on_metadata(None, image_of(topic("a", 7)))
        assert storage._event(storage.open_started, 7).wait(WAIT_S)  # a's open hangs
        manager.on_metadata(delta(topics={"b"}), image_of(topic("a", 7), topic("b", 8)))
        # b is served while a's open still waits (before: the pass waited for a first)
        wait_until(lambda: manager.get("b", 0) is not None, "b served")
        assert manager.get("a", 0) is None
        storage.release.set()
        wait_until(lambda: manager.get("a", 0) is not None, "a served")
    finally:
        storage.release.set()
        manager.stop()


def test_a_move_during_an_open_is_acted_on_when_the_open_ends():
    """Partition a moves to broker 2 and back (a newer epoch) while its open here is in
    flight: the passes in between neither open it a second time nor close its stream as an
    orphan under the open; once the open ends, the old epoch is closed (uploaded) and the
    new one opened and served. Topics b and c, each new in one of those deltas, show that
    the delta's pass has run."""
    storage = GatedStorage(gated={7})
    manager = PartitionManager(1, storage)
    manager.start()
    try:
        manager.on_metadata(None, image_of(topic("a", 7)))
        assert storage._event(storage.open_started, 7).wait(WAIT_S)
        # the controller still has stream 7 open by this node at epoch 3
        open_here_at_3 = {
            7: StreamMetaState(
                stream_id=7,
                epoch=3,
                state=StreamState.OPENED,
                node_id=1,
                tags={"topic": "a", "topic_id": "a", "partition": "0"},
            )
        }
        moved = image_of(topic("a", 7, leader=2, epoch=4), topic("b", 8), streams=open_here_at_3)
        manager.on_metadata(delta(topics={"a", "b"}, streams={7}), moved)
        wait_until(lambda: manager.get("b", 0) is not None, "the pass of the move")
        assert storage.orphan_closes == []
        back = image_of(
            topic("a", 7, epoch=5), topic("b", 8), topic("c", 9), streams=open_here_at_3
        )
        manager.on_metadata(delta(topics={"a", "c"}, streams={7}), back)
        wait_until(lambda: manager.get("c", 0) is not None, "the pass of the move back")
        assert storage.open_epochs[7] == [3]  # no second open of stream 7 under the first
        storage.release.set()
        # (epoch 3 may be served for a moment: the open ended, the pass that closes it not)
        wait_until(
            lambda: (plog := manager.get("a", 0)) is not None and plog.leader_epoch == 5,
            "a served at epoch 5",
        )
        assert storage.open_epochs[7] == [3, 5]
        assert storage.closed == [7]  # epoch 3 closed before epoch 5 opened
        assert storage.orphan_closes == []
    finally:
        storage.release.set()
        manager.stop()


def test_an_open_that_raises_is_logged_and_retried(caplog):
    class Failing(GatedStorage):
        failures = 1

        def open_stream(self, stream_id, epoch):
            if self.failures:
                self.failures -= 1
                raise OSError("disk gone")
            return super().open_stream(stream_id, epoch)

    storage = Failing(gated=set())
    manager = PartitionManager(1, storage)
    with caplog.at_level(logging.ERROR, logger="dataplane.kafka.partition_manager"):
        for opened in manager.reconcile(image_of(topic("a", 7))):
            opened.result()  # the error stays inside the open
    assert manager.get("a", 0) is None and manager.retrying() == {("a", 0)}
    assert "opening a-0 (stream 7) failed" in caplog.text
    for opened in manager.reconcile(image_of(topic("a", 7)), {"a"}, set()):
        opened.result()
    assert manager.get("a", 0) is not None and not manager.retrying()


def test_a_partition_not_served_yet_that_moves_during_its_retry_is_closed_once():
    """Its first open could not rebuild the producer state (not served; the stream stays
    open here and is retried). The partition moves to broker 2 while the retry's open is in
    flight: its stream is not closed (as unserved) under that open, but once, after it (the
    retry served it, so as a partition that moved)."""

    class TailFailsOnce(GatedStorage):
        def open_stream(self, stream_id, epoch):
            stream = super().open_stream(stream_id, epoch)
            if len(self.open_epochs[stream_id]) == 1:
                stream.fetch = lambda *a: (_ for _ in ()).throw(OSError("store unavailable"))
            return stream

    storage = TailFailsOnce(gated=set())
    manager = PartitionManager(1, storage)
    led = image_of(topic("a", 7))
    for opened in manager.reconcile(led):
        opened.result()
    assert manager.get("a", 0) is None and manager.retrying() == {("a", 0)}
    storage.gated.add(7)  # the retry's open hangs
    retry = manager.reconcile(led, {"a"}, set())
    wait_until(lambda: len(storage.open_epochs[7]) == 2, "the retry's open started")
    for opened in manager.reconcile(image_of(topic("a", 7, leader=2, epoch=4)), {"a"}, set()):
        opened.result()
    assert storage.closed == []  # not under the open in flight
    storage.release.set()
    for opened in retry:
        opened.result()
    for opened in manager.reconcile(image_of(topic("a", 7, leader=2, epoch=4)), {"a"}, set()):
        opened.result()
    assert storage.closed == [7] and manager.get("a", 0) is None


def test_an_open_queued_behind_others_is_not_started_once_the_partition_moved(monkeypatch):
    """With every worker busy, an open waits in the pool's queue; if the partition moved to
    another broker meanwhile, it is not opened here at all (its new leader would wait for
    this node to close it again)."""
    monkeypatch.setattr(partition_manager, "MOVE_WORKERS", 1)
    storage = GatedStorage(gated={7})
    manager = PartitionManager(1, storage)
    both = image_of(topic("a", 7), topic("b", 8))
    manager.on_metadata(None, both)
    opens = manager.reconcile(both)  # a's open takes the one worker; b's waits behind it
    assert storage._event(storage.open_started, 7).wait(WAIT_S)
    manager.on_metadata(delta(topics={"b"}), image_of(topic("a", 7), topic("b", 8, leader=2)))
    storage.release.set()
    for opened in opens:
        opened.result()
    assert 8 not in storage.open_epochs
    assert manager.get("a", 0) is not None and manager.get("b", 0) is None
    assert manager.led_or_closing() == 1


def test_a_slow_abort_retry_of_a_partition_is_not_queued_again_each_round():
    """Recording a partition's aborts hangs on a slow controller: the rounds after do not
    queue more retries of it (they would fill the pool the opens need)."""
    release, calls = threading.Event(), []

    def record_pending_aborts() -> None:
        calls.append(1)
        assert release.wait(3 * WAIT_S)

    manager = PartitionManager(1, GatedStorage(gated=set()))
    stuck = SimpleNamespace(has_unrecorded_aborts=True, record_pending_aborts=record_pending_aborts)
    manager._logs[("a", 0)] = stuck
    try:
        for _ in range(5):  # five rounds of the manager's loop
            manager._retry_unrecorded_aborts()
        wait_until(lambda: calls, "the first retry running")
        release.set()
        manager._pool.shutdown(wait=True)  # runs whatever was queued
        assert calls == [1]
    finally:
        release.set()
        manager.stop()


class _RefusedOnce(logging.Handler):
    """On the log line of a refused open, runs one more pass of the manager (a metadata
    batch that touched only topic b, in the same image) and waits for it to end: the pass
    comes while the refused open is still in flight."""

    def __init__(self, manager: PartitionManager, image: SimpleNamespace) -> None:
        super().__init__(logging.INFO)
        self.manager, self.image = manager, image
        self.passed = threading.Event()
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.fired or not record.getMessage().startswith("cannot open a-0 yet"):
            return
        self.fired = True
        reconcile = self.manager.reconcile

        def once_more(*args, **kwargs):
            try:
                return reconcile(*args, **kwargs)
            finally:
                self.passed.set()

        self.manager.reconcile = once_more  # the manager's own thread runs the pass
        self.manager.on_metadata(delta(topics={"b"}), self.image)
        assert self.passed.wait(WAIT_S)


def test_a_refused_open_is_retried_though_a_pass_ran_while_it_was_in_flight():
    """The controller refuses a's first open (its stream is still open on its previous
    leader); a pass that runs before that open has ended must not swallow its retry: a is
    opened again and served (before: the pass took the retry set, skipped a as in flight,
    and a waited for the next metadata change, minutes in the failed chaos run)."""

    class RefusedOnce(GatedStorage):
        def open_stream(self, stream_id: int, epoch: int) -> FakeStream:
            if stream_id == 7 and not self.open_epochs.get(7):
                self.open_epochs[7] = [epoch]
                raise ControllerError(ErrorCode.STREAM_NOT_CLOSED, "still open on node 2")
            return super().open_stream(stream_id, epoch)

    storage = RefusedOnce(gated=set())
    manager = PartitionManager(1, storage)
    image = image_of(topic("a", 7), topic("b", 8))
    handler = _RefusedOnce(manager, image)
    logger = logging.getLogger(partition_manager.__name__)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    manager.start()
    try:
        manager.on_metadata(None, image)
        wait_until(lambda: handler.passed.is_set(), "the pass during the refused open")
        wait_until(lambda: manager.get("a", 0) is not None, "a served after its retry")
        assert storage.open_epochs[7] == [3, 3]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        manager.stop()
