"""The shared commit step (dataplane/s3stream/commit.py): a commit whose answer was lost is
neither applied twice nor reported as failed when it was applied — the controller answers
a repeat `idempotent`, and with all answers lost the metadata image tells."""

from __future__ import annotations

import pytest

from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.records import ObjectState
from controlplane.requests import CommitStreamSetObjectRequest
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.s3stream.commit import (
    CommitOutcomeUnknownError,
    Committer,
    ObjectCommitter,
    commit_was_applied,
)
from tests.unit.test_upload_stream_errors import HookedController

BROKER = Committer(node_id=1, node_epoch=0)
ATTEMPTS = 3


@pytest.fixture
def ctrl(tmp_path) -> HookedController:
    c = HookedController(MetadataStateMachine(ControllerSettings(bucket_ids=[0])))
    c.execute(
        "register_broker",
        {
            "node_id": 1,
            "az": "az1",
            "host": "127.0.0.1",
            "kafka_port": 9001,
            "incarnation_id": "i1",
            "wal_uri": (tmp_path / "wal").resolve().as_uri(),
        },
    )
    c.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 0})
    return c


def _upload_commit(
    ctrl: HookedController, commits: ObjectCommitter
) -> CommitStreamSetObjectRequest:
    """A stream opened by node 1 and the commit of 10 records of it in a prepared object."""
    stream_id = ctrl.execute("create_stream", {**BROKER.fields()})["stream_id"]
    ctrl.execute("open_stream", {**BROKER.fields(), "stream_id": stream_id, "stream_epoch": 0})
    prepared = commits.prepare(BROKER, 1, 60_000)
    return CommitStreamSetObjectRequest(
        **BROKER.fields(),
        object_id=prepared.first_object_id,
        order_id=1,
        size_bytes=100,
        bucket_id=prepared.bucket_id,
        stream_ranges=[
            {"stream_id": stream_id, "stream_epoch": 0, "start_offset": 0, "end_offset": 10}
        ],
    )


def _image(ctrl: HookedController) -> MetadataImage:
    return ctrl.machine.image


def test_a_repeat_of_a_commit_whose_answer_was_lost_answers_idempotent(ctrl):
    commits = ObjectCommitter(ctrl, attempts=ATTEMPTS)
    commit = _upload_commit(ctrl, commits)
    ctrl.lose_answer["commit_stream_set_object"] = ATTEMPTS - 1
    assert commits.commit(commit).idempotent
    assert ctrl.calls.count("commit_stream_set_object") == ATTEMPTS
    assert ctrl.machine.image.streams[commit.stream_ranges[0].stream_id].end_offset == 10


def test_every_answer_lost_the_image_tells_the_commit_was_applied(ctrl):
    commits = ObjectCommitter(ctrl, attempts=ATTEMPTS, read_image=lambda: _image(ctrl))
    commit = _upload_commit(ctrl, commits)
    ctrl.lose_answer["commit_stream_set_object"] = ATTEMPTS
    assert commits.commit(commit).idempotent
    assert commit_was_applied(ctrl.machine.image, commit)
    assert ctrl.machine.image.objects[commit.object_id].state == ObjectState.COMMITTED


def test_every_answer_lost_without_an_image_the_commit_fails(ctrl):
    commits = ObjectCommitter(ctrl, attempts=ATTEMPTS)
    commit = _upload_commit(ctrl, commits)
    ctrl.lose_answer["commit_stream_set_object"] = ATTEMPTS
    with pytest.raises(ControllerError) as err:
        commits.commit(commit)
    assert err.value.code == ErrorCode.TIMEOUT


def test_a_refusal_with_no_lost_answer_is_raised_without_reading_the_image(ctrl):
    def no_image() -> MetadataImage:
        raise AssertionError("the image is read only after a lost answer")

    commits = ObjectCommitter(ctrl, attempts=ATTEMPTS, read_image=no_image)
    commit = _upload_commit(ctrl, commits)
    gap = commit.model_copy(
        update={"stream_ranges": [commit.stream_ranges[0].model_copy(update={"start_offset": 5})]}
    )
    with pytest.raises(ControllerError) as err:
        commits.commit(gap)
    assert err.value.code == ErrorCode.STREAM_OFFSET_GAP
    assert ctrl.calls.count("commit_stream_set_object") == 1
    assert not commit_was_applied(ctrl.machine.image, commit)


def test_an_unreadable_image_after_lost_answers_leaves_the_outcome_unknown(ctrl):
    def unreachable() -> MetadataImage:
        raise ControllerError(ErrorCode.NO_LEADER, "no controller leader")

    commits = ObjectCommitter(ctrl, attempts=ATTEMPTS, read_image=unreachable)
    commit = _upload_commit(ctrl, commits)
    ctrl.lose_answer["commit_stream_set_object"] = ATTEMPTS
    with pytest.raises(CommitOutcomeUnknownError):
        commits.commit(commit)
