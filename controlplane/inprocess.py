"""An in-process controller: the metadata state machine behind the controller client's API.

`InProcessController` answers the same calls as `ControllerClient` (`call`, `read_log`,
`image`, `stream`, `stream_objects`, `status`) from a `MetadataStateMachine` in this process,
with no HTTP and no Raft. The engine, the Kafka APIs and the Spark jobs take either, so their
tests run in milliseconds with no server; the validation and fencing are the real ones (the
same state machine every controller runs).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel

from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError, ErrorCode
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine

MAX_LONG_POLL_MS = 30_000


class InProcessController(ControllerCalls):
    """A single-voter controller in this process.

    Thread-safety: commands are applied under one lock (as Raft applies them one by one);
    reads take the published image, which never changes.
    """

    def __init__(
        self,
        settings: ControllerSettings | None = None,
        machine: MetadataStateMachine | None = None,
    ):
        self.machine = machine if machine is not None else MetadataStateMachine(settings)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    # ------------------------------------------------------------ commands

    def call(self, command: str, body: dict | BaseModel, timeout_s: float | None = None) -> dict:
        """Apply one command; return its result or raise ControllerError (as the client)."""
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        body = dict(body)
        if command == "create_topic" and not body.get("topic_id"):
            body["topic_id"] = str(uuid.uuid4())
        with self._lock:
            image = self.machine.image
            broker = (
                image.brokers.get(body.get("node_id", -1))
                if command == "broker_heartbeat"
                else None
            )
            if broker is not None and not (broker.fenced and broker.fence_reason == "registered"):
                result = self.machine.execute_readonly(command, body, _now_ms())
            else:
                result = self.machine.execute(command, body, _now_ms())
            self._changed.notify_all()
        if "error" in result:
            err = result["error"]
            raise ControllerError(ErrorCode(err["code"]), err.get("message", ""))
        return result.get("result", {})

    # ------------------------------------------------------------ reads

    def read_log(
        self,
        after_offset: int,
        max_records: int = 1000,
        wait_ms: int = 0,
        address: str | None = None,
    ) -> dict:
        deadline = time.monotonic() + min(wait_ms, MAX_LONG_POLL_MS) / 1000
        with self._changed:
            while self.machine.next_offset - 1 <= after_offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self.machine.read_log(after_offset, max_records)

    def image(self) -> dict:
        return self.machine.image.model_dump(mode="json")

    def stream(self, stream_id: int) -> dict:
        stream = self.machine.image.streams.get(stream_id)
        if stream is None:
            raise ControllerError(ErrorCode.UNKNOWN_STREAM, f"no stream {stream_id}")
        return {
            **stream.model_dump(mode="json", exclude={"object_ranges"}),
            "end_offset": stream.end_offset,
        }

    def stream_objects(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int,
        limit: int = 100,
        from_leader: bool = False,  # one state machine: always current
    ) -> list[dict]:
        found = self.machine.image.stream_objects_in_range(
            stream_id, start_offset, end_offset, limit
        )
        return [
            {**rng.model_dump(), "bucket_id": meta.bucket_id, "size_bytes": meta.size_bytes}
            for rng, meta in found
        ]

    def status(self, address: str | None = None) -> dict[str, Any]:
        image = self.machine.image
        return {
            "metadata_offset": image.offset,
            "fingerprint": image.fingerprint(),
            "raft": {"state": "leader", "has_quorum": True, "recoveries": 0},
        }


def _now_ms() -> int:
    return int(time.time() * 1000)
