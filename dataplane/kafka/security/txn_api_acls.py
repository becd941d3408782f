"""ACL rules of the producer and transaction APIs: DescribeProducers, DescribeTransactions,
ListTransactions, InitProducerId, and (as Kafka's KafkaApis: WRITE on the transactional id
first, then the topics / group) AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
TxnOffsetCommit; WriteTxnMarkers is for the cluster (CLUSTER_ACTION)."""

from __future__ import annotations

from typing import Any

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class
from dataplane.kafka.security.acl_checks import AclChecks, Handler, Policy
from dataplane.kafka.security.authorizer import allows_any


class TxnApiAcls:
    """Checks the producer and transaction APIs (see the module docstring)."""

    def __init__(self, checks: AclChecks) -> None:
        self.checks = checks

    def policies(self) -> dict[int, Policy]:
        """The rule of each API key these rules cover."""
        return {
            22: self.init_producer_id,
            24: self.add_partitions_to_txn,
            25: self.add_offsets_to_txn,
            26: self.end_txn,
            27: self.write_txn_markers,
            28: self.txn_offset_commit,
            61: self.describe_producers,
            65: self.describe_transactions,
            66: self.list_transactions,
        }

    async def describe_producers(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """READ on each topic (Kafka's rule); denied topics: TOPIC_AUTHORIZATION_FAILED."""
        R = response_class(61)
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=lambda t, code: R.TopicResponse(
                name=t.name,
                partitions=[
                    R.TopicResponse.PartitionResponse(
                        partition_index=p, error_code=code, error_message=None, active_producers=[]
                    )
                    for p in t.partition_indexes
                ],
            ),
            answer="topics",
        )

    async def describe_transactions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """DESCRIBE on each transactional id; denied: TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
        R = response_class(65)
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="transactional_ids",
            resource=lambda txn_id: ("TRANSACTIONAL_ID", txn_id),
            operation="DESCRIBE",
            denied_entry=lambda txn_id, code: R.TransactionState(
                error_code=code,
                transactional_id=txn_id,
                transaction_state="",
                transaction_timeout_ms=0,
                transaction_start_time_ms=-1,
                producer_id=-1,
                producer_epoch=-1,
                topics=[],
            ),
            answer="transaction_states",
        )

    async def list_transactions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """Only the transactional ids the principal may DESCRIBE (as ListGroups filters)."""
        response = await handler(req, ctx)
        response.transaction_states = [
            t
            for t in response.transaction_states
            if self.checks.allowed(ctx, "DESCRIBE", "TRANSACTIONAL_ID", t.transactional_id)
        ]
        return response

    async def init_producer_id(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of InitProducerId."""
        R = response_class(22)
        txn = req.transactional_id
        if txn:
            ok, code = (
                self.checks.allowed(ctx, "WRITE", "TRANSACTIONAL_ID", txn),
                KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            )
        else:
            # Kafka 3+: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or
            # WRITE on some topic
            principal = ctx.extras.get("principal") or ""
            ok = self.checks.allowed_cluster(ctx, "IDEMPOTENT_WRITE") or allows_any(
                self.checks.image_fn().acls.values(),
                self.checks.authorizer.super_users,
                principal,
                ctx.peer[0],
                "WRITE",
                "TOPIC",
            )
            code = KafkaError.CLUSTER_AUTHORIZATION_FAILED
        if ok:
            return await handler(req, ctx)
        return R[ctx.api_version](
            throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1
        )

    def _txn_denied(self, ctx: Any, txn_id: str | None) -> bool:
        return not self.checks.allowed(ctx, "WRITE", "TRANSACTIONAL_ID", txn_id or "")

    async def add_partitions_to_txn(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """WRITE on the transactional id (else every partition is
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and on each topic; with a denied topic
        nothing is added: its partitions are TOPIC_AUTHORIZATION_FAILED, the others
        OPERATION_NOT_ATTEMPTED (as Kafka answers)."""
        R = response_class(24)
        TR = R.AddPartitionsToTxnTopicResult
        topics = req.v3_and_below_topics or []
        if self._txn_denied(ctx, req.v3_and_below_transactional_id):
            codes = {t.name: KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for t in topics}
        else:
            codes = {
                t.name: KafkaError.TOPIC_AUTHORIZATION_FAILED
                for t in topics
                if not self.checks.allowed(ctx, "WRITE", "TOPIC", t.name)
            }
            if not codes:
                return await handler(req, ctx)
        return R[ctx.api_version](
            throttle_time_ms=0,
            results_by_topic_v3_and_below=[
                TR(
                    name=t.name,
                    results_by_partition=[
                        TR.AddPartitionsToTxnPartitionResult(
                            partition_index=p,
                            partition_error_code=codes.get(
                                t.name, KafkaError.OPERATION_NOT_ATTEMPTED
                            ),
                        )
                        for p in t.partitions
                    ],
                )
                for t in topics
            ],
        )

    async def add_offsets_to_txn(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """WRITE on the transactional id, READ on the group."""
        if self._txn_denied(ctx, req.transactional_id):
            code = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self.checks.allowed(ctx, "READ", "GROUP", req.group_id):
            code = KafkaError.GROUP_AUTHORIZATION_FAILED
        else:
            return await handler(req, ctx)
        return response_class(25)[ctx.api_version](throttle_time_ms=0, error_code=code)

    async def end_txn(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """WRITE on the transactional id."""
        if not self._txn_denied(ctx, req.transactional_id):
            return await handler(req, ctx)
        return response_class(26)[ctx.api_version](
            throttle_time_ms=0, error_code=KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )

    async def txn_offset_commit(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """WRITE on the transactional id, READ on the group (else every partition gets the
        refusal), READ on each topic (a denied topic's partitions only)."""
        R = response_class(28)

        def denied(t: Any, code: int) -> Any:
            return R.TxnOffsetCommitResponseTopic(
                name=t.name,
                partitions=[
                    R.TxnOffsetCommitResponseTopic.TxnOffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=code
                    )
                    for p in t.partitions
                ],
            )

        code = KafkaError.NONE
        if self._txn_denied(ctx, req.transactional_id):
            code = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self.checks.allowed(ctx, "READ", "GROUP", req.group_id):
            code = KafkaError.GROUP_AUTHORIZATION_FAILED
        if code != KafkaError.NONE:
            return R[ctx.api_version](
                throttle_time_ms=0, topics=[denied(t, code) for t in req.topics or []]
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=denied,
            answer="topics",
        )

    async def write_txn_markers(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """Brokers only: CLUSTER_ACTION on the cluster (a transaction coordinator's markers),
        else every partition is CLUSTER_AUTHORIZATION_FAILED."""
        if self.checks.allowed_cluster(ctx, "CLUSTER_ACTION"):
            return await handler(req, ctx)
        R = response_class(27)
        TR = R.WritableTxnMarkerResult.WritableTxnMarkerTopicResult
        code = KafkaError.CLUSTER_AUTHORIZATION_FAILED
        return R[ctx.api_version](
            markers=[
                R.WritableTxnMarkerResult(
                    producer_id=m.producer_id,
                    topics=[
                        TR(
                            name=t.name,
                            partitions=[
                                TR.WritableTxnMarkerPartitionResult(
                                    partition_index=p, error_code=code
                                )
                                for p in t.partition_indexes
                            ],
                        )
                        for t in m.topics
                    ],
                )
                for m in req.markers
            ]
        )
