"""The zone router's coordinator proxy (dataplane/zonerouter/coordinator_proxy.py): which
requests of a client of an AZ it forwards to a coordinator elsewhere (by group or
transactional id), how long a forward may take, and that a request it cannot forward is
answered by this broker's own handler (NOT_COORDINATOR there: the client looks again)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import HeartbeatRequest, JoinGroupRequest, OffsetFetchRequest
from kafka.protocol.producer import AddPartitionsToTxnRequest, InitProducerIdRequest

from dataplane.zonerouter.coordinator_proxy import (
    FORWARD_TIMEOUT_S,
    MAX_FORWARD_TIMEOUT_S,
    CoordinatorProxy,
    coordinator_key,
    forward_timeout_s,
)


def _join(rebalance_ms: int):
    return JoinGroupRequest[5](
        group_id="g",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=rebalance_ms,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[],
    )


def test_coordinator_key_names_the_group_or_transactional_id():
    assert coordinator_key(_join(1000)) == (0, "g")
    hb = HeartbeatRequest[4](group_id="h", generation_id=1, member_id="m", group_instance_id=None)
    assert coordinator_key(hb) == (0, "h")
    assert coordinator_key(
        DescribeGroupsRequest[5](groups=["x"], include_authorized_operations=False)
    ) == (0, "x")
    # several groups may have several coordinators: answered here
    assert (
        coordinator_key(
            DescribeGroupsRequest[5](groups=["x", "y"], include_authorized_operations=False)
        )
        is None
    )
    F = OffsetFetchRequest[8]
    one = F(groups=[F.OffsetFetchRequestGroup(group_id="z", topics=None)], require_stable=False)
    assert coordinator_key(one) == (0, "z")
    init = InitProducerIdRequest[4](
        transactional_id="t", transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1
    )
    assert coordinator_key(init) == (1, "t")
    idempotent = InitProducerIdRequest[4](
        transactional_id=None, transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1
    )
    assert coordinator_key(idempotent) is None  # any broker allocates it
    add = AddPartitionsToTxnRequest[3](
        v3_and_below_transactional_id="t2",
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[],
    )
    assert coordinator_key(add) == (1, "t2")


def test_a_join_group_may_wait_for_its_rebalance_bounded():
    assert forward_timeout_s(_join(300_000)) == 305.0
    assert forward_timeout_s(_join(1_000)) == FORWARD_TIMEOUT_S
    assert forward_timeout_s(_join(10**9)) == MAX_FORWARD_TIMEOUT_S
    hb = HeartbeatRequest[4](group_id="h", generation_id=1, member_id="m", group_instance_id=None)
    assert forward_timeout_s(hb) == FORWARD_TIMEOUT_S


def test_only_a_client_of_an_az_with_a_coordinator_elsewhere_is_forwarded(monkeypatch):
    from dataplane.zonerouter import coordinator_proxy

    brokers = {
        1: SimpleNamespace(node_id=1, host="127.0.0.1", kafka_port=1, fenced=False),
        2: SimpleNamespace(node_id=2, host="127.0.0.1", kafka_port=1, fenced=False),
    }
    coordinator = {"g": 2, "here": 1, "fenced": 3}
    brokers[3] = SimpleNamespace(node_id=3, host="127.0.0.1", kafka_port=1, fenced=True)
    monkeypatch.setattr(coordinator_proxy, "group_coordinator", lambda image, g: coordinator[g])
    image = SimpleNamespace(brokers=brokers)
    forwarded: list = []

    def forward(broker, req, api_key, version):  # on the proxy's own pool
        forwarded.append((broker, req, api_key, version))
        if broker.node_id == 2 and req.group_id == "g" and len(forwarded) > 1:
            raise ConnectionError("refused")  # the coordinator does not answer
        return "from the coordinator"

    proxy = CoordinatorProxy(1, lambda: image, lambda ctx: ctx.az)
    proxy._forward = forward  # type: ignore[method-assign]

    async def local(req, ctx):
        return "answered here"

    wrapped = proxy.wrap(local)

    def call(group: str, az: str | None):
        hb = HeartbeatRequest[4](
            group_id=group, generation_id=1, member_id="m", group_instance_id=None
        )
        return asyncio.run(wrapped(hb, SimpleNamespace(az=az, api_version=4)))

    assert call("g", "az1") == "from the coordinator"
    assert forwarded[0][0].node_id == 2 and forwarded[0][2:] == (12, 4)
    assert call("g", None) == "answered here"  # a client without an AZ found the coordinator
    assert call("here", "az1") == "answered here"  # coordinated by this broker
    assert call("fenced", "az1") == "answered here"  # no live coordinator
    assert call("g", "az1") == "answered here"  # forwarding failed: NOT_COORDINATOR here
    # at most MAX_IN_FLIGHT forwards at once: past it, answered here
    proxy._in_flight = coordinator_proxy.MAX_IN_FLIGHT
    forwarded.clear()
    assert call("g", "az1") == "answered here" and not forwarded
    proxy._in_flight = 0
    proxy.close()


def test_share_group_heartbeat_and_describe_are_forwarded_share_fetch_is_not():
    """KIP-932: ShareGroupHeartbeat and ShareGroupDescribe (of one group) go to the group's
    coordinator like ConsumerGroupHeartbeat; ShareFetch / ShareAcknowledge go to partition
    leaders (refused through a proxy), so the proxy never forwards them; and the proxy's
    connection can decode the coordinator's answers."""
    from dataplane.kafka.codec import decode_response, encode_request
    from dataplane.kafka.share.protocol import (
        ShareAcknowledgeRequest,
        ShareFetchRequest,
        ShareGroupDescribeRequest,
        ShareGroupHeartbeatRequest,
        ShareGroupHeartbeatResponse,
    )

    assert CoordinatorProxy.forwards(ShareGroupHeartbeatRequest)
    assert CoordinatorProxy.forwards(ShareGroupDescribeRequest)
    assert not CoordinatorProxy.forwards(ShareFetchRequest)
    assert not CoordinatorProxy.forwards(ShareAcknowledgeRequest)
    hb = ShareGroupHeartbeatRequest(
        version=1, group_id="sg", member_id="m", member_epoch=0, subscribed_topic_names=["t"]
    )
    assert coordinator_key(hb) == (0, "sg")
    assert forward_timeout_s(hb) == FORWARD_TIMEOUT_S
    one = ShareGroupDescribeRequest(
        version=1, group_ids=["sg"], include_authorized_operations=False
    )
    assert coordinator_key(one) == (0, "sg")
    two = ShareGroupDescribeRequest(
        version=1, group_ids=["sg", "x"], include_authorized_operations=False
    )
    assert coordinator_key(two) is None
    assert encode_request(hb, 9, client_id="proxy", version=1)  # the proxy can send it
    answer = ShareGroupHeartbeatResponse(
        version=1,
        throttle_time_ms=0,
        error_code=0,
        member_id="m",
        member_epoch=1,
        heartbeat_interval_ms=5000,
    )
    answer.with_header(correlation_id=9)
    got, resp = decode_response(bytes(answer.encode(header=True)), 76, 1)
    assert got == 9 and resp.member_epoch == 1 and resp.member_id == "m"
