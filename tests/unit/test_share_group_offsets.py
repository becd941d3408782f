"""DescribeShareGroupOffsets (90) and DeleteShareGroupOffsets (92) of KIP-932 share groups,
through the broker's codec (confluent-kafka 2.16's AdminClient has no share-group offsets
calls): the stored share-partition start offsets, -1 for a partition never read, Kafka's
errors (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, UNKNOWN_TOPIC_OR_PARTITION, NOT_COORDINATOR),
and a failed delete that changes nothing stored."""

from __future__ import annotations

import asyncio
import json

from controlplane.share_state import share_state_key
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_request, decode_response, encode_request, encode_response
from dataplane.kafka.registry import ApiRegistry, RequestContext
from dataplane.kafka.share.protocol import (
    ACK_ACCEPT,
    DeleteShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest,
)
from tests.unit.test_share_group_apis import (
    TID,
    TOPIC_ID,
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


def stored(apis, start: int) -> None:
    """The group's state of t-0 as the controller KV holds it (the image's copy)."""
    apis.broker.image_fn().kv[share_state_key("g", TID, 0)] = json.dumps(
        {"v": 1, "start": start, "runs": []}
    )


def test_api_versions_lists_90_and_92_at_version_0():
    apis, _ = make_apis()
    registry = ApiRegistry()
    for cls, lo, hi, handler in apis.registrations():
        registry.register(cls, lo, hi, handler)
    served = {k: (lo, hi) for k, lo, hi in registry.api_versions()}
    assert served[90] == (0, 0) and served[92] == (0, 0) and 91 not in served


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
    apis.partitions.stored_in_image = lambda key: share_state_key(*key) in image_kv

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
