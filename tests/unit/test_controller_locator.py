"""`ControllerLocator`: a stream's objects, looked up through the controller API; an answer
that falls short of committed offsets (a follower's image lagging the last commits) is asked
again of the leader."""

from __future__ import annotations

from dataplane.s3stream.controller_locator import ControllerLocator


def _obj(object_id: int, start: int, end: int) -> dict:
    return {
        "object_id": object_id,
        "bucket_id": 0,
        "size_bytes": 100,
        "start_offset": start,
        "end_offset": end,
    }


class LaggingController:
    """A follower's image holds the objects up to offset 20; the leader's up to 30."""

    def __init__(self) -> None:
        self.follower = [_obj(1, 0, 10), _obj(2, 10, 20)]
        self.leader = self.follower + [_obj(3, 20, 30)]
        self.asked: list[bool] = []

    def stream_objects(self, stream_id, start, end, limit=100, from_leader=False):
        self.asked.append(from_leader)
        found = self.leader if from_leader else self.follower
        return [o for o in found if o["end_offset"] > start and o["start_offset"] < end][:limit]


def test_a_short_answer_is_asked_again_of_the_leader():
    controller = LaggingController()
    locator = ControllerLocator(controller)
    found = locator.locate(7, 15, 30, 10)
    assert [loc.object_id for loc in found] == [2, 3]
    assert controller.asked == [False, True]
    # the leader's answer is what is cached: a read inside it asks nobody
    assert [loc.object_id for loc in locator.locate(7, 25, 30, 10)] == [3]
    assert controller.asked == [False, True]


def test_a_complete_answer_is_not_asked_again():
    controller = LaggingController()
    locator = ControllerLocator(controller)
    assert [loc.object_id for loc in locator.locate(7, 0, 20, 10)] == [1, 2]
    assert controller.asked == [False]


def test_offsets_nobody_has_yet_stay_unfound():
    """Past the leader's end too: what the leader has is the answer (one extra lookup)."""
    controller = LaggingController()
    locator = ControllerLocator(controller)
    assert [loc.object_id for loc in locator.locate(7, 25, 50, 10)] == [3]
    assert controller.asked == [False, True]


def test_without_a_reachable_leader_the_first_answer_stands():
    """A fetch is not failed (nor held for the client's whole timeout) because the second
    opinion could not be had: a tail read that needs the rest refuses on its own."""
    from controlplane.errors import ControllerError, ErrorCode

    class NoLeader(LaggingController):
        def stream_objects(self, stream_id, start, end, limit=100, from_leader=False):
            if from_leader:
                self.asked.append(True)
                raise ControllerError(ErrorCode.NO_LEADER, "no leader")
            return super().stream_objects(stream_id, start, end, limit)

    controller = NoLeader()
    found = ControllerLocator(controller).locate(7, 15, 30, 10)
    assert [loc.object_id for loc in found] == [2]
    assert controller.asked == [False, True]
