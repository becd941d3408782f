"""Uploads never wedge: per-stream classification of commit refusals (issue #10).

The storage engine runs against in-process fakes: the controller is the real
`MetadataStateMachine` behind a `ControllerClient` stand-in (same validation as the quorum,
with hooks to interleave metadata changes and to lose answers), the object store a dict with
failure injection, the WAL a real `FileWAL` in tmp_path.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError, ErrorCode
from controlplane.records import ObjectState
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.config import StorageConfig, WALConfig
from dataplane.formats.object_format import parse_object
from dataplane.objectstore import ObjectStoreUnavailableError, object_key
from dataplane.s3stream.storage import S3Storage
from dataplane.s3stream.uploader import (
    StorageError,
    data_lost,
    is_retriable_upload_error,
    permanent_stream_errors,
)
from dataplane.s3stream.wal_failover import recover_failed_wal

NOW_MS = 1_000_000
# the WAL pads each group commit to 4 KiB: after a full trim at most the last padding is used
WAL_ALIGN_BYTES = 4096


class HookedController(ControllerCalls):
    """A controller client over a real state machine, in this process, with hooks.

    `before[command]`: called before a command is applied (to change metadata in between);
    `lose_answer[command]`: how many more times to apply the command and then answer TIMEOUT
    (a commit that landed but whose answer was lost). Thread-safe (one lock).
    """

    def __init__(self, machine: MetadataStateMachine):
        self.machine = machine
        self.calls: list[str] = []
        self.before: dict[str, Callable[[], None]] = {}
        self.lose_answer: dict[str, int] = {}
        self._lock = threading.RLock()

    def execute(self, command: str, body: dict) -> dict:
        """Run a command directly (test setup); raises on refusal like the client."""
        with self._lock:
            result = self.machine.execute(command, json.loads(json.dumps(body)), NOW_MS)
        if "error" in result:
            err = result["error"]
            raise ControllerError(
                ErrorCode(err["code"]),
                err["message"],
                ControllerError.parse_stream_errors(err.get("stream_errors")),
            )
        return result["result"]

    def call(self, command: str, body, timeout_s: float | None = None) -> dict:
        if not isinstance(body, dict):
            body = body.model_dump(mode="json")
        with self._lock:
            self.calls.append(command)
            hook = self.before.pop(command, None)
            if hook is not None:
                hook()
            result = self.execute(command, body)
            if self.lose_answer.get(command, 0) > 0:
                self.lose_answer[command] -= 1
                raise ControllerError(ErrorCode.TIMEOUT, f"{command}: answer lost")
            return result

    def stream(self, stream_id: int) -> dict:
        with self._lock:
            s = self.machine.image.streams.get(stream_id)
            if s is None:
                raise ControllerError(ErrorCode.UNKNOWN_STREAM, f"no stream {stream_id}")
            return {
                **s.model_dump(mode="json", exclude={"object_ranges"}),
                "end_offset": s.end_offset,
            }

    def stream_objects(
        self, stream_id: int, start: int, end: int, limit: int = 100, from_leader: bool = False
    ) -> list:
        return []


class FakeObjects:
    """`ObjectStorage` stand-in: a dict, with `fail_puts` transient failures to inject."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, str], bytes] = {}
        self.fail_puts = 0
        self._lock = threading.Lock()

    def put_object_async(self, bucket_id: int, key: str, data: bytes, **_) -> Future:
        f: Future = Future()
        with self._lock:
            if self.fail_puts > 0:
                self.fail_puts -= 1
                f.set_exception(ObjectStoreUnavailableError("503 SlowDown (injected)"))
                return f
            self.data[(bucket_id, key)] = bytes(data)
        f.set_result(None)
        return f


@pytest.fixture
def ctrl(tmp_path) -> HookedController:
    c = HookedController(MetadataStateMachine(ControllerSettings(bucket_ids=[0])))
    for node in (1, 2):
        wal_uri = (tmp_path / f"node{node}" / "wal").resolve().as_uri()
        c.execute(
            "register_broker",
            {
                "node_id": node,
                "az": "az1",
                "host": "127.0.0.1",
                "kafka_port": 9000 + node,
                "incarnation_id": f"i{node}",
                "wal_uri": wal_uri,
            },
        )
        c.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0})
    return c


def make_engine(
    ctrl: HookedController,
    objects: FakeObjects,
    data_dir: Path,
    node_id: int = 1,
    active_bucket: Callable[[], int | None] | None = None,
    **config,
) -> S3Storage:
    cfg = StorageConfig(
        **{
            "upload_interval_s": 3600,
            "upload_threshold_bytes": 1 << 30,
            "upload_attempts": 3,
            **config,
        },
    )
    wal = WALConfig(capacity_bytes=16 << 20)
    engine = S3Storage(
        cfg, node_id, 0, ctrl, objects, data_dir=data_dir, wal=wal, active_bucket=active_bucket
    )
    engine.start()
    return engine


def append(stream, count: int, size: int = 100) -> None:
    for f in [stream.append(b"%d:" % stream.stream_id + b"x" * size) for _ in range(count)]:
        f.result(timeout=10)


def committed_streams(ctrl: HookedController, objects: FakeObjects) -> set[int]:
    """Streams whose data is inside a committed object (from the objects' own indexes).
    Objects of refused rounds stay PREPARED: the controller destroys them at the deadline."""
    committed = [o for o in ctrl.machine.image.objects.values() if o.state == ObjectState.COMMITTED]
    return {
        e.stream_id
        for o in committed
        for e in parse_object(objects.data[(o.bucket_id, object_key(o.object_id))])[1]
    }


@pytest.fixture
def engine_env(ctrl, tmp_path):
    objects = FakeObjects()
    engine = make_engine(ctrl, objects, tmp_path / "node1")
    try:
        yield ctrl, objects, engine
    finally:
        crash(engine)


def crash(engine: S3Storage) -> None:
    """Stop an engine without its final upload (as a crash would)."""
    engine._stop.set()
    engine.request_upload()
    engine._uploader.join(10)
    engine.wal.close()


# ---------------------------------------------------------------- pure classification


def test_only_per_stream_permanent_refusals_name_streams_to_leave_out():
    refused = ControllerError(
        ErrorCode.UNKNOWN_STREAM, "gone", {3: ErrorCode.UNKNOWN_STREAM, 5: ErrorCode.STREAM_FENCED}
    )
    assert permanent_stream_errors(refused) == {
        3: ErrorCode.UNKNOWN_STREAM,
        5: ErrorCode.STREAM_FENCED,
    }
    # about the whole upload: no stream is to blame
    for exc in (
        ControllerError(ErrorCode.NODE_FENCED, "node"),
        ControllerError(ErrorCode.TIMEOUT, "slow"),
        ControllerError(ErrorCode.UNKNOWN_STREAM, "old controller, no details"),
        ObjectStoreUnavailableError("503"),
        OSError("reset"),
    ):
        assert permanent_stream_errors(exc) == {}
    # a stream code the engine does not know to be permanent: not guessed
    assert (
        permanent_stream_errors(
            ControllerError(
                ErrorCode.UNKNOWN_STREAM,
                "x",
                {1: ErrorCode.UNKNOWN_STREAM, 2: ErrorCode.OBJECT_NOT_PREPARED},
            )
        )
        == {}
    )
    assert is_retriable_upload_error(ObjectStoreUnavailableError("timeout"))
    assert is_retriable_upload_error(ControllerError(ErrorCode.NO_LEADER, "election"))
    assert not is_retriable_upload_error(ControllerError(ErrorCode.UNKNOWN_STREAM, "gone"))


def test_data_lost_only_for_a_gap_the_committed_end_does_not_cover():
    assert not data_lost(ErrorCode.UNKNOWN_STREAM, None, 10)
    assert not data_lost(ErrorCode.STREAM_FENCED, None, 10)
    assert not data_lost(ErrorCode.STREAM_NOT_OPENED, None, 10)
    assert not data_lost(ErrorCode.STREAM_OFFSET_GAP, 10, 10)  # committed by a lost answer
    assert data_lost(ErrorCode.STREAM_OFFSET_GAP, 5, 10)
    assert data_lost(ErrorCode.STREAM_OFFSET_GAP, None, 10)  # unknown: assume the worst


def test_error_stream_details_survive_the_wire_format():
    exc = ControllerError(ErrorCode.STREAM_FENCED, "m", {7: ErrorCode.STREAM_FENCED})
    err = json.loads(json.dumps(exc.to_dict()))["error"]
    assert ControllerError.parse_stream_errors(err["stream_errors"]) == {7: ErrorCode.STREAM_FENCED}
    assert "stream_errors" not in ControllerError(ErrorCode.TIMEOUT, "t").to_dict()["error"]
    assert ControllerError.parse_stream_errors({"x": "UNKNOWN_STREAM", "2": "NEW_CODE"}) == {}


# ---------------------------------------------------------------- controller


def test_commit_refusal_names_every_refused_stream_and_applies_nothing(ctrl):
    ids = [
        ctrl.execute("create_stream", {"node_id": 1, "node_epoch": 0})["stream_id"]
        for _ in range(3)
    ]
    for sid in ids:
        ctrl.execute(
            "open_stream", {"node_id": 1, "node_epoch": 0, "stream_id": sid, "stream_epoch": 0}
        )
    ctrl.execute(
        "delete_stream", {"node_id": 1, "node_epoch": 0, "stream_id": ids[0], "stream_epoch": 0}
    )
    ctrl.execute(
        "close_stream", {"node_id": 1, "node_epoch": 0, "stream_id": ids[2], "stream_epoch": 0}
    )
    ctrl.execute(
        "open_stream", {"node_id": 2, "node_epoch": 0, "stream_id": ids[2], "stream_epoch": 1}
    )
    oid = ctrl.execute(
        "prepare_objects", {"node_id": 1, "node_epoch": 0, "count": 1, "ttl_ms": 60_000}
    )["first_object_id"]
    before = (ctrl.machine.image.fingerprint(), ctrl.machine.next_offset)
    with pytest.raises(ControllerError) as refused:
        ctrl.execute(
            "commit_stream_set_object",
            {
                "node_id": 1,
                "node_epoch": 0,
                "object_id": oid,
                "order_id": 1,
                "size_bytes": 10,
                "bucket_id": 0,
                "stream_ranges": [
                    {"stream_id": sid, "stream_epoch": 0, "start_offset": 0, "end_offset": 5}
                    for sid in ids
                ],
            },
        )
    assert refused.value.code == ErrorCode.UNKNOWN_STREAM  # the first refused stream's
    assert refused.value.stream_errors == {
        ids[0]: ErrorCode.UNKNOWN_STREAM,
        ids[2]: ErrorCode.STREAM_FENCED,
    }
    assert (ctrl.machine.image.fingerprint(), ctrl.machine.next_offset) == before


# ---------------------------------------------------------------- engine


def test_deleted_stream_is_left_out_and_its_wal_space_reclaimed(engine_env):
    ctrl, objects, engine = engine_env
    gone = engine.open_stream(engine.create_stream(), 0)
    live = engine.open_stream(engine.create_stream(), 0)
    append(gone, 20)
    append(live, 20)
    ctrl.execute(
        "delete_stream",
        {"node_id": 1, "node_epoch": 0, "stream_id": gone.stream_id, "stream_epoch": 0},
    )
    engine.flush()  # the old engine raised UNKNOWN_STREAM here, on every retry, forever
    image = ctrl.machine.image
    assert image.streams[live.stream_id].end_offset == 20
    assert committed_streams(ctrl, objects) == {live.stream_id}  # rebuilt without the deleted data
    assert engine.wal.used_bytes < WAL_ALIGN_BYTES
    stats = engine.upload_stats()
    assert stats.last_upload_error is None and stats.upload_lag_s == 0
    assert ctrl.calls.count("commit_stream_set_object") == 2
    with pytest.raises(StorageError):
        gone.append(b"late")
    gone.close()  # a deleted stream closes without an error
    append(live, 5)  # the healthy stream goes on
    engine.flush()
    assert ctrl.machine.image.streams[live.stream_id].end_offset == 25  # a new image per command


def test_streams_fenced_or_deleted_in_one_upload_cost_one_extra_round(engine_env):
    ctrl, objects, engine = engine_env
    deleted, fenced, healthy = (engine.open_stream(engine.create_stream(), 0) for _ in range(3))
    for s in (deleted, fenced, healthy):
        append(s, 10)
    ctrl.execute(
        "delete_stream",
        {"node_id": 1, "node_epoch": 0, "stream_id": deleted.stream_id, "stream_epoch": 0},
    )
    # `fenced` moved on: closed on our behalf (as a WAL failover does) and reopened by node 2
    ctrl.execute(
        "close_stream",
        {"node_id": 1, "node_epoch": 0, "stream_id": fenced.stream_id, "stream_epoch": 0},
    )
    ctrl.execute(
        "open_stream",
        {"node_id": 2, "node_epoch": 0, "stream_id": fenced.stream_id, "stream_epoch": 1},
    )
    engine.flush()
    assert ctrl.calls.count("commit_stream_set_object") == 2
    image = ctrl.machine.image
    assert image.streams[healthy.stream_id].end_offset == 10
    assert image.streams[fenced.stream_id].end_offset == 0  # not ours to extend any more
    assert committed_streams(ctrl, objects) == {healthy.stream_id}
    assert engine.wal.used_bytes < WAL_ALIGN_BYTES and engine.upload_error is None
    with pytest.raises(StorageError):
        fenced.append(b"x")
    # data of the left-out streams that arrives later is not offered to the controller again
    calls = len(ctrl.calls)
    append(healthy, 3)
    engine.flush()
    assert ctrl.calls[calls:].count("commit_stream_set_object") == 1


def test_transient_failures_keep_the_data_and_report_the_error(engine_env):
    ctrl, objects, engine = engine_env
    s = engine.open_stream(engine.create_stream(), 0)
    append(s, 10)
    objects.fail_puts = 2  # within the bounded retries of one upload
    engine.flush()
    assert ctrl.machine.image.streams[s.stream_id].end_offset == 10
    append(s, 10)
    objects.fail_puts = 100  # more than upload_attempts: this upload fails
    with pytest.raises(ObjectStoreUnavailableError):
        engine.flush()
    stats = engine.upload_stats()
    assert "503" in stats.last_upload_error
    assert stats.wal_used_bytes > 0 and stats.upload_lag_s > 0
    append(s, 1)  # retriable for the whole upload: nothing is left out, the stream writes
    objects.fail_puts = 0
    engine.flush()
    assert ctrl.machine.image.streams[s.stream_id].end_offset == 21
    assert engine.upload_stats().last_upload_error is None
    assert engine.upload_stats().upload_lag_s == 0 and engine.wal.used_bytes < WAL_ALIGN_BYTES


def test_a_commit_applied_with_its_answer_lost_is_not_committed_twice(engine_env):
    ctrl, _, engine = engine_env
    s = engine.open_stream(engine.create_stream(), 0)
    other = engine.open_stream(engine.create_stream(), 0)
    append(s, 10)
    ctrl.lose_answer["commit_stream_set_object"] = 3  # = upload_attempts: the upload fails
    with pytest.raises(ControllerError):
        engine.flush()
    assert ctrl.machine.image.streams[s.stream_id].end_offset == 10  # it did land
    append(other, 4)
    # the retry prepares new objects; the controller refuses s (already at its end) with a
    # gap: s is left out without losing anything, `other` is committed, nothing twice
    engine.flush()
    image = ctrl.machine.image
    assert image.streams[s.stream_id].end_offset == 10
    assert image.streams[other.stream_id].end_offset == 4
    assert sorted(
        rg.stream_id for sso in image.stream_set_objects.values() for rg in sso.ranges
    ) == sorted([s.stream_id, other.stream_id])
    assert engine.wal.used_bytes < WAL_ALIGN_BYTES and engine.upload_error is None
    append(s, 2)  # s was not broken by it
    engine.flush()
    assert ctrl.machine.image.streams[s.stream_id].end_offset == 12


def test_wal_failover_leaves_out_a_stream_deleted_mid_way(ctrl, tmp_path):
    objects = FakeObjects()
    failed = make_engine(ctrl, objects, tmp_path / "node1")
    gone = failed.open_stream(failed.create_stream(), 0)
    kept = failed.open_stream(failed.create_stream(), 0)
    append(gone, 10)
    append(kept, 10)
    crash(failed)  # nothing uploaded: node 1's WAL holds both streams
    ctrl.execute("fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "test crash"})
    ctrl.execute("lifecycle_tick", {"expired_brokers": []})  # plans node 1's WAL failover
    wal = ctrl.machine.image.node_wals[1]
    assert wal.failover_mode and wal.failover_target_node_id == 2
    target = make_engine(ctrl, objects, tmp_path / "node2", node_id=2)
    try:
        # the topic of `gone` is deleted after the target looked at it, before its commit
        ctrl.before["commit_stream_set_object"] = lambda: ctrl.execute(
            "delete_stream",
            {"node_id": 2, "node_epoch": 0, "stream_id": gone.stream_id, "stream_epoch": 0},
        )

        def open_streams() -> list[tuple[int, int]]:
            return sorted(
                (s.stream_id, s.epoch)
                for s in ctrl.machine.image.streams.values()
                if s.state.value == "opened" and s.node_id == 1
            )

        result = recover_failed_wal(target, 1, wal.wal_uri, wal.node_epoch, open_streams)
        assert gone.stream_id in result.skipped_streams
        assert result.batches_uploaded == 10
        image = ctrl.machine.image
        assert image.streams[kept.stream_id].end_offset == 10
        assert gone.stream_id not in image.streams
        assert not image.node_wals[1].failover_mode  # the failover completed
    finally:
        crash(target)


def test_a_wal_failover_that_failed_half_way_is_retried_to_its_end(ctrl, tmp_path):
    """The target took the WAL over, uploaded and trimmed it, then a controller call
    failed: the retry (same node, same failover epoch, as the broker's failover loop does)
    takes the WAL again and completes the failover; nothing is uploaded twice."""
    objects = FakeObjects()
    failed = make_engine(ctrl, objects, tmp_path / "node1")
    s = failed.open_stream(failed.create_stream(), 0)
    append(s, 10)
    crash(failed)
    ctrl.execute("fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "test crash"})
    ctrl.execute("lifecycle_tick", {"expired_brokers": []})
    wal = ctrl.machine.image.node_wals[1]
    target = make_engine(ctrl, objects, tmp_path / "node2", node_id=2)

    def open_streams() -> list[tuple[int, int]]:
        return sorted(
            (st.stream_id, st.epoch)
            for st in ctrl.machine.image.streams.values()
            if st.state.value == "opened" and st.node_id == 1
        )

    def controller_unreachable() -> None:
        raise ControllerError(ErrorCode.TIMEOUT, "close_stream: no answer")

    try:
        ctrl.before["close_stream"] = controller_unreachable  # one-shot
        with pytest.raises(ControllerError):
            recover_failed_wal(target, 1, wal.wal_uri, wal.node_epoch, open_streams)
        assert ctrl.machine.image.node_wals[1].failover_mode
        result = recover_failed_wal(target, 1, wal.wal_uri, wal.node_epoch, open_streams)
        assert result.batches_uploaded == 0  # the first attempt uploaded and trimmed them
        image = ctrl.machine.image
        assert image.streams[s.stream_id].end_offset == 10
        assert not image.node_wals[1].failover_mode
    finally:
        crash(target)


def test_upload_lag_grows_while_data_waits(engine_env):
    _, _, engine = engine_env
    s = engine.open_stream(engine.create_stream(), 0)
    assert engine.upload_stats().upload_lag_s == 0
    append(s, 1)
    time.sleep(0.05)
    stats = engine.upload_stats()
    assert stats.upload_lag_s >= 0.05 and stats.wal_used_bytes > 0
    assert stats.wal_capacity_bytes == 16 << 20


class ReadingObjects(FakeObjects):
    """Puts read their body through its reader in a thread of their own (as the store's
    pool does), so a paced body is sent at its pace; `reading` is set at the first read."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()

    def put_object_async(self, bucket_id: int, key: str, data, **_) -> Future:
        f: Future = Future()

        def put() -> None:
            reader = data.reader()
            got = bytearray()
            while chunk := reader.read(4096):
                self.reading.set()
                got += chunk
            with self._lock:
                self.data[(bucket_id, key)] = bytes(got)
            f.set_result(None)

        threading.Thread(target=put, daemon=True).start()
        return f


def test_a_flush_does_not_wait_for_the_pace_of_a_regular_upload(ctrl, tmp_path):
    """An upload sent at a pace (here 8 KiB/s: the 1 MB of its 2 MB past the first MiB
    would take two minutes); a flush asked for meanwhile (a stream close, a shutdown)
    unpaces it and uploads the rest at once: everything appended is committed long before
    the pace would allow."""
    from dataplane.objectstore import SendPace

    objects = ReadingObjects()
    engine = make_engine(ctrl, objects, tmp_path / "node1")  # no regular upload of its own
    try:
        stream = engine.open_stream(engine.create_stream(), 0)
        append(stream, 2000, size=1000)
        paced = threading.Thread(target=engine._upload_all, args=(SendPace(8192),))
        paced.start()  # what the upload loop does with a slow pace
        assert objects.reading.wait(10)  # the paced upload is being sent
        append(stream, 10, size=1000)
        started = time.monotonic()
        engine.flush()
        paced.join(30)
        assert time.monotonic() - started < 30 and not paced.is_alive()  # the pace: ~2 min
        assert committed_streams(ctrl, objects) == {stream.stream_id}
        assert ctrl.stream(stream.stream_id)["end_offset"] == 2010
    finally:
        crash(engine)
