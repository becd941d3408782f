"""The share-group APIs (KIP-932) without a cluster: their wire format (the version librdkafka
2.16 sends), ApiVersions, the heartbeat's and the share sessions' error codes, malformed
frames, and ShareFetch/ShareAcknowledge on fake partitions with a store that can fail
(acknowledgements are answered only once stored; a failed write changes nothing stored)."""

from __future__ import annotations

import asyncio
import struct
import uuid
from types import SimpleNamespace

import pytest

from dataplane.formats.kafka_errors import KafkaError, MalformedRequestError
from dataplane.formats.record_batch import build_batch
from dataplane.kafka.codec import decode_request, decode_response, encode_request, encode_response
from dataplane.kafka.registry import ApiRegistry, RequestContext
from dataplane.kafka.share.coordinator import ShareGroupCoordinator
from dataplane.kafka.share.handlers import ShareApis
from dataplane.kafka.share.partitions import SharePartitions, ShareSettings
from dataplane.kafka.share.protocol import (
    ACK_ACCEPT,
    ACK_RELEASE,
    ShareAcknowledgeRequest,
    ShareFetchRequest,
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
)
from dataplane.kafka.share.sessions import ShareSessions
from dataplane.kafka.share.store import ShareStateError

TOPIC_ID = uuid.uuid4()
TID = str(TOPIC_ID)


# ------------------------------------------------------------------ wire format


def test_heartbeat_request_as_librdkafka_writes_it():
    # librdkafka 2.16 rd_kafka_ShareGroupHeartbeatRequest v1: GroupId, MemberId,
    # MemberEpoch, RackId (null), SubscribedTopicNames, tags; flexible header v2
    body = (
        b"\x03g1"  # compact string "g1"
        + b"\x03m1"
        + struct.pack(">i", 0)
        + b"\x00"  # null rack
        + b"\x02\x04top"  # one topic "top"
        + b"\x00"  # tags
    )
    header = struct.pack(">hhi", 76, 1, 7) + struct.pack(">h", 3) + b"cli" + b"\x00"
    req = decode_request(header + body)
    assert (req.api_key, req.api_version) == (76, 1)
    assert (req.body.group_id, req.body.member_id, req.body.member_epoch) == ("g1", "m1", 0)
    assert req.body.rack_id is None and req.body.subscribed_topic_names == ["top"]


def test_heartbeat_response_assignment_is_a_nullable_struct():
    R = ShareGroupHeartbeatResponse
    req = decode_request(
        encode_request(
            ShareGroupHeartbeatRequest(
                version=1, group_id="g", member_id="m", member_epoch=0, subscribed_topic_names=["t"]
            ),
            5,
        )[4:]
    )
    with_assignment = R(
        throttle_time_ms=0,
        error_code=0,
        member_id="m",
        member_epoch=1,
        heartbeat_interval_ms=5000,
        assignment=R.Assignment(
            topic_partitions=[R.Assignment.TopicPartitions(topic_id=TOPIC_ID, partitions=[0, 1])]
        ),
    )
    frame = encode_response(req, with_assignment)
    _, back = decode_response(frame[4:], 76, 1)
    assert back.assignment.topic_partitions[0].partitions == [0, 1]
    without = R(throttle_time_ms=0, error_code=0, member_epoch=1, heartbeat_interval_ms=5000)
    frame = encode_response(req, without)
    assert frame.endswith(b"\xff\x00")  # assignment -1 (null), then the tags
    assert decode_response(frame[4:], 76, 1)[1].assignment is None


def test_truncated_share_fetch_is_malformed_not_a_crash():
    frame = encode_request(fetch_req(0, []), 3)[4:]
    for cut in (len(frame) - 3, 20, 14):
        with pytest.raises(MalformedRequestError):
            decode_request(frame[:cut])


def test_api_versions_lists_the_share_apis_at_version_1():
    apis, _ = make_apis()
    registry = ApiRegistry()
    for cls, lo, hi, handler in apis.registrations():
        registry.register(cls, lo, hi, handler)
    served = {k: (lo, hi) for k, lo, hi in registry.api_versions()}
    assert {k: served[k] for k in (76, 77, 78, 79)} == {k: (1, 1) for k in (76, 77, 78, 79)}


# ------------------------------------------------------------------ heartbeat rules


def test_heartbeat_error_codes():
    c = ShareGroupCoordinator()
    topics = {"t": (TID, 2)}.get

    def hb(member, epoch, subscribed=None):
        return c.heartbeat("g", member, epoch, None, subscribed, "cid", "/h", topics)

    assert hb("a", 0).error == KafkaError.INVALID_REQUEST  # no subscription on join
    joined = hb("a", 0, ["t"])
    assert joined.error == KafkaError.NONE and joined.assignment == {TID: (0, 1)}
    assert hb("a", joined.member_epoch).assignment is None  # unchanged: not sent again
    assert hb("a", joined.member_epoch + 5).error == KafkaError.FENCED_MEMBER_EPOCH
    assert hb("zz", 3).error == KafkaError.UNKNOWN_MEMBER_ID
    assert hb("", 0, ["t"]).error == KafkaError.INVALID_REQUEST
    assert hb("a", -2).error == KafkaError.INVALID_REQUEST
    assert hb("a", -1).member_epoch == -1
    assert hb("a", 1).error == KafkaError.UNKNOWN_MEMBER_ID
    assert c.group("g").state == "Empty"


def test_members_expire_after_the_session_timeout():
    now = [0.0]
    c = ShareGroupCoordinator(session_timeout_ms=1000, clock_s=lambda: now[0])
    c.heartbeat("g", "a", 0, None, ["t"], "", "", lambda n: None)
    now[0] = 2.0
    assert c.group("g").members == {}


# ------------------------------------------------------------------ fetch and acknowledge


class FakeLog:
    """A partition backend holding `count` one-record batches."""

    leader_epoch = 0
    log_start_offset = 0
    forwards_to_main = False
    lags_leader = False
    identity = "fake"

    def __init__(self, count: int):
        self.batches = [build_batch(b"", 1, base_offset=i) for i in range(count)]
        self.high_watermark = count

    def read(self, offset, max_bytes, end=None):
        return b"".join(self.batches[offset:end])

    def add_listener(self, cb):
        pass

    def remove_listener(self, cb):
        pass


class FakeStore:
    def __init__(self):
        self.docs: dict = {}
        self.fail = False

    def load(self, group_id, topic_id, partition, leader_epoch):
        return self.docs.get((group_id, topic_id, partition))

    def save(self, group_id, topic_id, partition, leader_epoch, doc, must_exist=False):
        if self.fail:
            raise ShareStateError(KafkaError.KAFKA_STORAGE_ERROR, "store down")
        key = (group_id, topic_id, partition)
        if must_exist and key not in self.docs:
            raise ShareStateError(KafkaError.NOT_LEADER_OR_FOLLOWER, "deleted: reload")
        if key in self.docs and self.docs[key].get("state_epoch", 0) != doc.get("state_epoch", 0):
            raise ShareStateError(KafkaError.NOT_LEADER_OR_FOLLOWER, "altered: reload")
        self.docs[key] = doc

    def alter_group(self, group_id, coordinator_epoch, states):
        if self.fail:
            raise ShareStateError(KafkaError.KAFKA_STORAGE_ERROR, "store down")
        self.altered_at = coordinator_epoch
        for topic_id, partition, doc in states:
            old = self.docs.get((group_id, topic_id, partition), {})
            self.docs[(group_id, topic_id, partition)] = {
                **doc,
                "state_epoch": old.get("state_epoch", 0) + 1,
            }
        return len(states)

    def delete_group(self, group_id, coordinator_epoch, topic_ids=None):
        if self.fail:
            raise ShareStateError(KafkaError.KAFKA_STORAGE_ERROR, "store down")
        self.deleted_at = coordinator_epoch
        gone = [
            k for k in self.docs if k[0] == group_id and (topic_ids is None or k[1] in topic_ids)
        ]
        for k in gone:
            del self.docs[k]
        return len(gone)


def make_apis(log: FakeLog | None = None):
    log = log or FakeLog(10)
    part = SimpleNamespace(partition=0, leader_node_id=1, leader_epoch=0, erasure_coded=False)
    topic = SimpleNamespace(topic_id=TID, name="t", partitions={0: part})
    image = SimpleNamespace(
        topics={TID: topic},
        topic_by_name=lambda n: topic if n == "t" else None,
        kv={},
        coordinator_slot_count=1,
        coordinator_slots={0: SimpleNamespace(node_id=1, epoch=3)},
    )

    async def run_io(fn, *args):
        return fn(*args)

    broker = SimpleNamespace(
        me=SimpleNamespace(node_id=1),
        image_fn=lambda: image,
        run_io=run_io,
        client_az=lambda ctx: None,
        routing=SimpleNamespace(get=lambda tid, p, az=None: log if tid == TID else None),
    )
    store = FakeStore()
    settings = ShareSettings(auto_offset_reset="earliest")
    apis = ShareApis(
        broker,
        ShareGroupCoordinator(),
        SharePartitions(store, lambda group_id: settings, run_io),
        ShareSessions(10),
        lambda g: True,
    )
    return apis, store


def ctx(key: int) -> RequestContext:
    return RequestContext(
        api_key=key, api_version=1, correlation_id=1, client_id="c", peer=("127.0.0.1", 1)
    )


def fetch_req(
    epoch: int,
    acks: list,
    member: str = "m",
    max_records: int = 3,
    partitions=True,
    topic_id: uuid.UUID | None = TOPIC_ID,
):
    F = ShareFetchRequest
    P = F.FetchTopic.FetchPartition
    batches = [
        P.AcknowledgementBatch(first_offset=f, last_offset=last, acknowledge_types=[t])
        for f, last, t in acks
    ]
    topics = [
        F.FetchTopic(
            topic_id=topic_id, partitions=[P(partition_index=0, acknowledgement_batches=batches)]
        )
    ]
    return F(
        version=1,
        group_id="g",
        member_id=member,
        share_session_epoch=epoch,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        max_records=max_records,
        batch_size=max_records,
        topics=topics if partitions else [],
        forgotten_topics_data=[],
    )


def ack_req(epoch: int, acks: list, member: str = "m"):
    A = ShareAcknowledgeRequest
    P = A.AcknowledgeTopic.AcknowledgePartition
    return A(
        version=1,
        group_id="g",
        member_id=member,
        share_session_epoch=epoch,
        topics=[
            A.AcknowledgeTopic(
                topic_id=TOPIC_ID,
                partitions=[
                    P(
                        partition_index=0,
                        acknowledgement_batches=[
                            P.AcknowledgementBatch(
                                first_offset=f, last_offset=last, acknowledge_types=[t]
                            )
                            for f, last, t in acks
                        ],
                    )
                ],
            )
        ],
    )


def acquired(resp) -> list[tuple[int, int, int]]:
    r = resp.resolved() if hasattr(resp, "resolved") else resp
    return [
        (a.first_offset, a.last_offset, a.delivery_count)
        for t in r.responses
        for p in t.partitions
        for a in p.acquired_records
    ]


def part_of(resp):
    r = resp.resolved() if hasattr(resp, "resolved") else resp
    return r.responses[0].partitions[0]


def run(coro):
    return asyncio.run(coro)


def test_share_fetch_acquires_and_acknowledges_durably():
    async def scenario():
        apis, store = make_apis()
        first = await apis.share_fetch(fetch_req(0, []), ctx(78))
        assert acquired(first) == [(0, 2, 1)]
        assert part_of(first).records  # the batches holding them
        other = await apis.share_fetch(fetch_req(0, [], member="o"), ctx(78))
        assert acquired(other) == [(3, 5, 1)]  # never what "m" holds
        resp = await apis.share_fetch(
            fetch_req(1, [(0, 1, ACK_ACCEPT), (2, 2, ACK_RELEASE)]), ctx(78)
        )
        assert part_of(resp).acknowledge_error_code == 0
        assert store.docs[("g", TID, 0)]["start"] == 2  # stored before the answer
        assert acquired(resp) == [(2, 2, 2), (6, 7, 1)]
        # a stale epoch, an unknown session, acks when opening one
        assert (await apis.share_fetch(fetch_req(1, []), ctx(78))).error_code == (
            KafkaError.INVALID_SHARE_SESSION_EPOCH
        )
        assert (await apis.share_fetch(fetch_req(1, [], member="x"), ctx(78))).error_code == (
            KafkaError.SHARE_SESSION_NOT_FOUND
        )
        assert (await apis.share_fetch(fetch_req(0, [(0, 0, 1)]), ctx(78))).error_code == (
            KafkaError.INVALID_REQUEST
        )

    run(scenario())


def test_a_share_fetch_for_the_nil_topic_id_is_answered_unknown_not_a_crash():
    # kafka-python decodes the all-zero topic id as None
    async def scenario():
        apis, _store = make_apis()
        resp = await apis.share_fetch(fetch_req(0, [], topic_id=None), ctx(78))
        answer = resp.resolved()
        assert answer.error_code == 0
        [topic] = answer.responses
        assert topic.topic_id is None  # the nil id, as kafka-python decodes it
        assert topic.partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_ID
        assert acquired(resp) == []

    run(scenario())


def test_acknowledge_errors_and_failed_writes_change_nothing_stored():
    async def scenario():
        apis, store = make_apis()
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        # not held by this member
        resp = await apis.share_acknowledge(ack_req(1, [(5, 5, ACK_ACCEPT)]), ctx(79))
        assert resp.responses[0].partitions[0].error_code == KafkaError.INVALID_RECORD_STATE
        store.fail = True
        resp = await apis.share_acknowledge(ack_req(2, [(0, 0, ACK_ACCEPT)]), ctx(79))
        assert resp.responses[0].partitions[0].error_code == KafkaError.KAFKA_STORAGE_ERROR
        assert store.docs[("g", TID, 0)]["start"] == 0
        store.fail = False
        # the share-partition was reloaded from the store: offset 0 is not accepted
        again = await apis.share_fetch(fetch_req(3, [], max_records=10), ctx(78))
        assert acquired(again)[0] == (0, 9, 1)
        assert (await apis.share_acknowledge(ack_req(0, []), ctx(79))).error_code == (
            KafkaError.INVALID_SHARE_SESSION_EPOCH
        )

    run(scenario())


def test_closing_the_session_releases_what_the_member_holds():
    async def scenario():
        apis, store = make_apis()
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        resp = await apis.share_acknowledge(ack_req(-1, [(0, 0, ACK_ACCEPT)]), ctx(79))
        assert resp.responses[0].partitions[0].error_code == 0
        other = await apis.share_fetch(fetch_req(0, [], member="o"), ctx(78))
        assert acquired(other) == [(1, 2, 2), (3, 3, 1)]
        assert apis.sessions.get("g", "m") is None

    run(scenario())


def test_a_group_id_of_another_type_is_refused():
    c = ShareGroupCoordinator(other_group_type=lambda g: "classic" if g == "old" else None)
    r = c.heartbeat("old", "a", 0, None, ["t"], "", "", lambda n: None)
    assert r.error == KafkaError.GROUP_ID_NOT_FOUND and "classic" in r.message
    assert c.group("old") is None


def test_list_groups_adds_share_groups_under_the_filters():
    from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse

    apis, _ = make_apis()
    apis.coordinator.heartbeat("sg", "a", 0, None, ["t"], "", "", lambda n: None)

    async def classic(req, ctx):  # the classic handler filters its own groups
        cg = ListGroupsResponse.ListedGroup(
            group_id="cg", protocol_type="consumer", group_state="Stable", group_type="classic"
        )
        wanted = not req.types_filter or "classic" in req.types_filter
        return ListGroupsResponse[5](
            throttle_time_ms=0, error_code=0, groups=[cg] if wanted else []
        )

    handler = apis.wrap(ListGroupsRequest, classic)

    def listed(types, states=()):
        req = ListGroupsRequest[5](states_filter=list(states), types_filter=list(types))
        resp = run(handler(req, RequestContext(16, 5, 1, "c", ("h", 1))))
        return sorted((g.group_id, g.group_type, g.group_state) for g in resp.groups)

    assert listed([]) == [("cg", "classic", "Stable"), ("sg", "share", "Stable")]
    assert listed(["share"]) == [("sg", "share", "Stable")]
    assert listed([], ["empty"]) == [("cg", "classic", "Stable")]  # classic filtering is inner's
    assert apis.wrap(ShareFetchRequest, classic) is classic


def test_every_share_api_has_an_acl_policy_and_denials_answer_kafka_codes():
    from dataplane.kafka.security.share_api_acls import ShareApiAcls

    apis, _ = make_apis()
    checks = SimpleNamespace(
        allowed=lambda ctx, op, kind, name: kind == "GROUP",  # every topic denied
        image_fn=apis.broker.image_fn,
    )
    acls = ShareApiAcls(checks)
    keys = {int(cls.API_KEY) for cls, *_ in apis.registrations()}
    assert keys <= set(acls.policies())

    async def never(req, ctx):
        raise AssertionError("a denied request reached its handler")

    resp = run(acls.share_fetch(never, fetch_req(0, []), ctx(78)))
    assert resp.error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    checks.allowed = lambda ctx, op, kind, name: False
    resp = run(acls.heartbeat(never, ShareGroupHeartbeatRequest(version=1, group_id="g"), ctx(76)))
    assert resp.error_code == KafkaError.GROUP_AUTHORIZATION_FAILED
    resp = run(acls.share_acknowledge(never, ack_req(1, []), ctx(79)))
    assert resp.error_code == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_group_configs_validate_describe_and_apply():
    import json

    from dataplane.kafka.share import group_configs as gc

    ops = [
        {"key": "share.record.lock.duration.ms", "op": "set", "value": "5000"},
        {"key": "share.auto.offset.reset", "op": "set", "value": "earliest"},
    ]
    configs = gc.validate_ops({}, ops)
    for bad, why in [
        ({"key": "share.unknown", "op": "set", "value": "1"}, "unknown group config"),
        ({"key": "share.delivery.count.limit", "op": "set", "value": "11"}, "outside"),
        ({"key": "share.auto.offset.reset", "op": "set", "value": "middle"}, "not one of"),
        ({"key": "share.record.lock.duration.ms", "op": "append", "value": "1"}, "not a list"),
    ]:
        with pytest.raises(ValueError, match=why):
            gc.validate_ops(configs, [bad])
    image = SimpleNamespace(kv={gc.KEY_PREFIX + "g": json.dumps(configs)})
    settings = gc.settings_for(image, "g", ShareSettings())
    assert (settings.record_lock_duration_ms, settings.auto_offset_reset) == (5000, "earliest")
    assert settings.delivery_count_limit == 5  # not set: the broker's
    rows = {r.name: r for r in gc.describe(image, "g", ShareSettings())}
    assert rows["share.record.lock.duration.ms"].value == "5000"
    assert rows["share.record.lock.duration.ms"].source is gc.GroupConfigSource.DYNAMIC_GROUP_CONFIG
    assert rows["share.delivery.count.limit"].source is gc.GroupConfigSource.DEFAULT_CONFIG
    assert gc.validate_ops(configs, [{"key": "share.auto.offset.reset", "op": "delete"}]) == {
        "share.record.lock.duration.ms": "5000"
    }


def test_a_share_group_id_is_refused_to_classic_and_consumer_members():
    from kafka.protocol.consumer import JoinGroupRequest

    from dataplane.kafka.groups.consumer_handlers import ConsumerGroupHeartbeatRequest

    apis, _ = make_apis()
    apis.coordinator.heartbeat("sg", "a", 0, None, ["t"], "", "", lambda n: None)

    async def inner(req, ctx):
        return "served"

    join = apis.wrap(JoinGroupRequest, inner)
    req = JoinGroupRequest[5](
        group_id="sg",
        session_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[],
    )
    resp = run(join(req, RequestContext(11, 5, 1, "c", ("h", 1))))
    assert resp.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    req.group_id = "other"
    assert run(join(req, RequestContext(11, 5, 1, "c", ("h", 1)))) == "served"
    hb = apis.wrap(ConsumerGroupHeartbeatRequest, inner)
    req = ConsumerGroupHeartbeatRequest[0](group_id="sg", member_id="m", member_epoch=0)
    resp = run(hb(req, RequestContext(68, 0, 1, "c", ("h", 1))))
    assert resp.error_code == KafkaError.GROUP_ID_NOT_FOUND


def test_describe_groups_of_a_share_group_answers_as_kafka_4():
    """Kafka 4's classic DescribeGroups of a share group: v6 GROUP_ID_NOT_FOUND "Group X is
    not a classic group.", older versions state Dead with no error; other ids unchanged."""
    from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse

    apis, _ = make_apis()
    apis.coordinator.heartbeat("sg", "a", 0, None, ["t"], "", "", lambda n: None)

    def dead(group_id: str, version: int):
        G = DescribeGroupsResponse[version].DescribedGroup
        return G(
            error_code=KafkaError.GROUP_ID_NOT_FOUND if version >= 6 else 0,
            error_message=f"Group {group_id} not found." if version >= 6 else None,
            group_id=group_id,
            group_state="Dead",
            protocol_type="",
            protocol_data="",
            members=[],
        )

    async def inner(req, ctx):  # the classic handler: neither id is a classic group
        groups = [dead(g, ctx.api_version) for g in req.groups]
        return DescribeGroupsResponse[ctx.api_version](throttle_time_ms=0, groups=groups)

    describe = apis.wrap(DescribeGroupsRequest, inner)
    for version in (5, 6):
        req = DescribeGroupsRequest[version](
            groups=["sg", "none"], include_authorized_operations=False
        )
        sg, none = run(describe(req, RequestContext(15, version, 1, "c", ("h", 1)))).groups
        assert sg.group_state == "Dead" and none.group_state == "Dead"
        if version >= 6:
            assert sg.error_code == KafkaError.GROUP_ID_NOT_FOUND
            assert sg.error_message == "Group sg is not a classic group."
            assert none.error_message == "Group none not found."
        else:
            assert sg.error_code == 0 and none.error_code == 0


def test_delete_groups_of_a_share_group_deletes_its_stored_state():
    """DeleteGroups of a share group: NON_EMPTY_GROUP while it has members; once empty its
    stored share-partition states go (by its coordinator, at its slot epoch) with its loaded
    share-partitions; other ids go to the classic handler, answers in request order."""
    from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse

    async def scenario():
        apis, store = make_apis()
        topics = {"t": (TID, 1)}.get
        joined = apis.coordinator.heartbeat("g", "m", 0, None, ["t"], "", "", topics)
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        await apis.share_fetch(fetch_req(1, [(0, 1, ACK_ACCEPT)]), ctx(78))
        assert store.docs[("g", TID, 0)]["start"] == 2
        classic_asked: list = []

        async def classic(req, c):
            classic_asked.extend(req.groups_names)
            R = DeleteGroupsResponse[c.api_version]
            return R(
                throttle_time_ms=0,
                results=[
                    R.DeletableGroupResult(group_id=g, error_code=KafkaError.GROUP_ID_NOT_FOUND)
                    for g in req.groups_names
                ],
            )

        delete = apis.wrap(DeleteGroupsRequest, classic)

        def request():
            return DeleteGroupsRequest[2](groups_names=["other", "g"])

        resp = await delete(request(), RequestContext(42, 2, 1, "c", ("h", 1)))
        assert [(r.group_id, r.error_code) for r in resp.results] == [
            ("other", KafkaError.GROUP_ID_NOT_FOUND),
            ("g", KafkaError.NON_EMPTY_GROUP),
        ]
        assert ("g", TID, 0) in store.docs  # nothing deleted
        left = apis.coordinator.heartbeat("g", "m", -1, None, None, "", "", topics)
        assert left.error == KafkaError.NONE and joined.error == KafkaError.NONE
        resp = await delete(request(), RequestContext(42, 2, 1, "c", ("h", 1)))
        assert [(r.group_id, r.error_code) for r in resp.results] == [
            ("other", KafkaError.GROUP_ID_NOT_FOUND),
            ("g", KafkaError.NONE),
        ]
        assert classic_asked == ["other", "other"]  # the share group never reached it
        assert not any(k[0] == "g" for k in store.docs) and store.deleted_at == 3
        assert apis.partitions.get_loaded(("g", TID, 0)) is None
        assert apis.coordinator.group("g") is None

    run(scenario())


def test_a_leader_holding_a_deleted_groups_state_reloads_it_fresh():
    """A leader elsewhere still holds the deleted group's share-partition loaded: its next
    write must find the stored state (must_exist), is refused, and the share-partition is
    reloaded fresh - the deleted state is not brought back."""

    async def scenario():
        apis, store = make_apis()
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        await apis.share_fetch(fetch_req(1, [(0, 1, ACK_ACCEPT)]), ctx(78))
        assert store.docs[("g", TID, 0)]["start"] == 2
        store.delete_group("g", 3)  # the group's coordinator (another broker) deleted it
        resp = await apis.share_fetch(fetch_req(2, [(2, 2, ACK_ACCEPT)]), ctx(78))
        assert part_of(resp).acknowledge_error_code == KafkaError.NOT_LEADER_OR_FOLLOWER
        # the same fetch then reloaded the share-partition: a fresh start (earliest here),
        # not the deleted state (start 2) brought back
        assert store.docs[("g", TID, 0)]["start"] == 0
        assert apis.partitions.get_loaded(("g", TID, 0)).state.start_offset == 0
        assert acquired(resp)[0][0] == 0

    run(scenario())


def test_the_simple_assignor_spreads_partitions_over_members():
    """Kafka's `simple` share assignor rules: more partitions than members - each partition
    to one member, evenly; more members than partitions - one partition each, every
    partition read; a member that leaves: the others take its partitions at their next
    heartbeat."""
    c = ShareGroupCoordinator()
    six = {"t": (TID, 6)}.get
    epochs: dict[str, int] = {}

    def hb(member: str, topics=six) -> dict:
        result = c.heartbeat("g", member, epochs.get(member, 0), None, ["t"], "", "", topics)
        assert result.error == KafkaError.NONE, result
        epochs[member] = result.member_epoch
        return c.group("g").members[member].assignment

    for m in "abc":
        hb(m)
    got = {m: hb(m)[TID] for m in "abc"}  # each heartbeats once more: the final split
    assert sorted(len(p) for p in got.values()) == [2, 2, 2]
    assert sorted(p for ps in got.values() for p in ps) == list(range(6))
    c.heartbeat("g", "c", -1, None, None, "", "", six)  # c leaves
    got = {m: hb(m)[TID] for m in "ab"}
    assert sorted(p for ps in got.values() for p in ps) == list(range(6))
    assert sorted(len(p) for p in got.values()) == [3, 3]
    # 2 partitions, 4 members: one partition each, both read by two members
    two = {"t": (TID, 2)}.get
    c2 = ShareGroupCoordinator()
    joined = {m: c2.heartbeat("h", m, 0, None, ["t"], "", "", two) for m in "wxyz"}
    for m, j in joined.items():  # each heartbeats once more, with all four in the group
        c2.heartbeat("h", m, j.member_epoch, None, None, "", "", two)
    parts = [c2.group("h").members[m].assignment[TID] for m in "wxyz"]
    assert all(len(p) == 1 for p in parts) and sorted(p[0] for p in parts) == [0, 0, 1, 1]
