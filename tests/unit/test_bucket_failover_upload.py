"""Uploads in object-storage failover: a round stuck on the main bucket is redone whole,
with fresh object ids, in the bucket writes switched to; nothing is committed twice.

Same in-process fakes as tests/unit/test_upload_stream_errors.py (the real state machine
behind the controller client, a dict as the object store, a real WAL)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from controlplane.records import ObjectState
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from tests.unit.test_upload_stream_errors import (
    FakeObjects,
    HookedController,
    append,
    committed_streams,
    crash,
    make_engine,
)


class HangingBucket(FakeObjects):
    """Puts to `dead` never answer (a frozen store) until `release()`."""

    def __init__(self, dead: int) -> None:
        super().__init__()
        self.dead = dead
        self.hung: list[Future] = []

    def put_object_async(self, bucket_id: int, key: str, data: bytes, **kw) -> Future:
        if bucket_id == self.dead:
            f: Future = Future()
            self.hung.append(f)
            return f
        return super().put_object_async(bucket_id, key, data, **kw)

    def release(self) -> None:
        for f in self.hung:
            if not f.done():
                f.set_result(None)


def test_an_upload_stuck_on_the_main_bucket_is_redone_whole_in_the_failover_bucket(tmp_path):
    ctrl = HookedController(MetadataStateMachine(ControllerSettings(bucket_ids=[0, 1])))
    ctrl.execute(
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
    ctrl.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 0})
    objects = HangingBucket(dead=0)
    engine = make_engine(
        ctrl, objects, tmp_path / "node1", active_bucket=lambda: ctrl.machine.image.active_bucket_id
    )
    try:
        s = engine.open_stream(engine.create_stream(), 0)
        append(s, 30)  # acknowledged from the WAL although no bucket took anything yet
        done = threading.Event()
        errors: list[BaseException] = []

        def flush() -> None:
            try:
                engine.flush()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            done.set()

        threading.Thread(target=flush, daemon=True).start()
        assert not done.wait(1.0)  # stuck on bucket 0
        assert objects.hung
        ctrl.execute("set_active_bucket", {"bucket_id": 1, "auto": True, "reason": "test"})
        assert done.wait(10), "the upload did not move to bucket 1"
        assert not errors, errors
        image = ctrl.machine.image
        assert image.streams[s.stream_id].end_offset == 30  # committed once, all of it
        committed = [o for o in image.objects.values() if o.state == ObjectState.COMMITTED]
        assert committed and {o.bucket_id for o in committed} == {1}
        abandoned = [o for o in image.objects.values() if o.bucket_id == 0]
        # the abandoned round's ids are never committed: they expire at their deadline
        assert abandoned and all(o.state == ObjectState.PREPARED for o in abandoned)
        assert committed_streams(ctrl, objects) == {s.stream_id}
        objects.release()  # the frozen store wakes up: changes nothing committed
        append(s, 5)
        engine.flush()
        assert ctrl.machine.image.streams[s.stream_id].end_offset == 35
    finally:
        objects.release()
        crash(engine)
