"""DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91) and DeleteShareGroupOffsets (92)
of KIP-932 share groups, through the broker's codec (confluent-kafka 2.16's AdminClient has
no share-group offsets calls): the stored share-partition start offsets, -1 for a partition
never read, Kafka's errors (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, UNKNOWN_TOPIC_OR_PARTITION,
NOT_COORDINATOR), a failed delete or alter that changes nothing stored, and an alter that a
leader holding the old state loaded (busy or idle) cannot undo."""

from __future__ import annotations

import asyncio
import json

from controlplane.share_state import share_state_key
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_request, decode_response, encode_request, encode_response
from dataplane.kafka.registry import ApiRegistry, RequestContext
from dataplane.kafka.share.protocol import (
    ACK_ACCEPT,
    AlterShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest,
)
from tests.unit.test_share_group_apis import (
    TID,
    TOPIC_ID,
    FakeLog,
    acquired,
    ctx,
    fetch_req,
    make_apis,
    run,
)

DReq = DescribeShareGroupOffsetsRequest
DGroup = DReq.DescribeShareGroupOffsetsRequestGroup
DTopic = DGroup.DescribeShareGroupOffsetsRequestTopic
XReq = DeleteShareGroupOffsetsRequest
XTopic = XReq.DeleteShareGroupOffsetsRequestTopic
AReq = AlterShareGroupOffsetsRequest
ATopic = AReq.AlterShareGroupOffsetsRequestTopic
APart = ATopic.AlterShareGroupOffsetsRequestPartition


def over_the_wire(request, api_key: int, handler):
    """Encode `request` as a client does, decode it as the broker does, run `handler`, and
    decode its encoded answer as the client does."""

    async def go():
        decoded = decode_request(encode_request(request, 7)[4:])
        assert (decoded.api_key, decoded.api_version) == (api_key, 0)
        answer = await handler(decoded.body, RequestContext(api_key, 0, 7, "c", ("h", 1)))
        out = encode_response(decoded, answer)
        out = out if isinstance(out, bytes) else b"".join(bytes(b) for b in out)
        return decode_response(out[4:], api_key, 0)[1]

    return run(go())


def describe(apis, group: str, topics=None):
    return over_the_wire(
        DReq(version=0, groups=[DGroup(group_id=group, topics=topics)]),
        90,
        apis.offsets.describe_offsets,
    ).groups[0]


def delete(apis, group: str, names):
    return over_the_wire(
        XReq(version=0, group_id=group, topics=[XTopic(topic_name=n) for n in names]),
        92,
        apis.offsets.delete_offsets,
    )


def alter(apis, group: str, offsets: dict, handler=None):
    """AlterShareGroupOffsets of `offsets` ({topic: {partition: start offset}})."""
    topics = [
        ATopic(topic_name=n, partitions=[APart(partition_index=p, start_offset=o) for p, o in ps])
        for n, ps in ((n, sorted(ps.items())) for n, ps in offsets.items())
    ]
    request = AReq(version=0, group_id=group, topics=topics)
    return over_the_wire(request, 91, handler or apis.offsets.alter_offsets)


def results(resp) -> list:
    return [
        (t.topic_name, p.partition_index, p.error_code)
        for t in resp.responses
        for p in t.partitions
    ]


def offsets(resp) -> list[int]:
    """The offsets a ShareFetch answer acquired."""
    return [o for first, last, _ in acquired(resp) for o in range(first, last + 1)]


def stored(apis, start: int) -> None:
    """The group's state of t-0 as the controller KV holds it (the image's copy)."""
    apis.broker.image_fn().kv[share_state_key("g", TID, 0)] = json.dumps(
        {"v": 1, "start": start, "runs": []}
    )


def test_api_versions_lists_90_to_92_at_version_0():
    apis, _ = make_apis()
    registry = ApiRegistry()
    for cls, lo, hi, handler in apis.registrations():
        registry.register(cls, lo, hi, handler)
    served = {k: (lo, hi) for k, lo, hi in registry.api_versions()}
    assert served[90] == served[91] == served[92] == (0, 0)


def test_describe_reports_the_stored_start_offsets():
    apis, _ = make_apis()
    assert describe(apis, "g").error_code == KafkaError.GROUP_ID_NOT_FOUND  # no share group
    stored(apis, 4)
    everything = describe(apis, "g")  # topics null: every partition with a stored state
    assert everything.error_code == KafkaError.NONE
    [topic] = everything.topics
    assert (topic.topic_name, topic.topic_id) == ("t", TOPIC_ID)
    assert [
        (p.partition_index, p.start_offset, p.leader_epoch, p.error_code) for p in topic.partitions
    ] == [(0, 4, 0, KafkaError.NONE)]
    named = describe(
        apis,
        "g",
        [DTopic(topic_name="t", partitions=[0, 5]), DTopic(topic_name="x", partitions=[0])],
    )
    t, x = named.topics
    assert [(p.partition_index, p.start_offset, p.error_code) for p in t.partitions] == [
        (0, 4, KafkaError.NONE),
        (5, -1, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert x.topic_id is None  # the zero UUID (kafka-python decodes it as None)
    assert x.partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    # a partition the group never read: -1 (Kafka's uninitialized share-partition)
    apis.broker.image_fn().kv.clear()
    apis.coordinator.heartbeat("g", "m", 0, None, ["t"], "", "", {"t": (TID, 1)}.get)
    [p] = describe(apis, "g", [DTopic(topic_name="t", partitions=[0])]).topics[0].partitions
    assert (p.start_offset, p.error_code) == (-1, KafkaError.NONE)
    apis.coordinates = lambda g: False
    apis.offsets.coordinates = apis.coordinates
    assert describe(apis, "g").error_code == KafkaError.NOT_COORDINATOR


def test_delete_removes_the_named_topics_state_of_an_empty_group_only():
    apis, store = make_apis()

    async def read_two_records():
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        await apis.share_fetch(fetch_req(1, [(0, 1, ACK_ACCEPT)]), ctx(78))
        await apis.share_fetch(fetch_req(-1, []), ctx(78))

    run(read_two_records())
    assert store.docs[("g", TID, 0)]["start"] == 2
    stored(apis, 2)
    topics = {"t": (TID, 1)}.get
    apis.coordinator.heartbeat("g", "m", 0, None, ["t"], "", "", topics)
    busy = delete(apis, "g", ["t"])
    assert busy.error_code == KafkaError.NON_EMPTY_GROUP and ("g", TID, 0) in store.docs
    apis.coordinator.heartbeat("g", "m", -1, None, None, "", "", topics)
    store.fail = True  # the controller refuses or cannot be reached: nothing changes
    failed = delete(apis, "g", ["t"])
    assert failed.responses[0].error_code == KafkaError.KAFKA_STORAGE_ERROR
    assert ("g", TID, 0) in store.docs and apis.partitions.get_loaded(("g", TID, 0))
    store.fail = False
    done = delete(apis, "g", ["t", "x"])
    assert done.error_code == KafkaError.NONE
    assert [(r.topic_name, r.topic_id, r.error_code) for r in done.responses] == [
        ("t", TOPIC_ID, KafkaError.NONE),
        ("x", None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),  # the zero UUID
    ]
    assert ("g", TID, 0) not in store.docs and store.deleted_at == 3
    assert apis.partitions.get_loaded(("g", TID, 0)) is None  # the next read starts afresh
    assert delete(apis, "nope", ["t"]).error_code == KafkaError.GROUP_ID_NOT_FOUND


def test_acls_describe_needs_describe_and_delete_needs_delete_on_the_group():
    from types import SimpleNamespace

    from dataplane.kafka.security.share_api_acls import ShareApiAcls

    apis, store = make_apis()
    stored(apis, 4)
    rules: set = {("DESCRIBE", "GROUP", "g"), ("READ", "TOPIC", "t")}
    checks = SimpleNamespace(
        allowed=lambda ctx, op, kind, name: (op, kind, name) in rules,
        image_fn=apis.broker.image_fn,
    )
    acls = ShareApiAcls(checks)

    def via_acls(policy, handler):
        async def guarded(req, c):
            return await policy(handler, req, c)

        return guarded

    describe_guarded = via_acls(acls.describe_offsets, apis.offsets.describe_offsets)
    request = DReq(version=0, groups=[DGroup(group_id="g", topics=None), DGroup(group_id="h")])
    resp = over_the_wire(request, 90, describe_guarded)
    g, h = resp.groups
    assert (g.error_code, g.topics) == (KafkaError.NONE, [])  # topic t not describable
    assert h.error_code == KafkaError.GROUP_AUTHORIZATION_FAILED
    rules.add(("DESCRIBE", "TOPIC", "t"))
    resp = over_the_wire(request, 90, describe_guarded)
    assert [t.topic_name for t in resp.groups[0].topics] == ["t"]
    named = DReq(version=0, groups=[DGroup(group_id="g", topics=[DTopic(topic_name="z")])])
    assert over_the_wire(named, 90, describe_guarded).groups[0].error_code == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    delete_guarded = via_acls(acls.delete_offsets, apis.offsets.delete_offsets)
    x = XReq(version=0, group_id="g", topics=[XTopic(topic_name="t")])
    assert over_the_wire(x, 92, delete_guarded).error_code == KafkaError.GROUP_AUTHORIZATION_FAILED
    rules.add(("DELETE", "GROUP", "g"))
    rules.discard(("READ", "TOPIC", "t"))
    assert over_the_wire(x, 92, delete_guarded).error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    rules.add(("READ", "TOPIC", "t"))
    assert over_the_wire(x, 92, delete_guarded).error_code == KafkaError.NONE


def test_an_idle_leader_reloads_a_share_partition_whose_state_was_deleted_elsewhere():
    """The group's coordinator (another broker) deleted the offsets; the leader holds the
    share-partition loaded, idle (nothing in flight, all stored), so no write of its own
    would find out. Once the deletion reaches its metadata image, the next fetch reloads:
    the group starts afresh (earliest here) instead of at the deleted start offset."""
    apis, store = make_apis()
    image_kv = apis.broker.image_fn().kv
    apis.partitions.stored_value = lambda key: image_kv.get(share_state_key(*key))

    async def scenario():
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        await apis.share_fetch(fetch_req(1, [(0, 1, ACK_ACCEPT)]), ctx(78))
        await apis.share_fetch(fetch_req(-1, []), ctx(78))  # the member closes: idle
        sp = apis.partitions.get_loaded(("g", TID, 0))
        for _ in range(100):  # its release on closing is stored in the background
            if sp.stored == sp.changes:
                break
            await asyncio.sleep(0)
        assert sp.stored == sp.changes and store.docs[("g", TID, 0)]["start"] == 2
        stored(apis, 2)  # the image has caught up with the stored state
        store.delete_group("g", 3, [TID])  # deleted by the coordinator elsewhere ...
        key, plog = ("g", TID, 0), apis.broker.routing.get(TID, 0)
        loaded = apis.partitions.get_loaded(key)
        assert await apis.partitions.get(key, plog) is loaded  # ... not yet in the image
        image_kv.clear()  # the deletion reached the image
        fresh = await apis.share_fetch(fetch_req(0, [], member="m3"), ctx(78))
        assert acquired(fresh)[0][0] == 0
        assert store.docs[("g", TID, 0)]["start"] == 0  # the fresh start stored at once

    run(scenario())


def test_alter_sets_the_start_offset_of_an_empty_group_only():
    """Kafka's rules: NON_EMPTY_GROUP while a member is in, GROUP_ID_NOT_FOUND for no share
    group, UNKNOWN_TOPIC_OR_PARTITION per unknown partition (the others are altered),
    INVALID_REQUEST for a negative offset, and a failed write changes nothing; the altered
    partition is read from the new start, everything in flight before it forgotten."""
    apis, store = make_apis()
    assert alter(apis, "g", {"t": {0: 1}}).error_code == KafkaError.GROUP_ID_NOT_FOUND

    async def read_two_and_leave():
        await apis.share_fetch(fetch_req(0, []), ctx(78))  # acquires 0..2
        await apis.share_fetch(fetch_req(1, [(0, 1, ACK_ACCEPT)]), ctx(78))
        await apis.share_fetch(fetch_req(-1, []), ctx(78))

    topics = {"t": (TID, 1)}.get
    apis.coordinator.heartbeat("g", "m", 0, None, ["t"], "", "", topics)
    run(read_two_and_leave())
    busy = alter(apis, "g", {"t": {0: 7}})
    assert busy.error_code == KafkaError.NON_EMPTY_GROUP and store.docs[("g", TID, 0)]["start"] == 2
    apis.coordinator.heartbeat("g", "m", -1, None, None, "", "", topics)
    store.fail = True
    failed = alter(apis, "g", {"t": {0: 7}})
    assert results(failed) == [("t", 0, KafkaError.KAFKA_STORAGE_ERROR)]
    assert (
        store.docs[("g", TID, 0)]["start"] == 2 and "state_epoch" not in store.docs[("g", TID, 0)]
    )
    store.fail = False
    done = alter(apis, "g", {"t": {0: 7, 3: 1}, "x": {0: 0}})
    assert done.error_code == KafkaError.NONE and done.responses[0].topic_id == TOPIC_ID
    assert results(done) == [
        ("t", 0, KafkaError.NONE),
        ("t", 3, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
        ("x", 0, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert store.docs[("g", TID, 0)] == {"v": 1, "start": 7, "runs": [], "state_epoch": 1}
    assert store.altered_at == 3
    assert apis.partitions.get_loaded(("g", TID, 0)) is None  # dropped here: reloaded
    assert results(alter(apis, "g", {"t": {0: -1}})) == [("t", 0, KafkaError.INVALID_REQUEST)]
    got = run(apis.share_fetch(fetch_req(0, [], member="m2"), ctx(78)))
    assert offsets(got) == [7, 8, 9]  # read from exactly the new start
    stored(apis, 7)
    assert describe(apis, "g").topics[0].partitions[0].start_offset == 7
    apis.coordinates = apis.offsets.coordinates = lambda g: False
    assert alter(apis, "g", {"t": {0: 1}}).error_code == KafkaError.NOT_COORDINATOR


def test_a_leader_holding_the_old_state_cannot_write_it_back_after_an_alter():
    """The coordinator is another broker: the leader here holds the share-partition loaded
    with records in flight (a departed member's locks). Its next write (the lock expiry)
    names the state epoch it loaded and is refused; it drops the state and the next fetch
    reads from the altered start."""
    now = [0]
    apis, store = make_apis()
    apis.partitions.clock_ms = lambda: now[0]

    async def scenario():
        await apis.share_fetch(fetch_req(0, [], member="m"), ctx(78))  # 0..2 locked
        key = ("g", TID, 0)
        sp = apis.partitions.get_loaded(key)
        assert store.docs[key]["start"] == 0 and sp.state_epoch == 0
        store.alter_group("g", 3, [(TID, 0, {"v": 1, "start": 5, "runs": []})])
        now[0] = 10**9  # the locks expire: the leader writes its state back ...
        apis.partitions.expire_locks(sp)
        for _ in range(100):
            if apis.partitions.get_loaded(key) is None:
                break
            await asyncio.sleep(0)
        # ... refused (state epoch 0, stored 1): nothing overwritten, the state dropped
        assert store.docs[key] == {"v": 1, "start": 5, "runs": [], "state_epoch": 1}
        assert apis.partitions.get_loaded(key) is None
        got = await apis.share_fetch(fetch_req(0, [], member="m2"), ctx(78))
        assert offsets(got) == [5, 6, 7]
        assert apis.partitions.get_loaded(key).state_epoch == 1
        # its later writes carry the new state epoch and are accepted
        await apis.share_fetch(fetch_req(1, [(5, 5, ACK_ACCEPT)], member="m2"), ctx(78))
        assert store.docs[key]["start"] == 6 and store.docs[key]["state_epoch"] == 1

    run(scenario())


def test_an_idle_leader_reloads_a_share_partition_whose_offsets_were_altered_elsewhere():
    """Idle (nothing in flight, all stored), the leader would never write and find out;
    once its metadata image shows the altered state (another state epoch) the next fetch
    reloads and reads from the altered start. An image that still shows the old state
    (lagging) changes nothing."""
    apis, store = make_apis()
    image_kv = apis.broker.image_fn().kv
    apis.partitions.stored_value = lambda key: image_kv.get(share_state_key(*key))
    key = ("g", TID, 0)

    async def scenario():
        await apis.share_fetch(fetch_req(0, []), ctx(78))
        await apis.share_fetch(fetch_req(1, [(0, 2, ACK_ACCEPT)]), ctx(78))
        await apis.share_fetch(fetch_req(-1, []), ctx(78))
        sp = apis.partitions.get_loaded(key)
        for _ in range(100):
            if sp.stored == sp.changes:
                break
            await asyncio.sleep(0)
        image_kv[share_state_key(*key)] = json.dumps(store.docs[key])  # image caught up
        store.alter_group("g", 3, [(TID, 0, {"v": 1, "start": 8, "runs": []})])
        plog = apis.broker.routing.get(TID, 0)
        assert await apis.partitions.get(key, plog) is sp  # the image lags: kept
        image_kv[share_state_key(*key)] = json.dumps(store.docs[key])  # the alter arrives
        got = await apis.share_fetch(fetch_req(0, [], member="m3"), ctx(78))
        assert offsets(got) == [8, 9]
        assert apis.partitions.get_loaded(key) is not sp

    run(scenario())


def test_acls_alter_needs_read_on_the_group_and_each_topic():
    from types import SimpleNamespace

    from dataplane.kafka.security.share_api_acls import ShareApiAcls

    apis, store = make_apis()
    stored(apis, 4)
    rules: set = {("READ", "TOPIC", "t")}
    checks = SimpleNamespace(
        allowed=lambda ctx, op, kind, name: (op, kind, name) in rules,
        image_fn=apis.broker.image_fn,
    )
    acls = ShareApiAcls(checks)

    async def guarded(req, c):
        return await acls.alter_offsets(apis.offsets.alter_offsets, req, c)

    denied = alter(apis, "g", {"t": {0: 1}}, guarded)
    assert denied.error_code == KafkaError.GROUP_AUTHORIZATION_FAILED and not store.docs
    rules.add(("READ", "GROUP", "g"))
    mixed = alter(apis, "g", {"t": {0: 1}, "secret": {0: 1}}, guarded)
    assert results(mixed) == [
        ("t", 0, KafkaError.NONE),
        ("secret", 0, KafkaError.TOPIC_AUTHORIZATION_FAILED),
    ]
    assert store.docs[("g", TID, 0)]["start"] == 1


def test_alter_past_the_log_end_waits_for_records_and_below_its_start_starts_there():
    log = FakeLog(10)
    apis, store = make_apis(log)
    apis.coordinator.heartbeat("g", "m", 0, None, ["t"], "", "", {"t": (TID, 1)}.get)
    apis.coordinator.heartbeat("g", "m", -1, None, None, "", "", {"t": (TID, 1)}.get)
    assert results(alter(apis, "g", {"t": {0: 12}})) == [("t", 0, KafkaError.NONE)]
    assert offsets(run(apis.share_fetch(fetch_req(0, []), ctx(78)))) == []
    run(apis.share_fetch(fetch_req(-1, []), ctx(78)))
    log.log_start_offset = 6  # retention removed 0..5
    assert results(alter(apis, "g", {"t": {0: 2}})) == [("t", 0, KafkaError.NONE)]
    assert offsets(run(apis.share_fetch(fetch_req(0, [], member="m2"), ctx(78)))) == [6, 7, 8]
