"""A partition led here keeps its produce order when its brokers' AZs change: while other
AZs have brokers, produce goes through the broker's own RouterChannel (a pipeline that
appends each request once its channel write is done); when the image loses them (the
other AZs' brokers fenced), produce goes straight to the partition, but not ahead of the
requests still in the pipeline. An idempotent producer pipelines a partition's batches
(sequence n, n+1, ...): a later batch appended first is refused OUT_OF_ORDER_SEQUENCE_NUMBER,
and librdkafka fails for good once the earlier ones are acked (seen in the coordinator e2e
test when the second of three brokers was fenced). The real `ZoneRouting` and
`own_channel_backend` on real metadata images; the router's channel writes are held by the
test."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.partition_backend import AppendOutcome
from dataplane.zonerouter.own_channel import OwnPipeline, own_channel_backend
from dataplane.zonerouter.routing import ZoneRouting
from tests.support.metadata_images import image_with

WAIT_S = 10.0
TOPIC = "t"


class _Partition:
    """The partition led here: records the order of its appends."""

    def __init__(self, topic_id: str, partition: int):
        self.topic_id, self.topic, self.partition = topic_id, TOPIC, partition
        self.appended: list[bytes] = []

    def append(self, records, link=None) -> AppendOutcome:
        self.appended.append(bytes(records))
        durable: Future = Future()
        durable.set_result(len(self.appended) - 1)
        return AppendOutcome(KafkaError.NONE, len(self.appended) - 1, [durable])


class _Traffic:
    def add(self, name: str, size: int) -> None:
        pass


class _Router:
    """The zone router's side of the own channel: channel writes complete when the test
    says (`release`); a finished one appends the records to the partition."""

    def __init__(self) -> None:
        self.traffic = _Traffic()
        self.pipelines: dict[tuple[str, int], OwnPipeline] = {}
        self.channel_writes: list[Future] = []
        self._lock = threading.Lock()  # the pipelines' workers begin writes
        self._released = False

    def existing_own_pipeline(self, topic_id: str, partition: int) -> OwnPipeline | None:
        return self.pipelines.get((topic_id, partition))

    def own_pipeline(self, topic_id: str, partition: int) -> OwnPipeline | None:
        return self.pipelines.setdefault((topic_id, partition), OwnPipeline(partition))

    def begin_own(self, records: bytes) -> tuple[int, Future]:
        write: Future = Future()
        with self._lock:
            self.channel_writes.append(write)
            if self._released:
                write.set_result(None)
            return len(self.channel_writes), write

    def finish_own(self, handler, plog, records, token, channel_append) -> AppendOutcome:
        return plog.append(records)

    def release(self) -> None:
        """Complete every channel write, begun or to come."""
        with self._lock:
            self._released = True
            held = [w for w in self.channel_writes if not w.done()]
        for write in held:
            write.set_result(None)

    def close(self) -> None:
        for pipeline in self.pipelines.values():
            pipeline.close()


def _routing(image_box: list, partition: _Partition, router: _Router) -> ZoneRouting:
    return ZoneRouting(
        2,
        lambda: image_box[0],
        type("_Resolver", (), {"get": lambda self, topic_id, p: partition})(),
        lambda topic_id, p: None,
        own_channel=lambda topic_id, plog, through: own_channel_backend(
            router, None, plog, topic_id, through
        ),
    )


def test_produce_after_the_other_azs_are_gone_waits_for_the_channels_earlier_produce():
    tid = str(uuid.uuid4())
    three_azs = image_with({1: "az1", 2: "az2", 3: "az3"}, TOPIC, 3, tid)
    only_az2 = image_with({2: "az2"}, TOPIC, 3, tid)  # brokers 1 and 3 gone: no proxies
    # a partition this broker (2) leads in both images
    index = next(
        p.partition
        for p in three_azs.topic_by_name(TOPIC).partitions.values()
        if p.leader_node_id == 2
    )
    assert only_az2.topic_by_name(TOPIC).partitions[index].leader_node_id == 2
    partition = _Partition(tid, index)
    router = _Router()
    images = [three_azs]
    routing = _routing(images, partition, router)
    try:
        early = routing.get(tid, index, None).append(b"seq 0")
        assert early.forwarded and partition.appended == []  # its channel write is held
        images[0] = only_az2
        later = routing.get(tid, index, None).append(b"seq 1")
        assert partition.appended == [], "the later produce overtook the one in the channel"
        router.release()
        outcomes = [f.result(WAIT_S) for o in (early, later) for f in o.durable]
        assert [o.error for o in outcomes] == [KafkaError.NONE, KafkaError.NONE]
        assert partition.appended == [b"seq 0", b"seq 1"]
        # nothing left in the pipeline: the partition itself now
        assert routing.get(tid, index, None) is partition
        direct = routing.get(tid, index, None).append(b"seq 2")
        assert not direct.forwarded and partition.appended[-1] == b"seq 2"
    finally:
        router.release()
        router.close()
