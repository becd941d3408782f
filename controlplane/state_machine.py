"""The replicated state machine: a command in, validated records out, applied to the image.

Commands (not records) are what the Raft log replicates: every voter runs the same
deterministic validation against the same image, so two racing requests can never both pass
a check that only one of them may pass. Time enters only as the command's `now_ms`, stamped
by the controller that received the request. No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from controlplane import (
    balancer,
    broker_configs,
    brokers,
    bucket_failover,
    compactors,
    coordinators,
    erasure_seal,
    fencing,
    objects,
    reassignment,
    route_epochs,
    security,
    share_state,
    streams,
    topics,
    wal_failover,
)
from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.records import encode_record
from controlplane.requests import (
    REQUEST_TYPES,
    AllocateProducerIdsRequest,
    AllocateProducerIdsResponse,
    LifecycleTickRequest,
    PutKVRequest,
    validation_message,
)
from controlplane.settings import ControllerSettings


def _lifecycle_tick(image: MetadataImage, req: LifecycleTickRequest, now_ms: int):
    recs = brokers.fence_expired_brokers(image, req.expired_brokers)
    newly_fenced = {rec.node_id for rec in recs}
    recs += wal_failover.plan_failovers(image, newly_fenced)
    recs += objects.expire_prepared_objects(image, now_ms)
    return recs, {"records": len(recs)}


def _fence_broker(image: MetadataImage, req, now_ms: int):
    """Fencing a broker that still owns open streams starts their WAL failover at once."""
    recs, response = brokers.fence_broker(image, req, now_ms)
    if recs:
        recs += wal_failover.plan_failovers(image, {req.node_id})
    return recs, response


def _allocate_producer_ids(image: MetadataImage, req: AllocateProducerIdsRequest, now_ms: int):
    fencing.require_active_broker(image, req.node_id, req.node_epoch)
    first = image.next_producer_id
    return (
        [
            r.NextIdsRecord(
                next_object_id=image.next_object_id,
                next_stream_id=image.next_stream_id,
                next_producer_id=first + req.count,
            )
        ],
        AllocateProducerIdsResponse(first_producer_id=first, count=req.count),
    )


def _put_kv(image: MetadataImage, req: PutKVRequest, now_ms: int):
    return [r.KVRecord(key=req.key, value=req.value)], {}


_Handler = Callable[..., tuple[list, Any]]
_HANDLERS: dict[str, tuple[_Handler, bool]] = {
    # command -> (handler, needs settings)
    "register_broker": (brokers.register_broker, False),
    "broker_heartbeat": (brokers.broker_heartbeat, False),
    "fence_broker": (_fence_broker, False),
    "controlled_shutdown": (reassignment.controlled_shutdown, False),
    "complete_wal_failover": (wal_failover.complete_wal_failover, False),
    "reassign_partitions": (reassignment.reassign_partitions, False),
    "create_topic": (topics.create_topic, False),
    "delete_topic": (topics.delete_topic, False),
    "create_partitions": (topics.create_partitions, False),
    "create_stream": (streams.create_stream, False),
    "open_stream": (streams.open_stream, False),
    "close_stream": (streams.close_stream, False),
    "trim_stream": (streams.trim_stream, False),
    "delete_stream": (streams.delete_stream, False),
    "prepare_objects": (objects.prepare_objects, False),
    "commit_stream_set_object": (objects.commit_stream_set_object, True),
    "commit_stream_object": (objects.commit_stream_object, True),
    "objects_deleted": (objects.objects_deleted, False),
    "set_active_bucket": (bucket_failover.set_active_bucket, True),
    "put_kv": (_put_kv, False),
    "lifecycle_tick": (_lifecycle_tick, False),
    "allocate_producer_ids": (_allocate_producer_ids, False),
    "put_group_offsets": (coordinators.put_group_offsets, False),
    "put_share_state": (share_state.put_share_state, False),
    "delete_share_group_state": (share_state.delete_share_group_state, False),
    "alter_share_group_state": (share_state.alter_share_group_state, False),
    "register_compactor": (compactors.register_compactor, False),
    "set_cleaner_checkpoints": (compactors.set_cleaner_checkpoints, False),
}
_HANDLERS.update(
    {  # the self-balancer (controlplane/balancer.py)
        "set_balancer": (balancer.set_balancer, False),
        "balance_partitions": (balancer.balance_partitions, False),
    }
)
_HANDLERS.update(
    {  # topic configs (controlplane/topic_configs.py)
        "alter_topic_configs": (topics.alter_topic_configs, False),
        "alter_broker_configs": (broker_configs.alter_broker_configs, False),
    }
)
_HANDLERS.update(
    {  # SCRAM credentials and ACLs (controlplane/security.py)
        "alter_scram_credentials": (security.alter_scram_credentials, False),
        "create_acls": (security.create_acls, False),
        "delete_acls": (security.delete_acls, False),
    }
)
_HANDLERS.update(
    {  # transaction coordinators' state (controlplane/coordinators.py)
        "put_txn_state": (coordinators.put_txn_state, False),
        "record_aborted_txns": (streams.record_aborted_txns, False),
    }
)
_HANDLERS.update(
    {  # erasure-coded partitions sealed into object storage (controlplane/erasure_seal.py)
        "seal_erasure_range": (erasure_seal.seal_erasure_range, True),
        "trim_erasure_stream": (erasure_seal.trim_erasure_stream, False),
    }
)
_HANDLERS.update(
    {  # the zone router's route epochs (controlplane/route_epochs.py)
        "bump_route_epoch": (route_epochs.bump_route_epoch, False),
    }
)
assert set(_HANDLERS) == set(REQUEST_TYPES), "every request type needs a handler"


class MetadataStateMachine:
    """Image + the in-memory tail of the metadata log (JSON lines with offsets).

    Picklable (no locks): pysyncobj snapshots it by pickling.
    """

    def __init__(self, settings: ControllerSettings | None = None):
        self.settings = settings or ControllerSettings()
        self.image = MetadataImage()
        self.log: list[str] = []  # JSON text of records log_start_offset ...
        self.log_start_offset = 0  # offset of self.log[0]
        self.next_offset = 0  # offset the next record gets

    # ------------------------------------------------------------ commands

    def _run(self, command: str, body: dict, now_ms: int) -> tuple[list, Any]:
        """Validate a command against the image: (records to append, response)."""
        entry = _HANDLERS.get(command)
        if entry is None:
            raise ControllerError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {command!r}")
        handler, needs_settings = entry
        try:
            req = REQUEST_TYPES[command].model_validate(body)
        except ValidationError as exc:
            raise ControllerError(ErrorCode.INVALID_REQUEST, validation_message(exc)) from None
        if needs_settings:
            recs, response = handler(self.image, req, now_ms, self.settings)
        else:
            recs, response = handler(self.image, req, now_ms)
        if isinstance(response, BaseModel):
            response = response.model_dump(mode="json")
        return recs, response

    def execute(self, command: str, body: dict, now_ms: int) -> dict:
        """Validate and apply one command; returns {"result": ...} or {"error": {...}}.

        A rejected command changes nothing.
        """
        try:
            recs, response = self._run(command, body, now_ms)
        except ControllerError as exc:
            return exc.to_dict()
        self.append(recs)
        if command == "lifecycle_tick" or coordinators.changes_brokers(recs):
            # group coordinator slots follow the brokers in the same command: a fenced or
            # stopping broker's slots move the moment its partitions are evacuated
            self.append(coordinators.plan_slot_moves(self.image, self.settings.coordinator_slots))
        return {"result": response, "offset": self.next_offset - 1}

    def execute_readonly(self, command: str, body: dict, now_ms: int = 0) -> dict:
        """Answer a command without logging anything; refused if it would emit records.

        Used for routine heartbeats, whose handler emits no record for an active broker.
        """
        try:
            recs, response = self._run(command, body, now_ms)
        except ControllerError as exc:
            return exc.to_dict()
        if recs:
            return ControllerError(
                ErrorCode.INVALID_REQUEST, f"{command} must be replicated"
            ).to_dict()
        return {"result": response, "offset": self.next_offset - 1}

    def append(self, recs: list) -> None:
        """Log and apply one command's records; publishes a new image (readers on other
        threads keep the one they hold, which never changes)."""
        if not recs:
            return
        first = self.next_offset
        self.image, _ = self.image.with_records((rec, first + i) for i, rec in enumerate(recs))
        for rec in recs:
            self.log.append(encode_record(rec))
            self.next_offset += 1
        overflow = len(self.log) - self.settings.log_retention_records
        if overflow > 0:
            del self.log[:overflow]
            self.log_start_offset += overflow

    # ------------------------------------------------------------ log reading

    def read_log(self, after_offset: int, max_records: int = 1000) -> dict:
        """Records with offset > after_offset, or the image snapshot if they are gone.

        A follower that was behind the retained tail gets `snapshot` (the image JSON at
        `snapshot_offset`) and continues reading after that offset.
        """
        start = after_offset + 1
        if start < self.log_start_offset:
            return {
                "snapshot": json.loads(self.image.model_dump_json()),
                "snapshot_offset": self.next_offset - 1,
                "records": [],
                "next_offset": self.next_offset,
            }
        idx = start - self.log_start_offset
        chunk = self.log[idx : idx + max_records]
        return {
            "records": [
                {"offset": start + i, "record": json.loads(text)} for i, text in enumerate(chunk)
            ],
            "next_offset": self.next_offset,
        }
