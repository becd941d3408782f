"""ACL enforcement around the real Kafka API handlers (in-process broker, no server):
denied entries get Kafka's authorization errors, allowed ones are served, and nothing the
principal may not see or do leaks through Metadata, auto-creation or group APIs."""

from __future__ import annotations

import asyncio

import pytest
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.fetch_encoder import FetchAnswer
from dataplane.kafka.registry import ApiRegistry, CloseConnection, RequestContext
from dataplane.kafka.security.authorizer import Authorizer
from dataplane.kafka.security.enforcement import AclEnforcer
from tests.unit.inprocess_broker import inprocess_broker
from tests.unit.test_kafka_apis_inprocess import batch, fetch_req, produce_req


def ctx(api_key: int, version: int, principal: str | None = "User:alice") -> RequestContext:
    return RequestContext(
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="unit",
        peer=("127.0.0.1", 1),
        extras={"principal": principal} if principal else {},
    )


@pytest.fixture
def secured(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with inprocess_broker(tmp_path) as (apis, controller, sync):
        registry = ApiRegistry()
        for cls, lo, hi, handler in apis.registrations():
            registry.register(cls, lo, hi, handler)
        AclEnforcer(Authorizer(["User:admin"]), apis.image_fn).install(registry)
        for name in ("orders", "secret"):
            controller.call("create_topic", {"name": name, "partitions": 1})
        sync()

        def handler(key: int):
            return registry.get(key).handler

        def grant(*bindings: dict) -> None:
            controller.call("create_acls", {"bindings": list(bindings)})
            sync()

        yield handler, grant, controller


def acl(op: str, name: str = "orders", rtype: str = "TOPIC", **kw) -> dict:
    return {
        "resource_type": rtype,
        "resource_name": name,
        "principal": "User:alice",
        "operation": op,
        "permission": "ALLOW",
        **kw,
    }


def resolved(response):
    """A fetch response as the client decodes it (record sets spliced in)."""
    if isinstance(response, FetchAnswer):
        return response.resolved()
    return response


def test_produce_and_fetch_need_write_and_read(secured):
    handler, grant, _ = secured
    produce, fetch = handler(0), handler(1)

    denied = asyncio.run(produce(produce_req("orders", batch([b"x"])), ctx(0, 9)))
    part = denied.responses[0].partition_responses[0]
    assert (denied.responses[0].name, part.error_code) == (
        "orders",
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    )

    grant(acl("WRITE"))
    ok = asyncio.run(produce(produce_req("orders", batch([b"x"])), ctx(0, 9)))
    assert ok.responses[0].partition_responses[0].error_code == KafkaError.NONE
    # a super user needs no ACL
    admin = asyncio.run(produce(produce_req("secret", batch([b"s"])), ctx(0, 9, "User:admin")))
    assert admin.responses[0].partition_responses[0].error_code == KafkaError.NONE

    got = resolved(asyncio.run(fetch(fetch_req("orders", 0), ctx(1, 12))))
    assert got.responses[0].partitions[0].error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert got.responses[0].partitions[0].records == b""  # no data leaks
    grant(acl("READ"))
    got = resolved(asyncio.run(fetch(fetch_req("orders", 0), ctx(1, 12))))
    assert got.responses[0].partitions[0].error_code == KafkaError.NONE
    assert got.responses[0].partitions[0].records


def test_a_request_mixing_allowed_and_denied_topics_is_split(secured):
    handler, grant, _ = secured
    grant(acl("DESCRIBE"))
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=-1
    )
    req = ListOffsetsRequest[7](
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=n, partitions=[part])
            for n in ("orders", "secret")
        ],
    )
    resp = asyncio.run(handler(2)(req, ctx(2, 7)))
    codes = {t.name: t.partitions[0].error_code for t in resp.topics}
    assert codes == {"orders": KafkaError.NONE, "secret": KafkaError.TOPIC_AUTHORIZATION_FAILED}


def test_metadata_hides_topics_and_auto_creation_needs_create(secured):
    handler, grant, controller = secured
    metadata = handler(3)
    everything = MetadataRequest[9](topics=None, allow_auto_topic_creation=True)
    assert asyncio.run(metadata(everything, ctx(3, 9))).topics == []
    grant(acl("DESCRIBE"))
    names = [t.name for t in asyncio.run(metadata(everything, ctx(3, 9))).topics]
    assert names == ["orders"]

    def wanted():  # a fresh request each time, as the server decodes one per frame
        return MetadataRequest[9](
            topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in ("secret", "newtopic")],
            allow_auto_topic_creation=True,
        )

    grant(acl("DESCRIBE", "newtopic"))
    resp = asyncio.run(metadata(wanted(), ctx(3, 9)))
    codes = {t.name: t.error_code for t in resp.topics}
    assert codes["secret"] == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert codes["newtopic"] == KafkaError.UNKNOWN_TOPIC_OR_PARTITION  # not auto-created
    assert "newtopic" not in [t["name"] for t in controller.image()["topics"].values()]
    grant(acl("CREATE", "newtopic"))
    resp = asyncio.run(metadata(wanted(), ctx(3, 9)))
    assert {t.name: t.error_code for t in resp.topics}["newtopic"] in (
        KafkaError.NONE,
        KafkaError.LEADER_NOT_AVAILABLE,
    )


def test_idempotent_producer_needs_idempotent_write_or_some_topic_write(secured):
    from kafka.protocol.producer import InitProducerIdRequest

    handler, grant, _ = secured
    init = handler(22)
    req = InitProducerIdRequest[4](
        transactional_id=None, transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1
    )
    denied = asyncio.run(init(req, ctx(22, 4)))
    assert denied.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    grant(acl("WRITE"))  # WRITE on some topic lets an idempotent producer start
    assert asyncio.run(init(req, ctx(22, 4))).error_code == KafkaError.NONE


def test_an_api_without_a_rule_is_for_super_users_only():
    registry = ApiRegistry()
    enforcer = AclEnforcer(Authorizer(["User:admin"]), lambda: None)

    async def describe_quorum(body, c):
        return "served"

    from kafka.protocol.admin import DescribeQuorumRequest

    registry.register(DescribeQuorumRequest, 0, 0, describe_quorum)
    enforcer.install(registry)
    wrapped = registry.get(int(DescribeQuorumRequest.API_KEY)).handler
    assert asyncio.run(wrapped(None, ctx(55, 0, "User:admin"))) == "served"
    with pytest.raises(CloseConnection):
        asyncio.run(wrapped(None, ctx(55, 0, "User:alice")))


def test_delete_records_and_cluster_admin_apis():
    from kafka.protocol.admin import (
        DeleteRecordsRequest,
        DeleteRecordsResponse,
        ListPartitionReassignmentsRequest,
        ListPartitionReassignmentsResponse,
    )

    from controlplane.image import MetadataImage
    from controlplane.records import AclBinding

    image = MetadataImage(
        acls={
            "a": AclBinding(
                resource_type="TOPIC",
                resource_name="orders",
                principal="User:alice",
                operation="DELETE",
                permission="ALLOW",
            )
        }
    )
    seen: list[list[str]] = []

    async def delete_records(req, c):
        seen.append([t.name for t in req.topics])
        R = DeleteRecordsResponse
        return R[2](
            throttle_time_ms=0,
            topics=[
                R.DeleteRecordsTopicResult(
                    name=t.name,
                    partitions=[
                        R.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                            partition_index=0, low_watermark=5, error_code=0
                        )
                    ],
                )
                for t in req.topics
            ],
        )

    async def list_reassignments(req, c):
        return ListPartitionReassignmentsResponse[0](throttle_time_ms=0, error_code=0, topics=[])

    registry = ApiRegistry()
    registry.register(DeleteRecordsRequest, 0, 2, delete_records)
    registry.register(ListPartitionReassignmentsRequest, 0, 0, list_reassignments)
    AclEnforcer(Authorizer(["User:admin"]), lambda: image).install(registry)

    P = DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition
    req = DeleteRecordsRequest[2](
        topics=[
            DeleteRecordsRequest.DeleteRecordsTopic(
                name=n, partitions=[P(partition_index=0, offset=5)]
            )
            for n in ("orders", "secret")
        ],
        timeout_ms=1000,
    )
    resp = asyncio.run(registry.get(21).handler(req, ctx(21, 2)))
    assert seen == [["orders"]]  # the denied topic never reached the handler
    codes = {t.name: t.partitions[0].error_code for t in resp.topics}
    assert codes == {"orders": 0, "secret": KafkaError.TOPIC_AUTHORIZATION_FAILED}

    lpr = ListPartitionReassignmentsRequest[0](timeout_ms=1000, topics=None)
    denied = asyncio.run(registry.get(46).handler(lpr, ctx(46, 0)))
    assert denied.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    allowed = asyncio.run(registry.get(46).handler(lpr, ctx(46, 0, "User:admin")))
    assert allowed.error_code == 0


def _txn_registry(bindings: list[dict]):
    """The transaction APIs behind the enforcer, with stand-ins that record what reached
    them and answer success; ACLs of `bindings` (principal User:alice unless given)."""
    from kafka.protocol.producer import (
        AddOffsetsToTxnRequest,
        AddOffsetsToTxnResponse,
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnResponse,
        EndTxnRequest,
        EndTxnResponse,
        TxnOffsetCommitRequest,
        TxnOffsetCommitResponse,
        WriteTxnMarkersRequest,
        WriteTxnMarkersResponse,
    )

    from controlplane.image import MetadataImage
    from controlplane.records import AclBinding

    image = MetadataImage(acls={str(i): AclBinding(**acl(**b)) for i, b in enumerate(bindings)})
    seen: list[tuple[int, object]] = []

    async def add_partitions(req, c):
        seen.append((24, [t.name for t in req.v3_and_below_topics]))
        TR = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
        return AddPartitionsToTxnResponse[c.api_version](
            throttle_time_ms=0,
            results_by_topic_v3_and_below=[
                TR(
                    name=t.name,
                    results_by_partition=[
                        TR.AddPartitionsToTxnPartitionResult(
                            partition_index=p, partition_error_code=0
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.v3_and_below_topics
            ],
        )

    async def add_offsets(req, c):
        seen.append((25, req.group_id))
        return AddOffsetsToTxnResponse[c.api_version](throttle_time_ms=0, error_code=0)

    async def end_txn(req, c):
        seen.append((26, req.transactional_id))
        return EndTxnResponse[c.api_version](throttle_time_ms=0, error_code=0)

    async def txn_offset_commit(req, c):
        seen.append((28, [t.name for t in req.topics]))
        R = TxnOffsetCommitResponse
        P = R.TxnOffsetCommitResponseTopic.TxnOffsetCommitResponsePartition
        return R[c.api_version](
            throttle_time_ms=0,
            topics=[
                R.TxnOffsetCommitResponseTopic(
                    name=t.name,
                    partitions=[
                        P(partition_index=p.partition_index, error_code=0) for p in t.partitions
                    ],
                )
                for t in req.topics
            ],
        )

    async def write_markers(req, c):
        seen.append((27, None))
        return WriteTxnMarkersResponse[1](markers=[])

    registry = ApiRegistry()
    registry.register(AddPartitionsToTxnRequest, 0, 3, add_partitions)
    registry.register(AddOffsetsToTxnRequest, 0, 3, add_offsets)
    registry.register(EndTxnRequest, 0, 3, end_txn)
    registry.register(TxnOffsetCommitRequest, 0, 3, txn_offset_commit)
    registry.register(WriteTxnMarkersRequest, 1, 1, write_markers)
    AclEnforcer(Authorizer(["User:admin", "User:broker"]), lambda: image).install(registry)
    return registry, seen


def _add_partitions_req(txn_id: str, topics: dict[str, list[int]]):
    from kafka.protocol.producer import AddPartitionsToTxnRequest as R

    return R[3](
        v3_and_below_transactional_id=txn_id,
        v3_and_below_producer_id=7,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[
            R.AddPartitionsToTxnTopic(name=n, partitions=ps) for n, ps in topics.items()
        ],
    )


def _codes(resp) -> dict[tuple[str, int], int]:
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in resp.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def test_add_partitions_to_txn_needs_write_on_the_id_and_each_topic():
    registry, seen = _txn_registry(
        [
            {"op": "WRITE", "name": "tx-", "rtype": "TRANSACTIONAL_ID", "pattern_type": "PREFIXED"},
            {"op": "WRITE", "name": "orders"},
        ]
    )
    handler = registry.get(24).handler
    # no ACL on the id: every partition refused with 53, nothing reaches the coordinator
    resp = asyncio.run(handler(_add_partitions_req("other", {"orders": [0, 1]}), ctx(24, 3)))
    assert set(_codes(resp).values()) == {KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    assert seen == []
    # a topic without WRITE: it is refused, the rest not attempted, nothing added
    req = _add_partitions_req("tx-1", {"orders": [0], "secret": [0, 1]})
    codes = _codes(asyncio.run(handler(req, ctx(24, 3))))
    assert codes == {
        ("orders", 0): KafkaError.OPERATION_NOT_ATTEMPTED,
        ("secret", 0): KafkaError.TOPIC_AUTHORIZATION_FAILED,
        ("secret", 1): KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
    assert seen == []
    resp = asyncio.run(handler(_add_partitions_req("tx-1", {"orders": [0, 1]}), ctx(24, 3)))
    assert set(_codes(resp).values()) == {0} and seen == [(24, ["orders"])]


def test_add_offsets_end_txn_and_txn_offset_commit_need_the_id_group_and_topics():
    from kafka.protocol.producer import AddOffsetsToTxnRequest, EndTxnRequest
    from kafka.protocol.producer import TxnOffsetCommitRequest as T

    registry, seen = _txn_registry(
        [
            {"op": "WRITE", "name": "tx-1", "rtype": "TRANSACTIONAL_ID"},
            {"op": "READ", "name": "g1", "rtype": "GROUP"},
            {"op": "READ", "name": "orders"},
        ]
    )
    add_offsets, end_txn, commit = (registry.get(k).handler for k in (25, 26, 28))

    def offsets_req(txn_id: str, group: str):
        return AddOffsetsToTxnRequest[3](
            transactional_id=txn_id, producer_id=7, producer_epoch=0, group_id=group
        )

    assert asyncio.run(add_offsets(offsets_req("tx-2", "g1"), ctx(25, 3))).error_code == 53
    assert (
        asyncio.run(add_offsets(offsets_req("tx-1", "g2"), ctx(25, 3))).error_code
        == KafkaError.GROUP_AUTHORIZATION_FAILED
    )
    assert asyncio.run(add_offsets(offsets_req("tx-1", "g1"), ctx(25, 3))).error_code == 0

    def end_req(txn_id: str):
        return EndTxnRequest[3](
            transactional_id=txn_id, producer_id=7, producer_epoch=0, committed=True
        )

    assert asyncio.run(end_txn(end_req("tx-2"), ctx(26, 3))).error_code == 53
    assert asyncio.run(end_txn(end_req("tx-1"), ctx(26, 3))).error_code == 0

    def commit_req(txn_id: str, group: str):
        P = T.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition
        return T[3](
            transactional_id=txn_id,
            group_id=group,
            producer_id=7,
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=[
                T.TxnOffsetCommitRequestTopic(
                    name=n,
                    partitions=[
                        P(
                            partition_index=0,
                            committed_offset=5,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                    ],
                )
                for n in ("orders", "secret")
            ],
        )

    def commit_codes(resp) -> dict[str, int]:
        return {t.name: t.partitions[0].error_code for t in resp.topics}

    assert commit_codes(asyncio.run(commit(commit_req("tx-2", "g1"), ctx(28, 3)))) == {
        "orders": 53,
        "secret": 53,
    }
    assert commit_codes(asyncio.run(commit(commit_req("tx-1", "g2"), ctx(28, 3)))) == {
        "orders": KafkaError.GROUP_AUTHORIZATION_FAILED,
        "secret": KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
    assert commit_codes(asyncio.run(commit(commit_req("tx-1", "g1"), ctx(28, 3)))) == {
        "orders": 0,
        "secret": KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
    # only the allowed pieces reached the handlers
    assert seen == [(25, "g1"), (26, "tx-1"), (28, ["orders"])]


def test_write_txn_markers_is_for_brokers_only():
    from kafka.protocol.producer import WriteTxnMarkersRequest as W

    registry, seen = _txn_registry([{"op": "ALL", "name": "*"}])
    markers = registry.get(27).handler
    req = W[1](
        markers=[
            W.WritableTxnMarker(
                producer_id=7,
                producer_epoch=0,
                transaction_result=True,
                topics=[
                    W.WritableTxnMarker.WritableTxnMarkerTopic(
                        name="orders", partition_indexes=[0, 1]
                    )
                ],
                coordinator_epoch=1,
            )
        ]
    )
    denied = asyncio.run(markers(req, ctx(27, 1)))
    codes = {p.error_code for m in denied.markers for t in m.topics for p in t.partitions}
    assert codes == {KafkaError.CLUSTER_AUTHORIZATION_FAILED} and seen == []
    asyncio.run(markers(req, ctx(27, 1, "User:broker")))
    assert seen == [(27, None)]


def _metadata_asking_operations(version: int = 10):
    return MetadataRequest[version](
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in ("orders",)],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True,
    )


def test_authorized_operations_are_the_principals_when_asked(secured):
    """Metadata v8+ and DescribeCluster fill the bitfields when asked (kafka-python's admin
    client fails on Kafka's "not provided" value); with ACLs: the principal's operations."""
    handler, grant, _ = secured
    grant(acl("DESCRIBE"), acl("WRITE"), acl("DESCRIBE", "kafka-cluster", "CLUSTER"))
    got = asyncio.run(handler(3)(_metadata_asking_operations(), ctx(3, 10)))
    # READ=3 WRITE=4 DESCRIBE=8 ... (Kafka's AclOperation codes); WRITE implies nothing else
    assert got.topics[0].authorized_operations == {4, 8}
    assert got.authorized_operations == {8}
    admin = asyncio.run(handler(3)(_metadata_asking_operations(), ctx(3, 10, "User:admin")))
    assert admin.topics[0].authorized_operations == {3, 4, 5, 6, 7, 8, 10, 11}
    assert admin.authorized_operations == {5, 7, 8, 9, 10, 11, 12}

    described = asyncio.run(
        handler(60)(
            DescribeClusterRequest[0](include_cluster_authorized_operations=True), ctx(60, 0)
        )
    )
    assert described.authorized_operations == {8}
    not_asked = asyncio.run(
        handler(3)(MetadataRequest[10](topics=None, allow_auto_topic_creation=False), ctx(3, 10))
    )
    assert all(t.authorized_operations is None for t in not_asked.topics)


def test_authorized_operations_without_an_authorizer_are_every_operation(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with inprocess_broker(tmp_path) as (apis, controller, sync):
        controller.call("create_topic", {"name": "orders", "partitions": 1})
        sync()
        got = asyncio.run(apis.cluster.metadata(_metadata_asking_operations(8), ctx(3, 8)))
        assert got.topics[0].authorized_operations == {3, 4, 5, 6, 7, 8, 10, 11}
        assert got.authorized_operations == {5, 7, 8, 9, 10, 11, 12}
        v11 = asyncio.run(apis.cluster.metadata(_metadata_asking_operations(11), ctx(3, 11)))
        assert v11.topics[0].authorized_operations == {3, 4, 5, 6, 7, 8, 10, 11}


def test_num_partitions_and_auto_create_topics_enable_are_honoured(tmp_path, monkeypatch):
    """Kafka's num.partitions (a topic created without a count) and
    auto.create.topics.enable=false (Metadata never creates a topic), as broker settings."""
    from kafka.protocol.admin import CreateTopicsRequest

    from dataplane.kafka.api_context import TopicCreation

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with inprocess_broker(tmp_path, TopicCreation(3, False)) as (apis, _controller, sync):
        asked = MetadataRequest[9](
            topics=[MetadataRequest.MetadataRequestTopic(name="wanted")],
            allow_auto_topic_creation=True,
        )
        got = asyncio.run(apis.cluster.metadata(asked, ctx(3, 9)))
        assert got.topics[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        assert apis.image_fn().topic_by_name("wanted") is None
        create = CreateTopicsRequest[5](
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name="counted-here",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=[],
                    configs=[],
                )
            ],
            timeout_ms=10_000,
            validate_only=False,
        )
        created = asyncio.run(apis.topic_admin.create_topics(create, ctx(19, 5)))
        assert created.topics[0].error_code == KafkaError.NONE
        assert created.topics[0].num_partitions == 3
        sync()
        assert len(apis.image_fn().topic_by_name("counted-here").partitions) == 3
