"""The broker's topic admin APIs: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs and IncrementalAlterConfigs (of topics and of brokers). Each
change goes through the controller; the handler answers once this broker's image holds it,
so a request right after sees it. `validate_only` runs the state machine's own checks on this
broker's image and changes nothing.
"""

from __future__ import annotations

import time
import uuid

from kafka.protocol.admin import (
    AlterConfigsResponse,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
    DescribeConfigsResponse,
    IncrementalAlterConfigsResponse,
)

from controlplane import broker_configs, topic_configs, topics
from controlplane import requests as cmd
from controlplane.calls import build_request
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.api_context import (
    METADATA_WAIT_S,
    BrokerApiContext,
    kafka_error,
)
from dataplane.kafka.share import group_configs
from dataplane.kafka.share.partitions import ShareSettings

# ConfigResource.Type and AlterConfigOp.OpType of Kafka's admin protocol
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
_INCREMENTAL_OPS = {0: "set", 1: "delete", 2: "append", 3: "subtract"}


def _config_ops(res, incremental: bool) -> list[dict]:
    """An (Incremental)AlterConfigs resource's entries as the controller's config ops
    (AlterConfigs sets every key it names)."""
    return [
        {
            "key": c.name,
            "op": _INCREMENTAL_OPS.get(c.config_operation, str(c.config_operation))
            if incremental
            else "set",
            "value": c.value,
        }
        for c in res.configs
    ]


def _created_topic_configs(configs: dict) -> list:
    """CreateTopics v5+ answers the new topic's configs (as DescribeConfigs would)."""
    C = CreateTopicsResponse.CreatableTopicResult.CreatableTopicConfigs
    stored = topic_configs.validate_new_topic_configs(configs)  # as the controller stored them
    return [
        C(
            name=row.name,
            value=row.value,
            read_only=row.read_only,
            config_source=row.source.value,
            is_sensitive=False,
        )
        for row in topic_configs.describe(stored)
    ]


class _AssignmentRefused(Exception):
    """A CreateTopics manual replica assignment Kafka refuses: its error and message."""

    def __init__(self, error: KafkaError, message: str):
        super().__init__(message)
        self.error = error
        self.message = message


def assigned_partition_count(t, image: MetadataImage) -> int | None:
    """The partition count of a CreateTopics topic with a manual replica assignment (its
    number of partitions), None without one; Kafka's checks of the assignment first.

    The assignment decides how many partitions there are, nothing more: a partition here
    has one replica, its stream in object storage (there is no follower to place), and its
    leader is the controller's placement (`controlplane/placement.py`), as for any new
    topic, not the assignment's first broker: leadership is a cheap, movable role here
    (the balancer moves it by load), and placing it in the request would add a field every
    controller must validate. The brokers named must still be registered, as in Kafka.

    Raises _AssignmentRefused: INVALID_REQUEST when num_partitions or replication_factor
    is set too; INVALID_REPLICA_ASSIGNMENT for partitions not numbered 0..n-1, an empty or
    duplicated replica list, replica lists of different lengths, or an unknown broker."""
    assignments = list(t.assignments or [])
    if not assignments:
        return None
    if t.num_partitions != -1 or t.replication_factor != -1:
        raise _AssignmentRefused(
            KafkaError.INVALID_REQUEST,
            "Both numPartitions or replicationFactor and replicasAssignments were set. "
            "Both cannot be used at the same time.",
        )
    invalid = KafkaError.INVALID_REPLICA_ASSIGNMENT
    indexes = sorted(a.partition_index for a in assignments)
    if indexes != list(range(len(assignments))):
        raise _AssignmentRefused(
            invalid, "partitions should be a consecutive 0-based integer sequence"
        )
    sizes = {len(a.broker_ids) for a in assignments}
    for a in assignments:
        if not a.broker_ids:
            raise _AssignmentRefused(
                invalid, "The manual partition assignment includes an empty replica list."
            )
        if len(set(a.broker_ids)) != len(a.broker_ids):
            raise _AssignmentRefused(
                invalid, f"partition {a.partition_index}: duplicate broker in {a.broker_ids}"
            )
        unknown = [b for b in a.broker_ids if b not in image.brokers]
        if unknown:
            raise _AssignmentRefused(
                invalid,
                f"The manual partition assignment includes broker {unknown[0]}, "
                "but no such broker is registered.",
            )
    if len(sizes) > 1:
        raise _AssignmentRefused(
            invalid,
            "All partitions in the manual partition assignment should have the same "
            "number of replicas",
        )
    return len(assignments)


class TopicAdminApis:
    """Handlers of the topic and config admin APIs (and the configs of share groups,
    `share/group_configs.py`, over `share_defaults`)."""

    def __init__(self, broker: BrokerApiContext, share_defaults: ShareSettings | None = None):
        self.broker = broker
        self.share_defaults = share_defaults or ShareSettings()

    def _create_topic(self, name: str, partitions: int, configs: dict, validate_only: bool):
        req = build_request(
            cmd.CreateTopicRequest, name=name, partitions=partitions, configs=configs
        )
        if validate_only:
            # the state machine's own checks (name, existence, configs, brokers) on this
            # broker's image, with a throwaway id: nothing is replicated
            topics.create_topic(
                self.broker.image_fn(), req.model_copy(update={"topic_id": str(uuid.uuid4())}), 0
            )
            return None
        res = self.broker.controller.create_topic(req)
        self.broker.await_topics([name])
        return res

    async def create_topics(self, req, ctx):
        """Create each topic (or only validate it) and answer once this broker serves it."""
        v = ctx.api_version
        R = CreateTopicsResponse
        out = []
        for t in req.topics:
            partitions = (
                t.num_partitions
                if t.num_partitions > 0
                else self.broker.topic_creation.default_partitions
            )
            configs = {c.name: c.value for c in (t.configs or []) if c.value is not None}
            error, message, topic_id = KafkaError.NONE, None, uuid.UUID(int=0)
            nulls = [c.name for c in (t.configs or []) if c.value is None]
            try:
                partitions = assigned_partition_count(t, self.broker.image_fn()) or partitions
                if nulls:
                    raise ControllerError(
                        ErrorCode.INVALID_CONFIG,
                        f"Null value not supported for topic configs: {', '.join(nulls)}",
                    )
                res = await self.broker.run_io(
                    self._create_topic, t.name, partitions, configs, bool(req.validate_only)
                )
                if res:
                    topic_id = uuid.UUID(res.topic_id)
            except _AssignmentRefused as exc:
                error, message = exc.error, exc.message
            except ControllerError as exc:
                error, message = kafka_error(exc), exc.message
            out.append(
                R.CreatableTopicResult(
                    name=t.name,
                    topic_id=topic_id,
                    error_code=error,
                    error_message=message,
                    num_partitions=partitions if error == KafkaError.NONE else -1,
                    replication_factor=1 if error == KafkaError.NONE else -1,
                    configs=_created_topic_configs(configs) if error == KafkaError.NONE else [],
                )
            )
        return R[v](throttle_time_ms=0, topics=out)

    def _delete_topic(self, name: str) -> None:
        self.broker.controller.delete_topic(build_request(cmd.DeleteTopicRequest, name=name))
        self.broker.await_topics([name], present=False)

    async def delete_topics(self, req, ctx):
        """Delete each topic (by name, or by id from v6) and answer once it is gone here."""
        v = ctx.api_version
        R = DeleteTopicsResponse
        image = self.broker.image_fn()
        targets = []
        if v >= 6:
            for t in req.topics:
                name = t.name
                if name is None and t.topic_id is not None:
                    topic = image.topics.get(str(t.topic_id))
                    name = topic.name if topic else None
                targets.append((name, t.topic_id))
        else:
            targets = [(n, None) for n in req.topic_names]
        out = []
        for name, _tid in targets:
            error, message = KafkaError.NONE, None
            topic = image.topic_by_name(name) if name else None
            if topic is None:
                error = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
            else:
                try:
                    await self.broker.run_io(self._delete_topic, name)
                except ControllerError as exc:
                    error, message = kafka_error(exc), exc.message
            out.append(
                R.DeletableTopicResult(
                    name=name,
                    topic_id=uuid.UUID(topic.topic_id) if topic else uuid.UUID(int=0),
                    error_code=error,
                    error_message=message,
                )
            )
        return R[v](throttle_time_ms=0, responses=out)

    def _create_partitions(self, name: str, count: int, validate_only: bool) -> None:
        if validate_only:
            topic = self.broker.image_fn().topic_by_name(name)
            if topic is None:
                raise ControllerError(ErrorCode.UNKNOWN_TOPIC, f"topic {name} does not exist")
            if count <= len(topic.partitions):
                raise ControllerError(ErrorCode.INVALID_PARTITIONS, "count must grow")
            return
        self.broker.controller.create_partitions(
            build_request(cmd.CreatePartitionsRequest, name=name, total_count=count)
        )
        deadline = time.monotonic() + METADATA_WAIT_S
        while time.monotonic() < deadline:
            topic = self.broker.image_fn().topic_by_name(name)
            if topic is not None and len(topic.partitions) >= count:
                return
            time.sleep(0.02)

    async def create_partitions(self, req, ctx):
        """Grow each topic to its new partition count (or only validate it)."""
        v = ctx.api_version
        R = CreatePartitionsResponse
        out = []
        for t in req.topics:
            error, message = KafkaError.NONE, None
            try:
                await self.broker.run_io(
                    self._create_partitions, t.name, t.count, bool(req.validate_only)
                )
            except ControllerError as exc:
                error, message = kafka_error(exc), exc.message
            out.append(
                R.CreatePartitionsTopicResult(name=t.name, error_code=error, error_message=message)
            )
        return R[v](throttle_time_ms=0, results=out)

    async def describe_configs(self, req, ctx):
        """Every topic config with its value in force and source (TOPIC_CONFIG when set on
        the topic, DEFAULT_CONFIG otherwise), synonyms and documentation when asked; a
        broker's static configs."""
        v = ctx.api_version
        R = DescribeConfigsResponse
        Entry = R.DescribeConfigsResult.DescribeConfigsResourceResult
        image = self.broker.image_fn()
        synonyms_wanted = bool(getattr(req, "include_synonyms", False))
        docs_wanted = bool(getattr(req, "include_documentation", False))
        results = []
        for res in req.resources:
            error, message, rows = KafkaError.NONE, None, []
            if res.resource_type == RESOURCE_TOPIC:
                topic = image.topic_by_name(res.resource_name)
                if topic is None:
                    error = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                    message = f"topic {res.resource_name!r} does not exist"
                else:
                    rows = topic_configs.describe(
                        topic.configs,
                        broker_configs.configs_of(image, ""),
                        broker_configs.configs_of(image, str(self.broker.me.node_id)),
                    )
            elif res.resource_type == RESOURCE_BROKER:
                error, message, rows = self.describe_broker(image, res.resource_name)
            elif res.resource_type == group_configs.RESOURCE_GROUP:
                rows = group_configs.describe(image, res.resource_name, self.share_defaults)
            else:
                error = KafkaError.INVALID_REQUEST
                message = f"unsupported resource type {res.resource_type}"
            keys = res.configuration_keys
            entries = [
                Entry(
                    name=row.name,
                    value=row.value,
                    read_only=row.read_only,
                    is_default=row.source == topic_configs.ConfigSource.DEFAULT_CONFIG,
                    config_source=row.source.value,
                    is_sensitive=row.name in topic_configs.SENSITIVE_BROKER_KEYS,
                    synonyms=[
                        Entry.DescribeConfigsSynonym(name=n, value=val, source=src.value)
                        for n, val, src in row.synonyms
                    ]
                    if synonyms_wanted
                    else [],
                    config_type=row.config_type,
                    documentation=row.doc if docs_wanted else None,
                )
                for row in rows
                if not keys or row.name in keys  # null or empty: all (as Kafka)
            ]
            results.append(
                R.DescribeConfigsResult(
                    error_code=error,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                    configs=entries,
                )
            )
        return R[v](throttle_time_ms=0, results=results)

    def describe_broker(self, image, resource: str) -> tuple[int, str | None, list]:
        """A broker's static configs and every dynamic one (the topic defaults' broker
        synonyms, then the broker's own settings) with its value in force and source;
        resource "" = the cluster default."""
        if resource and (not resource.isdigit() or int(resource) not in image.brokers):
            return KafkaError.INVALID_REQUEST, f"broker {resource!r} is not registered", []
        static = topic_configs.ConfigSource.STATIC_BROKER_CONFIG
        rows = [
            topic_configs.DescribedConfig(k, v, static, True, 0, None, ((k, v, static),))
            for k, v in (
                sorted(self._broker_configs(image, int(resource)).items()) if resource else []
            )
        ]
        cluster = broker_configs.configs_of(image, "")
        node = broker_configs.configs_of(image, resource) if resource else {}
        by_topic_key = {row.name: row for row in topic_configs.describe({}, cluster, node)}
        for key, topic_key in sorted(topic_configs.BROKER_SYNONYMS.items()):
            row = by_topic_key[topic_key]
            if row.read_only:
                continue
            rows.append(
                topic_configs.DescribedConfig(
                    key, row.value, row.source, False, row.config_type, row.doc, row.synonyms
                )
            )
        rows += topic_configs.describe_broker_settings(cluster, node)
        rows += topic_configs.describe_stored_broker_keys(cluster, node)
        return KafkaError.NONE, None, rows

    def _alter_broker_configs(self, req: cmd.AlterBrokerConfigsRequest, validate_only: bool):
        if validate_only:
            broker_configs.alter_broker_configs(self.broker.image_fn(), req, 0)
            return
        res = self.broker.controller.alter_broker_configs(req)
        self.broker.wait_for_offset(res.metadata_offset, METADATA_WAIT_S)

    def _broker_configs(self, image: MetadataImage, node_id: int) -> dict[str, str]:
        broker = image.brokers.get(node_id)
        configs = {
            # the described broker's, as registered (any broker answers for any other)
            "broker.id": str(node_id),
            "broker.rack": broker.az if broker is not None else self.broker.me.az,
            # this broker's (brokers of one cluster are configured alike)
            "num.partitions": str(self.broker.topic_creation.default_partitions),
            "auto.create.topics.enable": str(self.broker.topic_creation.auto_create).lower(),
        }
        if broker is not None and broker.endpoints:  # the described broker's, as registered
            configs["listeners"] = ",".join(
                f"{e.name}://{e.host}:{e.port}" for e in broker.endpoints
            )
            configs["listener.security.protocol.map"] = ",".join(
                f"{e.name}:{e.security_protocol}" for e in broker.endpoints
            )
        return configs

    def _alter_topic_configs(self, req: cmd.AlterTopicConfigsRequest, validate_only: bool):
        """Validate (validate_only: the state machine's own check on this broker's image)
        or apply one topic's alter, then wait until this broker's image holds it, so a
        DescribeConfigs or a produce right after sees the new values."""
        if validate_only:
            topics.alter_topic_configs(self.broker.image_fn(), req, 0)
            return
        res = self.broker.controller.alter_topic_configs(req)
        self.broker.wait_for_offset(res.metadata_offset, METADATA_WAIT_S)

    async def _alter_configs(self, req, ctx, R, incremental: bool):
        v = ctx.api_version
        seen: dict[tuple[int, str], int] = {}
        for res in req.resources:
            key = (res.resource_type, res.resource_name)
            seen[key] = seen.get(key, 0) + 1
        out = []
        for res in req.resources:
            error, message = KafkaError.NONE, None
            if seen[(res.resource_type, res.resource_name)] > 1:
                error, message = KafkaError.INVALID_REQUEST, "duplicate resource in the request"
            elif res.resource_type == RESOURCE_BROKER:
                error, message = await self._alter_broker(res, req, incremental)
            elif res.resource_type == group_configs.RESOURCE_GROUP:
                error, message = await self.broker.run_io(
                    group_configs.alter,
                    self.broker.controller,
                    self.broker.image_fn,
                    res.resource_name,
                    _config_ops(res, incremental),
                    not incremental,
                    bool(req.validate_only),
                )
            elif res.resource_type != RESOURCE_TOPIC:
                error = KafkaError.INVALID_REQUEST
                message = f"unsupported resource type {res.resource_type}"
            else:
                try:
                    alter = build_request(
                        cmd.AlterTopicConfigsRequest,
                        name=res.resource_name,
                        ops=_config_ops(res, incremental),
                        replace=not incremental,
                    )
                    await self.broker.run_io(
                        self._alter_topic_configs, alter, bool(req.validate_only)
                    )
                except ControllerError as exc:
                    error, message = kafka_error(exc), exc.message
            out.append(
                R.AlterConfigsResourceResponse(
                    error_code=error,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                )
            )
        return R[v](throttle_time_ms=0, responses=out)

    async def _alter_broker(self, res, req, incremental: bool) -> tuple[int, str | None]:
        """Dynamic configs of every broker (resource name "") or of one registered broker."""
        name = res.resource_name or ""
        if name and (not name.isdigit() or int(name) not in self.broker.image_fn().brokers):
            return KafkaError.INVALID_REQUEST, f"broker {name!r} is not registered"
        try:
            alter = build_request(
                cmd.AlterBrokerConfigsRequest,
                resource=name,
                ops=_config_ops(res, incremental),
                replace=not incremental,
            )
            await self.broker.run_io(self._alter_broker_configs, alter, bool(req.validate_only))
        except ControllerError as exc:
            return kafka_error(exc), exc.message
        return KafkaError.NONE, None

    async def alter_configs(self, req, ctx):
        """AlterConfigs: a topic's configs become exactly the ones given (others default)."""
        return await self._alter_configs(req, ctx, AlterConfigsResponse, incremental=False)

    async def incremental_alter_configs(self, req, ctx):
        """IncrementalAlterConfigs: SET/DELETE any key, APPEND/SUBTRACT list keys."""
        return await self._alter_configs(
            req, ctx, IncrementalAlterConfigsResponse, incremental=True
        )
