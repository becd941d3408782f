"""Published metadata images never change: batches make new images (copy on write)."""

from __future__ import annotations

import threading

from controlplane.image import MetadataImage
from controlplane.records import decode_record
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine

NOW = 1_000_000


def ok(result: dict) -> dict:
    assert "error" not in result, result
    return result["result"]


def _busy_log() -> list[tuple]:
    """A realistic log touching every kind of record: brokers, topics, streams, objects."""
    sm = MetadataStateMachine(ControllerSettings(bucket_ids=[0, 1]))
    for node in (1, 2):
        ok(
            sm.execute(
                "register_broker",
                {
                    "node_id": node,
                    "az": f"az{node}",
                    "host": "h",
                    "kafka_port": 9000 + node,
                    "incarnation_id": f"i{node}",
                },
                NOW,
            )
        )
        ok(sm.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0}, NOW))
    ok(sm.execute("create_topic", {"name": "t", "partitions": 3, "topic_id": "x"}, NOW))
    sid = ok(sm.execute("create_stream", {"node_id": 1, "node_epoch": 0}, NOW))["stream_id"]
    ok(
        sm.execute(
            "open_stream", {"node_id": 1, "node_epoch": 0, "stream_id": sid, "stream_epoch": 0}, NOW
        )
    )
    for i in range(5):
        oid = ok(
            sm.execute(
                "prepare_objects",
                {"node_id": 1, "node_epoch": 0, "count": 1, "ttl_ms": 60_000},
                NOW,
            )
        )["first_object_id"]
        ok(
            sm.execute(
                "commit_stream_set_object",
                {
                    "node_id": 1,
                    "node_epoch": 0,
                    "object_id": oid,
                    "order_id": oid,
                    "size_bytes": 10,
                    "bucket_id": 0,
                    "stream_ranges": [
                        {
                            "stream_id": sid,
                            "stream_epoch": 0,
                            "start_offset": i * 10,
                            "end_offset": i * 10 + 10,
                        }
                    ],
                    "stream_objects": [],
                    "compacted_object_ids": [],
                },
                NOW,
            )
        )
    ok(
        sm.execute(
            "trim_stream",
            {
                "node_id": 1,
                "node_epoch": 0,
                "stream_id": sid,
                "stream_epoch": 0,
                "new_start_offset": 15,
            },
            NOW,
        )
    )
    ok(sm.execute("put_kv", {"key": "a", "value": "1"}, NOW))
    ok(sm.execute("create_partitions", {"name": "t", "total_count": 4}, NOW))
    ok(sm.execute("fence_broker", {"node_id": 2, "node_epoch": 0, "reason": "test"}, NOW))
    ok(sm.execute("delete_topic", {"name": "t"}, NOW))
    return [
        (decode_record(item["record"]), item["offset"])
        for item in sm.read_log(-1, 10_000)["records"]
    ]


def test_with_records_never_changes_the_image_it_started_from():
    log = _busy_log()
    image = MetadataImage()
    for size in (1, 3, 7):  # batch sizes that split the log differently
        image = MetadataImage()
        images = [image]
        prints = [image.fingerprint()]
        for i in range(0, len(log), size):
            image, delta = image.with_records(log[i : i + size])
            assert len(delta.records) == len(log[i : i + size])
            images.append(image)
            prints.append(image.fingerprint())
        # every image still has the state it was published with
        assert [img.fingerprint() for img in images] == prints
    replica = MetadataImage()
    for rec, offset in log:
        replica.apply(rec, offset)
    assert image.fingerprint() == replica.fingerprint()


def test_delta_names_what_the_batch_touched():
    log = _busy_log()
    image, _ = MetadataImage().with_records(log[:4])  # two brokers registered and unfenced
    topic_recs = [(rec, off) for rec, off in log[4:] if rec.type in ("topic", "partition")]
    after, delta = image.with_records(topic_recs[:4])
    assert delta.touched["topics"] == {"x"}
    assert delta.base is image and delta.image is after
    assert "x" not in image.topics and "x" in after.topics
    assert after.brokers is image.brokers  # untouched containers are shared


def test_readers_see_whole_batches_while_a_writer_publishes():
    """One thread publishes batches of 50 KV writes (batch n sets every key to n); readers
    iterate whole images meanwhile: no exception, and every image holds one batch's values."""
    holder = {"image": MetadataImage()}
    errors: list[BaseException] = []
    stop = threading.Event()
    from controlplane.records import KVRecord

    def writer() -> None:
        try:
            offset = 0
            for n in range(1, 400):
                batch = []
                for k in range(50):
                    batch.append((KVRecord(key=f"k{k}", value=str(n)), offset))
                    offset += 1
                holder["image"], _ = holder["image"].with_records(batch)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    seen_mixed: list[set] = []
    reads = [0]

    def reader() -> None:
        try:
            while not stop.is_set():
                image = holder["image"]
                values = {v for _, v in image.kv.items()}  # iterates the whole dict
                if len(values) > 1:
                    seen_mixed.append(values)
                reads[0] += 1
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not seen_mixed, seen_mixed[:3]
    assert reads[0] > 0
    assert set(holder["image"].kv.values()) == {"399"}
