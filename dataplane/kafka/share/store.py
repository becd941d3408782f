"""Where share-partition state is kept durably: the controller's replicated KV, written by
the partition's leader and fenced by its leader epoch (`controlplane/share_state.py`).

Blocking (controller calls): run on the Kafka I/O pool. Thread-safe: no state of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError, ErrorCode
from controlplane.share_state import (
    AlteredShareState,
    AlterShareGroupStateRequest,
    DeleteShareGroupStateRequest,
    PutShareStateRequest,
)
from dataplane.formats.kafka_errors import KafkaError

PUT_TIMEOUT_S = 10.0
MAX_STATE_BYTES = 500_000

_NOT_LEADER = {
    ErrorCode.NOT_PARTITION_LEADER,
    ErrorCode.NODE_FENCED,
    ErrorCode.STALE_NODE_EPOCH,
    ErrorCode.UNKNOWN_NODE,
    ErrorCode.UNKNOWN_TOPIC,
}
# controller refusal -> what the client is answered (any other: KAFKA_STORAGE_ERROR)
_AS_LEADER = dict.fromkeys(_NOT_LEADER, KafkaError.NOT_LEADER_OR_FOLLOWER)
_AS_COORDINATOR = dict.fromkeys(
    _NOT_LEADER | {ErrorCode.NOT_COORDINATOR}, KafkaError.NOT_COORDINATOR
)
_AS_ALTERING_COORDINATOR = {
    **_AS_COORDINATOR,
    ErrorCode.UNKNOWN_TOPIC: KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
}


class ShareStateError(Exception):
    """The state could not be read or written: `error` is what the client is answered
    (NOT_LEADER_OR_FOLLOWER when this broker no longer leads the partition)."""

    def __init__(self, error: KafkaError, message: str):
        super().__init__(message)
        self.error = error


class ShareStateStore:
    """Loads and saves share-partition snapshots (JSON documents) in the controller KV."""

    def __init__(
        self, controller: ControllerCalls, node_id: int, node_epoch_fn: Callable[[], int]
    ) -> None:
        self.controller = controller
        self.node_id = node_id
        self.node_epoch_fn = node_epoch_fn

    def load(self, group_id: str, topic_id: str, partition: int, leader_epoch: int) -> dict | None:
        """The stored snapshot, None if the group never read the partition (blocking)."""
        value = self._call(group_id, topic_id, partition, leader_epoch, load=True, value=None)
        if value is None:
            return None
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ShareStateError(
                KafkaError.KAFKA_STORAGE_ERROR, f"unreadable share state: {exc}"
            ) from exc

    def save(
        self,
        group_id: str,
        topic_id: str,
        partition: int,
        leader_epoch: int,
        doc: dict,
        must_exist: bool = False,
    ) -> None:
        """Store the snapshot; returns once the controller committed it (blocking).
        `must_exist`: refused (NOT_LEADER_OR_FOLLOWER) if the stored state is gone (the group
        was deleted since this leader loaded it). The snapshot's `state_epoch` (0 if absent)
        is the state epoch this leader loaded: refused too if the stored one differs (the
        offsets were altered since)."""
        value = json.dumps(doc, separators=(",", ":"))
        if len(value) > MAX_STATE_BYTES:
            raise ShareStateError(
                KafkaError.KAFKA_STORAGE_ERROR,
                f"share state of {len(value)} bytes exceeds {MAX_STATE_BYTES}",
            )
        self._call(
            group_id,
            topic_id,
            partition,
            leader_epoch,
            load=False,
            value=value,
            must_exist=must_exist,
            state_epoch=int(doc.get("state_epoch", 0)),
        )

    def delete_group(
        self, group_id: str, coordinator_epoch: int, topic_ids: list[str] | None = None
    ) -> int:
        """Delete every stored share-partition state of the group (or of `topic_ids` only),
        as its coordinator at `coordinator_epoch` (blocking); how many there were.
        ShareStateError when refused (NOT_COORDINATOR) or the controller cannot be reached."""
        req = DeleteShareGroupStateRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch_fn(),
            group_id=group_id,
            coordinator_epoch=coordinator_epoch,
            topic_ids=topic_ids,
        )
        return _controller_call(self.controller.delete_share_group_state, req, _AS_COORDINATOR)

    def alter_group(
        self, group_id: str, coordinator_epoch: int, states: list[tuple[str, int, dict]]
    ) -> int:
        """Replace the stored states of (topic id, partition, snapshot) of the group at a
        higher state epoch, as its coordinator at `coordinator_epoch` (blocking; all or
        nothing); how many. ShareStateError when refused (NOT_COORDINATOR, or
        UNKNOWN_TOPIC_OR_PARTITION for a partition gone meanwhile) or unreachable."""
        req = AlterShareGroupStateRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch_fn(),
            group_id=group_id,
            coordinator_epoch=coordinator_epoch,
            states=[
                AlteredShareState(
                    topic_id=t, partition=p, value=json.dumps(doc, separators=(",", ":"))
                )
                for t, p, doc in states
            ],
        )
        return _controller_call(
            self.controller.alter_share_group_state, req, _AS_ALTERING_COORDINATOR
        )

    def _call(
        self,
        group_id: str,
        topic_id: str,
        partition: int,
        leader_epoch: int,
        *,
        load: bool,
        value: str | None,
        must_exist: bool = False,
        state_epoch: int = 0,
    ) -> str | None:
        req = PutShareStateRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch_fn(),
            group_id=group_id,
            topic_id=topic_id,
            partition=partition,
            leader_epoch=leader_epoch,
            load=load,
            value=value,
            must_exist=must_exist,
            state_epoch=state_epoch,
        )
        return _controller_call(self.controller.put_share_state, req, _AS_LEADER)


def _controller_call(
    call: Callable[..., Any], req: Any, refusals: dict[ErrorCode, KafkaError]
) -> Any:
    """`call(req)` (blocking, bounded by PUT_TIMEOUT_S); a controller refusal becomes a
    ShareStateError with the client's error from `refusals` (KAFKA_STORAGE_ERROR for one it
    does not name, and when the controller cannot be reached)."""
    try:
        return call(req, timeout_s=PUT_TIMEOUT_S)
    except ControllerError as exc:
        error = refusals.get(exc.code, KafkaError.KAFKA_STORAGE_ERROR)
        raise ShareStateError(error, str(exc)) from exc
    except (OSError, TimeoutError) as exc:
        raise ShareStateError(KafkaError.KAFKA_STORAGE_ERROR, str(exc)) from exc
