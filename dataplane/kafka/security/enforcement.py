"""ACLs enforced on every API of a SASL listener, with Kafka's error codes.

`AclEnforcer.install(registry)` wraps every registered handler: a request's resources are
checked with the pure `Authorizer` against the current metadata image's ACLs before the
handler runs. Per-topic (per-group, per-resource) APIs answer the denied entries with
TOPIC_AUTHORIZATION_FAILED / GROUP_AUTHORIZATION_FAILED / CLUSTER_AUTHORIZATION_FAILED (the
one table, dataplane/formats/kafka_errors.py) and pass the allowed rest to the handler; APIs about
one group or the cluster get the whole answer refused; Metadata and ListGroups leave out
what the principal may not DESCRIBE. An API without a policy here is for super users only
(anyone else is disconnected), so a newly registered API is never open by mistake.

Thread-safety: the wrappers run on the server's event loop; the image is immutable.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import ResponseWithRecords, response_class
from dataplane.kafka.registry import ApiRegistry, CloseConnection
from dataplane.kafka.security.authorizer import CLUSTER_RESOURCE, Authorizer, allows_any

log = logging.getLogger(__name__)

# ApiVersions and the SASL exchange: served before authentication, no resource
UNCHECKED_KEYS = frozenset({17, 18, 36})
# the security admin APIs check the cluster themselves (dataplane/kafka/security/admin_apis.py)
SELF_CHECKED_KEYS = frozenset({29, 30, 31, 50, 51})

DENIED = {
    "TOPIC": KafkaError.TOPIC_AUTHORIZATION_FAILED,
    "GROUP": KafkaError.GROUP_AUTHORIZATION_FAILED,
    "CLUSTER": KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    "TRANSACTIONAL_ID": KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}
_CONFIG_RESOURCE = {2: "TOPIC", 4: "CLUSTER"}  # ConfigResource types: topic, broker

Handler = Callable[[Any, Any], Any]


class AclEnforcer:
    """Checks requests of authenticated connections against the image's ACLs."""

    def __init__(self, authorizer: Authorizer, image_fn: Callable[[], MetadataImage]):
        self.authorizer = authorizer
        self.image_fn = image_fn

    # ------------------------------------------------------------ decisions

    def allowed(self, ctx: Any, operation: str, resource_type: str, name: str) -> bool:
        principal = ctx.extras.get("principal")
        if principal is None:
            return False
        return self.authorizer.authorize(
            self.image_fn().acls.values(), principal, ctx.peer[0], operation, resource_type, name
        )

    def allowed_cluster(self, ctx: Any, operation: str) -> bool:
        return self.allowed(ctx, operation, "CLUSTER", CLUSTER_RESOURCE)

    def is_super_user(self, ctx: Any) -> bool:
        return ctx.extras.get("principal") in self.authorizer.super_users

    # ------------------------------------------------------------ wiring

    def install(self, registry: ApiRegistry) -> None:
        """Wrap every registered handler (call after all APIs are registered)."""
        for key, _lo, _hi in registry.api_versions():
            if key in UNCHECKED_KEYS or key in SELF_CHECKED_KEYS:
                continue
            reg = registry.get(key)
            assert reg is not None
            policy = self._policies().get(key)
            wrapped = (
                self._wrap(policy, reg.handler)
                if policy is not None
                else self._super_only(reg.handler, reg.request_class.__name__)
            )
            registry.register(
                reg.request_class,
                reg.min_version,
                reg.max_version,
                wrapped,
                sequential=reg.sequential,
                replace=True,
            )

    def _wrap(self, policy, handler: Handler) -> Handler:
        async def checked(req: Any, ctx: Any) -> Any:
            return await policy(handler, req, ctx)

        return checked

    def _super_only(self, handler: Handler, name: str) -> Handler:
        async def checked(req: Any, ctx: Any) -> Any:
            if not self.is_super_user(ctx):
                raise CloseConnection(f"{name} is for super users only")
            return await handler(req, ctx)

        return checked

    def _policies(self) -> dict[int, Any]:
        return {
            0: self._produce,
            1: self._fetch,
            2: self._list_offsets,
            3: self._metadata,
            8: self._offset_commit,
            9: self._offset_fetch,
            10: self._find_coordinator,
            11: self._group_request,
            12: self._group_request,
            13: self._group_request,
            14: self._group_request,
            15: self._describe_groups,
            16: self._list_groups,
            19: self._create_topics,
            20: self._delete_topics,
            22: self._init_producer_id,
            24: self._add_partitions_to_txn,
            25: self._add_offsets_to_txn,
            26: self._end_txn,
            27: self._write_txn_markers,
            28: self._txn_offset_commit,
            23: self._offset_for_leader_epoch,
            32: self._describe_configs,
            33: self._alter_configs,
            37: self._create_partitions,
            21: self._delete_records,
            35: self._cluster_request("DESCRIBE"),  # DescribeLogDirs
            60: self._describe_cluster,
            42: self._delete_groups,
            44: self._alter_configs,
            45: self._cluster_request("ALTER"),  # AlterPartitionReassignments
            46: self._cluster_request("DESCRIBE"),  # ListPartitionReassignments
            47: self._offset_delete,
            61: self._describe_producers,
            65: self._describe_transactions,
            66: self._list_transactions,
        }

    # ------------------------------------------------------------ the generic split

    async def _split(
        self,
        handler: Handler,
        req: Any,
        ctx: Any,
        *,
        items: str,
        resource: Callable[[Any], tuple[str, str] | None],
        operation: str | Callable[[str, str], bool],
        denied_entry: Callable[[Any, int], Any],
        answer: str,
    ) -> Any:
        """Pass the allowed entries of `req.<items>` to the handler and add a denied answer
        for each other one to `response.<answer>`. `resource(item)` is (type, name), or None
        for an entry the handler should answer itself (e.g. an unknown topic id)."""
        allowed, denied = [], []
        for item in getattr(req, items) or []:
            res = resource(item)
            ok = res is None or (
                operation(*res) if callable(operation) else self.allowed(ctx, operation, *res)
            )
            (allowed if ok else denied).append((item, res))
        if not denied:
            return await handler(req, ctx)
        setattr(req, items, [item for item, _ in allowed])
        response = await handler(req, ctx)
        if response is None:  # Produce acks=0
            return None
        if isinstance(response, (bytes, bytearray)):
            raise CloseConnection("cannot merge denied entries into a pre-encoded response")
        # a fetch response carries its record sets beside the response object
        target = response.response if isinstance(response, ResponseWithRecords) else response
        entries = list(getattr(target, answer) or [])
        entries += [denied_entry(item, DENIED[res[0]]) for item, res in denied]
        setattr(target, answer, entries)
        return response

    def _topic_id_name(self, topic_id: Any) -> str | None:
        if topic_id is None or getattr(topic_id, "int", 0) == 0:
            return None
        topic = self.image_fn().topics.get(str(topic_id))
        return topic.name if topic is not None else None

    # ------------------------------------------------------------ data APIs

    async def _produce(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(0)
        txn = getattr(req, "transactional_id", None)
        if txn and not self.allowed(ctx, "WRITE", "TRANSACTIONAL_ID", txn):
            code = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return (
                R[ctx.api_version](
                    responses=[_produce_error(t, code) for t in req.topic_data or []],
                    throttle_time_ms=0,
                )
                if req.acks != 0
                else None
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="topic_data",
            resource=lambda t: ("TOPIC", t.name),
            operation="WRITE",
            denied_entry=_produce_error,
            answer="responses",
        )

    async def _fetch(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(1)
        v = ctx.api_version

        def resource(t: Any) -> tuple[str, str] | None:
            name = t.topic if v < 13 else self._topic_id_name(t.topic_id)
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

        if getattr(req, "replica_id", -1) >= 0 and not self.allowed_cluster(ctx, "CLUSTER_ACTION"):
            raise CloseConnection("follower fetch without CLUSTER_ACTION")
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=resource,
            operation="READ",
            denied_entry=denied,
            answer="responses",
        )

    async def _list_offsets(self, handler: Handler, req: Any, ctx: Any) -> Any:
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

        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="DESCRIBE",
            denied_entry=denied,
            answer="topics",
        )

    async def _offset_for_leader_epoch(self, handler: Handler, req: Any, ctx: Any) -> Any:
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

        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.topic),
            operation="DESCRIBE",
            denied_entry=denied,
            answer="topics",
        )

    async def _metadata(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(3)
        denied_names: list[str] = []
        if req.topics is not None:
            kept = []
            for t in req.topics:
                name = t.name or self._topic_id_name(getattr(t, "topic_id", None))
                if name is None or self.allowed(ctx, "DESCRIBE", "TOPIC", name):
                    kept.append(t)
                else:
                    denied_names.append(name)
            req.topics = kept
            if (
                getattr(req, "allow_auto_topic_creation", True)  # v0-3: always on
                and not self.allowed_cluster(ctx, "CREATE")
                and not all(self.allowed(ctx, "CREATE", "TOPIC", t.name or "") for t in kept)
            ):
                req.allow_auto_topic_creation = False
        response = await handler(req, ctx)
        response.topics = [
            t
            for t in response.topics
            if t.error_code != KafkaError.NONE or self.allowed(ctx, "DESCRIBE", "TOPIC", t.name)
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
        return response

    # ------------------------------------------------------------ topic admin

    async def _create_topics(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(19)
        cluster_create = self.allowed_cluster(ctx, "CREATE")
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation=lambda _type, name: (
                cluster_create or self.allowed(ctx, "CREATE", "TOPIC", name)
            ),
            denied_entry=lambda t, code: R.CreatableTopicResult(
                name=t.name,
                topic_id=uuid.UUID(int=0),
                error_code=code,
                error_message="not authorized to create the topic",
                topic_config_error_code=0,
                num_partitions=-1,
                replication_factor=-1,
                configs=None,
            ),
            answer="topics",
        )

    async def _delete_topics(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(20)
        if ctx.api_version < 6:
            return await self._split(
                handler,
                req,
                ctx,
                items="topic_names",
                resource=lambda name: ("TOPIC", name),
                operation="DELETE",
                denied_entry=lambda name, code: R.DeletableTopicResult(name=name, error_code=code),
                answer="responses",
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: (
                ("TOPIC", t.name or self._topic_id_name(t.topic_id))
                if (t.name or self._topic_id_name(t.topic_id))
                else None
            ),
            operation="DELETE",
            denied_entry=lambda t, code: R.DeletableTopicResult(
                name=t.name, topic_id=t.topic_id, error_code=code
            ),
            answer="responses",
        )

    async def _create_partitions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(37)
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="ALTER",
            denied_entry=lambda t, code: R.CreatePartitionsTopicResult(
                name=t.name, error_code=code, error_message="not authorized"
            ),
            answer="results",
        )

    def _config_resource(self, r: Any) -> tuple[str, str]:
        kind = _CONFIG_RESOURCE.get(int(r.resource_type), "CLUSTER")
        return (kind, r.resource_name if kind == "TOPIC" else CLUSTER_RESOURCE)

    async def _describe_configs(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(32)
        return await self._split(
            handler,
            req,
            ctx,
            items="resources",
            resource=self._config_resource,
            operation="DESCRIBE_CONFIGS",
            denied_entry=lambda r, code: R.DescribeConfigsResult(
                error_code=code,
                error_message="not authorized",
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=[],
            ),
            answer="results",
        )

    async def _alter_configs(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(ctx.api_key)
        return await self._split(
            handler,
            req,
            ctx,
            items="resources",
            resource=self._config_resource,
            operation="ALTER_CONFIGS",
            denied_entry=lambda r, code: R.AlterConfigsResourceResponse(
                error_code=code,
                error_message="not authorized",
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            ),
            answer="responses",
        )

    # ------------------------------------------------------------ groups and producers

    async def _describe_cluster(self, handler: Handler, req: Any, ctx: Any) -> Any:
        # the broker list is what Metadata gives any principal too (Kafka checks nothing
        # but the authorized-operations bitfield, which is not computed here)
        return await handler(req, ctx)

    async def _find_coordinator(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(10)
        kind = "TRANSACTIONAL_ID" if int(getattr(req, "key_type", 0) or 0) == 1 else "GROUP"
        if ctx.api_version < 4:
            if self.allowed(ctx, "DESCRIBE", kind, req.key):
                return await handler(req, ctx)
            return R[ctx.api_version](
                throttle_time_ms=0,
                error_code=DENIED[kind],
                error_message="not authorized",
                node_id=-1,
                host="",
                port=-1,
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="coordinator_keys",
            resource=lambda key: (kind, key),
            operation="DESCRIBE",
            denied_entry=lambda key, code: R.Coordinator(
                key=key, node_id=-1, host="", port=-1, error_code=code, error_message=None
            ),
            answer="coordinators",
        )

    async def _group_request(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group, else refused."""
        if self.allowed(ctx, "READ", "GROUP", req.group_id):
            return await handler(req, ctx)
        fields: dict[str, Any] = {"error_code": KafkaError.GROUP_AUTHORIZATION_FAILED}
        if ctx.api_key == 11:  # JoinGroup: the client reads these even on an error
            fields.update(generation_id=-1, leader="", member_id="", members=[])
        return response_class(ctx.api_key)[ctx.api_version](**fields)

    async def _offset_commit(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(8)

        def denied(t: Any, code: int) -> Any:
            return R.OffsetCommitResponseTopic(
                name=t.name,
                partitions=[
                    R.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=code
                    )
                    for p in t.partitions
                ],
            )

        if not self.allowed(ctx, "READ", "GROUP", req.group_id):
            return R[ctx.api_version](
                throttle_time_ms=0,
                topics=[denied(t, KafkaError.GROUP_AUTHORIZATION_FAILED) for t in req.topics],
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=denied,
            answer="topics",
        )

    async def _offset_fetch(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(9)
        if ctx.api_version < 8:
            if self.allowed(ctx, "DESCRIBE", "GROUP", req.group_id):
                return await handler(req, ctx)
            return R[ctx.api_version](
                throttle_time_ms=0, topics=[], error_code=KafkaError.GROUP_AUTHORIZATION_FAILED
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="groups",
            resource=lambda g: ("GROUP", g.group_id),
            operation="DESCRIBE",
            denied_entry=lambda g, code: R.OffsetFetchResponseGroup(
                group_id=g.group_id, topics=[], error_code=code
            ),
            answer="groups",
        )

    async def _describe_groups(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(15)
        return await self._split(
            handler,
            req,
            ctx,
            items="groups",
            resource=lambda g: ("GROUP", g),
            operation="DESCRIBE",
            denied_entry=lambda g, code: R.DescribedGroup(
                error_code=code,
                group_id=g,
                group_state="",
                protocol_type="",
                protocol_data="",
                members=[],
            ),
            answer="groups",
        )

    async def _list_groups(self, handler: Handler, req: Any, ctx: Any) -> Any:
        response = await handler(req, ctx)
        if not self.allowed_cluster(ctx, "DESCRIBE"):
            response.groups = [
                g for g in response.groups if self.allowed(ctx, "DESCRIBE", "GROUP", g.group_id)
            ]
        return response

    async def _delete_groups(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(42)
        return await self._split(
            handler,
            req,
            ctx,
            items="groups_names",
            resource=lambda g: ("GROUP", g),
            operation="DELETE",
            denied_entry=lambda g, code: R.DeletableGroupResult(group_id=g, error_code=code),
            answer="results",
        )

    def _cluster_request(self, operation: str):
        """An API about the whole cluster: `operation` on the cluster, else the whole
        answer is CLUSTER_AUTHORIZATION_FAILED (the response's top-level error code)."""

        async def check(handler: Handler, req: Any, ctx: Any) -> Any:
            if self.allowed_cluster(ctx, operation):
                return await handler(req, ctx)
            # versions without a top-level error code (DescribeLogDirs v1-2) encode an empty
            # answer, which is what Kafka sends them
            return response_class(ctx.api_key)[ctx.api_version](
                throttle_time_ms=0, error_code=KafkaError.CLUSTER_AUTHORIZATION_FAILED
            )

        return check

    async def _delete_records(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(21)
        return await self._split(
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

    async def _offset_delete(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(47)
        if not self.allowed(ctx, "DELETE", "GROUP", req.group_id):
            return R[ctx.api_version](
                error_code=KafkaError.GROUP_AUTHORIZATION_FAILED, throttle_time_ms=0, topics=[]
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=lambda t, code: R.OffsetDeleteResponseTopic(
                name=t.name,
                partitions=[
                    R.OffsetDeleteResponseTopic.OffsetDeleteResponsePartition(
                        partition_index=p.partition_index, error_code=code
                    )
                    for p in t.partitions
                ],
            ),
            answer="topics",
        )

    async def _describe_producers(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """READ on each topic (Kafka's rule); denied topics: TOPIC_AUTHORIZATION_FAILED."""
        R = response_class(61)
        return await self._split(
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

    async def _describe_transactions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """DESCRIBE on each transactional id; denied: TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
        R = response_class(65)
        return await self._split(
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

    async def _list_transactions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """Only the transactional ids the principal may DESCRIBE (as ListGroups filters)."""
        response = await handler(req, ctx)
        response.transaction_states = [
            t
            for t in response.transaction_states
            if self.allowed(ctx, "DESCRIBE", "TRANSACTIONAL_ID", t.transactional_id)
        ]
        return response

    async def _init_producer_id(self, handler: Handler, req: Any, ctx: Any) -> Any:
        R = response_class(22)
        txn = req.transactional_id
        if txn:
            ok, code = (
                self.allowed(ctx, "WRITE", "TRANSACTIONAL_ID", txn),
                KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            )
        else:
            # Kafka 3+: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or
            # WRITE on some topic
            principal = ctx.extras.get("principal") or ""
            ok = self.allowed_cluster(ctx, "IDEMPOTENT_WRITE") or allows_any(
                self.image_fn().acls.values(),
                self.authorizer.super_users,
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

    # ------------------------------------------------------------ transactions (Kafka's
    # KafkaApis: WRITE on the transactional id first, then the topics / group)

    def _txn_denied(self, ctx: Any, txn_id: str | None) -> bool:
        return not self.allowed(ctx, "WRITE", "TRANSACTIONAL_ID", txn_id or "")

    async def _add_partitions_to_txn(self, handler: Handler, req: Any, ctx: Any) -> Any:
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
                if not self.allowed(ctx, "WRITE", "TOPIC", t.name)
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

    async def _add_offsets_to_txn(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """WRITE on the transactional id, READ on the group."""
        if self._txn_denied(ctx, req.transactional_id):
            code = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self.allowed(ctx, "READ", "GROUP", req.group_id):
            code = KafkaError.GROUP_AUTHORIZATION_FAILED
        else:
            return await handler(req, ctx)
        return response_class(25)[ctx.api_version](throttle_time_ms=0, error_code=code)

    async def _end_txn(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """WRITE on the transactional id."""
        if not self._txn_denied(ctx, req.transactional_id):
            return await handler(req, ctx)
        return response_class(26)[ctx.api_version](
            throttle_time_ms=0, error_code=KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )

    async def _txn_offset_commit(self, handler: Handler, req: Any, ctx: Any) -> Any:
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
        elif not self.allowed(ctx, "READ", "GROUP", req.group_id):
            code = KafkaError.GROUP_AUTHORIZATION_FAILED
        if code != KafkaError.NONE:
            return R[ctx.api_version](
                throttle_time_ms=0, topics=[denied(t, code) for t in req.topics or []]
            )
        return await self._split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=denied,
            answer="topics",
        )

    async def _write_txn_markers(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """Brokers only: CLUSTER_ACTION on the cluster (a transaction coordinator's markers),
        else every partition is CLUSTER_AUTHORIZATION_FAILED."""
        if self.allowed_cluster(ctx, "CLUSTER_ACTION"):
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
