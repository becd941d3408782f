"""`StallWatch`: a broker process stopped past its controller session serves nothing until
a heartbeat sent after the stop succeeds (its state may be stale: fenced, partitions moved)."""

from __future__ import annotations

from dataplane.broker.stall import StallWatch
from dataplane.kafka.partition_manager import PartitionManager


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch_with_session(session_ms: int = 6000) -> tuple[StallWatch, Clock]:
    clock = Clock()
    watch = StallWatch(clock)
    watch.heartbeat_succeeded(clock.now, session_ms)
    return watch, clock


def test_regular_ticks_keep_serving():
    watch, clock = watch_with_session()
    for _ in range(100):
        clock.now += 0.1
        watch.tick()
        assert watch.serving()


def test_a_stop_longer_than_the_session_holds_serving_until_a_later_heartbeat():
    watch, clock = watch_with_session()
    clock.now += 20  # SIGSTOP for 20 s
    assert not watch.serving()  # before the ticker even ran again
    sent_before = clock.now - 0.5  # a heartbeat sent before the stop, answered after it
    watch.tick()
    clock.now += 0.01
    watch.heartbeat_succeeded(sent_before, 6000)
    assert not watch.serving()  # its answer proves nothing about now
    clock.now += 0.1
    watch.tick()
    assert not watch.serving()
    watch.heartbeat_succeeded(clock.now - 0.05, 6000)  # sent after the stall was noticed
    assert watch.serving()


def test_a_stop_shorter_than_the_session_changes_nothing():
    watch, clock = watch_with_session()
    clock.now += 5
    assert watch.serving()
    watch.tick()
    assert watch.serving()


def test_without_a_known_session_nothing_is_held_back():
    clock = Clock()
    watch = StallWatch(clock)
    clock.now += 1000
    watch.tick()
    assert watch.serving()


def test_partitions_are_not_served_while_stalled():
    watch, clock = watch_with_session()
    manager = PartitionManager(1, storage=None, serving=watch.serving)
    manager._logs[("t", 0)] = plog = object()
    assert manager.get("t", 0) is plog
    clock.now += 30
    assert manager.get("t", 0) is None
