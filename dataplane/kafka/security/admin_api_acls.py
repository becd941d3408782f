"""ACL rules of the topic and cluster admin APIs: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs / IncrementalAlterConfigs, DescribeCluster and the APIs about
the whole cluster (DescribeLogDirs, partition reassignments)."""

from __future__ import annotations

import uuid
from typing import Any

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class
from dataplane.kafka.security.acl_checks import AclChecks, Handler, Policy
from dataplane.kafka.security.authorizer import CLUSTER_RESOURCE

_CONFIG_RESOURCE = {2: "TOPIC", 4: "CLUSTER"}  # ConfigResource types: topic, broker


class AdminApiAcls:
    """Checks the admin APIs' topics, config resources and the cluster (see the module docstring)."""

    def __init__(self, checks: AclChecks) -> None:
        self.checks = checks

    def policies(self) -> dict[int, Policy]:
        """The rule of each API key these rules cover."""
        return {
            19: self.create_topics,
            20: self.delete_topics,
            37: self.create_partitions,
            32: self.describe_configs,
            33: self.alter_configs,
            44: self.alter_configs,
            60: self.describe_cluster,
            35: self._cluster_request("DESCRIBE"),  # DescribeLogDirs
            45: self._cluster_request("ALTER"),  # AlterPartitionReassignments
            46: self._cluster_request("DESCRIBE"),  # ListPartitionReassignments
        }

    async def create_topics(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of CreateTopics."""
        R = response_class(19)
        cluster_create = self.checks.allowed_cluster(ctx, "CREATE")
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation=lambda _type, name: (
                cluster_create or self.checks.allowed(ctx, "CREATE", "TOPIC", name)
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

    async def delete_topics(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of DeleteTopics."""
        R = response_class(20)
        if ctx.api_version < 6:
            return await self.checks.split(
                handler,
                req,
                ctx,
                items="topic_names",
                resource=lambda name: ("TOPIC", name),
                operation="DELETE",
                denied_entry=lambda name, code: R.DeletableTopicResult(name=name, error_code=code),
                answer="responses",
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: (
                ("TOPIC", t.name or self.checks.topic_id_name(t.topic_id))
                if (t.name or self.checks.topic_id_name(t.topic_id))
                else None
            ),
            operation="DELETE",
            denied_entry=lambda t, code: R.DeletableTopicResult(
                name=t.name, topic_id=t.topic_id, error_code=code
            ),
            answer="responses",
        )

    async def create_partitions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of CreatePartitions."""
        R = response_class(37)
        return await self.checks.split(
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

    async def describe_configs(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of DescribeConfigs."""
        R = response_class(32)
        return await self.checks.split(
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

    async def alter_configs(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of AlterConfigs and IncrementalAlterConfigs."""
        R = response_class(ctx.api_key)
        return await self.checks.split(
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

    async def describe_cluster(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of DescribeCluster."""
        # the broker list is what Metadata gives any principal too (Kafka checks nothing
        # but the authorized-operations bitfield, narrowed here to the principal's)
        response = await handler(req, ctx)
        if getattr(response, "authorized_operations", None) is not None:
            response.authorized_operations = self.checks.authorized_operations(
                ctx, "CLUSTER", CLUSTER_RESOURCE
            )
        return response

    def _cluster_request(self, operation: str):
        """An API about the whole cluster: `operation` on the cluster, else the whole
        answer is CLUSTER_AUTHORIZATION_FAILED (the response's top-level error code)."""

        async def check(handler: Handler, req: Any, ctx: Any) -> Any:
            if self.checks.allowed_cluster(ctx, operation):
                return await handler(req, ctx)
            # versions without a top-level error code (DescribeLogDirs v1-2) encode an empty
            # answer, which is what Kafka sends them
            return response_class(ctx.api_key)[ctx.api_version](
                throttle_time_ms=0, error_code=KafkaError.CLUSTER_AUTHORIZATION_FAILED
            )

        return check
