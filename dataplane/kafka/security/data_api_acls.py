"""ACL rules of the data APIs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, Metadata,
DeleteRecords (per-topic: denied topics are answered with TOPIC_AUTHORIZATION_FAILED, the
rest goes to the handler; Metadata leaves out the topics the principal may not DESCRIBE)."""

from __future__ import annotations

import uuid
from typing import Any

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class
from dataplane.kafka.registry import CloseConnection
from dataplane.kafka.security.acl_checks import AclChecks, Handler, Policy
from dataplane.kafka.security.authorizer import CLUSTER_RESOURCE


class DataApiAcls:
    """Checks the data APIs' topics (see the module docstring)."""

    def __init__(self, checks: AclChecks) -> None:
        self.checks = checks

    def policies(self) -> dict[int, Policy]:
        """The rule of each API key these rules cover."""
        return {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            23: self.offset_for_leader_epoch,
            3: self.metadata,
            21: self.delete_records,
        }

    async def produce(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of Produce."""
        R = response_class(0)
        txn = getattr(req, "transactional_id", None)
        if txn and not self.checks.allowed(ctx, "WRITE", "TRANSACTIONAL_ID", txn):
            code = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return (
                R[ctx.api_version](
                    responses=[_produce_error(t, code) for t in req.topic_data or []],
                    throttle_time_ms=0,
                )
                if req.acks != 0
                else None
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topic_data",
            resource=lambda t: ("TOPIC", t.name),
            operation="WRITE",
            denied_entry=_produce_error,
            answer="responses",
        )

    async def fetch(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of Fetch."""
        R = response_class(1)
        v = ctx.api_version

        def resource(t: Any) -> tuple[str, str] | None:
            name = t.topic if v < 13 else self.checks.topic_id_name(t.topic_id)
            return ("TOPIC", name) if name is not None else None

        def denied(t: Any, code: int) -> Any:
            parts = [
                R.FetchableTopicResponse.PartitionData(
                    partition_index=p.partition,
                    error_code=code,
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    records=b"",
                )
                for p in t.partitions
            ]
            key = {"topic": t.topic} if v < 13 else {"topic_id": t.topic_id}
            return R.FetchableTopicResponse(partitions=parts, **key)

        if getattr(req, "replica_id", -1) >= 0 and not self.checks.allowed_cluster(
            ctx, "CLUSTER_ACTION"
        ):
            raise CloseConnection("follower fetch without CLUSTER_ACTION")
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=resource,
            operation="READ",
            denied_entry=denied,
            answer="responses",
        )

    async def list_offsets(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of ListOffsets."""
        R = response_class(2)

        def denied(t: Any, code: int) -> Any:
            return R.ListOffsetsTopicResponse(
                name=t.name,
                partitions=[
                    R.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index, error_code=code, timestamp=-1, offset=-1
                    )
                    for p in t.partitions
                ],
            )

        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="DESCRIBE",
            denied_entry=denied,
            answer="topics",
        )

    async def offset_for_leader_epoch(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of OffsetForLeaderEpoch."""
        R = response_class(23)

        def denied(t: Any, code: int) -> Any:
            return R.OffsetForLeaderTopicResult(
                topic=t.topic,
                partitions=[
                    R.OffsetForLeaderTopicResult.EpochEndOffset(
                        partition=p.partition, error_code=code, leader_epoch=-1, end_offset=-1
                    )
                    for p in t.partitions
                ],
            )

        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.topic),
            operation="DESCRIBE",
            denied_entry=denied,
            answer="topics",
        )

    async def metadata(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of Metadata."""
        R = response_class(3)
        denied_names: list[str] = []
        if req.topics is not None:
            kept = []
            for t in req.topics:
                name = t.name or self.checks.topic_id_name(getattr(t, "topic_id", None))
                if name is None or self.checks.allowed(ctx, "DESCRIBE", "TOPIC", name):
                    kept.append(t)
                else:
                    denied_names.append(name)
            req.topics = kept
            if (
                getattr(req, "allow_auto_topic_creation", True)  # v0-3: always on
                and not self.checks.allowed_cluster(ctx, "CREATE")
                and not all(self.checks.allowed(ctx, "CREATE", "TOPIC", t.name or "") for t in kept)
            ):
                req.allow_auto_topic_creation = False
        response = await handler(req, ctx)
        response.topics = [
            t
            for t in response.topics
            if t.error_code != KafkaError.NONE
            or self.checks.allowed(ctx, "DESCRIBE", "TOPIC", t.name)
        ] + [
            R.MetadataResponseTopic(
                error_code=KafkaError.TOPIC_AUTHORIZATION_FAILED,
                name=name,
                topic_id=uuid.UUID(int=0),
                is_internal=False,
                partitions=[],
            )
            for name in denied_names
        ]
        for t in response.topics:
            if t.error_code == KafkaError.NONE and t.authorized_operations is not None:
                t.authorized_operations = self.checks.authorized_operations(ctx, "TOPIC", t.name)
        if getattr(response, "authorized_operations", None) is not None:
            response.authorized_operations = self.checks.authorized_operations(
                ctx, "CLUSTER", CLUSTER_RESOURCE
            )
        return response

    async def delete_records(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of DeleteRecords."""
        R = response_class(21)
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="DELETE",
            denied_entry=lambda t, code: R.DeleteRecordsTopicResult(
                name=t.name,
                partitions=[
                    R.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                        partition_index=p.partition_index, low_watermark=-1, error_code=code
                    )
                    for p in t.partitions
                ],
            ),
            answer="topics",
        )


def _produce_error(t: Any, code: int) -> Any:
    R = response_class(0)
    return R.TopicProduceResponse(
        name=t.name,
        partition_responses=[
            R.TopicProduceResponse.PartitionProduceResponse(
                index=p.index, error_code=code, base_offset=-1
            )
            for p in t.partition_data
        ],
    )
